"""The stability map: does TROLL make a GRPO run more forgiving than the paper's clip baseline?

``python experiments/stability_map.py FOLDER`` (the last step of ``make map``) reads every finished ``troll train``
cell below FOLDER, whatever study it belongs to (a cell is a folder holding config.json with its "options" and
summary.json), and groups the cells by task, *arm* (the loss and whatever else sets it apart, written as in ``troll
study --losses``: ``troll``, ``troll:tail=renormalize``, ``troll_seq:agg=token-mean``), learning rate and *reuse*
(optimiser steps per rollout batch). Cells whose other settings (steps, completions per step, evaluation, prompt)
differ from the task's most common ones are left out, and counted. Into FOLDER (or ``--out``) it writes:

- map.md: per task and arm, the largest learning rate and the largest reuse at which the arm ends above its starting
  held-out accuracy on every seed; each arm's best setting (highest mean accuracy after the run); the paired
  difference TROLL - baseline per seed (mean and 95% t-interval, :mod:`troll.study.stats`) at each one's best setting
  and at every setting both ran; then the extras, each variant arm against its reference at the same setting
  (``troll:tail=renormalize`` - ``troll``, ``troll:kl-bound=0.2`` - ``troll``, ``troll_seq:...`` - ``gspo_tm``).
- map_lr.png and map_reuse.png: held-out accuracy after the run and at its peak (the best evaluation after step 0)
  against the learning rate and against reuse, one line per arm, bands of one standard error over seeds, the
  starting accuracy dashed.
- map_kl.png: the KL each arm reached on its off-policy steps against the learning rate (the mean over those steps of
  the token-mean KL(pi || pi_old) over TROLL's sparse support before any projection; the clip losses log it with
  ``--measure-kl``), with the largest per-token KL dotted and TROLL's bound.
- map_kl_share.png: where that KL comes from, on the tokens over TROLL's bound: the old policy's 8 most probable
  tokens, the rest of the support, and the tail.
- map.json: the numbers behind all of it.

The x-axes are found from the cells: the learning-rate sweep is the main arms' cells at their most common reuse, the
reuse sweep their cells at the learning rate with the most reuse values.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from troll.lm.metrics import off_policy_rows
from troll.lm.options import CLIP_LOSSES, LOSSES, TROLL_LOSSES, RunOptions, bound_name
from troll.lm.study import cell_metrics
from troll.runs.files import CONFIG_FILE, SUMMARY_FILE, UsageError, read_jsonl, write_json
from troll.study import stats

TABLE, JSON = "map.md", "map.json"
SHARES = ("old_top8", "support", "rest")
NUMBERS = ("acc_before", "acc_after", "acc_peak", "kl_mean", "kl_max") + tuple(f"share_{s}" for s in SHARES)
LABELS = {"acc_after": "held-out acc. after", "acc_peak": "held-out acc. peak", "kl_mean": "KL reached, mean"}
# Options that make a cell's arm or its place on an axis; the rest must agree for cells to be compared.
ARM_KEYS = (
    "loss",
    "kl_bound",
    "clip_eps",
    "cispo_cap",
    "tail",
    "agg",
    "clip_eps_high",
    "dual_clip",
    "alpha",
    "top_k",
    "delta",
)
NOT_COMPARED = {"seed", "out", "threads", "save_every", "lr", "steps_per_rollout", "prompts_per_step", "measure_kl"}


@dataclass
class MapCell:
    task: str
    arm: str
    lr: float
    reuse: int
    seed: int
    base: tuple  # the settings compared cells share, as sorted (name, value) pairs
    numbers: dict


def arm_label(opts: RunOptions) -> str:
    """The arm as ``troll study --losses`` writes it: the loss, then every setting that differs from its default."""
    spec, default = LOSSES[opts.loss], RunOptions()
    parts = [opts.loss]
    if opts.bound != spec.bound:
        parts.append(f"{bound_name(opts.loss).replace('_', '-')}={opts.bound:g}")
    for key in ("tail", "agg", "alpha", "top_k", "delta"):
        if opts.loss in TROLL_LOSSES or key == "tail":
            value = getattr(opts, key)
            if value != getattr(default, key):
                parts.append(f"{key.replace('_', '-')}={value:g}" if not isinstance(value, str) else f"{key}={value}")
    if opts.loss in CLIP_LOSSES:
        if opts.clip_eps_high is not None and opts.clip_eps_high != opts.bound:
            parts.append(f"clip-eps-high={opts.clip_eps_high:g}")
        if (opts.dual_clip or 0.0) != (spec.dual_clip or 0.0) and opts.dual_clip is not None:
            parts.append(f"dual-clip={opts.dual_clip:g}")
    return ":".join(parts)


def read_cell(folder: Path) -> MapCell | None:
    """The cell in ``folder`` (None unless it finished: summary.json is written last)."""
    try:
        opts = RunOptions.from_json(json.loads((folder / CONFIG_FILE).read_text())["options"])
        summary = json.loads((folder / SUMMARY_FILE).read_text())
    except (OSError, KeyError, TypeError, ValueError):
        return None
    rows = read_jsonl(folder / "metrics.jsonl")
    numbers = cell_metrics(summary, rows, opts.steps_per_rollout)
    numbers.update(kl_shares(rows, opts.steps_per_rollout))
    base = {k: v for k, v in dataclasses.asdict(opts).items() if k not in NOT_COMPARED | set(ARM_KEYS) | {"task"}}
    base["completions_per_step"] = opts.batch_size
    return MapCell(opts.task, arm_label(opts), opts.lr, opts.steps_per_rollout, opts.seed, tuple(sorted(base.items())),
                   numbers)  # fmt: skip


def kl_shares(rows: list[dict], steps_per_rollout: int) -> dict:
    """Mean over the off-policy steps that had tokens over the bound (their shares sum to one) of each kl_share."""
    picked = []
    for r in off_policy_rows(rows, steps_per_rollout):
        values = [r.get(f"troll/kl_share/{s}") for s in SHARES]
        if None not in values and abs(sum(values) - 1) < 1e-3:
            picked.append(values)
    return {f"share_{s}": stats.mean([v[i] for v in picked]) for i, s in enumerate(SHARES)}


def find_cells(folder: Path) -> list[MapCell]:
    cells = [read_cell(p.parent) for p in sorted(Path(folder).rglob(SUMMARY_FILE))]
    return [c for c in cells if c is not None]


# ---------------------------------------------------------------- grouping and statistics


def by_seed(cells: list[MapCell], arm: str, key: str, **where) -> dict[int, float]:
    return {
        c.seed: c.numbers.get(key) for c in cells if c.arm == arm and all(getattr(c, k) == v for k, v in where.items())
    }


def sweep(cells: list[MapCell], arm: str, axis: str, fixed: dict) -> list[dict]:
    """Per value of ``axis`` ("lr" or "reuse"): the arm's numbers over seeds (mean, se, n) and every-seed facts."""
    values = sorted({getattr(c, axis) for c in cells if c.arm == arm and _matches(c, fixed)})
    out = []
    for x in values:
        group = [c for c in cells if c.arm == arm and getattr(c, axis) == x and _matches(c, fixed)]
        entry = {axis: x, "seeds": sorted(c.seed for c in group)}
        entry.update({key: stats.summarize([c.numbers.get(key) for c in group]) for key in NUMBERS})
        pairs = [(c.numbers.get("acc_after"), c.numbers.get("acc_before")) for c in group]
        entry["above_start_every_seed"] = bool(pairs) and all(
            a is not None and b is not None and a > b for a, b in pairs
        )
        out.append(entry)
    return out


