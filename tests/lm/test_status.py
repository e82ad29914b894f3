"""``troll status``: a ``troll study`` folder built by hand (finished, stopped, running and not started cells; a
checkpoint whose mark says which metrics lines a resume keeps; a budget raised on resume), printed line by line
against values worked by hand; nothing is written; a folder without a study is refused."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from troll.cli import main  # noqa: E402
from troll.lm import study  # noqa: E402
from troll.lm.options import RunOptions  # noqa: E402
from troll.runs.protocol import MARK  # noqa: E402
from troll.study import lease  # noqa: E402


def fake_study(out, losses=("troll", "grpo"), seeds=(0, 1), steps=4):
    """A study's config.json, as ``troll study`` writes it, and no cell yet."""
    spec = study.StudySpec(RunOptions(task="chain_sum", model="smollm2", steps=steps), list(losses), list(seeds))
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"command": "study", "spec": spec.to_json()}))


def training(step, seconds):
    return {"step": step, "loss": 0.1, "reward": 0.5, "step_time": seconds}


def held_out(step, accuracy):
    return {"step": step, "heldout/accuracy": accuracy, "heldout/n": 4}


def write_cell(folder, lines, *, summary=False, checkpoint=None, steps=None):
    """A cell's metrics.jsonl (its lines as given: dicts, or text for a damaged line), its summary, a complete
    checkpoint (step, metrics lines it recorded) and a config.json asking for ``steps``."""
    folder.mkdir(parents=True)
    text = "".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines)
    (folder / "metrics.jsonl").write_text(text)
    if summary:
        (folder / "summary.json").write_text(json.dumps({"wall_time_s": 9999.0}))
    if checkpoint is not None:
        step, kept = checkpoint
        (folder / f"checkpoint-{step}").mkdir()
        (folder / f"checkpoint-{step}" / MARK).write_text(json.dumps({"step": step, "metrics_lines": kept}))
    if steps is not None:
        (folder / "config.json").write_text(json.dumps({"command": "train", "options": {"steps": steps}}))


def test_status_of_a_study_worked_by_hand(tmp_path, capsys):
    out = tmp_path / "studies" / "code"
    fake_study(out)
    # finished: 4 steps of 10 s (its rows' time, not its summary's wall time), evaluated at 0 and 4
    write_cell(out / "troll" / "seed0", [held_out(0, 0.0), *(training(s, 10.0) for s in (1, 2, 3, 4)),
                                        held_out(4, 0.5)], summary=True)  # fmt: skip
    # stopped: its checkpoint at step 2 recorded 5 lines (a damaged one among them); step 3 was logged after it,
    # so a resume runs it again. Its run was raised to 6 steps. Kept: steps 1 and 2, 5 s each, evaluated at 2.
    write_cell(out / "grpo" / "seed0", [held_out(0, 0.0), training(1, 5.0), "{torn", training(2, 5.0),
                                        held_out(2, 0.25), training(3, 5.0)], checkpoint=(2, 5), steps=6)  # fmt: skip
    # running (a live lease): one step of 20 s
    write_cell(out / "troll" / "seed1", [held_out(0, 0.125), training(1, 20.0)])
    held = lease.Lease(out / "troll" / "seed1")
    held.acquire()
    try:
        before = sorted((p.as_posix(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
        assert main(["status", str(tmp_path / "studies")]) == 0
        after = sorted((p.as_posix(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    finally:
        held.release()
    assert after == before  # read only
    # Left: troll/seed1, 3 steps at its 20 s: 60 s; grpo/seed0, 4 of its 6 steps at 5 s: 20 s; grpo/seed1, no rows:
    # grpo's mean rate (5 s) times 4 steps: 20 s. In all 100 s, 1.7 min. Run: 4 + 2 + 1 of 4 + 6 + 4 + 4 = 18.
    assert capsys.readouterr().out.splitlines() == [
        f"{out}: task chain_sum, model smollm2, troll,grpo x seeds 0,1, 4 or 6 optimiser steps a cell",
        "  troll/seed0  finished           4 of 4      40 s  held-out accuracy 0.500 at step 4",
        "  grpo/seed0   stopped            2 of 6      10 s  held-out accuracy 0.250 at step 2 (metrics.jsonl: 1 "
        "damaged line(s) skipped, the first line 3)",
        "  troll/seed1  running            1 of 4      20 s  held-out accuracy 0.125 at step 0",
        "  grpo/seed1   not started",
        "  1 finished, 1 running, 1 stopped, 1 not started; 7 of 18 optimiser steps (38 %)",
        "  left: about 1.7 min of run time, one cell at a time, at each cell's rate so far",
    ]


def test_a_killed_cell_without_a_checkpoint_and_a_damaged_study(tmp_path, capsys):
    """A cell the study recorded as failed reads as failed, and counts nothing when no checkpoint keeps its rows; a
    study whose config.json is damaged gets a line saying why, the other is shown, and the exit status is 1."""
    fake_study(tmp_path / "a", losses=("troll",), seeds=(0,))
    write_cell(tmp_path / "a" / "troll" / "seed0", [held_out(0, 0.0), training(1, 10.0)])
    cells = [{"value": None, "loss": "troll", "seed": 0, "status": "failed (exit -9)"}]
    (tmp_path / "a" / "study.json").write_text(json.dumps({"cells": cells}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text('{"command": "study", "spec": {"losses": ["troll"]}}')
    assert main(["status", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "  troll/seed0  failed             0 of 4       0 s (exit -9)" in lines
    assert "  left: the cells of troll, which have no rate yet" in lines
    assert lines[-1] == (f"{tmp_path / 'b'}: cannot be read as a study: {tmp_path / 'b' / 'config.json'} holds a "
                         "damaged study spec (KeyError: 'base')")  # fmt: skip


def test_status_of_a_folder_without_a_study_is_refused(tmp_path, capsys):
    fake_study(tmp_path / "lm")
    (tmp_path / "tce").mkdir()
    (tmp_path / "tce" / "config.json").write_text(json.dumps({"command": "tce study", "spec": {}}))
    assert main(["status", str(tmp_path / "tce")]) == 2  # a study of the other command is not one of these
    assert f"troll status: error: {tmp_path / 'tce'} holds no 'troll study'" in capsys.readouterr().err
    assert main(["tce", "status", str(tmp_path / "lm")]) == 2
    assert main(["status", str(tmp_path / "nothing")]) == 2
    assert f"{tmp_path / 'nothing'} does not exist" in capsys.readouterr().err


def test_a_cell_killed_after_its_last_step_is_not_done(tmp_path, capsys, monkeypatch):
    """Killed after the checkpoint of its last step, before the final evaluation and summary: every step has run,
    yet the study is not finished, and says what is left."""
    fake_study(tmp_path / "s", losses=("troll",), seeds=(0,))
    cell = tmp_path / "s" / "troll" / "seed0"
    write_cell(cell, [held_out(0, 0.0), *(training(s, 10.0) for s in (1, 2, 3, 4))], checkpoint=(4, 5))
    assert main(["status", str(tmp_path / "s")]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  troll/seed0  stopped            4 of 4      40 s  held-out accuracy 0.000 at step 0",
        "  1 stopped; 4 of 4 optimiser steps (99 %)",
        "  left: the end of 1 cell(s) whose steps have all run (their last evaluation)",
    ]
    # a checkpoint a live run removes between finding it and reading its mark: nothing known kept, no error
    from troll.lm import status

    monkeypatch.setattr(status.checkpoints, "last_checkpoint", lambda folder: folder / "checkpoint-2")
    assert status._kept(SimpleNamespace(folder=cell), []) == []
