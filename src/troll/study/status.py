"""Where a study stands, read from its folder without writing to it (``troll status`` and ``troll tce status``, whose
modules give what their studies differ in: the budget, the evaluation, the rows a resume keeps).

Each cell of the grid is, checked in this order:

- ``finished``: its run wrote summary.json (a run's last file);
- ``running``: an attempt holds the cell's lease and looks alive (:func:`troll.study.lease.probably_live`: its
  process runs on this host, or its heartbeat moved within the last minute, for a cell on another machine), or a
  process of this host holds its folder (:func:`troll.runs.folder.busy`: a run resumed by hand);
- ``failed``: its last attempt ended with a failure: the status line of its log (:func:`troll.study.cell.last_status`,
  which a cell on a cluster writes) or else the status the study recorded in study.json (a study run here);
- ``stopped``: it holds a checkpoint, which the study's ``--resume`` continues from;
- ``not started``: nothing to continue from (a folder without a checkpoint starts again from the beginning);
- ``unreadable``: its files cannot be read (permissions).

How far a cell has run is the x-axis value (environment or optimiser steps) of its last metrics row, and for how
long, the sum of its rows' ``time_key`` (an episodic run's ``time/iteration``, a GRPO run's ``step_time``): the run
time of the iterations it keeps. A stopped or failed cell counts the rows its resume keeps (``kept``: those up to its
newest checkpoint; the rest are run again); a finished cell may give its summary's seconds instead (an episodic cell
restored from an archive keeps no timings in its rows). A metrics line that is not a JSON object with a number on the
x-axis is skipped and named in the cell's note (a torn last line, one being written, is not).

The budget a cell will reach is its own budget rounded up to whole iterations (a run ends its last iteration), the
env steps of an iteration read from its rows. What is left is estimated per cell at the rate it has run so far, or,
for a cell with no rows yet, at the mean rate of the cells with rows of its arm and swept value: the run time one
cell at a time would take (``--jobs`` cells at a time divide it), without the start of each process.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from troll.runs.files import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, UsageError
from troll.runs.folder import busy
from troll.runs.numbers import is_real
from troll.study import lease
from troll.study.cell import last_status
from troll.study.grid import Cell, Grid
from troll.study.report import JSON_FILE as STUDY_JSON_FILE

STATES = ("finished", "running", "failed", "stopped", "not started", "unreadable")


@dataclass(frozen=True)
class CellStatus:
    """A cell's state (one of :data:`STATES`), the x-axis value of its last metrics row (``done``, 0 without rows)
    against the ``budget`` it will reach, its run time in seconds, its last row holding an evaluation ({} when none)
    and a note (why it failed, a damaged metrics line)."""

    cell: Cell
    state: str
    done: float
    budget: float
    seconds: float
    evaluation: dict
    note: str = ""


def number(value) -> float | None:
    """``value`` as a float when it is a finite real number, None for anything else (a string, a bool, NaN)."""
    return float(value) if is_real(value) else None


def read_rows(path: Path, x_key: str, *, lines: int | None = None) -> tuple[list[dict], str]:
    """The metrics rows of ``path`` that are JSON objects with a number at ``x_key``, and a note naming the first
    line that is not (empty when all are; a torn last line is not counted). ``lines``: at most the first lines (those
    a checkpoint recorded; a resume keeps no more, and no torn one). OSError when the file cannot be read."""
    try:
        text = path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return [], ""
    whole = text.split("\n")[:-1][:lines]  # the part after the last newline is a line being written
    rows, bad = [], []
    for index, line in enumerate(whole, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and number(row.get(x_key)) is not None:
            rows.append(row)
        else:
            bad.append(index)
    note = f"{path.name}: {len(bad)} damaged line(s) skipped, the first line {bad[0]}" if bad else ""
    return rows, note


def _summary_seconds(path: Path, key: str) -> float | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return number(data.get(key)) if isinstance(data, dict) else None


def _reached(budget: float, rows: list[dict], x_key: str) -> float:
    """``budget`` rounded up to the run's whole iterations (x per iteration from its last row), as it will end."""
    if not rows or number(rows[-1].get("iteration")) in (None, 0.0):
        return budget
    per = number(rows[-1][x_key]) / number(rows[-1]["iteration"])
    return math.ceil(budget / per - 1e-9) * per if per > 0 else budget


