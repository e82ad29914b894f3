"""The run folder (:mod:`troll.runs.folder`): a folder knows what it wrote, and keeps a user's files.

``--overwrite`` deletes only what the command wrote and refuses, with the list, when anything else
is there (``R/.canary``, ``R/checkpoint-notes.txt``, ``.git/``, ``checkpoint-backup/``, notes in a study folder or
in a cell, ``model.safetensors`` beside a foreign ``config.json``); a folder of one command is never replaced by
another; the leftovers of a start killed before its config.json was whole never make a folder unusable.

One writer at a time: while another live process holds a run folder, it is refused with ``--resume`` and with
``--overwrite`` and nothing changes; once that process ends (killed, here) the folder is free again. Every command
held to these rules on its command line: tests/cli/test_cli.py.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
from conftest import busy_elsewhere, held_elsewhere, make_run, tree

from troll import runs
from troll.runs import UsageError
from troll.runs.folder import MANIFEST

COMMANDS = tuple(runs.LAYOUTS)
USER_FILES = (".canary", "checkpoint-notes.txt", ".git/HEAD", "checkpoint-backup/model.pt", ".canary.tmp-1")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("user", USER_FILES)
def test_overwrite_refuses_and_keeps_a_user_file(tmp_path, command, user):
    out = make_run(tmp_path / "r", command)
    assert runs.foreign(out) == [] and runs.check_folder(out, command, resume=False, overwrite=True) == "replace"
    (out / user).parent.mkdir(parents=True, exist_ok=True)
    (out / user).write_text("mine")
    before = tree(out)
    with pytest.raises(UsageError, match=f"did not write: {user.split('/')[0]}") as err:
        runs.check_folder(out, command, resume=False, overwrite=True)
    assert "nothing was deleted" in str(err.value)
    with pytest.raises(UsageError, match="changed since it was checked"):
        runs.clear(out, command)
    assert tree(out) == before
    assert runs.check_folder(out, command, resume=True, overwrite=False) == "resume"  # resuming leaves it alone
    runs.begin(out, command)
    assert (out / user).read_text() == "mine"


@pytest.mark.parametrize("command, other", [(a, b) for a in COMMANDS for b in COMMANDS if a != b])
def test_a_folder_of_one_command_is_never_taken_by_another(tmp_path, command, other):
    out = make_run(tmp_path / "r", command)
    before = tree(out)
    for resume, overwrite in ((False, False), (True, False), (False, True)):
        with pytest.raises(UsageError, match=f"'troll {command}', which 'troll {other}' never continues nor"):
            runs.check_folder(out, other, resume=resume, overwrite=overwrite)
    assert tree(out) == before


def test_a_foreign_config_json_is_not_a_run(tmp_path):
    """mkdir M; echo '{}' > M/config.json; touch M/model.safetensors; troll train --out M --overwrite: refused."""
    out = tmp_path / "M"
    out.mkdir()
    (out / "config.json").write_text("{}")
    for resume, overwrite in ((False, False), (True, False), (False, True)):
        with pytest.raises(UsageError, match=r"holds something else \(config.json\)"):
            runs.check_folder(out, "train", resume=resume, overwrite=overwrite)
    (out / "model.safetensors").write_text("weights")
    with pytest.raises(UsageError, match=r"holds something else \(config.json, model.safetensors\)"):
        runs.check_folder(out, "train", resume=False, overwrite=True)
    assert tree(out) == {"config.json": b"{}", "model.safetensors": b"weights"}


def test_notes_in_a_study_or_in_a_cell_stop_an_overwrite(tmp_path):
    out = tmp_path / "study"
    cells = ("mean_bound=0.1/tce/seed0", "mean_bound=0.1/bbrl/seed0")
    logs = tuple(f"{c}.log" for c in cells)
    make_run(out, "tce study", files=(*runs.LAYOUTS["tce study"], *logs), runs=cells)
    for cell, log in zip(cells, logs, strict=True):
        make_run(out / cell, "tce train")
        (out / log).write_text("$ troll tce train ...\n")
    assert runs.foreign(out) == [] and runs.check_folder(out, "tce study", resume=False, overwrite=True) == "replace"
    for note, shown in (("notes.md", "notes.md"), ("mean_bound=0.1/notes.md", "mean_bound=0.1/notes.md"),
                        ("mean_bound=0.1/tce/seed0/notes.md", "mean_bound=0.1/tce/seed0/notes.md"),
                        ("mean_bound=0.2/x", "mean_bound=0.2/")):  # fmt: skip
        (out / note).parent.mkdir(parents=True, exist_ok=True)
        (out / note).write_text("mine")
        with pytest.raises(UsageError, match=f"did not write: {shown};"):
            runs.check_folder(out, "tce study", resume=False, overwrite=True)
        (out / note).unlink()
    (out / "mean_bound=0.2").rmdir()
    runs.clear(out, "tce study")
    assert not out.exists()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("leftover", [f".{MANIFEST}.tmp-4242", ".config.json.tmp-4242"])
def test_a_start_killed_before_its_config_is_whole_counts_as_empty(tmp_path, command, leftover):
    out = tmp_path / "r"
    out.mkdir()
    if leftover.startswith(".config"):
        runs.begin(out, command)  # the manifest was whole, config.json was not
    (out / leftover).write_text('{"half')
    for resume, overwrite in ((False, False), (True, False), (False, True)):
        assert runs.check_folder(out, command, resume=resume, overwrite=overwrite) == "new"
    (out / "notes.txt").write_text("mine")  # but a user's file beside them is still refused, untouched
    with pytest.raises(UsageError, match=r"holds something else \(notes.txt\)"):
        runs.check_folder(out, command, resume=False, overwrite=True)
    (out / "notes.txt").unlink()
    runs.begin(out, command)
    assert sorted(os.listdir(out)) == [MANIFEST]  # the stale temporary file is gone


def test_begin_removes_only_stale_temporary_files_of_its_own_names(tmp_path):
    out = make_run(tmp_path / "r", "tce train")
    (out / ".metrics.jsonl.tmp-999998").write_text("half")
    (out / ".notes.txt.tmp-999998").write_text("mine")  # not a name of the command: kept, and foreign
    own = out / f".config.json.tmp-{os.getpid()}"  # this process's own write in progress: kept
    own.write_text("{}")
    runs.begin(out, "tce train")
    names = sorted(os.listdir(out))
    assert ".checkpoint-6.pt.tmp-999999" not in names and ".metrics.jsonl.tmp-999998" not in names
    assert ".notes.txt.tmp-999998" in names and own.name in names
    assert runs.foreign(out) == [".notes.txt.tmp-999998"]


def test_seal_records_a_folder_file_by_file(tmp_path):
    out = make_run(tmp_path / "r", "train")
    runs.seal(out, "model")
    (out / "model" / "notes.txt").write_text("mine")
    assert runs.foreign(out) == ["model/notes.txt"]


def test_overwrite_and_resume_exclude_each_other(tmp_path):
    with pytest.raises(UsageError, match="--overwrite and --resume exclude each other"):
        runs.check_folder(tmp_path / "r", "train", resume=True, overwrite=True)


def test_an_unwritable_out_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """A read-only --out (root may write anywhere, so the permission is simulated): a message, not a traceback."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    for out in (locked, locked / "run"):
        with pytest.raises(UsageError, match=f"--out {out}: {locked} is not writable"):
            runs.check_folder(out, "tce train", resume=False, overwrite=False)
    assert list(locked.iterdir()) == []


