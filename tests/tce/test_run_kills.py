"""``troll tce train`` SIGKILLed at every write point, then resumed: the same end as an uninterrupted run.

The killed run is a fork of the test process (torch and the package already imported, so a case costs about a
second of work, not an interpreter start) whose writes are patched: with ``<name>:<k>`` it SIGKILLs itself at the
k-th atomic write onto ``<name>`` (a glob), after the temporary file is whole and before ``os.replace`` moves it
into place, so the folder keeps the temporary file as a kill at that instant leaves it; with ``append:<k>`` it
writes half of the k-th metrics line and dies. Write points: the manifest and the first config.json (a folder
holding only temporary files), metrics.jsonl (its first truncation, a torn line), a checkpoint (a
stale ``.checkpoint-N.pt.tmp-PID``) and summary.json. After each, ``--resume`` (with the run's flags, which a start
killed before its config needs) ends with the metrics and summary of the uninterrupted run, and the folder holds
nothing but the command's files.
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")

from troll import runs  # noqa: E402
from troll.cli import main  # noqa: E402
from troll.runs.files import read_jsonl  # noqa: E402

ARGV = ["--env", "toy/viapoint", "--steps", "2400", "--episodes", "8", "--eval-episodes", "8", "--eval-every", "2",
        "--checkpoint-every", "2", "--policy-hidden", "16", "--critic-hidden", "16", "--policy-epochs", "2",
        "--critic-epochs", "2", "--workers", "0", "--no-progress"]  # fmt: skip


def _arm(spec: str) -> None:
    """In the forked child only: SIGKILL at the write ``spec`` names (module docstring)."""
    name, _, k = spec.rpartition(":")
    seen = [0]

    def due() -> bool:
        seen[0] += 1
        return seen[0] == int(k)

    if name == "append":
        write = os.write

        def torn(fd, data):
            if os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl") and due():
                write(fd, data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return write(fd, data)

        os.write = torn
    else:
        replace = os.replace

        def killed(src, dst, *args, **kwargs):
            if fnmatch.fnmatch(os.path.basename(dst), name) and due():
                os.kill(os.getpid(), signal.SIGKILL)
            return replace(src, dst, *args, **kwargs)

        os.replace = killed


def _killed_run(out: Path, spec: str) -> int:
    """Run ``troll tce train`` in a fork armed with ``spec``; the signal that ended it."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            _arm(spec)
            main(["tce", "train", "--out", str(out), *ARGV])
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)


def _steady(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def _summary(out: Path) -> dict:
    return {k: v for k, v in json.loads((out / "summary.json").read_text()).items() if not k.startswith("seconds")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (3 iterations, checkpoints after 2 and 3)."""
    root = tmp_path_factory.mktemp("kills")
    assert main(["tce", "train", "--out", str(root / "full"), *ARGV]) == 0
    return root


@pytest.mark.parametrize(
    "kill, left",
    [
        (".troll-run.json:1", ["..troll-run.json.tmp-"]),  # the manifest, the first write of all
        ("config.json:1", [".config.json.tmp-"]),  # the first config.json
        ("metrics.jsonl:1", [".metrics.jsonl.tmp-"]),  # its first truncation, right after config.json
        ("append:2", ["metrics.jsonl"]),  # a torn second line
        ("checkpoint-*.pt:1", [".checkpoint-2.pt.tmp-"]),  # the first checkpoint
        ("checkpoint-*.pt:2", [".checkpoint-3.pt.tmp-"]),  # the last checkpoint
        ("summary.json:1", [".summary.json.tmp-"]),  # the summary, written last
    ],
)
def test_a_kill_at_every_write_resumes_to_the_same_end(reference, capsys, kill, left):
    out = reference / kill.replace("*", "N").replace(":", "-")
    assert _killed_run(out, kill) == signal.SIGKILL
    names = [p.name for p in out.iterdir()]
    assert all(any(n.startswith(prefix) for n in names) for prefix in left), names
    assert main(["tce", "train", "--out", str(out), *ARGV, "--resume"]) == 0, capsys.readouterr().err
    full = reference / "full"
    assert _steady(read_jsonl(out / "metrics.jsonl")) == _steady(read_jsonl(full / "metrics.jsonl"))
    assert _summary(out) == _summary(full)
    assert not [n for n in os.listdir(out) if ".tmp-" in n]  # the command's temporary files are gone
    assert runs.foreign(out) == []


def _stopped_run(out: Path, signame: str, argv: list[str]) -> int:
    """Run ``troll tce train`` in a fork that sends itself ``signame`` while its first metrics line is written (the
    first iteration's, or PPO's first rollout's); its exit code."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 3
        try:
            write = os.write

            def signalled(fd, data):
                done = write(fd, data)
                if os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl"):
                    os.write = write
                    os.kill(os.getpid(), getattr(signal, signame))
                return done

            os.write = signalled
            code = main(["tce", "train", "--out", str(out), *argv])
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


@pytest.mark.parametrize(("signame", "code"), [("SIGTERM", 143), ("SIGUSR1", 138)])
def test_a_stop_signal_checkpoints_its_iteration_and_resumes_to_the_same_end(reference, capsys, signame, code):
    """SIGTERM or SIGUSR1 during the first iteration (of 3; checkpoints due after 2 and 3): the run ends that
    iteration, saves checkpoint-1.pt and exits with 128 + the signal's number; ``--resume`` ends as the uninterrupted
    run does."""
    out = reference / f"stopped-{signame}"
    assert _stopped_run(out, signame, ARGV) == code
    assert sorted(p.name for p in out.iterdir()) == [".troll-run.json", "checkpoint-1.pt", "config.json",
                                                     "metrics.jsonl"]  # fmt: skip
    assert [r["iteration"] for r in read_jsonl(out / "metrics.jsonl")] == [1]
    assert main(["tce", "train", "--out", str(out), *ARGV, "--resume"]) == 0, capsys.readouterr().err
    full = reference / "full"
    assert _steady(read_jsonl(out / "metrics.jsonl")) == _steady(read_jsonl(full / "metrics.jsonl"))
    assert _summary(out) == _summary(full)


def test_a_stop_signal_ends_ppo_after_its_rollout_with_a_checkpoint(tmp_path, capsys):
    """PPO (gym/reacher, rollouts of 100 steps, a checkpoint due every 10): SIGTERM while the first rollout's row is
    written saves checkpoint-100.zip and exits 143; ``--resume`` runs the other rollouts from it. (SB3 saves no random
    state, so the resumed run is not the uninterrupted one number for number.)"""
    pytest.importorskip("stable_baselines3")
    argv = ["--env", "gym/reacher", "--algo", "ppo", "--steps", "300", "--ppo-n-steps", "100", "--no-progress",
            "--eval-episodes", "2", "--ppo-batch-size", "50", "--ppo-n-epochs", "1",
            "--checkpoint-every", "10"]  # fmt: skip
    out = tmp_path / "ppo"
    assert _stopped_run(out, "SIGTERM", argv) == 143
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-100.zip"]
    assert [r["env_steps"] for r in read_jsonl(out / "metrics.jsonl")] == [100]
    assert main(["tce", "train", "--out", str(out), *argv, "--resume"]) == 0, capsys.readouterr().err
    assert [r["env_steps"] for r in read_jsonl(out / "metrics.jsonl")] == [100, 200, 300]
