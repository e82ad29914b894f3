"""Runs that wait without computing give their slot back: the rule on a stand-in cgroup, and in the real sandbox a
sleeping program no longer holds up the run queued behind it, while its new memory limit holds it to an eighth."""

from __future__ import annotations

import threading
import time

import pytest
from sandbox_hostile import ADD, adds, fenced

from troll.sandbox import BubblewrapSandbox, score_completions
from troll.sandbox import slots as slots_lib
from troll.sandbox.scoring import run_tests
from troll.sandbox.slots import IDLE, IdleWatch, Slots


class FakeCgroup:
    def __init__(self, memory=1 << 20, weight=True):
        self.ticks, self.memory, self.weight = {7: 10}, memory, weight
        self.calls = []

    def cpu_ticks(self):
        return dict(self.ticks)

    def memory_bytes(self):
        return self.memory

    def cap_memory(self, limit):
        self.calls.append(("cap", limit))
        return True

    def lower_weight(self):
        self.calls.append(("weight",))
        return self.weight


def _watch(cgroup, memory_limit=1 << 30, waiting=1):
    free = Slots(1)
    watch = IdleWatch(free.take(), memory_limit)
    watch.attach(cgroup)
    free.waiting = waiting  # runs waiting for a slot (as Slots.take counts them)
    return free, watch


def test_an_idle_run_gives_its_slot_back_after_capping_its_memory_and_weight():
    cgroup = FakeCgroup()
    free, watch = _watch(cgroup)
    watch.tick(0.0)
    watch.tick(IDLE - 0.01)
    assert watch.slot.held and not cgroup.calls  # not idle long enough
    watch.tick(IDLE + 0.01)
    assert not watch.slot.held and cgroup.calls == [("cap", (1 << 30) // 8), ("weight",)]
    assert free._free.acquire(blocking=False)  # the slot is free for the next run
    watch.slot.give_back()  # the run's end gives it back once only
    assert not free._free.acquire(blocking=False)


@pytest.mark.parametrize("case", ["computing", "big", "no cpu controller", "no cgroup", "nobody waiting"])
def test_a_run_keeps_its_slot_while_it_computes_holds_memory_or_cannot_be_weighted(case):
    cgroup = FakeCgroup(memory=(1 << 30) // 8 + 1 if case == "big" else 1 << 20, weight=case != "no cpu controller")
    free, watch = _watch(cgroup, waiting=0 if case == "nobody waiting" else 1)
    if case == "no cgroup":
        watch.cgroup = None
    for step in range(10):
        if case == "computing":
            cgroup.ticks[7] += 1
        watch.tick(step * IDLE)
    assert watch.slot.held
    assert case not in ("nobody waiting", "no cgroup", "computing") or not cgroup.calls  # left as it was


def test_slots_count_the_runs_waiting_for_one():
    free = Slots(1)
    first = free.take()
    waiter = threading.Thread(target=free.take)
    waiter.start()
    deadline = time.monotonic() + 5
    while not free.waiting and time.monotonic() < deadline:
        time.sleep(0.001)
    assert free.waiting == 1
    first.give_back()
    waiter.join(5)
    assert free.waiting == 0 and not waiter.is_alive()


@pytest.fixture(scope="module")
def sandbox():
    sandbox = BubblewrapSandbox()
    if sandbox.mode == "rlimits":
        pytest.fail(f"a cgroup mode is needed here, got rlimits ({sandbox.mode})")
    return sandbox


SLEEPER = "import time\ndef f(a, b):\n    time.sleep(100)\n    return a + b"
SLEEP_THEN_ALLOCATE = (
    "import time\ndef f(a, b):\n    time.sleep(0.6)\n    block = bytearray(400 << 20)\n    return a + b\n"
)


def test_a_sleeping_run_lets_the_next_one_start_before_it_ends(sandbox):
    """One slot: a program asleep in its first test (3 s allowed) and a correct one queued behind it; the correct
    one gets the slot once the sleeper has been idle, long before the sleeper's test is over."""
    free, times = Slots(1), {}

    def run(name, code):
        times[name] = (time.monotonic(), run_tests(sandbox, code, adds(timeout=3.0, n=1), slots=free),
                       time.monotonic())  # fmt: skip

    sleeper = threading.Thread(target=run, args=("sleeper", SLEEPER + "\n"))
    sleeper.start()
    time.sleep(0.05)  # the sleeper takes the slot first
    run("correct", ADD + "\n")
    sleeper.join()
    assert times["correct"][1].reward == 1.0 and times["sleeper"][1].reward == 0.0
    assert times["sleeper"][1].status == "timeout"
    assert times["correct"][2] < times["sleeper"][2] - 1.0, times  # done a second or more before the sleeper


def test_a_run_that_gave_its_slot_back_has_an_eighth_of_its_memory(sandbox):
    """Asleep long enough to give its slot back, then 400 MiB, over an eighth of the 1 GiB a run may hold: it fails;
    with a slot of its own to the end (one run, nothing waiting) the same program passes."""
    queued = [fenced(SLEEP_THEN_ALLOCATE), fenced(ADD)]
    got = score_completions(queued, [adds(timeout=3.0, n=1)] * 2, sandbox=sandbox, slots=1)
    assert got[1].reward == 1.0 and got[0].reward == 0.0, got
    alone = score_completions(queued[:1], [adds(timeout=3.0, n=1)], sandbox=sandbox, slots=1)[0]
    assert alone.reward == 1.0, alone
    assert slots_lib.IDLE < 0.6


def test_an_idle_program_alone_still_passes_when_it_is_fast_enough(sandbox):
    """Giving the slot back changes nothing for a program that sleeps within its time and needs little memory."""
    nap = "import time\ndef f(a, b):\n    time.sleep(0.5)\n    return a + b"
    assert score_completions([fenced(nap)], [adds(timeout=2.0, n=2)], sandbox=sandbox, slots=1)[0].reward == 1.0
