"""Attacks on the sandbox and on the scoring, run as completions in the real bubblewrap sandbox (one batch, several
slots; the programs are in tests/support/sandbox_attacks.py). Each must score 0 (a Score, not None: the sandbox
worked) and leave the host untouched: the canaries unread and unchanged, no file created outside, no process left,
no signal received, and loopback listeners on the host that see nothing. The function's expected value is what a
successful attack would return, so a leak shows as a reward above 0."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import process_state
from sandbox_attacks import ATTACKS, FORK_BOMB, PARTIAL, STEPS, attacks
from sandbox_helpers import Recording, descendants, fenced, processes_of_uids

from troll.sandbox import BubblewrapSandbox, SandboxUnavailable, Score, score_completions
from troll.sandbox.scoring import extract_program

ROOT = Path(__file__).resolve().parents[2]
TOKEN = secrets.token_hex(8)
UID_BASE = 3_000_000 + (os.getpid() % 10_000) * 64


def test_bubblewrap_is_installed():
    """A hard requirement of the suite (make installs it): never a skip."""
    assert shutil.which("bwrap") or os.path.exists("/usr/bin/bwrap"), "apt-get install -y bubblewrap"


class HostTraps:
    """While open: canary files in $HOME and the checkout, a canary environment variable, TCP and UDP listeners on
    the host's loopback and a SIGUSR1 handler. ``seen()`` says what reached the host; closing removes them all."""

    def __init__(self):
        self.secret = "canary-" + TOKEN
        home = Path.home()
        self.canaries = [home / f".troll-canary-{TOKEN}", ROOT / f".troll-canary-{TOKEN}"]
        self.marks = [home / f"x-{TOKEN}", ROOT / f"x-{TOKEN}", Path(f"/tmp/x-{TOKEN}"), Path(f"/tmp/daemon-{TOKEN}")]
        self.signals: list = []

    def __enter__(self) -> HostTraps:
        for path in self.canaries:
            path.write_text(self.secret)
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a host service on an abstract socket
        self.abstract.bind(f"\0troll-{TOKEN}")
        self.abstract.listen(8)
        for sock in (self.tcp, self.udp, self.abstract):
            sock.setblocking(False)
        self.old_handler = signal.signal(signal.SIGUSR1, lambda *a: self.signals.append(a))
        os.environ["TROLL_SANDBOX_CANARY"] = self.secret
        return self

    def fields(self) -> dict:
        """The values the attack templates are filled with."""
        home_mark, repo_mark = (str(p) for p in self.marks[:2])
        outside = [home_mark, repo_mark, str(self.canaries[0]), f"/usr/x-{TOKEN}", f"/x-{TOKEN}"]
        return {
            "token": TOKEN, "secret": self.secret, "outside": outside, "repo_mark": repo_mark,
            "canary_home": str(self.canaries[0]), "canary_repo": str(self.canaries[1]),
            "home": str(Path.home()), "root": str(ROOT), "tcp": self.tcp.getsockname()[1],
            "udp": self.udp.getsockname()[1], "host_pid": os.getpid(), "host_ppid": os.getppid(),
            "abstract": f"\0troll-{TOKEN}",
        }  # fmt: skip

    def seen(self) -> dict:
        return {
            "canaries": [p.read_text() for p in self.canaries],
            "created": [str(p) for p in self.marks if p.exists()],
            "signals": list(self.signals),
            "tcp": _accepted(self.tcp),
            "udp": _received(self.udp),
            "abstract": _accepted(self.abstract),
        }

    def __exit__(self, *exc) -> None:
        os.environ.pop("TROLL_SANDBOX_CANARY", None)
        signal.signal(signal.SIGUSR1, self.old_handler)
        self.tcp.close()
        self.udp.close()
        self.abstract.close()
        for path in self.canaries + self.marks:
            path.unlink(missing_ok=True)


def _accepted(sock) -> bool:
    try:
        sock.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def _received(sock) -> bool:
    try:
        sock.recvfrom(16)
        return True
    except BlockingIOError:
        return False


@pytest.fixture(scope="module")
def batch():
    """Every attack and partial case in one batch (4 slots) with the host's traps set; returns the scores, the
    recording, what the host saw, the canary secret and the batch's seconds."""
    with HostTraps() as traps:
        programs = attacks(traps.fields())
        names = list(programs) + list(PARTIAL)
        completions = [fenced(code) for code, _ in programs.values()] + [c for c, _ in PARTIAL.values()]
        suites = [s for _, s in programs.values()] + [STEPS] * len(PARTIAL)
        sandbox = BubblewrapSandbox(uid_base=UID_BASE)
        recording = Recording(sandbox)
        start = time.monotonic()
        scores = score_completions(completions, suites, sandbox=recording, slots=4)
        seconds = time.monotonic() - start
        left = [pid for block in sandbox.uids for pid in processes_of_uids(block.start, block.stop)]
        host = {"left": left, **traps.seen()}  # nothing of a run outlives it: no waiting
    return dict(zip(names, scores)), recording, host, traps.secret, seconds


