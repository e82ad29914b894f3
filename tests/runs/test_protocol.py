"""The run protocol (:mod:`troll.runs.protocol`) that ``troll train``, ``troll tce train`` and PPO share: the saved
config, checkpoints written whole with the newest kept (files renamed into place, folders marked once whole), and
metrics cut back to the checkpoint a resumed run continues from."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from troll import runs
from troll.runs import UsageError, protocol


def _metrics(out: Path, n: int, torn: bool = False) -> None:
    lines = "".join(json.dumps({"step": i}) + "\n" for i in range(n))
    (out / "metrics.jsonl").write_text(lines + ('{"step": ' if torn else ""))


def test_start_writes_the_config_with_its_extras_and_an_empty_metrics_file(tmp_path):
    _metrics(tmp_path, 3)
    protocol.start(tmp_path, "train", {"lr": 1e-5}, "options", versions={"troll": "1"})
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "command": "train", "options": {"lr": 1e-5}, "versions": {"troll": "1"}}  # fmt: skip
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert protocol.saved_config(tmp_path, "train", key="options") == {"lr": 1e-5}
    assert protocol.saved_config(tmp_path, "tce train", key="options") is None  # another command's folder


def test_a_checkpoint_file_is_written_whole_and_only_the_newest_is_kept(tmp_path):
    protocol.save_checkpoint(tmp_path, "checkpoint-{}.pt", 4, lambda f: f.write(b"four"))
    (tmp_path / "checkpoint-notes.pt").write_text("a user's")  # no number: never taken for a checkpoint

    def fail(f):
        f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        protocol.save_checkpoint(tmp_path, "checkpoint-{}.pt", 8, fail)
    assert not (tmp_path / "checkpoint-8.pt").exists() and (tmp_path / "checkpoint-4.pt").read_bytes() == b"four"
    protocol.save_checkpoint(tmp_path, "checkpoint-{}.pt", 12, lambda f: f.write(b"twelve"))
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert names == ["checkpoint-12.pt", "checkpoint-notes.pt"]


def test_a_marked_checkpoint_folder_counts_and_replaces_the_older_ones(tmp_path):
    """A folder another library writes file by file counts once marked; marking it removes the older ones, never the
    newer unmarked one being written, and a mark for another step than the folder's name does not count."""
    for step in (2, 4, 6):
        (tmp_path / f"checkpoint-{step}").mkdir()
    protocol.mark_checkpoint(tmp_path / "checkpoint-2", step=2, metrics_lines=3)
    assert protocol.last_marked(tmp_path, "checkpoint-{}") == tmp_path / "checkpoint-2"
    protocol.mark_checkpoint(tmp_path / "checkpoint-4", step=4, metrics_lines=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "checkpoint-6"]
    assert protocol.last_marked(tmp_path, "checkpoint-{}") == tmp_path / "checkpoint-4"
    runs.write_json(tmp_path / "checkpoint-6" / protocol.MARK, {"step": 4, "metrics_lines": 5})  # copied mark
    assert protocol.last_marked(tmp_path, "checkpoint-{}") == tmp_path / "checkpoint-4"
    with pytest.raises(ValueError, match="not a numbered checkpoint folder"):
        protocol.mark_checkpoint(tmp_path / "final", step=1, metrics_lines=0)


