"""The results of a ``troll study``: per-cell numbers, aggregates over seeds, paired differences, curves.

Writes ``study.json`` (every cell's summary and numbers, the aggregates, the paired comparisons and the mean
curves), ``study.md`` (the tables) and ``study.png`` (the curves). The statistics are those of
:mod:`troll.train.stats`: mean and standard error over seeds, and for the paired comparison the per-seed
difference TROLL - baseline with its mean and 95% t-interval.
"""

from __future__ import annotations

import json
from pathlib import Path

from troll.train import stats
from troll.train.options import TROLL_LOSSES

# Per-cell numbers: (key, label in study.md).
CELL_METRICS = [
    ("acc_before", "held-out acc. before"),
    ("acc_after", "held-out acc. after"),
    ("reward_last_quarter", "reward, last quarter"),
    ("entropy_final", "entropy, final"),
    ("kl_after_max", "max KL after projection"),
    ("clipped_share", "clipped share"),
]
PAIRED_METRICS = [("acc_after", "held-out acc. after"), ("reward_last_quarter", "reward, last quarter")]
# Curves: (metrics.jsonl key, panel title, off-policy steps only).
CURVES = [
    ("heldout/accuracy", "held-out greedy accuracy", False),
    ("reward", "rollout reward", False),
    ("entropy", "entropy (nats / token)", False),
    ("troll/kl_after/max", "max KL after projection (TROLL)", True),
    ("clip_ratio/region_mean", "clipped share (clip losses)", True),
]


def cell_metrics(summary: dict, rows: list[dict], steps_per_rollout: int) -> dict:
    """A cell's numbers: held-out accuracy before/after, mean reward of the last quarter of the logged rollouts,
    the last logged entropy, and over the off-policy steps the largest KL after projection (TROLL losses) or the
    mean clipped share (clip losses); None where not logged."""
    from troll.train.plots import off_policy_rows

    off = off_policy_rows(rows, steps_per_rollout)
    entropy = [r["entropy"] for r in rows if r.get("entropy") is not None]
    kl = [r["troll/kl_after/max"] for r in off if r.get("troll/kl_after/max") is not None]
    clipped = [r["clip_ratio/region_mean"] for r in off if r.get("clip_ratio/region_mean") is not None]
    return {
        "acc_before": summary.get("heldout_accuracy_before"),
        "acc_after": summary.get("heldout_accuracy_after"),
        "reward_last_quarter": summary.get("reward_last_quarter_mean"),
        "entropy_final": entropy[-1] if entropy else None,
        "kl_after_max": max(kl) if kl else None,
        "clipped_share": stats.mean(clipped),
    }


def mean_curve(runs: list[list[dict]], key: str) -> dict:
    """{"step", "mean", "se", "n"} lists: at each step logged by any run, the mean and standard error of ``key``
    over the runs that logged it there."""
    by_step: dict[int, list[float]] = {}
    for rows in runs:
        for r in rows:
            if r.get(key) is not None and "step" in r:
                by_step.setdefault(r["step"], []).append(r[key])
    steps = sorted(by_step)
    return {
        "step": steps,
        "mean": [stats.mean(by_step[s]) for s in steps],
        "se": [stats.std_error(by_step[s]) for s in steps],
        "n": [len(by_step[s]) for s in steps],
    }


def aggregate(cells: list[dict], values: list, losses: list[str]) -> list[dict]:
    """Per (sweep value, loss): mean, standard error and count over seeds of every cell metric."""
    out = []
    for value in values:
        for loss in losses:
            group = [c for c in cells if c["value"] == value and c["loss"] == loss and c["metrics"]]
            entry = {"value": value, "loss": loss, "seeds": [c["seed"] for c in group]}
            entry.update({k: stats.summarize([c["metrics"][k] for c in group]) for k, _ in CELL_METRICS})
            out.append(entry)
    return out


def paired_comparisons(cells: list[dict], values: list, losses: list[str]) -> list[dict]:
    """Per sweep value, TROLL loss (troll, troll_seq) and baseline: per-seed differences TROLL - baseline."""
    out = []
    trolls = [loss for loss in losses if loss in TROLL_LOSSES]
    baselines = [loss for loss in losses if loss not in TROLL_LOSSES]
    for value in values:
        for troll in trolls:
            for base in baselines:
                for key, _ in PAIRED_METRICS:
                    a = _by_seed(cells, value, troll, key)
                    b = _by_seed(cells, value, base, key)
                    out.append({"value": value, "troll": troll, "baseline": base, "metric": key, **stats.paired(a, b)})
    return out


def _by_seed(cells: list[dict], value, loss: str, key: str) -> dict:
    return {
        c["seed"]: c["metrics"].get(key) for c in cells if c["value"] == value and c["loss"] == loss and c["metrics"]
    }


