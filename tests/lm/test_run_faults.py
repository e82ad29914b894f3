"""``troll train`` and ``troll study`` killed with SIGKILL at chosen moments, then resumed with ``--resume``.

Faults are injected deterministically, not by timing: the subprocesses run with a ``sitecustomize`` (written here,
on their PYTHONPATH only) that, when ``TROLL_FAULT`` is set, SIGKILLs the process right after a given metrics line
(``log:N`` after optimiser step N's line, ``heldout:N`` after the held-out line of step N) or in the middle of
writing ``checkpoint-N/optimizer.pt`` (``ckpt:N``: a few bytes written, then the kill, so the folder looks like a
checkpoint and is not one). The tiny random model of tests/support/tiny.py scores 0 on every task, which would leave
every advantage, hence every gradient, at zero; the runs here are rewarded by the share of the letter "a" in a
completion instead (the same function in the subprocesses and in the reference run), so that the weights really move.

Determinism on CPU: with one thread, the same seed and checkpoints between rollout batches, a resumed run repeats
the uninterrupted one bit for bit (the Trainer restores the RNG states, the optimiser and the data order), so the
final weights and every logged number except wall-clock times are compared for equality. About 1.5 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")

from conftest import SRC, run_cli  # noqa: E402

from troll import runs  # noqa: E402
from troll.cli import main  # noqa: E402
from troll.lm import tasks  # noqa: E402
from troll.lm.checkpoints import MARK, last_checkpoint  # noqa: E402
from troll.runs.files import read_jsonl  # noqa: E402

TINY = ["--heldout", "4", "--max-completion-length", "6", "--eval-every", "2", "--save-every", "2", "--lr", "0.01"]
RUN = ["--steps", "6", *TINY, "--seed", "0"]
VOLATILE = {"step_time"}  # seconds an optimiser step took

REWARD = '''
def letter_a(self, prompts=None, completions=None, rg_index=None, **kwargs):
    """Share of "a" among a completion's characters: varies between samples of a random model."""
    texts = [completion_text(c) for c in completions]
    return [t.count("a") / max(len(t), 1) for t in texts]
'''

HOOK = '''"""Test-only fault injection and reward for the subprocesses of tests/lm/test_run_faults.py (else inert)."""
import importlib.util
import os
import signal
import sys

FAULT = os.environ.get("TROLL_FAULT", "")


def _armed():
    """Only the run whose --out contains TROLL_FAULT_OUT, and (with TROLL_FAULT_ONCE) only the first time."""
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else ""
    once = os.environ.get("TROLL_FAULT_ONCE")
    return FAULT and os.environ.get("TROLL_FAULT_OUT", "") in out and not (once and os.path.exists(once))


def _die():
    once = os.environ.get("TROLL_FAULT_ONCE")
    if once:
        open(once, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)


def _patch_tasks(module):
    if os.environ.get("TROLL_TEST_REWARD") == "letter_a":
        scope = {"completion_text": module.completion_text}
        exec(REWARD, scope)
        module.TaskReward.__call__ = scope["letter_a"]


def _patch_callbacks(module):
    if not _armed() or FAULT == "config":
        return
    kind, _, step = FAULT.partition(":")
    step = int(step)
    write = module.RunLog.write

    def write_then_die(self, at, values):
        write(self, at, values)
        if at == step and (kind == "log" and "loss" in values or kind == "heldout" and "heldout/accuracy" in values):
            _die()

    module.RunLog.write = write_then_die
    if kind == "ckpt":
        import torch

        save = torch.save

        def torn_save(obj, f, *args, **kwargs):
            if str(f).endswith(os.path.join(f"checkpoint-{step}", "optimizer.pt")):
                with open(f, "wb") as part:
                    part.write(b"torn")
                _die()
            return save(obj, f, *args, **kwargs)

        torch.save = torn_save


if FAULT == "config":  # killed at the first config.json's atomic rename: the folder keeps its temporary file
    _replace = os.replace

    def _replace_or_die(src, dst, *args, **kwargs):
        if os.path.basename(str(dst)) == "config.json" and _armed():
            _die()
        return _replace(src, dst, *args, **kwargs)

    os.replace = _replace_or_die


class _AfterImport:
    """A meta-path finder that patches a module right after it is executed."""

    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.patches[name](module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterImport({"troll.lm.tasks": _patch_tasks, "troll.lm.callbacks": _patch_callbacks}))
