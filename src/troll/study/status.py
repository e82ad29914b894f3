"""Where a study stands, read from its folder without writing to it (``troll tce status``).

Each cell of the grid is, checked in this order:

- ``finished``: its run wrote summary.json (a run's last file);
- ``running``: an attempt holds the cell's lease and looks alive (:func:`troll.study.lease.probably_live`: its
  process runs on this host, or its heartbeat moved within the last minute, for a cell on another machine);
- ``failed``: its last attempt ended with a failure (the status line of its log, :func:`troll.study.cell.last_status`);
- ``stopped``: it holds a checkpoint, which the study's ``--resume`` continues from;
- ``not started``: nothing to continue from (a folder without a checkpoint starts again from the beginning).

How far a cell has run is the x-axis value (environment steps) of its last metrics row against its budget, and for
how long, the sum of its rows' ``time/iteration``: the run time of the iterations it keeps (a resumed run cuts its
metrics back to its checkpoint, and the time of the iterations it redoes counts once); a finished cell's summary
says it (``seconds``; a cell restored from an archive keeps no timings in its rows). What is left is estimated
per cell at the rate it has run so far, or, for a cell with no rows yet, at the mean rate of its arm's cells with
rows: the hours one cell at a time would take, which ``--jobs`` cells at a time divide.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from troll.runs.files import METRICS_FILE, SUMMARY_FILE, read_jsonl
from troll.study import lease
from troll.study.cell import last_status
from troll.study.grid import Cell

STATES = ("finished", "running", "failed", "stopped", "not started")
TIME_KEY = "time/iteration"  # seconds of one row's iteration, in every metrics row of an episodic run


@dataclass(frozen=True)
class CellStatus:
    """A cell's state (one of :data:`STATES`), the x-axis value of its last metrics row (``done``, 0 without rows)
    against its ``budget``, its run time in seconds, its last row holding an evaluation ({} when none) and, for a
    failed cell, its log's status."""

    cell: Cell
    state: str
    done: float
    budget: float
    seconds: float
    evaluation: dict
    detail: str = ""


def cell_status(cell: Cell, *, can_resume: Callable[[Cell], bool], x_key: str, budget: float,
                eval_key: str) -> CellStatus:  # fmt: skip
    """The status of ``cell`` (module docstring); ``eval_key`` marks the rows that hold an evaluation."""
    try:
        rows = read_jsonl(cell.folder / METRICS_FILE)
    except ValueError:  # a damaged metrics file: the cell's own run reports it when resumed
        rows = []
    done = float(rows[-1].get(x_key) or 0) if rows else 0.0
    seconds = float(sum(row.get(TIME_KEY) or 0 for row in rows))
    evaluation = next((row for row in reversed(rows) if row.get(eval_key) is not None), {})
    status, detail = last_status(cell), ""
    if (cell.folder / SUMMARY_FILE).is_file():
        state = "finished"
        try:
            seconds = float(json.loads((cell.folder / SUMMARY_FILE).read_text()).get("seconds") or seconds)
        except (OSError, ValueError, TypeError, AttributeError):
            pass  # a damaged summary: the rows' time stands
    elif lease.probably_live(cell.folder) is not None:
        state = "running"
    elif status is not None and status.startswith("failed"):
        state, detail = "failed", status
    elif can_resume(cell):
        state = "stopped"
    else:
        state, done, seconds = "not started", 0.0, 0.0  # a folder without a checkpoint starts from the beginning
    return CellStatus(cell, state, done, float(budget), seconds, evaluation, detail)


def seconds_left(statuses: list[CellStatus]) -> float | None:
    """The run time the unfinished cells still need, one at a time (module docstring); None when a cell's rate
    cannot be estimated (its arm has no cell with rows)."""

    def rate(s: CellStatus) -> float:
        return s.seconds / s.done

    by_arm: dict[str, list[float]] = {}
    for s in statuses:
        if s.done > 0 and s.seconds > 0:
            by_arm.setdefault(s.cell.arm, []).append(rate(s))
    total = 0.0
    for s in statuses:
        if s.state == "finished":
            continue
        if s.done > 0 and s.seconds > 0:
            per_step = rate(s)
        elif s.cell.arm in by_arm:
            per_step = statistics.fmean(by_arm[s.cell.arm])
        else:
            return None
        total += max(s.budget - s.done, 0.0) * per_step
    return total


def counts(statuses: list[CellStatus]) -> str:
    """``3 finished, 2 running, 1 not started``: the states present, in :data:`STATES`' order."""
    found = [(sum(s.state == state for s in statuses), state) for state in STATES]
    return ", ".join(f"{n} {state}" for n, state in found if n)
