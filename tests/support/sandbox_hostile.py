"""Programs that game the scoring or load the host, and the correct programs that must keep 1.0 beside them (the
tests of tests/sandbox/test_bubblewrap_limits.py).

Each hostile program is a completion whose honest score is 0: it is too slow, or asks for more than the limits,
so a reward above 0 means it got past them."""

from __future__ import annotations

from troll.sandbox import TestCase, TestSuite


def fenced(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def adds(timeout: float = 1.0, n: int = 3) -> TestSuite:
    """f(a, b) = a + b on ``n`` tests."""
    return TestSuite("call", [TestCase([i, i + 1], 2 * i + 1) for i in range(n)], "f", timeout=timeout)


def sums(timeout: float = 1.0, n: int = 3) -> TestSuite:
    """stdin "a b" -> stdout a + b on ``n`` tests."""
    return TestSuite("stdio", [TestCase(f"{i} {i + 7}\n", f"{2 * i + 7}\n") for i in range(n)], timeout=timeout)


ADD = "def f(a, b):\n    return a + b"
SUM = "a, b = map(int, input().split())\nprint(a + b)"

# -- the time limit is the program's to switch off
IGNORE_ALARM = """
import signal, time
def f(a, b):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep($slow)
    return a + b
"""
SWALLOW_ALARM = """
import time
def f(a, b):
    try:
        time.sleep($slow)
    except BaseException:
        time.sleep($slow)
    return a + b
"""
# a stdio test's child stops the harness, takes its result channel and reports every test itself
TAKE_CHANNEL = r"""
import ctypes, gc, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
parent, taken = os.getppid(), []
try:
    pidfd = os.pidfd_open(parent)
    for fd in range(3, 12):
        got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
        if got >= 0:
            taken.append(got)
except OSError:
    pass
for fd in range(3, 12):
    try:
        taken.append(os.open(f"/proc/{parent}/fd/{fd}", os.O_WRONLY))
    except OSError:
        pass
if taken:
    os.kill(parent, signal.SIGSTOP)
    inputs = [o["inputs"] for o in gc.get_objects() if type(o) is dict and "inputs" in o and "kind" in o]
    lines = []
    for i, text in enumerate(inputs[0] if inputs else []):
        a, b = map(int, text.split())
        lines.append('{"case": %d, "stdout": "%d\\n", "timeout": false, "truncated": false}' % (i, a + b))
    data = ("\n".join(lines + ['{"done": 1}']) + "\n").encode()
    for fd in taken:
        try:
            os.write(fd, data)
        except OSError:
            pass
    os.kill(parent, signal.SIGKILL)
time.sleep($slow)
a, b = map(int, input().split())
print(a + b)
"""
# a stdio test's program that tries every way to stop the harness, then answers: it must still count
STOP_HARNESS = """
import os, signal
for target in (os.getppid(), 2, 1, -1):
    try:
        os.kill(target, signal.SIGSTOP)
    except OSError:
        pass
try:
    os.setpgid(0, 1)
    os.kill(0, signal.SIGSTOP)
except OSError:
    pass
a, b = map(int, input().split())
print(a + b)
"""
# -- memory outside every per-process limit: 1.5 GiB of SysV shared memory, or of memfd files from two processes
SYSV_SHM = """
import ctypes
def f(a, b):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    size = 1 << 29
    for _ in range(3):  # each segment attached, filled and detached: it lives on outside the address space
        shmid = libc.shmget(0, ctypes.c_size_t(size), 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
        if shmid < 0:
            return 0
        address = libc.shmat(shmid, None, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return 0
        ctypes.memset(address, 1, size)
        libc.shmdt(ctypes.c_void_p(address))
    return a + b
"""
MEMFD = """
import os
def f(a, b):
    pid, held, block = os.fork(), [], b"x" * (15 << 20)
    try:
        for _ in range(52):  # 780 MiB in each of two processes: under RLIMIT_NOFILE x RLIMIT_FSIZE
            fd = os.memfd_create("x")
            os.write(fd, block)
            held.append(fd)
    except OSError:
        if pid == 0:
            os._exit(1)
        return 0
    if pid == 0:
        os._exit(0)
    return a + b if os.waitpid(pid, 0)[1] == 0 else 0
"""
# -- processes: 30 children that spin on, in sessions of their own, after the program has reported
SPINNERS = """
import os, time
for _ in range(30):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
def f(a, b):
    time.sleep($hold)
    return -1
"""
CPU_BOUND = """
def f(a, b):
    total = 0
    for i in range($work):
        total += i % 7
    return a + b if total >= 0 else 0
"""


def hostile_mix(slow: float = 1.5) -> dict[str, tuple[str, TestSuite]]:
    """The hostile quarter of a batch: (completion, suite) by name, each scoring 0 when the limits hold."""
    from string import Template

    def fill(code: str) -> str:
        return fenced(Template(code).substitute(slow=slow, hold=0.5))

    return {
        "ignore_alarm": (fill(IGNORE_ALARM), adds()),
        "swallow_alarm": (fill(SWALLOW_ALARM), adds()),
        "take_channel": (fill(TAKE_CHANNEL), sums()),
        "sysv_shm": (fill(SYSV_SHM), adds()),
        "memfd": (fill(MEMFD), adds()),
        "spinners": (fill(SPINNERS), adds()),
    }
