"""A study cell's state, progress and run time read from its folder (troll.study.status), and the time left, on
cells built by hand: one of each state, damaged and unreadable files, the estimate worked by hand."""

from __future__ import annotations

import json
import subprocess
import sys

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
    """Metrics rows at the given env steps, iterations 1, 2, ..., each taking ``seconds``; an evaluation on the rows
    in ``evals``."""
    return [{"iteration": i, "env_steps": s, "time/iteration": seconds, **({"eval/return": -s} if s in evals else {})}
            for i, s in enumerate(steps, start=1)]  # fmt: skip


def check(cell, budget=1000, **kwargs):
    kwargs = {"summary_seconds": "seconds", **kwargs}
    return status.cell_status(cell, can_resume=lambda c: (c.folder / "checkpoint-2.pt").is_file(), x_key="env_steps",
                              budget=budget, eval_key="eval/return", time_key="time/iteration", **kwargs)  # fmt: skip


def test_each_state_and_its_progress(tmp_path):
    finished = make_cell(tmp_path, "tce", 0, rows=rows(500, 1000, evals=(1000,)), summary={"seconds": 7200.0})
    stopped = make_cell(tmp_path, "tce", 1, rows=rows(200, 400, 600, evals=(400,)), checkpoint=True,
                        log="stopped (SIGTERM)")  # fmt: skip
    failed = make_cell(tmp_path, "bbrl", 0, rows=rows(100), checkpoint=True, log="failed (exit 1)")
    unstarted = make_cell(tmp_path, "bbrl", 1, rows=rows(100, 200))  # no checkpoint: it starts again
    never = make_cell(tmp_path, "bbrl", 2)

    s = check(finished)
    assert (s.state, s.done, s.seconds, s.evaluation) == ("finished", 1000, 7200.0, rows(500, 1000, evals=(1000,))[1])
    s = check(stopped)  # the run time of its three rows; its last evaluation was at 400
    assert (s.state, s.done, s.seconds, s.evaluation["env_steps"]) == ("stopped", 600, 30.0, 400)
    s = check(failed)
    assert (s.state, s.note, s.done) == ("failed", "exit 1", 100)
    assert (check(unstarted).state, check(unstarted).done, check(unstarted).seconds) == ("not started", 0, 0)
    assert (check(never).state, check(never).evaluation) == ("not started", {})
    # a study run here records its cells' ends in study.json, not in their logs
    assert check(unstarted, recorded="failed (exit -9)").state == "failed"
    assert check(stopped, recorded="failed (exit -9)").state == "stopped"  # the log's newer line wins
    # the rows a resume keeps: after a kill, those past the newest checkpoint are run again
    s = check(stopped, kept=lambda cell, rows: rows[:2])
    assert (s.done, s.seconds, s.evaluation["env_steps"]) == (400, 20.0, 400)

    # an attempt that holds the lease and lives (this process) makes the stopped cell a running one
    held = lease.Lease(stopped.folder)
    held.acquire()
    try:
        assert check(stopped).state == "running"
    finally:
        held.release()
    assert check(stopped).state == "stopped"
    # a run resumed by hand takes no lease but holds its folder
    code = ("import sys, time; from troll.runs import folder; folder.hold(sys.argv[1]); print('held', flush=True); "
            "time.sleep(60)")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", code, str(stopped.folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert check(stopped).state == "running"
    finally:
        holder.kill()
        holder.wait()
    assert check(stopped).state == "stopped"
    # a finished cell without seconds in its summary, or a summary that is not JSON, keeps its rows' time
    (finished.folder / "summary.json").write_text("{}")
    assert check(finished).seconds == 20.0
    (finished.folder / "summary.json").write_text("{not json")
    assert (check(finished).state, check(finished).seconds) == ("finished", 20.0)
    # a study that times its cells by their rows alone (a GRPO run's step times) ignores the summary
    (finished.folder / "summary.json").write_text(json.dumps({"seconds": 7200.0}))
    assert (check(finished, summary_seconds=None).state, check(finished, summary_seconds=None).seconds) == (
        "finished", 20.0
    )  # fmt: skip


def test_damaged_lines_are_skipped_and_named_and_an_unreadable_cell_says_so(tmp_path):
    cell = make_cell(tmp_path, "tce", 0, rows=rows(100, 200), checkpoint=True)
    good = (cell.folder / "metrics.jsonl").read_text().splitlines()
    lines = [good[0], "{garbage", "3", '{"env_steps": "abc"}', good[1], '{"env_steps": 300, "time/it']  # torn last
    (cell.folder / "metrics.jsonl").write_text("\n".join(lines))
    s = check(cell)
    assert (s.state, s.done, s.seconds) == ("stopped", 200, 20.0)
    assert s.note == "metrics.jsonl: 3 damaged line(s) skipped, the first line 2"
    (cell.folder / "metrics.jsonl").unlink()
    (cell.folder / "metrics.jsonl").mkdir()  # reading it fails as a file without permission would
    s = check(cell)
    assert s.state == "unreadable" and s.note.endswith("metrics.jsonl") and (s.done, s.seconds) == (0, 0)