def _matches(cell: MapCell, fixed: dict) -> bool:
    return all(getattr(cell, k) == v for k, v in fixed.items())


def largest_above_start(points: list[dict], axis: str):
    passing = [p[axis] for p in points if p["above_start_every_seed"]]
    return max(passing) if passing else None


def best(points: list[dict], axis: str):
    """The value with the highest mean accuracy after the run (the smaller one on a tie); None without any."""
    scored = [(p["acc_after"]["mean"], -p[axis], p[axis]) for p in points if p["acc_after"]["mean"] is not None]
    return max(scored)[2] if scored else None


def paired(cells, a: str, b: str, key: str, where_a: dict, where_b: dict) -> dict:
    return stats.paired(by_seed(cells, a, key, **where_a), by_seed(cells, b, key, **where_b))


def reference_of(arm: str, present: set[str]) -> str | None:
    """What a variant arm is compared with at its own setting: its plain loss (``troll:kl-bound=0.2`` -> ``troll``); a
    sequence-level TROLL arm with GSPO first (the paper's pairing). None for a plain arm."""
    loss = arm.split(":")[0]
    candidates = ["gspo_tm", "gspo", "troll_seq"] if loss == "troll_seq" else ([loss] if ":" in arm else [])
    return next((c for c in candidates if c in present and c != arm), None)


