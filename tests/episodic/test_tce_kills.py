"""``troll tce train`` SIGKILLed at every write point, then resumed: the same end as an uninterrupted run.

The kill is injected in a subprocess by a ``sitecustomize`` (written here, on its PYTHONPATH only): with
``TROLL_KILL=<name>:<k>`` the process SIGKILLs itself at the k-th atomic write onto ``<name>`` (a glob), after the
temporary file is whole and before ``os.replace`` moves it into place, so the folder keeps the temporary file, as a
kill at that instant leaves it; with ``TROLL_KILL=append:<k>`` it writes half of the k-th metrics line and dies.
Write points: the manifest and the first config.json (a folder holding only temporary files, issue 28 item 2),
metrics.jsonl (its first truncation, a torn line), a checkpoint (a stale ``.checkpoint-N.pt.tmp-PID``) and
summary.json. After each, ``--resume`` (with the run's flags, which a start killed before its config needs) ends
with the metrics and summary of the uninterrupted run, and the folder holds nothing but the command's files.
About 2 s a case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")

from troll import runs  # noqa: E402
from troll.runs.files import read_jsonl  # noqa: E402

SRC = Path(__file__).parents[2] / "src"
ARGV = ["--env", "toy/viapoint", "--steps", "2400", "--episodes", "8", "--eval-episodes", "8", "--eval-every", "2",
        "--checkpoint-every", "2", "--policy-hidden", "16", "--critic-hidden", "16", "--policy-epochs", "2",
        "--critic-epochs", "2", "--workers", "0", "--no-progress"]  # fmt: skip

HOOK = '''"""Test-only: SIGKILL at a chosen write (tests/episodic/test_tce_kills.py); inert without TROLL_KILL."""
import fnmatch
import os
import signal

SPEC = os.environ.get("TROLL_KILL", "")
if SPEC:
    NAME, _, K = SPEC.rpartition(":")
    K, SEEN = int(K), [0]

    def _count() -> bool:
        SEEN[0] += 1
        return SEEN[0] == K

    if NAME == "append":
        _write = os.write

        def write(fd, data):
            if os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl") and _count():
                _write(fd, data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return _write(fd, data)

        os.write = write
    else:
        _replace = os.replace

        def replace(src, dst, *args, **kwargs):
            if fnmatch.fnmatch(os.path.basename(dst), NAME) and _count():
                os.kill(os.getpid(), signal.SIGKILL)
            return _replace(src, dst, *args, **kwargs)

        os.replace = replace
'''


def _cli(out: Path, *extra: str, kill: str = "", hook: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TROLL_KILL": kill, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(hook), str(SRC), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    cmd = [sys.executable, "-m", "troll.cli", "tce", "train", "--out", str(out), *ARGV, *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def _steady(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def _summary(out: Path) -> dict:
    return {k: v for k, v in json.loads((out / "summary.json").read_text()).items() if k != "seconds"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (3 iterations, checkpoints after 2 and 3) and the hook folder."""
    root = tmp_path_factory.mktemp("kills")
    hook = root / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    done = _cli(root / "full", hook=hook)
    assert done.returncode == 0, done.stderr
    return root, hook


@pytest.mark.parametrize(
    "kill, left",
    [
        (".troll-run.json:1", ["..troll-run.json.tmp-"]),  # the manifest, the first write of all
        ("config.json:1", [".config.json.tmp-"]),  # the first config.json (issue 28 item 2)
        ("metrics.jsonl:1", [".metrics.jsonl.tmp-"]),  # its first truncation, right after config.json
        ("append:2", ["metrics.jsonl"]),  # a torn second line
        ("checkpoint-*.pt:1", [".checkpoint-2.pt.tmp-"]),  # the first checkpoint
        ("checkpoint-*.pt:2", [".checkpoint-3.pt.tmp-"]),  # the last checkpoint
        ("summary.json:1", [".summary.json.tmp-"]),  # the summary, written last
    ],
)
def test_a_kill_at_every_write_resumes_to_the_same_end(reference, kill, left):
    root, hook = reference
    out = root / kill.replace("*", "N").replace(":", "-")
    killed = _cli(out, kill=kill, hook=hook)
    assert killed.returncode == -9, killed.stderr
    names = [p.name for p in out.iterdir()]
    assert all(any(n.startswith(prefix) for n in names) for prefix in left), names
    resumed = _cli(out, "--resume", hook=hook)
    assert resumed.returncode == 0, resumed.stderr
    full = root / "full"
    assert _steady(read_jsonl(out / "metrics.jsonl")) == _steady(read_jsonl(full / "metrics.jsonl"))
    assert _summary(out) == _summary(full)
    assert not [n for n in os.listdir(out) if ".tmp-" in n]  # the command's temporary files are gone
    assert runs.foreign(out) == []
