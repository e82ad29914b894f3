"""What the sandbox tests share: a recording wrapper around a backend, fenced completions, and a view of the
processes a sandbox may leave behind."""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING

from troll.sandbox import Limits, RunResult, Sandbox

if TYPE_CHECKING:
    from troll.sandbox import Watch


class Recording(Sandbox):
    """Delegates to ``inner`` and keeps every run's result (to count runs and to search their output)."""

    def __init__(self, inner: Sandbox):
        self.inner = inner
        self.results: list[RunResult] = []
        self.runs: dict[str, tuple[RunResult, Limits]] = {}  # the model's program -> its run
        self._lock = threading.Lock()

    def run(self, program: str, stdin: bytes, limits: Limits, watch: Watch | None = None) -> RunResult:
        result = self.inner.run(program, stdin, limits, watch=watch)
        with self._lock:
            self.results.append(result)
            self.runs[json.loads(stdin.split(b"\n", 1)[0])["program"]] = (result, limits)
        return result

    def output(self) -> bytes:
        return b"".join(r.stdout + r.stderr for r in self.results)


def fenced(code: str, tag: str = "python") -> str:
    """A completion with ``code`` in a fenced block, some prose around it."""
    return f"Here is my solution.\n```{tag}\n{code.strip()}\n```\nIt should work."


def processes_of_uids(lo: int, hi: int) -> list[int]:
    """Pids of the processes whose real uid is in [lo, hi) (the slots' uids when the sandbox runs as root)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if lo <= uid < hi:
            found.append(int(entry))
    return found


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (by the PPid chain in /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found