def analyse(cells: list[MapCell], troll: str, baseline: str) -> dict:
    """Everything map.md, map.json and the plots show, per task."""
    tasks = {}
    for task in sorted({c.task for c in cells}):
        mine = [c for c in cells if c.task == task]
        common = Counter(c.base for c in mine).most_common(1)[0][0]
        kept = [c for c in mine if c.base == common]
        tasks[task] = analyse_task(kept, troll, baseline) | {"left_out": len(mine) - len(kept), "base": dict(common)}
    return tasks


def analyse_task(cells: list[MapCell], troll: str, baseline: str) -> dict:
    main = [arm for arm in (troll, baseline) if any(c.arm == arm for c in cells)]
    mains = [c for c in cells if c.arm in main]
    reuse0 = Counter(c.reuse for c in mains).most_common(1)[0][0] if mains else None
    reuses_at = {lr: {c.reuse for c in mains if c.lr == lr} for lr in {c.lr for c in mains}}
    lr0 = min(reuses_at, key=lambda lr: (-len(reuses_at[lr]), lr)) if reuses_at else None
    out = {"arms": main, "reuse_of_lr_sweep": reuse0, "lr_of_reuse_sweep": lr0, "lr": {}, "reuse": {}, "summary": []}
    for arm in main:
        out["lr"][arm] = sweep(cells, arm, "lr", {"reuse": reuse0})
        out["reuse"][arm] = sweep(cells, arm, "reuse", {"lr": lr0})
        out["summary"].append({
            "arm": arm,
            "largest_lr": largest_above_start(out["lr"][arm], "lr"),
            "largest_reuse": largest_above_start(out["reuse"][arm], "reuse"),
            "best_lr": best(out["lr"][arm], "lr"),
            "best_reuse": best(out["reuse"][arm], "reuse"),
        })  # fmt: skip
    out["paired"] = paired_rows(cells, out, troll, baseline) if len(main) == 2 else []
    out["extras"] = extras(cells, set(main))
    return out


def paired_rows(cells, out: dict, troll: str, baseline: str) -> list[dict]:
    """TROLL - baseline per seed: at each one's best setting, then at every setting both ran, on both axes."""
    rows = []
    mine, theirs = out["summary"]
    for axis, fixed in (("lr", {"reuse": out["reuse_of_lr_sweep"]}), ("reuse", {"lr": out["lr_of_reuse_sweep"]})):
        settings = [("best", {axis: mine[f"best_{axis}"]}, {axis: theirs[f"best_{axis}"]})]
        shared = sorted({p[axis] for p in out[axis][troll]} & {p[axis] for p in out[axis][baseline]})
        settings += [(x, {axis: x}, {axis: x}) for x in shared]
        for name, where_a, where_b in settings:
            for key in ("acc_after", "acc_peak"):
                diff = paired(cells, troll, baseline, key, fixed | where_a, fixed | where_b)
                rows.append({"axis": axis, "at": name, "troll_at": where_a[axis], "baseline_at": where_b[axis],
                             "metric": key, **diff})  # fmt: skip
    return rows