# ---------------------------------------------------------------- one writer at a time


def test_a_folder_another_process_writes_is_refused_until_that_process_ends(tmp_path):
    out = make_run(tmp_path / "r", "tce train")
    runs.release(out)
    with held_elsewhere(out, "tce train") as proc:
        before = tree(out)  # as the holder's begin left it
        assert runs.busy(out)
        for flags in ({"resume": True, "overwrite": False}, {"resume": False, "overwrite": True}):
            with pytest.raises(UsageError, match="is in use: another process is still writing there.*nothing was"):
                runs.check_folder(out, "tce train", **flags)
        with pytest.raises(UsageError, match="in use.*nothing was deleted"):
            runs.clear(out, "tce train")
        with pytest.raises(UsageError, match="in use.*nothing was changed"):
            runs.begin(out, "tce train")
        assert tree(out) == before
        proc.kill()  # the way a run usually ends early: the lock goes with the process
        proc.wait()
        assert not runs.busy(out)
        assert runs.check_folder(out, "tce train", resume=True, overwrite=False) == "resume"
        runs.clear(out, "tce train")
    assert not out.exists()


def test_the_lock_is_this_process_s_until_it_releases_it(tmp_path):
    out = make_run(tmp_path / "r", "tce train")
    assert not runs.busy(out)  # its own writer is not in its way: begin again, resume, clear
    runs.begin(out, "tce train")
    assert runs.check_folder(out, "tce train", resume=True, overwrite=False) == "resume"
    assert busy_elsewhere(out)
    runs.release(out)
    assert not busy_elsewhere(out)
    runs.release(out)  # giving back what is not held: nothing happens


def test_a_folder_deleted_and_made_again_is_taken_anew(tmp_path):
    out = make_run(tmp_path / "r", "tce train")
    runs.clear(out, "tce train")  # deleted while held: the lock of the old folder goes with it
    make_run(out, "tce train")
    assert busy_elsewhere(out)  # the new folder is held, not the deleted one
    runs.release(out)
    assert not busy_elsewhere(out)


def test_a_begin_that_fails_gives_the_lock_back(tmp_path):
    out = make_run(tmp_path / "r", "tce train")
    runs.release(out)
    with pytest.raises(UsageError, match="not of 'troll train'"):
        runs.begin(out, "train")  # another command's folder: refused after the lock was taken
    assert not busy_elsewhere(out)


def _child(out: str, queue, done) -> None:
    try:
        runs.check_folder(out, "tce train", resume=True, overwrite=False)
        queue.put("taken")
    except UsageError:
        queue.put("refused")
    done.wait(60)


def test_a_forked_child_does_not_hold_its_parent_s_folder(tmp_path):
    out = make_run(tmp_path / "r", "tce train")
    ctx = multiprocessing.get_context("fork")
    queue, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_child, args=(str(out), queue, done))
    child.start()
    try:
        assert queue.get(timeout=60) == "refused"  # to the child the folder is its parent's: another process's
        runs.release(out)
        assert not busy_elsewhere(out)  # the child lives on, but its copy of the descriptor was closed
    finally:
        done.set()
        child.join(60)