def collect(spec, cells, status: dict[str, str]) -> dict:
    """The content of study.json."""
    from troll.train.run import SUMMARY_FILE, read_metrics

    rows_of, out_cells = {}, []
    for cell in cells:
        path = cell.folder / SUMMARY_FILE
        summary = json.loads(path.read_text()) if path.is_file() else None
        rows = read_metrics(cell.folder) if summary else []
        rows_of[cell.label] = rows
        metrics = cell_metrics(summary, rows, cell.opts.steps_per_rollout) if summary else None
        state = status.get(cell.label, "not run")
        out_cells.append(
            {"value": cell.value, "loss": cell.loss, "seed": cell.seed, "folder": cell.label, "status": state}
            | {"metrics": metrics, "summary": summary}
        )
    values = list(spec.sweep_values) if spec.sweep_key else [None]
    curves = []
    for value in values:
        for loss in spec.losses:
            group = [c for c in cells if c.value == value and c.loss == loss]
            spr = group[0].opts.steps_per_rollout if group else 1
            runs = [rows_of[c.label] for c in group if rows_of[c.label]]
            for key, _, off in CURVES:
                from troll.train.plots import off_policy_rows

                picked = [off_policy_rows(r, spr) for r in runs] if off else runs
                curves.append({"value": value, "loss": loss, "key": key, **mean_curve(picked, key)})
    return {
        "spec": spec.to_json(),
        "cells": out_cells,
        "aggregates": aggregate(out_cells, values, spec.losses),
        "paired": paired_comparisons(out_cells, values, spec.losses),
        "curves": curves,
    }


def write(out: Path, spec, cells, status: dict[str, str], *, plot: bool = True) -> dict:
    """Write study.json, study.md and (``plot``) study.png into ``out``; returns the study.json content."""
    from troll.train import plots

    data = collect(spec, cells, status)
    (out / "study.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "study.md").write_text(markdown(data, spec, cells))
    if plot:
        plots.plot_study(data, out / "study.png", title=_title(spec, cells))
    return data


def _title(spec, cells) -> str:
    b = cells[0].opts if cells else spec.base
    seeds = f"{len(spec.seeds)} seed{'s' if len(spec.seeds) > 1 else ''}"
    return f"{b.task}, {b.model}, {seeds}, {b.steps} steps"


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _pm(entry: dict) -> str:
    if entry["mean"] is None:
        return "-"
    return _fmt(entry["mean"]) + ("" if entry["se"] is None else f" ± {_fmt(entry['se'])}")


def markdown(data: dict, spec, cells) -> str:
    """The tables of study.md: aggregates per (sweep value, loss), then the paired comparisons."""
    key = spec.sweep_key.replace("_", "-") if spec.sweep_key else None
    lead = f"| {key} " if key else ""
    head = lead + "| loss | seeds | " + " | ".join(label for _, label in CELL_METRICS) + " |\n"
    head += "|---" * (len(CELL_METRICS) + 2 + bool(key)) + "|\n"
    lines = []
    for a in data["aggregates"]:
        first = f"| {a['value']} " if key else ""
        cols = [a["loss"], str(len(a["seeds"]))] + [_pm(a[k]) for k, _ in CELL_METRICS]
        lines.append(first + "| " + " | ".join(cols) + " |\n")
    text = "## Per loss: mean ± standard error over seeds\n\n" + head + "".join(lines) + "\n"
    text += _paired_table(data["paired"], key)
    failed = [c for c in data["cells"] if c["metrics"] is None]
    if failed:
        text += "\nCells without a result: " + ", ".join(f"{c['folder']} ({c['status']})" for c in failed) + "\n"
    return text + _note(spec, cells)


def _paired_table(paired: list[dict], key: str | None) -> str:
    if not paired:
        return "No paired comparison: the study needs a TROLL loss (troll, troll_seq) and a baseline.\n"
    lead = f"| {key} " if key else ""
    head = lead + "| metric | TROLL - baseline | per seed | mean | 95% interval | n |\n"
    head += "|---" * (6 + bool(key)) + "|\n"
    labels = dict(PAIRED_METRICS)
    lines = []
    for p in paired:
        per_seed = ", ".join(f"s{k}: {v:+.3f}" for k, v in p["diffs"].items()) or "-"
        ci = "-" if p["ci95"] is None else f"[{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"
        first = f"| {p['value']} " if key else ""
        mean = "-" if p["mean"] is None else f"{p['mean']:+.3f}"
        cols = [labels[p["metric"]], f"{p['troll']} - {p['baseline']}", per_seed, mean, ci, str(p["n"])]
        lines.append(first + "| " + " | ".join(cols) + " |\n")
    return "## Paired: TROLL minus baseline, same seed\n\n" + head + "".join(lines)


def _note(spec, cells) -> str:
    if not cells:
        return ""
    r = cells[0].opts
    eps = ", ".join(sorted({f"{c.loss} {c.opts.eps:g}" for c in cells}))
    return (
        f"\nTask {r.task}, model {r.model}, seeds {', '.join(map(str, spec.seeds))}; {r.steps} optimiser steps, "
        f"rollouts of {r.prompts_per_step} prompts x {r.generations} samples in {r.steps_per_rollout} steps "
        f"(unless swept), {r.heldout} held-out items scored greedily; eps: {eps}. Standard errors use n - 1; the "
        "95% interval is mean ± t(0.975, n - 1) x standard error of the per-seed differences (seeds pair the "
        "data, the initial model and the held-out items). Max KL after projection (TROLL) and the clipped share "
        "(clip losses) are over the off-policy steps (the 2nd to last of each rollout). The reward of the last "
        "quarter is the mean over the last quarter of the logged rollout rewards; entropy is at the last logged "
        "step.\n"
    )
