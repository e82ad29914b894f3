"""Attacks on the sandbox and on the scoring, run as completions in the real bubblewrap sandbox (one batch, several
slots). Each must score 0 (a Score, not None: the sandbox worked) and leave the host untouched: the canaries
unread and unchanged, no file created outside, no process left, no signal received, and loopback listeners on
the host that see nothing. The function's expected value is what a successful attack would return, so a leak
shows as a reward above 0."""

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
from sandbox_helpers import Recording, descendants, fenced, processes_of_uids

from troll.sandbox import BubblewrapSandbox, SandboxUnavailable, Score, TestCase, TestSuite, score_completions
from troll.sandbox.scoring import extract_program

ROOT = Path(__file__).resolve().parents[2]
TOKEN = secrets.token_hex(8)
UID_BASE = 3_000_000 + (os.getpid() % 10_000) * 64
ONE = TestSuite("call", [TestCase([], "escaped")], "f", timeout=1.0)
FORK_BOMB = """
import os
def f():
    while True:
        try:
            os.fork()
        except OSError:
            pass
"""
FAKE_RESULTS = r"""
import os
for fd in range(64):  # every descriptor, the result channel among them: a second report of test 0
    try:
        os.write(fd, b'{"case": 0, "value": "escaped"}\n{"done": 1}\n')
    except OSError:
        pass
print('{"case": 0, "value": "escaped"}')
def f():
    return 0
"""


def test_bubblewrap_is_installed():
    """A hard requirement of the suite (make installs it): never a skip."""
    assert shutil.which("bwrap") or os.path.exists("/usr/bin/bwrap"), "apt-get install -y bubblewrap"