def cell_status(cell: Cell, *, can_resume: Callable[[Cell], bool], x_key: str, time_key: str, budget: float,
                eval_key: str, recorded: str | None = None, summary_seconds: str | None = None,
                kept: Callable[[Cell, list[dict]], list[dict]] | None = None) -> CellStatus:  # fmt: skip
    """The status of ``cell`` (module docstring). ``time_key`` holds a row's seconds, ``eval_key`` marks the rows
    that hold an evaluation; ``recorded`` is the status the study recorded for it; ``summary_seconds``, the key of
    summary.json that gives a finished cell's run time (None: its rows'); ``kept(cell, rows)``, the rows a resume
    keeps."""
    try:
        rows, note = read_rows(cell.folder / METRICS_FILE, x_key)
        budget = _reached(float(budget), rows, x_key)
        status = last_status(cell) or recorded
        seconds = None
        if (cell.folder / SUMMARY_FILE).is_file():
            state = "finished"
            seconds = _summary_seconds(cell.folder / SUMMARY_FILE, summary_seconds) if summary_seconds else None
        elif lease.probably_live(cell.folder) is not None or busy(cell.folder):
            state = "running"
        elif status is not None and status.startswith("failed"):
            state, note = "failed", "; ".join(filter(None, [status.removeprefix("failed").strip(" ()"), note]))
        elif can_resume(cell):
            state = "stopped"
        else:
            state, rows = "not started", []
        if state in ("failed", "stopped") and kept is not None:
            rows = kept(cell, rows)
    except OSError as err:
        reason = f"{err.strerror or err}: {err.filename}" if err.filename else str(err)
        return CellStatus(cell, "unreadable", 0.0, float(budget), 0.0, {}, reason)
    done = number(rows[-1][x_key]) if rows else 0.0
    if seconds is None:
        seconds = sum(number(row.get(time_key)) or 0.0 for row in rows)
    evaluation = next((row for row in reversed(rows) if row.get(eval_key) is not None), {})
    return CellStatus(cell, state, done, budget, seconds, evaluation, note)


def seconds_left(statuses: list[CellStatus]) -> tuple[float, list[str]]:
    """The run time the unfinished cells still need, one at a time (module docstring), and the arms whose rate is not
    known yet (no cell of theirs, at that swept value, has rows); their cells are not in the estimate."""
    rates: dict[tuple, list[float]] = {}
    for s in statuses:
        if s.done > 0 and s.seconds > 0:
            rates.setdefault((s.cell.value, s.cell.arm), []).append(s.seconds / s.done)
    total, unknown = 0.0, []
    for s in statuses:
        if s.state == "finished":
            continue
        if s.done > 0 and s.seconds > 0:
            per_step = s.seconds / s.done
        elif (s.cell.value, s.cell.arm) in rates:
            per_step = statistics.fmean(rates[s.cell.value, s.cell.arm])
        else:
            unknown += [s.cell.arm] if s.cell.arm not in unknown else []
            continue
        total += max(s.budget - s.done, 0.0) * per_step
    return total, unknown


def counts(statuses: list[CellStatus]) -> str:
    """``3 finished, 2 running, 1 not started``: the states present, in :data:`STATES`' order."""
    found = [(sum(s.state == state for s in statuses), state) for state in STATES]
    return ", ".join(f"{n} {state}" for n, state in found if n)


def find_studies(folder: Path, command: str) -> list[Path]:
    """The folders at or below ``folder`` whose config.json names ``command`` (studies written before run folders
    had a manifest included), sorted; a config.json that is not JSON counts when its text names the command, so
    that the study is reported as damaged rather than missed."""
    found = []
    for config in sorted(Path(folder).rglob(CONFIG_FILE)):
        try:
            text = config.read_text()
        except OSError:
            continue
        try:
            head = json.loads(text)
        except ValueError:
            head = {"command": command} if f'"command": "{command}"' in text else None
        if isinstance(head, dict) and head.get("command") == command:
            found.append(config.parent)
    return found


def saved_number(cell: Cell, key: str, field: str) -> float | None:
    """``config.json[key][field]`` of the cell's own run folder (the budget it asks for), or None when the file, the
    entry or a number there is missing."""
    try:
        value = json.loads((cell.folder / CONFIG_FILE).read_text())[key][field]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return number(value)