def extras(cells: list[MapCell], main: set[str]) -> list[dict]:
    """Each variant arm minus its reference (:func:`reference_of`), same task, learning rate, reuse and seed."""
    rows = []
    settings = sorted({(c.lr, c.reuse) for c in cells})
    for lr, reuse in settings:
        here = [c for c in cells if c.lr == lr and c.reuse == reuse]
        present = {c.arm for c in here}
        for arm in sorted(present - main):
            ref = reference_of(arm, present)
            if ref is None:
                continue
            for key in ("acc_after", "acc_peak", "kl_mean"):
                where = {"lr": lr, "reuse": reuse}
                diff = paired(here, arm, ref, key, where, where)
                means = {side: stats.mean([v for v in by_seed(here, side, key).values() if v is not None])
                         for side in (arm, ref)}  # fmt: skip
                rows.append({"lr": lr, "reuse": reuse, "arm": arm, "reference": ref, "metric": key,
                             "arm_mean": means[arm], "reference_mean": means[ref], **diff})  # fmt: skip
    return rows


# ---------------------------------------------------------------- map.md


def _f(value, spec=".3f") -> str:
    return "-" if value is None else format(value, spec)


def _x(value) -> str:
    return "none" if value is None else f"{value:g}"


def _ci(d: dict) -> str:
    return "-" if d.get("ci95") is None else f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"


def _seeds(d: dict) -> str:
    return ", ".join(f"s{k}: {v:+.3f}" for k, v in d["diffs"].items()) or "-"


def markdown(result: dict, troll: str, baseline: str) -> str:
    text = f"# Stability map: {troll} against {baseline}\n"
    for task, t in result.items():
        text += f"\n## {task}\n\n" + _settings_line(t) + "\n\n"
        text += "| loss | largest lr above its start on every seed | largest reuse above its start on every seed | "
        text += "best lr | best reuse |\n|---|---|---|---|---|\n"
        for s in t["summary"]:
            row = [s["arm"], _x(s["largest_lr"]), _x(s["largest_reuse"]), _x(s["best_lr"]), _x(s["best_reuse"])]
            text += "| " + " | ".join(row) + " |\n"
        text += _sweep_table(t, "lr", "learning rate", f"reuse {t['reuse_of_lr_sweep']}")
        text += _sweep_table(t, "reuse", "reuse", f"lr {_x(t['lr_of_reuse_sweep'])}")
        text += _paired_table(t["paired"], troll, baseline)
        text += _extras_table(t["extras"])
    return text + NOTE


def _settings_line(t: dict) -> str:
    b = t["base"]
    left = f"; {t['left_out']} cell(s) with other settings left out" if t["left_out"] else ""
    return (f"{b.get('steps')} optimiser steps of {b.get('completions_per_step')} completions, {b.get('heldout')} "
            f"held-out items (evaluated every {b.get('eval_every')} steps), completions of at most "
            f"{b.get('max_completion_length')} tokens{left}.")  # fmt: skip


def _sweep_table(t: dict, axis: str, name: str, fixed: str) -> str:
    head = f"\n**Against {name}** ({fixed}): mean ± standard error over seeds\n\n"
    head += f"| loss | {axis} | seeds | acc. before | acc. after | acc. peak | above start, every seed | KL reached | "
    head += "KL over the bound: old top 8 / rest of support / tail |\n|---|---|---|---|---|---|---|---|---|\n"
    lines = []
    for arm, points in t[axis].items():
        for p in points:
            cols = [arm, _x(p[axis]), str(len(p["seeds"]))]
            cols += [_pm(p[k]) for k in ("acc_before", "acc_after", "acc_peak")]
            cols += ["yes" if p["above_start_every_seed"] else "no", _pm(p["kl_mean"], ".4f")]
            cols += [" / ".join(_f(p[f"share_{s}"]["mean"], ".2f") for s in SHARES)]
            lines.append("| " + " | ".join(cols) + " |\n")
    return head + "".join(lines)


def _pm(d: dict, spec=".3f") -> str:
    if d["mean"] is None:
        return "-"
    return _f(d["mean"], spec) + ("" if d["se"] is None else f" ± {_f(d['se'], spec)}")


