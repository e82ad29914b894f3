"""The run as the unit of limits, in the real bubblewrap sandbox: time kept by the scoring parent, memory bounded
for the whole run, uids unique across slots, sandboxes and processes, a slot's uid reused only once its run is
gone, a fair share of the CPU per run, the cost of a hostile completion capped, and the modes. Every correct
program beside the hostile ones must keep 1.0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from string import Template

import pytest
from sandbox_helpers import processes_of_uids
from sandbox_hostile import (
    CPU_BOUND,
    IGNORE_ALARM,
    MEMFD,
    SPINNERS,
    STOP_HARNESS,
    SUM,
    SWALLOW_ALARM,
    SYSV_SHM,
    TAKE_CHANNEL,
    adds,
    fenced,
    sums,
)

import troll
from troll.sandbox import BubblewrapSandbox, Limits, SandboxUnavailable, score_completions

ROOT = Path(__file__).resolve().parents[2]


def fill(code: str, **fields) -> str:
    return fenced(Template(code).substitute(**fields))


@pytest.fixture(scope="module")
def sandbox():
    return BubblewrapSandbox()


def test_the_mode_is_a_cgroup_here_and_can_be_required(sandbox):
    """On the test machines (root, or a delegated v2 subtree) every run gets a cgroup; requiring one then works."""
    assert sandbox.mode in ("cgroup-v1", "cgroup-v2")
    assert BubblewrapSandbox(require_cgroup=True, check=False).mode == sandbox.mode


def test_without_cgroups_the_mode_says_so_and_shared_memory_is_refused(monkeypatch):
    from troll.sandbox import cgroups as cgroups_module

    monkeypatch.setattr(cgroups_module, "detect", lambda: cgroups_module.Setup("rlimits", reason="none here"))
    with pytest.raises(SandboxUnavailable, match="none here.*Delegate=yes"):
        BubblewrapSandbox(require_cgroup=True, check=False)
    plain = BubblewrapSandbox()
    assert plain.mode == "rlimits"
    program = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.shmget(0, 4096, 0o1600), ctypes.get_errno())\n"
        "try:\n    os.memfd_create('x')\nexcept OSError as e:\n    print(e.errno)\n"
    )
    result = plain.run(program, b"", Limits(wall=10.0))
    assert result.stdout.split() == [b"-1", b"1", b"1"], result  # EPERM from the seccomp filter


CLOCK = {  # name: (program, suite, expected reward); the slow ones are over their time, the fast ones are not
    "ignore_alarm": (fill(IGNORE_ALARM, slow=1.3), adds(n=2), 0.0),
    "ignore_alarm_fast": (fill(IGNORE_ALARM, slow=0.0), adds(n=2), 1.0),
    "swallow_alarm": (fill(SWALLOW_ALARM, slow=1.3), adds(n=2), 0.0),
    "swallow_alarm_fast": (fill(SWALLOW_ALARM, slow=0.0), adds(n=2), 1.0),
    "take_channel": (fill(TAKE_CHANNEL, slow=1.3), sums(n=3), 0.0),
    "take_channel_fast": (fill(TAKE_CHANNEL, slow=0.0), sums(n=3), 1.0),
    "stop_harness": (fenced(STOP_HARNESS), sums(n=2), 1.0),
}


@pytest.fixture(scope="module")
def clock(sandbox):
    """Every program of CLOCK scored in one batch (4 slots): name -> Score."""
    scores = score_completions([c for c, _, _ in CLOCK.values()], [s for _, s, _ in CLOCK.values()],
                               sandbox=sandbox, slots=4)  # fmt: skip
    return dict(zip(CLOCK, scores))


@pytest.mark.parametrize("attack", ["ignore_alarm", "swallow_alarm"])
def test_a_test_over_its_time_fails_whatever_the_program_does_to_the_timer(clock, attack):
    assert clock[attack].reward == 0.0 and clock[attack].status == "timeout", clock[attack]
    assert clock[f"{attack}_fast"].reward == 1.0, clock[f"{attack}_fast"]  # the same program within its time


def test_a_stdio_program_cannot_take_the_harness_s_channel(clock):
    assert clock["take_channel"].reward == 0.0 and clock["take_channel"].status == "timeout", clock["take_channel"]
    assert clock["take_channel_fast"].reward == 1.0, clock["take_channel_fast"]


def test_a_stdio_program_cannot_stop_the_harness(clock):
    assert clock["stop_harness"].reward == 1.0 and clock["stop_harness"].status == "ok", clock["stop_harness"]


def test_memory_outside_the_per_process_limits_is_bounded_per_run(sandbox):
    """1.5 GiB of shared memory (SysV, or memfd from two processes; RLIMIT_AS counts neither) against the run's
    1 GiB: the run's cgroup stops both."""
    suite = adds(timeout=10.0, n=1)
    scores = score_completions([fenced(SYSV_SHM), fenced(MEMFD)], [suite, suite], sandbox=sandbox, slots=2)
    assert all(s is not None and s.reward == 0.0 for s in scores), scores


def test_a_uid_comes_back_only_once_its_run_is_gone(sandbox):
    """Runs that leave 30 spinning children alternate with correct stdio programs on one slot: each correct one
    forks its tests on a uid whose last run must be entirely gone, and none is left once scoring returns."""
    spin = fill(SPINNERS, hold=0.0)
    completions = [spin if i % 2 == 0 else fenced(SUM + f"\n# {i}") for i in range(6)]
    suites = [adds(n=1) if i % 2 == 0 else sums() for i in range(6)]
    scores = score_completions(completions, suites, sandbox=sandbox, slots=1)
    held = [uid for block in sandbox.uids for uid in block]
    assert processes_of_uids(min(held), max(held) + 1) == [], "processes of a run outlived it"
    assert [s.reward for s in scores[1::2]] == [1.0, 1.0, 1.0], scores