def recorded(out: Path, arm: str) -> dict[tuple, str]:
    """The status of each cell as the study last recorded it in study.json: (value, arm, seed) -> status; ``arm``
    is the name of the arm's key (``algo``, ``loss``)."""
    try:
        cells = json.loads((out / STUDY_JSON_FILE).read_text())["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    found = {}
    for c in cells if isinstance(cells, list) else []:
        try:
            found[c["value"], c[arm], c["seed"]] = str(c["status"])
        except (KeyError, TypeError):  # a damaged entry: that cell's status is unknown, the others' are not
            continue
    return found


def saved_spec(out: Path, from_json: Callable[[dict], Any]) -> Any:
    """The spec of a study folder's config.json, read by ``from_json``; ValueError saying what is wrong with it (a
    reader that only reports has no fix to offer, unlike ``--resume``)."""
    try:
        head = json.loads((out / CONFIG_FILE).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{out / CONFIG_FILE} is not JSON ({err})") from None
    if not isinstance(head, dict) or not isinstance(head.get("spec"), dict):
        raise ValueError(f"{out / CONFIG_FILE} holds no study spec")
    try:
        return from_json(head["spec"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"{out / CONFIG_FILE} holds a damaged study spec ({type(err).__name__}: {err})") from None


def duration(seconds: float) -> str:
    """2.5 h, 12.0 min, or 40 s."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def formatter(budgets: list[float]) -> Callable[[float], str]:
    """Steps as 10.00M when a budget is a million or more, else as 1,600."""
    if max(budgets, default=0) >= 1e6:
        return lambda steps: f"{steps / 1e6:.2f}M"
    return lambda steps: f"{steps:,.0f}"


def study_report(out: Path, grid: Grid, cells: list[Cell], *, what: str, unit: str, budget: Callable[[Cell], float],
                 evaluation: Callable[[dict, Callable], str], arm: str, **keys) -> str:  # fmt: skip
    """A study's status: a heading (``what`` it runs, its grid, each cell's ``budget`` in ``unit``: env steps,
    optimiser steps), a line per cell (its state, steps of its budget, run time, and ``evaluation(row, steps)``, the
    headline of its last evaluation row), then the counts, the steps run and the time left. ``arm`` is the key of a
    cell's arm in study.json; ``keys`` go to :func:`cell_status`."""
    statuses = recorded(out, arm)
    asked = [budget(cell) for cell in cells]  # each cell's config.json, read once
    found = [cell_status(cell, budget=b, recorded=statuses.get((cell.value, cell.arm, cell.seed)), **keys)
             for cell, b in zip(cells, asked)]  # fmt: skip
    if not found:
        raise ValueError(f"its spec plans no cell (no {arm} or no seed)")
    steps = formatter([s.budget for s in found])
    sweep = f", {grid.sweep_flag}={','.join(map(str, grid.sweep_values))}" if grid.sweep_key else ""
    lines = [f"{out}: {what}, {','.join(grid.arms)} x seeds {','.join(map(str, grid.seeds))}{sweep}, "
             f"{' or '.join(steps(b) for b in sorted(set(asked)))} {unit} a cell"]  # fmt: skip
    width = max(len(s.cell.folder.relative_to(out).as_posix()) for s in found)
    for s in found:
        line = f"  {s.cell.folder.relative_to(out).as_posix():<{width}}  {s.state:<11}"
        if s.state not in ("not started", "unreadable"):
            line += f"  {steps(s.done):>7} of {steps(s.budget)}  {duration(s.seconds):>8}"
            line += f"  {evaluation(s.evaluation, steps)}" if s.evaluation else ""
        lines.append(line.rstrip() + (f" ({s.note})" if s.note else ""))
    done = sum(s.budget if s.state == "finished" else min(s.done, s.budget) for s in found)
    total = sum(s.budget for s in found)
    unfinished = sum(s.state != "finished" for s in found)
    share = min(int(100 * done / total), 99) if unfinished and total > 0 else 100  # 100 % only when all finished
    lines.append(f"  {counts(found)}; {steps(done)} of {steps(total)} {unit} ({share} %)")
    left, unknown = seconds_left(found)
    if unfinished:
        parts = (
            [f"about {duration(left)} of run time, one cell at a time, at each cell's rate so far"] if left > 0 else []
        )
        parts += [f"the cells of {', '.join(unknown)}, which have no rate yet"] if unknown else []
        # every step run, yet a cell unfinished: killed after its last checkpoint, before its summary
        parts = parts or [f"the end of {unfinished} cell(s) whose steps have all run (their last evaluation)"]
        lines.append(f"  left: {', and '.join(parts)}")
    return "\n".join(lines)


def status_report(folder: Path, command: str, name: str, study_text: Callable[[Path], str]) -> tuple[str, bool]:
    """The status of every study of ``command`` at or below ``folder`` (``study_text(out)`` gives one; ``name``: the
    command as typed, ``troll study``), and whether each could be read (a study that cannot gets a line saying why).
    UsageError when ``folder`` holds none."""
    folder = Path(folder)
    if not folder.exists():
        raise UsageError(f"{folder} does not exist; give a study's --out or a folder holding studies.")
    found = find_studies(folder, command)
    if not found:
        raise UsageError(f"{folder} holds no '{name}' (no config.json of one at or below it): give a study's --out, "
                         "or a folder above it.")  # fmt: skip
    texts, ok = [], True
    for out in found:
        try:
            texts.append(study_text(out))
        except Exception as err:  # noqa: BLE001 -- one damaged study must not hide the others
            texts.append(f"{out}: cannot be read as a study: {err or type(err).__name__}")
            ok = False
    return "\n\n".join(texts), ok


def show(text: str, ok: bool) -> int:
    """Print a status report; the exit status: 0, or 1 when a study could not be read. A reader that went away
    (``| head``) ends it quietly."""
    import os
    import sys

    try:
        print(text, flush=True)
    except BrokenPipeError:  # nothing more to say (and no second error when Python flushes stdout at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0 if ok else 1