@pytest.mark.parametrize("name", list(ATTACKS))
def test_each_attack_scores_zero(batch, name):
    scores = batch[0]
    assert scores[name] is not None, "the sandbox itself failed"
    assert scores[name].reward == 0.0 and scores[name].passed == 0, scores[name]


def test_the_host_is_untouched(batch):
    _, recording, host, secret, _ = batch
    assert host["left"] == [], "sandbox processes left behind"
    assert host["canaries"] == [secret, secret]
    assert host["created"] == []
    assert host["signals"] == []
    assert not host["tcp"] and not host["udp"], "the host's loopback listener saw a connection"
    assert not host["abstract"], "the host's abstract unix socket saw a connection"
    assert secret.encode() not in recording.output(), "a canary leaked into the sandbox's output"


def test_statuses_and_limits(batch):
    scores, recording, _, _, seconds = batch
    assert scores["write_outside"] == Score(0, 1, 0.0, False, "ok")  # ran, and found every outside path closed
    assert scores["network"] == Score(0, 1, 0.0, False, "ok")
    assert scores["kill_parent"] == Score(0, 1, 0.0, False, "ok")
    assert scores["nested_userns"] == Score(0, 1, 0.0, False, "ok")
    assert scores["keyring"] == Score(0, 1, 0.0, False, "ok")
    assert scores["raise_rlimits"] == Score(0, 1, 0.0, False, "ok")
    assert scores["huge_int_vs_float"] == Score(0, 1, 0.0, False, "ok")
    assert scores["while_true"].status == "timeout"
    assert scores["while_true_no_alarm"].status in ("timeout", "crashed")  # the wall clock or RLIMIT_CPU
    assert scores["syntax_error"].status == "syntax_error"
    assert scores["sys_exit_first"].status == "no_entry_point"
    assert scores["os_exit_first"].status == "crashed"
    assert scores["stderr_100mb"].status == "output_limit"
    result, limits = recording.runs[extract_program(fenced(FORK_BOMB))]
    assert result.seconds <= limits.wall + 1.0, "the fork bomb outlived its wall-clock limit by over 1 s"
    assert all(len(r.stdout) <= lim.output and len(r.stderr) <= lim.output for r, lim in recording.runs.values())
    assert seconds < 30


@pytest.mark.parametrize("name", list(PARTIAL))
def test_partial_credit_stops_where_the_program_did(batch, name):
    passed, status = PARTIAL[name][1]
    assert batch[0][name] == Score(passed, 3, passed / 3, passed == 3, status)


def test_a_missing_bubblewrap_names_the_fix():
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        BubblewrapSandbox(bwrap="/nonexistent/bwrap")


def test_a_bwrap_that_drops_the_seccomp_filter_is_refused(tmp_path):
    """The self-test checks that the filter is in force: a bwrap ignoring ``--seccomp`` is no sandbox here."""
    real = shutil.which("bwrap") or "/usr/bin/bwrap"
    fake = tmp_path / "bwrap"
    fake.write_text(f'#!/bin/sh\n[ "$1" = --seccomp ] && shift 2\nexec {real} "$@"\n')
    fake.chmod(0o755)
    BubblewrapSandbox(bwrap=real, uid_base=UID_BASE + 16)  # the real one passes
    with pytest.raises(SandboxUnavailable, match="seccomp filter did not apply"):
        BubblewrapSandbox(bwrap=str(fake), uid_base=UID_BASE + 16)


KILLED = """
import sys
from troll.sandbox import BubblewrapSandbox, TestCase, TestSuite, score_completions
suite = TestSuite("call", [TestCase([], 1)], "f", timeout=20.0)
spin = '''```python
import signal, os
os.fork()
def f():
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        pass
```'''
sandbox = BubblewrapSandbox(uid_base=int(sys.argv[1]))
print("go", sandbox.uids[0].start, flush=True)
score_completions([spin, spin + " "], [suite, suite], sandbox=sandbox, slots=2)
"""


def test_sigkill_of_the_scorer_leaves_no_sandbox_process():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(UID_BASE)], stdout=subprocess.PIPE, env=env)
    try:
        go, base = proc.stdout.readline().split()
        assert go == b"go"
        base = int(base)
        deadline = time.monotonic() + 10
        while len(processes_of_uids(base, base + 32)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = descendants(proc.pid)
        assert processes_of_uids(base, base + 32), "no sandbox started"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and (_alive(tree) or processes_of_uids(base, base + 32)):
        time.sleep(0.05)
    assert not _alive(tree) and not processes_of_uids(base, base + 32)
    from troll.sandbox import cgroups

    killed = [uid for uid in cgroups.left_behind(cgroups.detect()) if base <= uid < base + 64]
    assert killed, "the killed scorer's runs had cgroups"
    BubblewrapSandbox(check=False)  # a new sandbox removes what a killed scorer left
    assert not [uid for uid in cgroups.left_behind(cgroups.detect()) if base <= uid < base + 64]


def _alive(pids: set[int]) -> set[int]:
    """The pids still running (a zombie has ended)."""
    return {pid for pid in pids if process_state(pid) not in ("Z", "")}