def test_two_sandboxes_in_one_process_hold_different_uids():
    a, b = BubblewrapSandbox(uid_base=2_500_000, check=False), BubblewrapSandbox(uid_base=2_500_000, check=False)
    a.run("pass", b"", Limits())
    b.run("pass", b"", Limits())
    assert a.uids and b.uids and not set(a.uids[0]) & set(b.uids[0])


SCORER = """
import json, sys
sys.path.insert(0, sys.argv[2])
from sandbox_hostile import ADD, SUM, adds, fenced, hostile_mix, sums
from troll.sandbox import BubblewrapSandbox, score_completions
sandbox = BubblewrapSandbox(uid_base=int(sys.argv[1]))
hostile = list(hostile_mix().values())[:4]
correct = [(fenced(ADD + f"\\n# {i} {sys.argv[3]}"), adds()) if i % 2 else (fenced(SUM + f"\\n# {i}"), sums())
           for i in range(12)]
batch = correct[:6] + hostile + correct[6:]
print("go", flush=True)
sys.stdin.readline()
scores = score_completions([c for c, _ in batch], [s for _, s in batch], sandbox=sandbox, slots=2)
print(json.dumps([None if s is None else [s.reward, s.status] for s in scores]))
"""


def test_two_scorers_and_a_hostile_quarter_leave_every_correct_program_at_one():
    """Two processes score at once, asking for the same uids; a quarter of each batch is hostile (timers switched
    off, shared memory, a stolen channel, spinning children). Every correct program of both scores 1.0."""
    env = {**os.environ, "PYTHONPATH": str(Path(troll.__file__).parents[1])}  # the troll under test
    support = str(ROOT / "tests" / "support")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCORER, "2600000", support, str(k)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )  # fmt: skip
        for k in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline() == b"go\n"
        for proc in procs:
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        results = [json.loads(proc.communicate(timeout=120)[0]) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for scores in results:
        correct = scores[:6] + scores[10:]
        assert all(s == [1.0, "ok"] for s in correct), scores
        assert all(s is not None and s[0] == 0.0 for s in scores[6:10]), scores


def test_a_noisy_neighbour_does_not_starve_a_run(sandbox):
    """30 spinning children in sessions of their own in one run; a CPU-bound correct program in the other slot
    still gets its share (its cgroup's) and passes within its time."""
    noisy = fill(SPINNERS, hold=0.5)
    work = fenced(Template(CPU_BOUND).substitute(work=2_000_000))
    scores = score_completions([noisy, work], [adds(n=3), adds(timeout=1.0, n=3)], sandbox=sandbox, slots=2)
    assert scores[1].reward == 1.0, scores[1]


HEAVY = """
import time
def f(a, b):
    start = time.process_time()
    while time.process_time() - start < 0.75:
        pass
    return a + b
"""
THREADED = """
import threading, time
def f(a, b):
    def work():
        start = time.process_time()
        while time.process_time() - start < 0.75:
            pass
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    return a + b
"""
SPIN = "def f(a, b):\n    while True:\n        pass"


def test_correct_programs_get_their_time_beside_runs_that_take_the_cpu(sandbox):
    """Four slots on the two CPUs of the test machines: three functions that each need 0.75 s of CPU (one in a
    thread of its own) and one that spins share them, so each gets about half a core and takes well over its 1 s
    test in wall time; the three still pass (a test's time leaves out what its run lacked of a CPU), the spinning
    one still fails, within its run's wall limit."""
    start = time.monotonic()
    scores = score_completions([fenced(HEAVY), fenced(HEAVY + " "), fenced(THREADED), fenced(SPIN)],
                               [adds(timeout=1.0, n=1)] * 4, sandbox=sandbox, slots=4)  # fmt: skip
    took = time.monotonic() - start
    assert [s.reward for s in scores] == [1.0, 1.0, 1.0, 0.0], scores
    assert scores[3].status == "timeout" and took < 6.0, (scores[3], took)


def test_a_stdio_program_s_compilation_is_not_its_first_test_s_time(sandbox):
    """A program whose source takes a while to compile (a long literal) and whose first test needs most of its
    time: the compilation is timed as the program's load, not as part of the test."""
    table = "TABLE = [" + ", ".join(str(i) for i in range(150_000)) + "]\n"
    work = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.8:\n    pass\n"
    score = score_completions([fenced(table + work + SUM)], [sums(timeout=1.0, n=1)], sandbox=sandbox)[0]
    assert score.reward == 1.0, score


def test_a_hostile_completion_costs_at_most_one_test_s_time():
    """Timers switched off on the first of 10 tests: the parent ends the run at that test's time and a grace,
    not at 10 tests' time; a slow honest program stops at the per-completion budget."""
    sandbox = BubblewrapSandbox()
    suite = adds(timeout=0.5, n=10)
    start = time.monotonic()
    scores = score_completions([fill(IGNORE_ALARM, slow=100.0), fill(IGNORE_ALARM, slow=100.0) + " "],
                               [suite, suite], sandbox=sandbox, slots=2)  # fmt: skip
    assert time.monotonic() - start < 2.5 and all(s.reward == 0.0 for s in scores)
    steady = fill(IGNORE_ALARM, slow=0.3)
    start = time.monotonic()
    score = score_completions([steady], [suite], sandbox=sandbox, budget=1.0)[0]
    assert time.monotonic() - start < 2.0
    assert 1 <= score.passed <= 3 and score.status == "timeout", score