def test_resuming_from_a_marked_folder_cuts_the_metrics_back_and_drops_the_rest(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    protocol.mark_checkpoint(tmp_path / "checkpoint-2", step=2, metrics_lines=3)
    (tmp_path / "checkpoint-4").mkdir()  # an interrupted write
    _metrics(tmp_path, 6, torn=True)
    folder, rows = protocol.resume_from_marked(tmp_path, "checkpoint-{}")
    assert folder == tmp_path / "checkpoint-2" and rows == [{"step": 0}, {"step": 1}, {"step": 2}]
    assert not (tmp_path / "checkpoint-4").exists() and len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    protocol.remove_checkpoints(tmp_path, "checkpoint-{}")
    assert not (tmp_path / "checkpoint-2").exists()
    (tmp_path / "checkpoint-6").mkdir()  # never marked: the run starts over, without its metrics
    assert protocol.resume_from_marked(tmp_path, "checkpoint-{}") == (None, [])
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoint-6").exists()


@dataclasses.dataclass
class _Config:
    lr: float = 0.1
    steps: int = 10


def _prepare(out, config, resume, **kw):
    def saved(folder):
        data = protocol.saved_config(folder, "tce train")
        return None if data is None else _Config(**data)

    return protocol.prepare(config, out, command="tce train", resume=resume, saved=saved, kind="toy",
                            resumable=("steps",), **kw)  # fmt: skip


def test_differences_compares_the_fields_given_but_the_resumable():
    assert protocol.differences(_Config(), _Config(lr=0.2, steps=20)) == {"lr": (0.1, 0.2), "steps": (10, 20)}
    assert protocol.differences(_Config(), _Config(lr=0.2, steps=20), resumable=("steps",)) == {"lr": (0.1, 0.2)}
    # a dict names only the fields it compares; one the saved config lacks shows as MISSING
    assert protocol.differences({"lr": 0.1, "steps": 10}, {"lr": 0.1}) == {}
    assert protocol.differences(_Config(), {"width": 3}) == {"width": (protocol.MISSING, 3)}


def test_prepare_starts_resumes_and_refuses_a_changed_config(tmp_path):
    out = tmp_path / "run"
    assert _prepare(out, _Config(), resume=False) == (_Config(), False)
    with pytest.raises(UsageError, match="holds no run to resume"):
        _prepare(out, None, resume=True)
    runs.begin(out, "tce train")
    protocol.start(out, "tce train", dataclasses.asdict(_Config()))
    assert _prepare(out, None, resume=True) == (_Config(), False)
    assert _prepare(out, _Config(steps=20), resume=True) == (_Config(steps=20), False)  # a resumable field
    with pytest.raises(UsageError, match="lr: folder 0.1, given 0.2"):
        _prepare(out, _Config(lr=0.2), resume=True)
    runs.write_json(out / "summary.json", {"done": True})
    assert _prepare(out, None, resume=True) == (_Config(), True)
    # a run that can be extended past its end says when it is finished
    assert _prepare(out, _Config(steps=20), resume=True, finished=lambda c: c.steps <= 10) == (_Config(steps=20), False)
    assert protocol.run(out, lambda: _prepare(out, None, resume=True), lambda c: {"ran": True}) == {"done": True}


def test_stop_requests_note_the_first_signal_and_restore_the_handlers():
    import os
    import signal
    import threading

    before = signal.getsignal(signal.SIGTERM)
    with protocol.stop_requests() as stop:
        assert stop.signal is None
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # noted, not obeyed: the process lives on
        assert stop.signal == "SIGUSR1"  # the first one
    assert signal.getsignal(signal.SIGTERM) is before and signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    seen = []

    def in_a_thread():  # Python runs handlers in the main thread only: nothing is installed here
        with protocol.stop_requests() as request:
            seen.append((request.signal, signal.getsignal(signal.SIGTERM)))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [(None, before)]
    stopped = protocol.Stopped("SIGTERM", 7, "run/checkpoint-7.pt")
    assert (stopped.exit_code, protocol.Stopped("SIGUSR1", 7, "c").exit_code) == (128 + 15, 128 + 10)
    assert str(stopped) == "stopped by SIGTERM after step 7; the checkpoint is run/checkpoint-7.pt"


def test_a_second_ctrl_c_stops_at_once_and_stop_codes_name_their_signal():
    import os
    import signal

    import pytest

    # Ctrl-C as an interactive Python has it: a job started in the background (``cmd &`` in a script) begins with
    # SIGINT ignored, and the handlers restore what they found
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with protocol.stop_requests(("SIGTERM", "SIGINT")) as stop:
            os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C is a stop request like SIGTERM
            assert stop.signal == "SIGINT"
            os.kill(os.getpid(), signal.SIGTERM)  # a repeated SIGTERM changes nothing
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with protocol.stop_requests() as stop:  # SIGINT is not a stop signal unless asked for
            os.kill(os.getpid(), signal.SIGTERM)
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, found)
    names = [protocol.stop_signal_of(code) for code in (143, -15, 138, -10, 130, -2, -9, 137, 0, 1, 15)]
    assert names == ["SIGTERM", "SIGTERM", "SIGUSR1", "SIGUSR1", None, None, None, None, None, None, None]
