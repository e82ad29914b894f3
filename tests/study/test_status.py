"""A study cell's state, progress and run time read from its folder (troll.study.status), and the time left, on
cells built by hand: one of each state, the estimate worked by hand."""

from __future__ import annotations

import json

import pytest

from troll.study import lease, status
from troll.study.cell import STATUS_LINE
from troll.study.grid import Cell


def make_cell(root, arm, seed, *, rows=(), checkpoint=False, summary=None, log=None) -> Cell:
    cell = Cell(None, arm, seed, root / arm / f"seed{seed}")
    if rows or checkpoint or summary is not None:
        cell.folder.mkdir(parents=True)
        (cell.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if checkpoint:
        (cell.folder / "checkpoint-2.pt").write_bytes(b"")
    if summary is not None:
        (cell.folder / "summary.json").write_text(json.dumps(summary))
    if log is not None:
        cell.log.parent.mkdir(parents=True, exist_ok=True)
        cell.log.write_text(f"$ troll tce train ...\n{STATUS_LINE}{log} (attempt 7 on host)\n")
    return cell


def rows(*steps, seconds=10.0, evals=()):
    """Metrics rows at the given env steps, each iteration taking ``seconds``; an evaluation on the rows in
    ``evals``."""
    return [{"env_steps": s, "time/iteration": seconds, **({"eval/return": -s} if s in evals else {})} for s in steps]


def check(cell, budget=1000):
    return status.cell_status(cell, can_resume=lambda c: (c.folder / "checkpoint-2.pt").is_file(), x_key="env_steps",
                              budget=budget, eval_key="eval/return")  # fmt: skip


def test_each_state_and_its_progress(tmp_path):
    finished = make_cell(tmp_path, "tce", 0, rows=rows(500, 1000, evals=(1000,)), summary={"seconds": 7200.0})
    stopped = make_cell(tmp_path, "tce", 1, rows=rows(200, 400, 600, evals=(400,)), checkpoint=True,
                        log="stopped (SIGTERM)")  # fmt: skip
    failed = make_cell(tmp_path, "bbrl", 0, rows=rows(100), checkpoint=True, log="failed (exit 1)")
    unstarted = make_cell(tmp_path, "bbrl", 1, rows=rows(100, 200))  # no checkpoint: it starts again
    never = make_cell(tmp_path, "bbrl", 2)

    s = check(finished)
    assert (s.state, s.done, s.seconds, s.evaluation) == ("finished", 1000, 7200.0, rows(1000, evals=(1000,))[0])
    s = check(stopped)  # the run time of its three rows; its last evaluation was at 400
    assert (s.state, s.done, s.seconds, s.evaluation["env_steps"]) == ("stopped", 600, 30.0, 400)
    s = check(failed)
    assert (s.state, s.detail, s.done) == ("failed", "failed (exit 1)", 100)
    assert (check(unstarted).state, check(unstarted).done, check(unstarted).seconds) == ("not started", 0, 0)
    assert (check(never).state, check(never).evaluation) == ("not started", {})

    # an attempt that holds the lease and lives (this process) makes the stopped cell a running one
    held = lease.Lease(stopped.folder)
    held.acquire()
    try:
        assert check(stopped).state == "running"
    finally:
        held.release()
    assert check(stopped).state == "stopped"
    # a finished cell without seconds in its summary keeps its rows' time
    (finished.folder / "summary.json").write_text("{}")
    assert check(finished).seconds == 20.0


def test_the_time_left_worked_by_hand(tmp_path):
    # tce/seed1 ran 600 of 1000 steps in 30 s (0.05 s a step): 400 left, 20 s; bbrl/seed0 100 in 10 s (0.1 s a
    # step): 900 left, 90 s; bbrl/seed1 has no rows: its arm's mean rate, 0.1 s, times 1000: 100 s. Total 210 s.
    cells = [make_cell(tmp_path, "tce", 0, rows=rows(500, 1000), summary={"seconds": 99.0}),
             make_cell(tmp_path, "tce", 1, rows=rows(200, 400, 600), checkpoint=True),
             make_cell(tmp_path, "bbrl", 0, rows=rows(100), checkpoint=True),
             make_cell(tmp_path, "bbrl", 1)]  # fmt: skip
    found = [check(c) for c in cells]
    assert status.seconds_left(found) == pytest.approx(210.0)
    assert status.counts(found) == "1 finished, 2 stopped, 1 not started"
    # an arm with no cell that has run: no estimate
    found.append(check(make_cell(tmp_path, "ppo", 0)))
    assert status.seconds_left(found) is None
    assert status.seconds_left([check(cells[0])]) == 0.0