def _paired_table(rows: list[dict], troll: str, baseline: str) -> str:
    if not rows:
        return f"\nNo paired comparison: this task lacks {troll} or {baseline}.\n"
    text = f"\n**Paired: {troll} - {baseline}, same seed** (at each one's best setting, then at each shared one)\n\n"
    text += "| axis | at | metric | per seed | mean | 95% interval | n |\n|---|---|---|---|---|---|---|\n"
    for r in rows:
        at = f"best ({_x(r['troll_at'])} vs {_x(r['baseline_at'])})" if r["at"] == "best" else _x(r["at"])
        cols = [r["axis"], at, LABELS[r["metric"]], _seeds(r), _f(r["mean"], "+.3f"), _ci(r), str(r["n"])]
        text += "| " + " | ".join(cols) + " |\n"
    return text


def _extras_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    text = "\n**Extras: each variant against its reference, same setting and seed**\n\n"
    text += "| lr | reuse | variant - reference | metric | variant | reference | per seed | mean | 95% interval |\n"
    text += "|---|---|---|---|---|---|---|---|---|\n"
    for r in rows:
        spec = ".4f" if r["metric"] == "kl_mean" else ".3f"
        cols = [_x(r["lr"]), _x(r["reuse"]), f"{r['arm']} - {r['reference']}", LABELS[r["metric"]]]
        cols += [_f(r["arm_mean"], spec), _f(r["reference_mean"], spec), _seeds(r), _f(r["mean"], "+.3f"), _ci(r)]
        text += "| " + " | ".join(cols) + " |\n"
    return text


NOTE = (
    "\nReuse is the number of optimiser steps per rollout batch (each on its own share of the batch). The peak is the "
    'best held-out evaluation after step 0. "Above start" means the accuracy after the run beats the accuracy '
    "before it on every seed. The KL reached is the mean over the off-policy steps (the 2nd to last of each rollout "
    "batch) of the token-mean KL(pi || pi_old) over TROLL's sparse support before any projection (for the clip "
    "losses measured the same way, without changing them). The last column splits that KL, on the off-policy tokens "
    "over TROLL's bound, between the old policy's 8 most probable tokens, the other ids of the support and the rest "
    "category (mean shares; a part can be negative). Standard errors use n - 1; the 95% interval is mean ± "
    "t(0.975, n - 1) x the standard error of the per-seed differences (a seed fixes the data, the initial model and "
    "the held-out items).\n"
)


# ---------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _band(ax, xs, entries, color, label, ls="-"):
    points = [(x, e["mean"], e["se"] or 0.0) for x, e in zip(xs, entries) if e["mean"] is not None]
    if not points:
        return
    x, m, se = zip(*points)
    ax.plot(x, m, color=color, ls=ls, marker="o", ms=3, label=label)
    ax.fill_between(x, [a - b for a, b in zip(m, se)], [a + b for a, b in zip(m, se)], color=color, alpha=0.2, lw=0)


def plot_accuracy(result: dict, axis: str, path: Path) -> None:
    """Held-out accuracy after the run and at its peak against ``axis``, one row of two panels per task."""
    plt = _plt()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(len(result), 2, figsize=(10, 3.4 * len(result)), squeeze=False)
    for row, (task, t) in zip(axes, result.items()):
        for ax, key in zip(row, ("acc_after", "acc_peak")):
            for i, (arm, points) in enumerate(t[axis].items()):
                xs = [p[axis] for p in points]
                _band(ax, xs, [p[key] for p in points], colors[i % len(colors)], arm)
            start = [p["acc_before"]["mean"] for points in t[axis].values() for p in points if p["acc_before"]["mean"]]
            if start:
                ax.axhline(stats.mean(start), color="gray", ls="--", lw=1, label="before training")
            fixed = f"reuse {t['reuse_of_lr_sweep']}" if axis == "lr" else f"lr {_x(t['lr_of_reuse_sweep'])}"
            _axes(ax, t, axis, f"{task}: {LABELS[key]} ({fixed})", log_y=False)
    _save(plt, fig, path, "held-out greedy accuracy (mean ± standard error over seeds)")


