"""``troll compare``: the same run (task, seeds, batch shape, steps) once per loss, then one plot and one table.

Each loss runs into ``<out>/<loss>/`` exactly as ``troll train`` would; ``<out>`` gets config.json, compare.png and
compare.md. With --resume, finished runs (summary.json present) are kept and interrupted ones resumed.
"""

from __future__ import annotations

import json
from pathlib import Path

from troll import runs as run_folder
from troll.lm import options
from troll.lm.metrics import off_policy_rows, read_metrics
from troll.lm.options import LOSSES, RunOptions, UsageError
from troll.runs.files import CONFIG_FILE, SUMMARY_FILE, write_json
from troll.study.grid import parse_arms

COMMAND = "compare"
PLOT_FILE = "compare.png"
TABLE_FILE = "compare.md"


def plan(base: RunOptions, losses: list[str]) -> list[RunOptions]:
    """One resolved, value-checked RunOptions per loss, in ``<out>/<loss>``: ``base.kl_bound`` is the TROLL losses'
    bound, ``base.clip_eps`` the clip losses' (each loss keeps its own family's, :func:`~troll.lm.options.for_loss`)."""
    parse_losses(",".join(losses))
    options.check_used(base, losses)
    out = Path(base.out or f"runs/compare-{options.task_label(base.task)}-seed{base.seed}")
    runs = []
    for loss in losses:
        runs.append(options.for_loss(base, loss, out=str(out / loss)).resolved())
    return runs


def parse_losses(text: str) -> list[str]:
    """``--losses troll,grpo`` of compare and study: known losses, each once."""
    return parse_arms(text, LOSSES, flag="--losses", noun="loss", example="troll,grpo")


def check_compare_folder(out: Path, *, overwrite: bool, resume: bool, runs: list[RunOptions] | None = None) -> bool:
    """As :func:`troll.lm.options.check_run_folder`, for a compare folder (whose runs are run folders of their own).

    With ``resume`` the folder's config.json must be a comparison's, and, when ``runs`` is given, hold the same
    runs: a comparison resumed with other options would mix two experiments in one table. An unfinished run that
    must start over is checked like ``troll train --overwrite``'s folder (nothing it did not write is deleted).
    """
    action = run_folder.check_folder(out, COMMAND, resume=resume, overwrite=overwrite, what="comparison")
    if resume and action == "new":
        raise UsageError(f"--resume: {out} holds no earlier comparison; start it without --resume.")
    if action == "resume":
        check_saved_runs(out, runs)
        for opts in runs or []:
            folder = Path(opts.out)
            if folder.exists() and not _finished(folder) and options.last_checkpoint(folder) is None:
                run_folder.check_folder(folder, options.COMMAND, resume=False, overwrite=True)
    return action == "replace"


def _finished(folder: Path) -> bool:
    return (folder / SUMMARY_FILE).is_file()


def check_saved_runs(out: Path, runs: list[RunOptions] | None) -> None:
    """--resume: config.json must be a comparison's (``command`` "compare", a ``runs`` list) with ``runs``' options."""
    path = out / CONFIG_FILE
    data = options.read_config(out)
    if not (isinstance(data, dict) and data.get("command") == COMMAND and isinstance(data.get("runs"), list)):
        raise UsageError(
            f"--resume: {path} is not a comparison's config (no command '{COMMAND}' with a 'runs' list); it was not "
            "written by troll compare, start a new --out."
        )
    if runs is None:
        return
    saved = {r.get("loss"): r for r in data["runs"] if isinstance(r, dict)}
    given = {r.loss: r.to_json() for r in runs}
    if saved.keys() != given.keys():
        raise UsageError(
            f"--resume: {out} compares {', '.join(map(str, saved))}, not {', '.join(given)}; pass the same --losses "
            "or start a new --out."
        )
    for loss, opts in given.items():
        for key, value in opts.items():
            if saved[loss].get(key) != value:
                raise UsageError(
                    f"--resume: the saved {loss} run has {key}={saved[loss].get(key)!r}, this command gives "
                    f"{value!r}; resume with the same options or start a new --out."
                )