def test_the_lines_a_checkpoint_recorded(tmp_path):
    """``lines``: the first lines only, damaged ones still skipped and named; never a torn last line, which a resume
    drops too, even when the checkpoint recorded more lines than the file holds."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{torn\n{"step": 1}\n{"step": 2}\n{"step": 3')
    assert status.read_rows(path, "step", lines=3) == (
        [{"step": 0}, {"step": 1}], "metrics.jsonl: 1 damaged line(s) skipped, the first line 2"
    )  # fmt: skip
    assert status.read_rows(path, "step", lines=0) == ([], "")
    assert status.read_rows(path, "step", lines=9) == (  # the torn line 5 is neither a row nor damaged
        [{"step": 0}, {"step": 1}, {"step": 2}], "metrics.jsonl: 1 damaged line(s) skipped, the first line 2"
    )  # fmt: skip
    assert status.read_rows(path, "step")[0] == [{"step": 0}, {"step": 1}, {"step": 2}]  # the torn last line left out
    assert status.read_rows(tmp_path / "none.jsonl", "step", lines=2) == ([], "")


def test_the_formats():
    assert [status.duration(s) for s in (40, 90, 5400)] == ["40 s", "1.5 min", "1.5 h"]
    assert status.formatter([1600.0])(1234.0) == "1,234"
    assert status.formatter([1600.0, 1e7])(1234.0) == "0.00M"
    assert status.formatter([])(16.0) == "16"


def test_the_budget_a_run_reaches_is_whole_iterations(tmp_path):
    # 300 env steps an iteration: a budget of 1,000 ends after 4 iterations, at 1,200
    s = check(make_cell(tmp_path, "tce", 0, rows=rows(300, 600), checkpoint=True))
    assert (s.done, s.budget) == (600, 1200)
    assert check(make_cell(tmp_path, "tce", 1)).budget == 1000  # no rows: the budget as asked


def test_the_time_left_worked_by_hand(tmp_path):
    # tce/seed1 ran 600 of 1000 steps in 30 s (0.05 s a step): 400 left, 20 s; bbrl/seed0 100 in 10 s (0.1 s a
    # step): 900 left, 90 s; bbrl/seed1 has no rows: its arm's mean rate, 0.1 s, times 1000: 100 s. Total 210 s.
    # (Rows of 200 and 100 env steps an iteration: the budgets stay 1000.)
    cells = [make_cell(tmp_path, "tce", 0, rows=rows(500, 1000), summary={"seconds": 99.0}),
             make_cell(tmp_path, "tce", 1, rows=rows(200, 400, 600), checkpoint=True),
             make_cell(tmp_path, "bbrl", 0, rows=rows(100), checkpoint=True),
             make_cell(tmp_path, "bbrl", 1)]  # fmt: skip
    found = [check(c) for c in cells]
    left, unknown = status.seconds_left(found)
    assert (left, unknown) == (pytest.approx(210.0), [])
    assert status.counts(found) == "1 finished, 2 stopped, 1 not started"
    # an arm with no cell that has run: named, and left out of the estimate
    found.append(check(make_cell(tmp_path, "ppo", 0)))
    left, unknown = status.seconds_left(found)
    assert (left, unknown) == (pytest.approx(210.0), ["ppo"])
    assert status.seconds_left([check(cells[0])]) == (0.0, [])


def test_the_statuses_a_study_recorded(tmp_path):
    """study.json's statuses by (value, arm, seed); a damaged entry loses only its own."""
    cells = [{"value": None, "loss": "troll", "seed": 0, "status": "failed (exit 1)"}, {"value": None, "seed": 1},
             "nonsense", {"value": None, "loss": "clip", "seed": 0, "status": "done"}]  # fmt: skip
    (tmp_path / "study.json").write_text(json.dumps({"cells": cells}))
    assert status.recorded(tmp_path, "loss") == {(None, "troll", 0): "failed (exit 1)", (None, "clip", 0): "done"}
    (tmp_path / "study.json").write_text(json.dumps({"cells": "nonsense"}))
    assert status.recorded(tmp_path, "loss") == {}
    assert status.recorded(tmp_path / "none", "loss") == {}
