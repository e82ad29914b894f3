"""The report of a study: per-cell numbers, aggregates over seeds, paired differences, mean curves.

Writes ``study.json`` (every cell's summary and numbers, the aggregates, the paired comparisons and the mean
curves), ``study.md`` (the tables) and ``study.png`` (the curves, :mod:`troll.study.plot`). The statistics are
those of :mod:`troll.study.stats`: mean and standard error over seeds, and for each pair of arms (a, b) of the
frontend's :class:`~troll.study.frontend.Pairing` the per-seed difference a - b with its mean and 95% t-interval.
What the numbers and curves are is the frontend's; this module only arranges them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from troll.runs.files import METRICS_FILE, SUMMARY_FILE, read_jsonl, write_json
from troll.study import stats

if TYPE_CHECKING:
    from troll.study.frontend import Frontend, Study
    from troll.study.grid import Cell

JSON_FILE = "study.json"
TABLE_FILE = "study.md"
PLOT_FILE = "study.png"


def mean_curve(runs: list[list[dict]], key: str, x_key: str = "step") -> dict:
    """{x_key, "mean", "se", "n"} lists: at each x logged by any run, the mean and standard error of ``key`` over
    the runs that logged it there."""
    by_x: dict = {}
    for rows in runs:
        for r in rows:
            if r.get(key) is not None and x_key in r:
                by_x.setdefault(r[x_key], []).append(r[key])
    xs = sorted(by_x)
    return {
        x_key: xs,
        "mean": [stats.mean(by_x[x]) for x in xs],
        "se": [stats.std_error(by_x[x]) for x in xs],
        "n": [len(by_x[x]) for x in xs],
    }


def aggregate(frontend: Frontend, cells: list[dict], values: list, arms: list[str]) -> list[dict]:
    """Per (sweep value, arm): mean, standard error and count over seeds of every number of ``frontend.table``."""
    out = []
    for value in values:
        for arm in arms:
            group = [c for c in cells if c["value"] == value and c[frontend.arm] == arm and c["metrics"]]
            entry = {"value": value, frontend.arm: arm, "seeds": [c["seed"] for c in group]}
            entry.update({n.key: stats.summarize([c["metrics"][n.key] for c in group]) for n in frontend.table})
            out.append(entry)
    return out


def paired_comparisons(frontend: Frontend, cells: list[dict], values: list, arms: list[str]) -> list[dict]:
    """Per sweep value, pair (a, b) and paired number: the per-seed differences a - b and their statistics."""
    a_key, b_key = frontend.pairing.keys
    out = []
    for value in values:
        for a, b in frontend.pairing.pairs(arms):
            for number in frontend.paired:
                diffs = stats.paired(_by_seed(frontend, cells, value, a, number.key),
                                     _by_seed(frontend, cells, value, b, number.key))  # fmt: skip
                out.append({"value": value, a_key: a, b_key: b, "metric": number.key, **diffs})
    return out


def _by_seed(frontend: Frontend, cells: list[dict], value, arm: str, key: str) -> dict:
    picked = [c for c in cells if c["value"] == value and c[frontend.arm] == arm and c["metrics"]]
    return {c["seed"]: c["metrics"].get(key) for c in picked}


def _read_summary(cell: Cell) -> dict | None:
    path = cell.folder / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def collect(study: Study, status: dict[str, str]) -> dict:
    """The content of study.json."""
    frontend, grid = study.frontend, study.grid
    rows_of, entries = {}, []
    for cell in study.cells:
        summary = _read_summary(cell)
        rows = read_jsonl(cell.folder / METRICS_FILE) if summary else []
        rows_of[cell.label] = rows
        entries.append(
            {"value": cell.value, frontend.arm: cell.arm, "seed": cell.seed, "folder": cell.label}
            | {"status": status.get(cell.label, "not run")}
            | {"metrics": frontend.numbers(cell, summary, rows) if summary else None, "summary": summary}
        )
    curves = []
    for value in grid.values:
        for arm in grid.arms:
            group = [c for c in study.cells if c.value == value and c.arm == arm and rows_of[c.label]]
            for curve in frontend.curves:
                runs = [curve.rows(c, rows_of[c.label]) if curve.rows else rows_of[c.label] for c in group]
                points = mean_curve(runs, curve.key, frontend.x_key)
                curves.append({"value": value, frontend.arm: arm, "key": curve.key, **points})
    return {
        "spec": study.spec,
        "cells": entries,
        "aggregates": aggregate(frontend, entries, grid.values, grid.arms),
        "paired": paired_comparisons(frontend, entries, grid.values, grid.arms),
        "curves": curves,
    }


def write(study: Study, status: dict[str, str], *, plot: bool = True) -> dict:
    """Write study.json, study.md and (``plot``) study.png into the study folder; returns the study.json content."""
    data = collect(study, status)
    write_json(study.out / JSON_FILE, data)
    text = markdown(data, study)
    tmp = study.out / f".{TABLE_FILE}.tmp"
    tmp.write_text(text)
    tmp.replace(study.out / TABLE_FILE)
    if plot:
        from troll.study.plot import plot_study

        title = study.frontend.title(study.grid, study.cells)
        done = sum(cell["metrics"] is not None for cell in data["cells"])  # as study.md's "without a result"
        if done < len(data["cells"]):  # the curves are over the finished cells, not the whole grid
            title += f", {done} of {len(data['cells'])} cells finished"
        plot_study(data, study.out / PLOT_FILE, study.frontend, study.grid, title=title)
    return data


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _pm(entry: dict) -> str:
    if entry["mean"] is None:
        return "-"
    return _fmt(entry["mean"]) + ("" if entry["se"] is None else f" ± {_fmt(entry['se'])}")


def markdown(data: dict, study: Study) -> str:
    """The tables of study.md: aggregates per (sweep value, arm), then the paired comparisons, then the note."""
    frontend, key = study.frontend, study.grid.sweep_flag
    lead = f"| {key} " if key else ""
    head = lead + f"| {frontend.arm} | seeds | " + " | ".join(n.label for n in frontend.table) + " |\n"
    head += "|---" * (len(frontend.table) + 2 + bool(key)) + "|\n"
    lines = []
    for a in data["aggregates"]:
        first = f"| {a['value']} " if key else ""
        cols = [a[frontend.arm], str(len(a["seeds"]))] + [_pm(a[n.key]) for n in frontend.table]
        lines.append(first + "| " + " | ".join(cols) + " |\n")
    text = f"## Per {frontend.arm}: mean ± standard error over seeds\n\n" + head + "".join(lines) + "\n"
    text += _paired_table(data["paired"], key, frontend)
    failed = [c for c in data["cells"] if c["metrics"] is None]
    if failed:
        text += "\nCells without a result: " + ", ".join(f"{c['folder']} ({c['status']})" for c in failed) + "\n"
    return text + (frontend.note(study.grid, study.cells) if study.cells else "")


def _paired_table(paired: list[dict], key: str | None, frontend: Frontend) -> str:
    pairing = frontend.pairing
    if not paired:
        return pairing.none
    lead = f"| {key} " if key else ""
    head = lead + f"| metric | {pairing.column} | per seed | mean | 95% interval | n |\n"
    head += "|---" * (6 + bool(key)) + "|\n"
    labels = {n.key: n.label for n in frontend.paired}
    a_key, b_key = pairing.keys
    lines = []
    for p in paired:
        per_seed = ", ".join(f"s{k}: {v:+.3f}" for k, v in p["diffs"].items()) or "-"
        ci = "-" if p["ci95"] is None else f"[{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"
        first = f"| {p['value']} " if key else ""
        mean = "-" if p["mean"] is None else f"{p['mean']:+.3f}"
        cols = [labels[p["metric"]], f"{p[a_key]} - {p[b_key]}", per_seed, mean, ci, str(p["n"])]
        lines.append(first + "| " + " | ".join(cols) + " |\n")
    return f"## Paired: {pairing.heading}, same seed\n\n" + head + "".join(lines)