def run(out: Path, runs: list[RunOptions], *, clear: bool, resume: bool) -> str:
    """Train every run (skipping finished ones when resuming), then write the plot and the table; returns the table."""
    if clear:
        run_folder.clear(out, COMMAND)
    with run_folder.holding(out):
        run_folder.begin(out, COMMAND, runs=tuple(Path(r.out).name for r in runs))
        return _run(out, runs, resume=resume)


def _run(out: Path, runs: list[RunOptions], *, resume: bool) -> str:
    from troll.lm import plots
    from troll.lm.run import train

    config = {"command": COMMAND, "runs": [r.to_json() for r in runs]}
    write_json(out / CONFIG_FILE, config)
    summaries = {}
    for opts in runs:
        folder = Path(opts.out)
        if resume and (folder / SUMMARY_FILE).is_file():
            summaries[opts.loss] = json.loads((folder / SUMMARY_FILE).read_text())
            continue
        again = resume and options.last_checkpoint(folder) is not None
        if folder.exists() and not again:  # an unfinished run without a checkpoint: start it over
            if run_folder.check_folder(folder, options.COMMAND, resume=False, overwrite=True) == "replace":
                run_folder.clear(folder, options.COMMAND)
        summaries[opts.loss] = train(opts, resume=again)
    metrics = {opts.loss: read_metrics(Path(opts.out)) for opts in runs}
    r = runs[0]
    title = f"{r.task}, {r.model}, seed {r.seed}, {r.steps} steps"
    plots.plot_compare(metrics, out / PLOT_FILE, steps_per_rollout=r.steps_per_rollout, title=title)
    table = markdown(runs, summaries, metrics)
    (out / TABLE_FILE).write_text(table)  # after every run finished; a rerun with --resume rewrites it
    return table


def markdown(runs: list[RunOptions], summaries: dict[str, dict], metrics: dict[str, list[dict]]) -> str:
    """A markdown table: one row per loss with held-out accuracy, reward, KL, projected/clipped share and time."""
    head = "| loss | bound | held-out acc. before | after | reward first -> last quarter | max KL after | "
    head += "projected / clipped | entropy (last) | train s |\n"
    head += "|---|---|---|---|---|---|---|---|---|\n"
    lines = []
    for opts in runs:
        s, rows = summaries[opts.loss], metrics[opts.loss]
        off = off_policy_rows(rows, opts.steps_per_rollout)
        kl = _agg(off, "troll/kl_after/max", max)
        frac = _agg(off, "troll/projected_frac", _mean)
        frac = _agg(off, "clip_ratio/region_mean", _mean) if frac is None else frac
        cells = [
            opts.loss,
            f"{options.bound_name(opts.loss)} {opts.bound:g}",
            _fmt(s.get("heldout_accuracy_before")),
            _fmt(s.get("heldout_accuracy_after")),
            f"{_fmt(s.get('reward_first'))} -> {_fmt(s.get('reward_last_quarter_mean'))}",
            _fmt(kl),
            _fmt(frac),
            _fmt(_agg(rows, "entropy", lambda v: v[-1])),
            _fmt(s.get("train_time_s"), ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |\n")
    r = runs[0]
    note = (
        f"\nTask {r.task}, model {r.model}, seed {r.seed}, {r.steps} optimiser steps, rollouts of "
        f"{r.prompts_per_step} prompts x {r.generations} samples split into {r.steps_per_rollout} steps, "
        f"{r.heldout} held-out items (greedy; one item is {1 / r.heldout:.3f}, and the standard error of an accuracy "
        f"near 0.5 is {0.5 / r.heldout**0.5:.3f}). Max KL after projection and the projected share are TROLL's, "
        "over the off-policy steps (the 2nd to last of each rollout); the clip losses log the clipped share there "
        "instead. Entropy is per token, at the last logged step.\n"
    )
    return head + "".join(lines) + note


def _agg(rows: list[dict], key: str, fn):
    values = [r[key] for r in rows if r.get(key) is not None]
    return fn(values) if values else None


def _mean(values):
    return sum(values) / len(values)


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)
