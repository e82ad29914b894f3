"""Where a study stands, read from its folder without writing to it (``troll tce status``).

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

How far a cell has run is the x-axis value (environment steps) of its last metrics row, and for how long, the sum of
its rows' ``time_key`` (an episodic run's ``time/iteration``): the run time of the iterations it keeps. A stopped or
failed cell counts the rows its resume keeps (``kept``: those up to its newest checkpoint; the rest are run again), a
finished cell its summary's ``seconds`` (a cell restored from an archive keeps no timings in its rows). A metrics
line that is not a JSON object with a number on the x-axis is skipped and named in the cell's note (a torn last line,
one being written, is not).

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

from troll.runs.files import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE
from troll.runs.folder import busy
from troll.runs.numbers import is_real
from troll.study import lease
from troll.study.cell import last_status
from troll.study.grid import Cell

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


def read_rows(path: Path, x_key: str) -> tuple[list[dict], str]:
    """The metrics rows of ``path`` that are JSON objects with a number at ``x_key``, and a note naming the first
    line that is not (empty when all are; a torn last line is not counted). OSError when the file cannot be read."""
    try:
        text = path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return [], ""
    lines = text.split("\n")
    rows, bad = [], []
    for index, line in enumerate(lines[:-1], start=1):  # the part after the last newline is a line being written
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


def _summary_seconds(path: Path) -> float | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return number(data.get("seconds")) if isinstance(data, dict) else None


def _reached(budget: float, rows: list[dict], x_key: str) -> float:
    """``budget`` rounded up to the run's whole iterations (x per iteration from its last row), as it will end."""
    if not rows or number(rows[-1].get("iteration")) in (None, 0.0):
        return budget
    per = number(rows[-1][x_key]) / number(rows[-1]["iteration"])
    return math.ceil(budget / per - 1e-9) * per if per > 0 else budget


def cell_status(cell: Cell, *, can_resume: Callable[[Cell], bool], x_key: str, time_key: str, budget: float,
                eval_key: str, recorded: str | None = None,
                kept: Callable[[Cell, list[dict]], list[dict]] | None = None) -> CellStatus:  # fmt: skip
    """The status of ``cell`` (module docstring). ``time_key`` holds a row's seconds, ``eval_key`` marks the rows
    that hold an evaluation; ``recorded`` is the status the study recorded for it; ``kept(cell, rows)``, the rows a
    resume keeps."""
    try:
        rows, note = read_rows(cell.folder / METRICS_FILE, x_key)
        budget = _reached(float(budget), rows, x_key)
        status = last_status(cell) or recorded
        seconds = None
        if (cell.folder / SUMMARY_FILE).is_file():
            state, seconds = "finished", _summary_seconds(cell.folder / SUMMARY_FILE)
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