def _attacks(paths: dict, tcp: int, udp: int) -> dict[str, tuple[str, TestSuite]]:
    host_pid = os.getpid()
    outside = [paths["home_mark"], paths["repo_mark"], paths["canary_home"], "/usr/x-" + TOKEN, "/x-" + TOKEN]
    return {
        "write_outside": (
            f"""
def f():
    hits = []
    for p in {outside!r} + ["/tmp/x-{TOKEN}"]:
        try:
            with open(p, "w") as fh:
                fh.write("x")
            hits.append(p)
        except OSError:
            pass
    return "escaped" if set(hits) - {{"/tmp/x-{TOKEN}"}} else "contained"
""",
            ONE,
        ),
        "read_home_checkout_env": (
            f"""
import os
found = []
for p in [{paths["canary_home"]!r}, {paths["canary_repo"]!r}, "/proc/1/environ", "/proc/self/environ"]:
    try:
        found.append(open(p, errors="replace").read())
    except OSError:
        pass
for d in [{str(Path.home())!r}, {str(ROOT)!r}]:
    try:
        found.extend(os.listdir(d))
    except OSError:
        pass
found.append(os.environ.get("TROLL_SANDBOX_CANARY", ""))
print("\\n".join(found))
""",
            TestSuite("stdio", [TestCase("", paths["secret"])], timeout=1.0),
        ),
        "network": (
            f"""
import socket
def f():
    hits = []
    for family, addr in [(socket.AF_INET, ("127.0.0.1", {tcp})), (socket.AF_INET, ("1.1.1.1", 53)),
                         (socket.AF_INET, ("8.8.8.8", 443)), (socket.AF_INET6, ("::1", {tcp}))]:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(0.3)
            s.connect(addr)
            hits.append(addr)
        except OSError:
            pass
    for addr in [("127.0.0.1", {udp}), ("1.1.1.1", 53)]:
        try:
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"ping", addr)
        except OSError:
            pass
    try:
        socket.getaddrinfo("example.com", 80)
        hits.append("dns")
    except OSError:
        pass
    return "escaped" if hits else "contained"
""",
            ONE,
        ),
        "kill_parent": (
            f"""
import os, signal
def f():
    for pid in [os.getppid(), 1, {host_pid}, {os.getppid()}]:
        for sig in (signal.SIGUSR1, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    return "contained"
""",
            ONE,
        ),
        "daemon": (
            f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for _ in range(200):
            for p in ["/tmp/daemon-{TOKEN}", {paths["repo_mark"]!r}]:
                try:
                    open(p, "w").close()
                except OSError:
                    pass
            time.sleep(0.05)
    os._exit(0)
def f():
    return "contained"
""",
            ONE,
        ),
        "fork_bomb": (FORK_BOMB, ONE),
        "while_true": ("def f():\n    while True:\n        pass", ONE),
        "while_true_no_alarm": (
            "import signal\ndef f():\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    while True:\n        pass",
            ONE,
        ),
        "alloc_4gb": ("def f():\n    x = bytearray(4 << 30)\n    return 'escaped'", ONE),
        "output_100mb": (
            "import sys\nsys.stdout.write('x' * (100 << 20))",
            TestSuite("stdio", [TestCase("", "x")], timeout=1.0),
        ),
        "stderr_100mb": ("import os\nfor _ in range(100):\n    os.write(2, b'y' * (1 << 20))\ndef f():\n    pass", ONE),
        "always_true_eq": (
            "class A:\n    def __eq__(self, other):\n        return True\ndef f():\n    return A()",
            ONE,
        ),
        "int_subclass_eq": (
            "class I(int):\n    def __eq__(self, other):\n        return True\ndef f():\n    return I(1)",
            ONE,
        ),
        "fake_results": (FAKE_RESULTS, ONE),
        "fake_results_stdio": (
            'print(\'{"case": 0, "stdout": "escaped", "timeout": false, "truncated": false}\')',
            TestSuite("stdio", [TestCase("", "escaped")], timeout=1.0),
        ),
        "sys_exit_first": ("import sys\nsys.exit(0)\ndef f():\n    return 'escaped'", ONE),
        "os_exit_first": ("import os\nos._exit(0)\ndef f():\n    return 'escaped'", ONE),
        "syntax_error": ("def f(:\n    return 'escaped'", ONE),
        "non_utf8_output": (
            "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe escaped\\n')",
            TestSuite("stdio", [TestCase("", "\ufffd\ufffd escaped")], timeout=1.0),
        ),
    }


STEPS = TestSuite("call", [TestCase([1], 2), TestCase([2], 3), TestCase([3], 4)], "f", timeout=1.0)
PATCHES = """
import builtins, json, json.encoder, os, sys
json.dumps = lambda *a, **k: '"escaped"'
json.loads = lambda *a, **k: {"case": 0, "value": 2}
json.encoder.encode_basestring_ascii = lambda s: '"escaped"'
builtins.print = lambda *a, **k: None
builtins.repr = lambda x: "2"
os.write = lambda fd, data: len(data)
sys.stdout = None
"""
# (code, suite, the exact Score): partial credit stops at the tests an exit or a patch ended, and no further
PARTIAL = {
    "os_exit_in_test_2": (
        "import os\ndef f(x):\n    if x == 2:\n        os._exit(0)\n    return x + 1",
        STEPS,
        (1, "crashed"),
    ),
    "sys_exit_in_test_2": (
        "def f(x):\n    if x == 2:\n        raise SystemExit(0)\n    return x + 1",
        STEPS,
        (2, "ok"),
    ),
    "patched_right": (PATCHES + "def f(x):\n    return x + 1", STEPS, (3, "ok")),
    "patched_wrong": (PATCHES + "def f(x):\n    return 0", STEPS, (0, "ok")),
    "unclosed_fence": (None, STEPS, (3, "ok")),
}


@pytest.fixture(scope="module")
def batch():
    """Run every attack in one batch (4 slots) with canaries, listeners and a SIGUSR1 trap in place; return the
    scores, the recording and what the host saw."""
    secret = "canary-" + TOKEN
    paths = {
        "secret": secret,
        "canary_home": str(Path.home() / f".troll-canary-{TOKEN}"),
        "canary_repo": str(ROOT / f".troll-canary-{TOKEN}"),
        "home_mark": str(Path.home() / f"x-{TOKEN}"),
        "repo_mark": str(ROOT / f"x-{TOKEN}"),
    }
    for key in ("canary_home", "canary_repo"):
        Path(paths[key]).write_text(secret)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    signals = []
    old = signal.signal(signal.SIGUSR1, lambda *a: signals.append(a))
    os.environ["TROLL_SANDBOX_CANARY"] = secret
    try:
        attacks = _attacks(paths, tcp.getsockname()[1], udp.getsockname()[1])
        names = list(attacks) + list(PARTIAL)
        completions = [fenced(code) for code, _ in attacks.values()]
        completions += [
            "```python\ndef f(x):\n    return x + 1\n" if c is None else fenced(c) for c, _, _ in PARTIAL.values()
        ]
        suites = [s for _, s in attacks.values()] + [s for _, s, _ in PARTIAL.values()]
        recording = Recording(BubblewrapSandbox(uid_base=UID_BASE))
        start = time.monotonic()
        scores = score_completions(completions, suites, sandbox=recording, slots=4)
        seconds = time.monotonic() - start
        deadline = time.monotonic() + 1.0
        while processes_of_uids(UID_BASE, UID_BASE + 64) and time.monotonic() < deadline:
            time.sleep(0.05)
        host = {
            "left": processes_of_uids(UID_BASE, UID_BASE + 64),
            "canaries": [Path(paths[k]).read_text() for k in ("canary_home", "canary_repo")],
            "created": [
                p
                for p in (paths["home_mark"], paths["repo_mark"], f"/tmp/x-{TOKEN}", f"/tmp/daemon-{TOKEN}")
                if os.path.exists(p)
            ],
            "signals": signals,
            "tcp": _accepted(tcp),
            "udp": _received(udp),
        }
    finally:
        os.environ.pop("TROLL_SANDBOX_CANARY", None)
        signal.signal(signal.SIGUSR1, old)
        tcp.close()
        udp.close()
        for key in ("canary_home", "canary_repo", "home_mark", "repo_mark"):
            Path(paths[key]).unlink(missing_ok=True)
    return dict(zip(names, scores)), recording, host, secret, seconds


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


ATTACKS = list(_attacks(dict.fromkeys(["canary_home", "canary_repo", "home_mark", "repo_mark", "secret"], ""), 0, 0))


@pytest.mark.parametrize("name", ATTACKS)
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
    assert secret.encode() not in recording.output(), "a canary leaked into the sandbox's output"


def test_statuses_and_limits(batch):
    scores, recording, _, _, seconds = batch
    assert scores["write_outside"] == Score(0, 1, 0.0, False, "ok")  # ran, and found every outside path closed
    assert scores["network"] == Score(0, 1, 0.0, False, "ok")
    assert scores["kill_parent"] == Score(0, 1, 0.0, False, "ok")
    assert scores["while_true"].status == "timeout"
    assert scores["while_true_no_alarm"].status in ("timeout", "crashed")  # the wall clock or RLIMIT_CPU
    assert scores["syntax_error"].status == "syntax_error"
    assert scores["sys_exit_first"].status == "no_entry_point"
    assert scores["os_exit_first"].status == "crashed"
    assert scores["stderr_100mb"].status == "output_limit"
    result, limits = recording.runs[extract_program(fenced(FORK_BOMB))]
    assert result.seconds <= limits.wall + 1.0, "the fork bomb outlived its wall-clock limit by over 1 s"
    assert all(len(r.stdout) <= 2 << 20 and len(r.stderr) <= 2 << 20 for r in recording.results)
    assert seconds < 30


@pytest.mark.parametrize("name", list(PARTIAL))
def test_partial_credit_stops_where_the_program_did(batch, name):
    passed, status = PARTIAL[name][2]
    assert batch[0][name] == Score(passed, 3, passed / 3, passed == 3, status)


def test_a_missing_bubblewrap_names_the_fix():
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        BubblewrapSandbox(bwrap="/nonexistent/bwrap")


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
print("go", flush=True)
score_completions([spin, spin + " "], [suite, suite], sandbox=BubblewrapSandbox(uid_base=int(sys.argv[1])), slots=2)
"""


def test_sigkill_of_the_scorer_leaves_no_sandbox_process():
    base = UID_BASE + 32
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(base)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"go\n"
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


def _alive(pids: set[int]) -> set[int]:
    """The pids still running (a zombie has ended)."""
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except OSError:
            pass
    return alive
