"""``troll tce status``: the study of test_results.py's fabricated cells, some made unfinished by hand (stopped,
failed, running, not started), printed line by line against values worked by hand; a folder without a study is
refused; nothing is written."""

from __future__ import annotations

import json
from types import SimpleNamespace

from troll.cli import main
from troll.study import lease
from troll.study import status as study_status
from troll.study.cell import STATUS_LINE
from troll.tce import status

from .test_results import GYM_EVALS, fake_study


def unfinish(cell, *, keep_rows: int, checkpoint: bool, log: str | None = None) -> None:
    """Make a finished cell look interrupted: no summary, its first ``keep_rows`` metrics rows, a checkpoint of
    iteration 1."""
    (cell / "summary.json").unlink()
    rows = (cell / "metrics.jsonl").read_text().splitlines(keepends=True)
    (cell / "metrics.jsonl").write_text("".join(rows[:keep_rows]))
    if checkpoint:
        (cell / "checkpoint-1.pt").write_bytes(b"")
    if log is not None:
        cell.with_name(cell.name + ".log").write_text(f"$ troll tce train ...\n{STATUS_LINE}{log} (attempt 3 on h)\n")


def test_status_of_a_study_worked_by_hand(tmp_path, capsys):
    root = tmp_path / "studies"
    out = root / "reacher"
    fake_study(out, "gym/reacher-sparse", GYM_EVALS)  # 2 evaluations a cell, at 800 and 1,600 env steps, 30 s each
    unfinish(out / "tce" / "seed1", keep_rows=2, checkpoint=True, log="stopped (SIGTERM)")  # the kill came after
    # iteration 2, the checkpoint at 1: a resume runs iteration 2 again, so it counts up to 800
    unfinish(out / "tce" / "seed2", keep_rows=1, checkpoint=True, log="failed (exit 1)")
    unfinish(out / "bbrl" / "seed2", keep_rows=1, checkpoint=True)
    unfinish(out / "bbrl" / "seed1", keep_rows=1, checkpoint=False)  # nothing to resume: it starts again
    held = lease.Lease(out / "bbrl" / "seed2")  # a live attempt of this process holds it
    held.acquire()
    try:
        before = sorted((p.as_posix(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
        assert main(["tce", "status", str(root)]) == 0
        after = sorted((p.as_posix(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    finally:
        held.release()
    assert after == before  # read only
    # left: tce/seed1, tce/seed2 and bbrl/seed2 ran 800 of 1,600 steps in 30 s: 30 s each; bbrl/seed1 has no rows:
    # bbrl's mean rate, of bbrl/seed0 (60 s for 1,600, its summary) and bbrl/seed2 (30 s for 800), 0.0375 s a step,
    # times 1,600: 60 s. In all 150 s, 2.5 minutes. Env steps run: 2 x 1,600 + 3 x 800 = 5,600 of 6 x 1,600.
    assert capsys.readouterr().out.splitlines() == [
        f"{out}: gym/reacher-sparse, tce,bbrl x seeds 0,1,2, 1,600 env steps a cell",
        "  tce/seed0   finished       1,600 of 1,600   1.0 min  success 1.000 at 1,600",
        "  bbrl/seed0  finished       1,600 of 1,600   1.0 min  success 0.500 at 1,600",
        "  tce/seed1   stopped          800 of 1,600      30 s  success 0.250 at 800",
        "  bbrl/seed1  not started",
        "  tce/seed2   failed           800 of 1,600      30 s  success 0.500 at 800 (exit 1)",
        "  bbrl/seed2  running          800 of 1,600      30 s  success 0.500 at 800",
        "  2 finished, 1 running, 1 failed, 1 stopped, 1 not started; 5,600 of 9,600 env steps (58 %)",
        "  left: about 2.5 min of run time, one cell at a time, at each cell's rate so far",
    ]


def test_a_study_run_here_records_a_failed_cell_and_a_damaged_study_leaves_the_others(tmp_path, capsys):
    """A local study records a cell's end in study.json (not in the cell's log): a killed cell reads as failed. A
    study whose config.json is damaged gets a line saying so, the other is shown, and the exit status is 1."""
    fake_study(tmp_path / "a", "gym/reacher-sparse", GYM_EVALS)
    unfinish(tmp_path / "a" / "tce" / "seed0", keep_rows=1, checkpoint=False)
    data = json.loads((tmp_path / "a" / "study.json").read_text())
    (entry,) = [c for c in data["cells"] if (c["algo"], c["seed"]) == ("tce", 0)]
    entry["status"] = "failed (exit -9)"
    (tmp_path / "a" / "study.json").write_text(json.dumps(data))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text('{"command": "tce study", "spec": ')
    assert main(["tce", "status", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "  tce/seed0   failed             0 of 1,600       0 s (exit -9)" in out  # no checkpoint: it starts again
    assert out[-1].startswith(f"{tmp_path / 'b'}: cannot be read as a study: {tmp_path / 'b' / 'config.json'} is "
                              "not JSON")  # fmt: skip


def test_status_of_a_folder_without_a_study_is_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"command": "tce train", "config": {}}))
    assert main(["tce", "status", str(tmp_path)]) == 2
    assert f"troll tce status: error: {tmp_path} holds no 'troll tce study'" in capsys.readouterr().err
    assert main(["tce", "status", str(tmp_path / "nothing")]) == 2
    assert f"{tmp_path / 'nothing'} does not exist" in capsys.readouterr().err


def test_what_a_resume_keeps_the_budget_and_the_formats(tmp_path):
    cell = SimpleNamespace(folder=tmp_path, options={"config": SimpleNamespace(total_env_steps=1600)})
    rows = [{"iteration": i, "env_steps": 800 * i} for i in (1, 2, 3)]
    assert status._kept(cell, rows) == []  # no checkpoint: it starts again
    (tmp_path / "checkpoint-2000.zip").write_bytes(b"")  # PPO's, named by its env steps
    assert status._kept(cell, rows) == rows[:2]
    (tmp_path / "checkpoint-1.pt").write_bytes(b"")  # TCE's, named by its iteration
    assert status._kept(cell, rows) == rows[:1]
    assert status._budget(cell) == 1600  # no config.json: the planned one
    (tmp_path / "config.json").write_text(json.dumps({"command": "tce train", "config": {"total_env_steps": 3200}}))
    assert status._budget(cell) == 3200  # the cell's own

    steps = study_status.formatter([1e7])
    assert status._evaluation({"env_steps": 2.5e6, "eval/return": -3.0, "eval/success_rate": 0.5}, steps) == (
        "success 0.500 at 2.50M"
    )
    hop = {"env_steps": 1e6, "eval/return": 15.5, "eval/success_rate": None, "eval/max_height": 1.75}
    assert status._evaluation(hop, steps) == "return 15.50, max height 1.750 m at 1.00M"