def plot_kl(result: dict, path: Path, bound: float | None) -> None:
    """The KL each arm reached on its off-policy steps against the learning rate: token mean (solid), max (dotted)."""
    plt = _plt()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(result), figsize=(5 * len(result), 3.6), squeeze=False)
    for ax, (task, t) in zip(axes[0], result.items()):
        for i, (arm, points) in enumerate(t["lr"].items()):
            xs = [p["lr"] for p in points]
            _band(ax, xs, [p["kl_mean"] for p in points], colors[i % len(colors)], f"{arm}, token mean")
            _band(ax, xs, [p["kl_max"] for p in points], colors[i % len(colors)], f"{arm}, largest token", ls=":")
        if bound:
            ax.axhline(bound, color="gray", ls="--", lw=1, label=f"TROLL's bound {bound:g}")
        _axes(ax, t, "lr", f"{task}: KL(pi || pi_old) reached (reuse {t['reuse_of_lr_sweep']})", log_y=True)
    _save(plt, fig, path, "KL on the off-policy steps, over TROLL's sparse support, before projection")


def plot_kl_share(result: dict, path: Path) -> None:
    """Shares of the KL of the tokens over the bound, per arm (colour) and part (line style), against lr."""
    plt = _plt()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = {"old_top8": "-", "support": "--", "rest": ":"}
    fig, axes = plt.subplots(1, len(result), figsize=(5 * len(result), 3.6), squeeze=False)
    for ax, (task, t) in zip(axes[0], result.items()):
        for i, (arm, points) in enumerate(t["lr"].items()):
            for part, ls in styles.items():
                entries = [p[f"share_{part}"] for p in points]
                _band(ax, [p["lr"] for p in points], entries, colors[i % len(colors)], f"{arm}: {part}", ls=ls)
        _axes(ax, t, "lr", f"{task}: where the KL of tokens over the bound comes from", log_y=False)
    _save(plt, fig, path, "old_top8: the old policy's 8 most probable tokens; support: the rest of it; rest: the tail")


def _axes(ax, t: dict, axis: str, title: str, *, log_y: bool) -> None:
    """Scales, labels and legend of one panel of task ``t``; x ticks at the values its sweep along ``axis`` tried."""
    ax.set_xscale("log", base=10 if axis == "lr" else 2)
    ticks = sorted({p[axis] for points in t[axis].values() for p in points})
    if ticks:
        from matplotlib.ticker import NullLocator

        ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("learning rate" if axis == "lr" else "optimiser steps per rollout batch")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no cells", ha="center", va="center", transform=ax.transAxes, color="gray")


def _save(plt, fig, path: Path, title: str) -> None:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- command line


def write_map(folder: Path, out: Path | None = None, *, troll: str = "troll", baseline: str = "clip") -> dict:
    """Read the cells below ``folder`` and write map.md, map.json and the four PNGs into ``out`` (default: folder)."""
    cells = find_cells(folder)
    if not cells:
        raise UsageError(f"no finished troll train cell below {folder} (a folder with config.json and summary.json).")
    result = analyse(cells, troll, baseline)
    out = Path(out or folder)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / JSON, {"troll": troll, "baseline": baseline, "cells": len(cells), "tasks": result})
    (out / TABLE).write_text(markdown(result, troll, baseline))
    plot_accuracy(result, "lr", out / "map_lr.png")
    plot_accuracy(result, "reuse", out / "map_reuse.png")
    bound = LOSSES[troll].bound if troll in TROLL_LOSSES else None
    plot_kl(result, out / "map_kl.png", bound)
    plot_kl_share(result, out / "map_kl_share.png")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python experiments/stability_map.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the folder holding the map's studies (make map's studies/map-*)")
    parser.add_argument("--out", type=Path, default=None, help="where to write map.md and the PNGs (default: folder)")
    parser.add_argument("--troll", default="troll", help="the TROLL arm (default: troll)")
    parser.add_argument("--baseline", default="clip", help="the baseline arm (default: clip, the paper's)")
    args = parser.parse_args(argv)
    try:
        write_map(args.folder, args.out, troll=args.troll, baseline=args.baseline)
    except UsageError as err:
        print(f"stability_map: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {Path(args.out or args.folder) / TABLE} and map_*.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
