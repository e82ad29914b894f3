"""The attack programs of tests/sandbox/test_attacks.py, as templates: ``$name`` fields are filled in per run
(canary paths, the host's listener ports and pid, a random token). In call style the function ``f`` returns
"escaped" only if the attack worked, which is the expected value: a working attack scores above 0."""

from __future__ import annotations

from string import Template

from troll.sandbox import TestCase, TestSuite

ONE = TestSuite("call", [TestCase([], "escaped")], "f", timeout=1.0)


def stdio(expected: str) -> TestSuite:
    return TestSuite("stdio", [TestCase("", expected)], timeout=1.0)


WRITE_OUTSIDE = """
def f():
    hits = []
    for p in $outside + ["/tmp/x-$token"]:
        try:
            with open(p, "w") as fh:
                fh.write("x")
            hits.append(p)
        except OSError:
            pass
    return "escaped" if set(hits) - {"/tmp/x-$token"} else "contained"
"""
READ_SECRETS = """
import os
found = []
for p in [$canary_home, $canary_repo, "/proc/1/environ", "/proc/self/environ"]:
    try:
        found.append(open(p, errors="replace").read())
    except OSError:
        pass
for d in [$home, $root]:
    try:
        found.extend(os.listdir(d))
    except OSError:
        pass
found.append(os.environ.get("TROLL_SANDBOX_CANARY", ""))
print("\\n".join(found))
"""
NETWORK = """
import socket
def f():
    hits = []
    for family, addr in [(socket.AF_INET, ("127.0.0.1", $tcp)), (socket.AF_INET, ("1.1.1.1", 53)),
                         (socket.AF_INET, ("8.8.8.8", 443)), (socket.AF_INET6, ("::1", $tcp))]:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(0.3)
            s.connect(addr)
            hits.append(addr)
        except OSError:
            pass
    for addr in [("127.0.0.1", $udp), ("1.1.1.1", 53)]:
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
"""
KILL_PARENT = """
import os, signal
def f():
    for pid in [os.getppid(), 1, $host_pid, $host_ppid]:
        for sig in (signal.SIGUSR1, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    return "contained"
"""
DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for _ in range(200):
            for p in ["/tmp/daemon-$token", $repo_mark]:
                try:
                    open(p, "w").close()
                except OSError:
                    pass
            time.sleep(0.05)
    os._exit(0)
def f():
    return "contained"
"""
FORK_BOMB = """
import os
def f():
    while True:
        try:
            os.fork()
        except OSError:
            pass
"""
WHILE_TRUE = "def f():\n    while True:\n        pass"
WHILE_TRUE_NO_ALARM = """
import signal
def f():
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
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
ATTACKS = {
    "write_outside": (WRITE_OUTSIDE, ONE),
    "read_home_checkout_env": (READ_SECRETS, stdio("$secret")),
    "network": (NETWORK, ONE),
    "kill_parent": (KILL_PARENT, ONE),
    "daemon": (DAEMON, ONE),
    "fork_bomb": (FORK_BOMB, ONE),
    "while_true": (WHILE_TRUE, ONE),
    "while_true_no_alarm": (WHILE_TRUE_NO_ALARM, ONE),
    "alloc_4gb": ("def f():\n    x = bytearray(4 << 30)\n    return 'escaped'", ONE),
    "output_100mb": ("import sys\nsys.stdout.write('x' * (100 << 20))", stdio("x")),
    "stderr_100mb": ("import os\nfor _ in range(100):\n    os.write(2, b'y' * (1 << 20))\ndef f():\n    pass", ONE),
    "always_true_eq": ("class A:\n    def __eq__(self, other):\n        return True\ndef f():\n    return A()", ONE),
    "int_subclass_eq": (
        "class I(int):\n    def __eq__(self, other):\n        return True\ndef f():\n    return I(1)",
        ONE,
    ),
    "fake_results": (FAKE_RESULTS, ONE),
    "fake_results_stdio": (
        'print(\'{"case": 0, "stdout": "escaped", "timeout": false, "truncated": false}\')',
        stdio("escaped"),
    ),
    "sys_exit_first": ("import sys\nsys.exit(0)\ndef f():\n    return 'escaped'", ONE),
    "os_exit_first": ("import os\nos._exit(0)\ndef f():\n    return 'escaped'", ONE),
    "syntax_error": ("def f(:\n    return 'escaped'", ONE),
    # the replacement characters a lenient decoding of the bytes would give
    "non_utf8_output": ("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe escaped\\n')", stdio("\ufffd\ufffd escaped")),
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
# name -> (completion, the passed count and status it must score on STEPS): credit stops where the program did
PARTIAL = {
    "os_exit_in_test_2": (
        "```python\nimport os\ndef f(x):\n    if x == 2:\n        os._exit(0)\n    return x + 1\n```",
        (1, "crashed"),
    ),
    "sys_exit_in_test_2": (
        "```python\ndef f(x):\n    if x == 2:\n        raise SystemExit(0)\n    return x + 1\n```",
        (2, "ok"),
    ),
    "patched_right": (f"```python\n{PATCHES}\ndef f(x):\n    return x + 1\n```", (3, "ok")),
    "patched_wrong": (f"```python\n{PATCHES}\ndef f(x):\n    return 0\n```", (0, "ok")),
    "unclosed_fence": ("Here it is:\n```python\ndef f(x):\n    return x + 1\n", (3, "ok")),
}


def attacks(fields: dict) -> dict[str, tuple[str, TestSuite]]:
    """Every attack's program with ``fields`` filled in (strings are written as Python literals), and its suite."""
    values = {k: v if isinstance(v, int) else repr(v) for k, v in fields.items()}
    values["token"] = fields["token"]
    out = {}
    for name, (code, suite) in ATTACKS.items():
        if suite.kind == "stdio" and suite.cases[0].expected == "$secret":
            suite = stdio(fields["secret"])
        out[name] = (Template(code).substitute(values), suite)
    return out