'''.replace("exec(REWARD, scope)", "exec(" + repr(REWARD) + ", scope)")


@pytest.fixture
def hooked(tmp_path, monkeypatch):
    """The environment of the faulty subprocesses: the hook first on PYTHONPATH, this checkout's troll next."""
    folder = tmp_path / "hook"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(HOOK)
    monkeypatch.setenv("TROLL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(SRC), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TROLL_TEST_REWARD", "letter_a")
    for name in ("TROLL_FAULT", "TROLL_FAULT_OUT", "TROLL_FAULT_ONCE"):
        monkeypatch.delenv(name, raising=False)
    scope = {"completion_text": tasks.completion_text}
    exec(REWARD, scope)
    monkeypatch.setattr(tasks.TaskReward, "__call__", scope["letter_a"])  # the same reward for in-process runs
    return folder


def _train(*argv: str, fault: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "TROLL_FAULT": fault}
    cmd = [sys.executable, "-m", "troll.cli", "train", *map(str, argv)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _steady(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in VOLATILE}


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_train_killed_anywhere_resumes_to_the_same_end(tmp_path, tiny_model_dir, hooked):
    out = tmp_path / "run"
    # 0. killed while its first config.json is written: the folder holds the manifest and .config.json.tmp-PID
    proc = _train("--model", tiny_model_dir, "--out", out, *RUN, fault="config")
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert sorted(p.name[:17] for p in out.iterdir()) == [".config.json.tmp-", ".troll-run.json"]
    # 1. --resume (with the run's flags: no config was saved) starts it over; killed while the first checkpoint is
    #    written: it is not complete, nothing can be resumed from
    proc = _train("--model", tiny_model_dir, "--out", out, *RUN, "--resume", fault="ckpt:2")
    assert "holds no complete config.json; the run starts over" in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (out / "checkpoint-2" / "optimizer.pt").read_bytes() == b"torn" and last_checkpoint(out) is None
    # 2. --resume starts over; killed while checkpoint-4 is written, after checkpoint-2 was completed
    proc = _train("--out", out, "--resume", fault="ckpt:4")
    assert proc.returncode == -9 and "starts over from step 0" in proc.stderr, proc.stderr[-2000:]
    assert last_checkpoint(out) == out / "checkpoint-2" and not (out / "checkpoint-4" / MARK).exists()
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "lo')  # and, as if killed in the middle of a write, a torn last line
    # 3. resumes from checkpoint-2 (not the torn checkpoint-4); killed after the final held-out line, before
    #    model/ and summary.json: that line is logged after checkpoint-6, and the resumed run logs it again
    proc = _train("--out", out, "--resume", fault="heldout:6")
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert last_checkpoint(out) == out / "checkpoint-6" and not (out / "summary.json").exists()
    # 4. resumes from checkpoint-6 and finishes
    proc = _train("--out", out, "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]

    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]  # each optimiser step once
    assert [r["step"] for r in rows if "heldout/accuracy" in r] == [0, 2, 4, 6]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] is True and not list(out.glob("checkpoint-*"))
    assert runs.foreign(out) == [] and not list(out.glob(".*.tmp-*"))  # no leftover of the kills remains

    ref = tmp_path / "ref"  # the same run, uninterrupted (in this process, with the same reward)
    assert main(["train", "--model", str(tiny_model_dir), "--out", str(ref), *RUN]) == 0
    assert [_steady(r) for r in rows] == [_steady(r) for r in read_jsonl(ref / "metrics.jsonl")]
    expected = json.loads((ref / "summary.json").read_text())
    for key in ("train_time_s", "wall_time_s", "resumed"):
        summary.pop(key), expected.pop(key)
    assert summary == expected
    final, reference, start = _weights(out / "model"), _weights(ref / "model"), _weights(tiny_model_dir)
    assert final.keys() == reference.keys()
    assert all(bool((final[k] == reference[k]).all()) for k in final)
    assert any(not bool((final[k] == start[k]).all()) for k in final)  # the weights did move: not a vacuous test


def test_study_reruns_only_a_killed_cell(tmp_path, capsys, tiny_model_dir, hooked, monkeypatch):
    out = tmp_path / "study"
    monkeypatch.setenv("TROLL_FAULT", "log:3")  # after step 3's line; checkpoint-2 is complete by then
    monkeypatch.setenv("TROLL_FAULT_OUT", "seed1")
    monkeypatch.setenv("TROLL_FAULT_ONCE", str(tmp_path / "killed-once"))
    argv = ["study", "--model", str(tiny_model_dir), "--out", str(out), "--losses", "grpo", "--seeds", "2"]
    code, err = run_cli(capsys, *argv, "--steps", "4", *TINY)
    assert code == 1 and "FAILED" in err and "(exit -9)" in err, err
    done, cut = out / "grpo" / "seed0", out / "grpo" / "seed1"
    stamp = (done / "summary.json").stat().st_mtime_ns
    assert not (cut / "summary.json").exists() and last_checkpoint(cut) == cut / "checkpoint-2"
    code, err = run_cli(capsys, "study", "--out", str(out), "--resume")
    assert code == 0, err
    assert f"started {cut.as_posix()} (resuming)" in err and f"started {done.as_posix()}" not in err
    assert (done / "summary.json").stat().st_mtime_ns == stamp
    rows = read_jsonl(cut / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if "heldout/accuracy" in r] == [0, 2, 4]
    data = json.loads((out / "study.json").read_text())
    assert [c["status"] for c in data["cells"]] == ["kept", "done"]
