"""How many runs use the CPU at once: ``slots`` of them, and a run that has been idle gives its slot back.

A run that waits without computing (a program asleep past its test's time, or one that swallowed its timer's
exception and sleeps again) would otherwise hold its slot until the scorer's clock ends it, and a few such
completions in a batch would stall the honest ones behind them. :class:`IdleWatch` sees that none of the run's
processes has used the CPU for :data:`IDLE` seconds and that it holds little memory; while another run waits for a
slot, it then lowers the run's memory limit to an eighth, gives it the smallest CPU weight of its cgroup and its
slot to the next run. The run goes on under the same clock: its tests still fail or pass by the time they take,
and if it wakes up to compute, the runs holding slots come first, so it cannot take their CPU. At most ``slots``
runs hold a slot and at most ``IDLE_RUNS * slots`` more have given theirs back
(:func:`troll.sandbox.scoring.score_completions` runs that many threads), so all runs together hold at most 1.5
times the memory of ``slots`` runs.

The cost falls on a program that sleeps for :data:`IDLE` seconds within a test while other runs wait, and then needs
more than an eighth of its memory or CPU that the runs with slots are using: it may fail where it would have passed
alone (a run with nobody waiting keeps its slot).

Only a run in a cgroup with a cpu controller gives its slot back; in the ``rlimits`` mode a run holds its slot to
the end.
"""

from __future__ import annotations

import threading

IDLE = 0.3  # seconds without CPU time in any of a run's processes before it gives its slot back
POLL = 0.05  # seconds between looks at an idle candidate's CPU time
IDLE_MEMORY_SHARE = 8  # a run gives its slot back while it holds at most 1/8 of its memory limit, its new limit
IDLE_RUNS = 4  # runs that gave their slot back, at most, per slot: all of them hold at most 4/8 = half of the memory
# of the runs with a slot


class Slots:
    """``n`` slots; :meth:`take` waits for one, and :attr:`waiting` counts the runs waiting."""

    def __init__(self, n: int):
        self.n = n
        self._free = threading.Semaphore(n)
        self._lock = threading.Lock()
        self.waiting = 0

    def take(self) -> Slot:
        with self._lock:
            self.waiting += 1
        try:
            self._free.acquire()
        finally:
            with self._lock:
                self.waiting -= 1
        return Slot(self)


class Slot:
    """One slot of ``slots``, held until :meth:`give_back` (which may be called again, from any thread)."""

    def __init__(self, slots: Slots):
        self.slots, self._lock, self.held = slots, threading.Lock(), True

    def give_back(self) -> None:
        with self._lock:
            if self.held:
                self.held = False
                self.slots._free.release()


class IdleWatch:
    """Gives ``slot`` back, while another run waits for one, once the run's cgroup (:meth:`attach`) has used no CPU
    for :data:`IDLE` seconds while
    holding at most ``memory_limit / IDLE_MEMORY_SHARE`` bytes, after lowering its memory limit to that and its
    CPU weight to the smallest (:meth:`tick`)."""

    def __init__(self, slot: Slot, memory_limit: int):
        self.slot, self.memory = slot, memory_limit // IDLE_MEMORY_SHARE
        self.cgroup = None
        self.ticks: dict[int, int] | None = None
        self.since = 0.0  # when the CPU time last changed

    def attach(self, cgroup) -> None:
        self.cgroup = cgroup

    def tick(self, now: float) -> None:
        if self.cgroup is None or not self.slot.held:
            return
        if not self.slot.slots.waiting:  # nobody to give it to: the run keeps its slot, its memory and weight
            self.ticks = None
            return
        try:
            ticks = self.cgroup.cpu_ticks()
        except OSError:
            return
        if ticks != self.ticks:
            self.ticks, self.since = ticks, now
            return
        if now - self.since < IDLE:
            return
        try:
            small = self.cgroup.memory_bytes() <= self.memory
        except (OSError, ValueError):
            return
        if small and self.cgroup.cap_memory(self.memory) and self.cgroup.lower_weight():
            self.slot.give_back()
