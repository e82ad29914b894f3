"""Scoring completions by running tests in the sandbox: the program of a completion, the tests of a task, the score.

One sandboxed run per distinct (program, tests) pair runs all its tests (at most ``max_tests``) through the harness
(``_harness.py``); the harness reports values and the parent compares them here, so expected outputs never enter
the sandbox. reward = passed / total over the first ``max_tests`` tests; a failure of the model's code is a Score of
0, a failure of the sandbox itself is ``None`` (unscorable, as TRL's reward functions may return).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from troll.sandbox import cgroups
from troll.sandbox.backend import Limits, Sandbox, SandboxError, Watch
from troll.sandbox.slots import IDLE_RUNS, POLL, IdleWatch, Slots

KINDS = ("call", "stdio")
HARNESS = (Path(__file__).parent / "_harness.py").read_text()
STARTUP = 2.0  # seconds of wall time a run gets for starting the sandbox and the interpreter, besides the tests
GRACE = 0.25  # seconds the harness has after the last test to report that it is done; in the run's wall limit
SLACK = 0.05  # seconds past a stdio test's time its report may arrive: the harness reaps the program, then reports
BUDGET = 6.0  # default seconds of wall time one completion's run may take in all, startup included
OUTPUT = 1 << 20  # default bytes of stdout per stdio test, or of one return value
MAX_OUTPUT = 16 << 20
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[ \t]*$")
_PYTHON_TAGS = ("", "python", "python3", "py", "py3")


def extract_program(completion: str) -> str | None:
    """The code of the last fenced block (```python, ```py or a bare ```) of ``completion``; an unclosed last
    fence gives the text after it. ``None`` when there is no such block or it holds only whitespace."""
    blocks, current = [], None
    for line in completion.splitlines():
        match = _FENCE.match(line)
        if current is None:
            if match:
                current = [] if match.group(1).lower() in _PYTHON_TAGS else "other"
                current = current if current == "other" else []
        elif match and not match.group(1):
            if current != "other":
                blocks.append("\n".join(current))
            current = None
        elif current != "other":
            current.append(line)
    if isinstance(current, list):
        blocks.append("\n".join(current))
    code = blocks[-1] if blocks else None
    return code + "\n" if code and code.strip() else None


@dataclass(frozen=True)
class TestCase:
    """One test. kind "call": ``input`` the positional arguments (a list or tuple of JSON values; the function gets
    lists for tuples), ``expected`` the JSON value the call must return. kind "stdio": ``input`` the text on stdin,
    ``expected`` the text on stdout (compared line by line, trailing whitespace and trailing empty lines ignored)."""

    __test__ = False  # not a pytest class
    input: Any
    expected: Any

    def __hash__(self) -> int:
        return hash(json.dumps([self.input, self.expected], sort_keys=True))


@dataclass(frozen=True)
class TestSuite:
    """The tests of one task: ``kind`` "call" (``entry_point`` names the function) or "stdio" (whole programs);
    ``timeout`` seconds of wall and CPU time per test; ``output`` the bytes of stdout a stdio test may print or the
    size of one return value (call): more fails the test."""

    __test__ = False
    kind: str
    cases: tuple[TestCase, ...]
    entry_point: str | None = None
    timeout: float = 1.0
    output: int = OUTPUT
    _key: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"TestSuite.kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.cases, (tuple, list)) or not self.cases:
            raise ValueError(f"TestSuite.cases must be a non-empty tuple of TestCase, got {self.cases!r}")
        object.__setattr__(self, "cases", tuple(self.cases))
        for i, case in enumerate(self.cases):
            _check_case(self.kind, i, case)
        if self.kind == "call" and not (isinstance(self.entry_point, str) and self.entry_point.isidentifier()):
            raise ValueError(f"TestSuite.entry_point must name the function for kind 'call', got {self.entry_point!r}")
        if self.kind == "stdio" and self.entry_point is not None:
            raise ValueError("TestSuite.entry_point must be None for kind 'stdio' (the program reads stdin)")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not 0 < self.timeout <= 60:
            raise ValueError(f"TestSuite.timeout must be seconds per test in (0, 60], got {self.timeout!r}")
        if isinstance(self.output, bool) or not isinstance(self.output, int) or not 0 < self.output <= MAX_OUTPUT:
            raise ValueError(f"TestSuite.output must be bytes in (0, 16 MiB], got {self.output!r}")
        cases = [[c.input, c.expected] for c in self.cases]
        key = [self.kind, self.entry_point, self.timeout, self.output, cases]
        object.__setattr__(self, "_key", json.dumps(key, sort_keys=True))

    def __hash__(self) -> int:
        return hash(self._key)


def _check_case(kind: str, i: int, case: TestCase) -> None:
    where = f"TestSuite.cases[{i}]"
    if not isinstance(case, TestCase):
        raise ValueError(f"{where} must be a TestCase, got {type(case).__name__}")
    if kind == "stdio":
        for name in ("input", "expected"):
            value = getattr(case, name)
            if not isinstance(value, str):
                raise ValueError(f"{where}.{name} must be a str for kind 'stdio', got {value!r}")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(f"{where}.{name} must be text that UTF-8 can encode: {err}") from err
        return
    if not isinstance(case.input, (list, tuple)):
        raise ValueError(f"{where}.input must be the list of positional arguments for kind 'call', got {case.input!r}")
    for name in ("input", "expected"):
        problem = _not_json(getattr(case, name))
        if problem:
            raise ValueError(
                f"{where}.{name} must be JSON (lists, dicts with str keys, str, numbers, bool, None): {problem}"
            )


def _not_json(value: Any, depth: int = 0) -> str:
    """Why ``value`` does not survive a JSON round trip unchanged (tuples count as lists), or "" if it does."""
    if depth > 100:
        return "nested over 100 deep"
    if value is None or isinstance(value, (bool, int, str)):
        return "" if type(value) in (type(None), bool, int, str) else f"a {type(value).__name__}"
    if type(value) is float:
        return "" if math.isfinite(value) else f"{value} is not finite"
    if type(value) in (list, tuple):
        return next((p for p in (_not_json(v, depth + 1) for v in value) if p), "")
    if type(value) is dict:
        if not all(type(k) is str for k in value):
            return "a dict key is not a str"
        return next((p for p in (_not_json(v, depth + 1) for v in value.values()) if p), "")
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class Score:
    """The result of one completion: ``passed`` of ``total`` tests (the first ``max_tests``), ``reward`` =
    passed / total, ``all_passed``, and ``status``: "ok" (ran; its tests passed or failed), "no_code",
    "syntax_error", "no_entry_point", "timeout" (the run or a test hit its time limit), "output_limit",
    "crashed" (the run ended before all tests reported, e.g. ``os._exit`` or memory)."""

    passed: int
    total: int
    reward: float
    all_passed: bool
    status: str

    @classmethod
    def of(cls, passed: int, total: int, status: str) -> Score:
        return cls(passed, total, passed / total, passed == total, status)


def report_bytes(suite: TestSuite) -> int:
    """The longest line the harness writes for one test: its output (stdout, or a return value) JSON-escaped, at
    most 6 bytes a byte, and the rest of the line."""
    return 6 * suite.output + 256


def limits_for(suite: TestSuite, n: int, budget: float = BUDGET) -> Limits:
    """The limits of one run of ``n`` tests: wall = the smaller of ``budget`` and STARTUP + (n + 1) * timeout +
    GRACE (the module's load counts as a test's time), CPU per process the same rounded up (RLIMIT_CPU), room on
    the result channel for every test's output JSON-escaped, the other limits at :class:`Limits`' defaults."""
    wall = min(budget, STARTUP + (n + 1) * suite.timeout + GRACE)
    return Limits(wall=wall, cpu=math.ceil(wall) + 1, output=max(1 << 20, n * report_bytes(suite) + 4096))


def score_completions(
    completions: list[str],
    suites: list[TestSuite],
    *,
    sandbox: Sandbox | None = None,
    slots: int = 2,
    max_tests: int = 10,
    budget: float = BUDGET,
) -> list[Score | None]:
    """Score each completion against its suite (``suites[i]`` for ``completions[i]``): one sandboxed run per
    distinct (program, suite) pair, ``slots`` runs at a time (and as many more that have been idle and gave their
    slot back: :mod:`troll.sandbox.slots`), each at most ``budget`` seconds in all (tests that have not reported by
    then fail). ``None`` where the sandbox itself failed. ``sandbox=None`` uses a shared
    :class:`BubblewrapSandbox` (raises SandboxUnavailable where none works)."""
    if len(completions) != len(suites):
        raise ValueError(f"completions and suites must have one entry each, got {len(completions)} and {len(suites)}")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be a positive int (parallel sandbox runs), got {slots!r}")
    if isinstance(max_tests, bool) or not isinstance(max_tests, int) or max_tests < 1:
        raise ValueError(f"max_tests must be a positive int, got {max_tests!r}")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 600:
        raise ValueError(f"budget must be seconds in (0, 600] per completion, got {budget!r}")
    for i, (c, s) in enumerate(zip(completions, suites)):
        if not isinstance(c, str):
            raise ValueError(f"completions[{i}] must be a str, got {type(c).__name__}")
        if not isinstance(s, TestSuite):
            raise ValueError(f"suites[{i}] must be a TestSuite, got {type(s).__name__}")
    programs = [extract_program(c) for c in completions]
    jobs: dict[tuple[str, str], tuple[str, TestSuite]] = {}
    for program, suite in zip(programs, suites):
        if program is not None:
            jobs.setdefault((program, suite._key), (program, suite))
    if jobs and sandbox is None:
        sandbox = default_sandbox()
    free = Slots(slots)
    with ThreadPoolExecutor(max_workers=min((1 + IDLE_RUNS) * slots, max(1, len(jobs)))) as pool:
        scored = pool.map(
            lambda job: run_tests(sandbox, *job, max_tests=max_tests, budget=budget, slots=free), jobs.values()
        )
        done = dict(zip(jobs, scored))
    return [
        Score.of(0, min(len(s.cases), max_tests), "no_code") if p is None else done[(p, s._key)]
        for p, s in zip(programs, suites)
    ]


@functools.cache
def _takes_watch(backend: type) -> bool:
    return "watch" in inspect.signature(backend.run).parameters


@functools.lru_cache(maxsize=1)
def default_sandbox() -> Sandbox:
    from troll.sandbox.bubblewrap import BubblewrapSandbox

    return BubblewrapSandbox()


def run_tests(
    sandbox: Sandbox,
    program: str,
    suite: TestSuite,
    *,
    max_tests: int = 10,
    budget: float = BUDGET,
    slots: Slots | None = None,
) -> Score | None:
    """One sandboxed run of ``program`` on the first ``max_tests`` tests of ``suite``, at most ``budget`` seconds,
    in one of ``slots`` (held from start to end, or until the run has been idle a while); ``None`` if the sandbox
    failed (it raised, or the harness never reported ready)."""
    cases = suite.cases[:max_tests]
    limits = limits_for(suite, len(cases), budget)
    watched = _takes_watch(type(sandbox))
    header = {
        "kind": suite.kind,
        "program": program,
        "entry_point": suite.entry_point,
        "n": len(cases),
        # the harness's own timers: a courtesy where the parent's clock watches the run (a test's time may then be
        # longer than its timeout by what the run lacked of a CPU), the only per-test clock where it cannot
        "timeout": limits.wall if watched else suite.timeout,
        "output": suite.output,
        "rlimits": limits.rlimits(),
    }
    job = [json.dumps(header).encode(), b"\n"]
    if suite.kind == "call":
        header["inputs"] = [c.input for c in cases]
        job[0] = json.dumps(header).encode()
    else:
        for case in cases:
            data = case.input.encode("utf-8")
            job += [str(len(data)).encode(), b"\n", data]
    slot = slots.take() if slots is not None else None
    idle = IdleWatch(slot, limits.run_memory) if slot is not None else None
    clock = CaseClock(suite.kind, len(cases), suite.timeout, idle=idle, line_max=report_bytes(suite))
    try:
        if watched:
            result = sandbox.run(HARNESS, b"".join(job), limits, watch=clock)
        else:  # a backend without a watch: the reports are timed as they come back, all at once
            result = sandbox.run(HARNESS, b"".join(job), limits)
            clock.feed(result.stdout, time.monotonic())
    except SandboxError:
        return None
    finally:
        if slot is not None:
            slot.give_back()
    return _judge(result, clock, suite, cases)


class CaseClock(Watch):
    """The parent's clock over a run's reports. Test i starts when the report of test i - 1 first arrives (test 0:
    when the program has loaded: a call-style module has run, a stdio program has compiled; the load is timed from
    ready like a test, and a load over a test's time fails every test).

    A test's time is its wall time less the time the run lacked a CPU that others held: at most every
    :data:`~troll.sandbox.slots.POLL` seconds (and at a deadline or a report that would otherwise be late) the parent
    adds to the running test the longest any of the run's threads waited, runnable, for a CPU since the last look (and,
    on a virtual machine whose host steals CPU time, the run's share of the most stolen from one CPU: stolen x its CPU
    time / the time that CPU ran; the run lacks it without waiting), and the part of that interval the run did not fill
    with a core's worth of CPU time, while the run holds its slot; the test's credit is the smaller of the two sums. So
    a correct program gets its time whatever else holds the CPU (other runs, the scorer, the host), and no test's time
    is less than the CPU time the run used in it (a single core's worth: parallel programs without contention are timed
    by the wall clock). A program that makes its own threads wait and also sleeps can turn some of its sleep into
    credit, never more than it waited (or was stolen from); the run's wall limit still bounds it. Credit from the last
    interval of a test may go to the next one. The credit needs a cgroup that counts the run's CPU time; without one a
    test's time is its wall time.

    A report later than its test's time (stdio: and :data:`SLACK`) fails the test and ends the run, and so does
    the earliest test without a report once it is over that time: the tests after the first one over its time
    fail; after the last report the harness has ``GRACE`` seconds to say it is done. The harness writes "ready",
    one line per test and at most two more; only the first 2n + 8 lines are read, and lines longer than
    ``line_max`` (no report is) are dropped unread, so flooding the channel costs this process little. With
    ``idle``, the run gives its slot back once idle (:class:`troll.sandbox.slots.IdleWatch`)."""

    def __init__(self, kind: str, n: int, timeout: float, idle: IdleWatch | None = None, line_max: float = math.inf):
        self.kind, self.n, self.timeout = kind, n, timeout
        self.idle = idle
        self.poll = POLL if idle is not None else math.inf
        self.line_max = line_max  # longer lines are no report of the harness: dropped unread
        self.buf, self.lines, self.skip = bytearray(), 0, False
        self.ready: float | None = None
        self.loaded: float | None = None
        self.items: list[tuple[dict, float]] = []
        self.first: dict[int, float] = {}  # test -> when its first report arrived
        self.over = math.inf  # when a test was reported over its time
        self.cgroup = None
        self.last: tuple[float, int, dict[int, int], dict[str, int]] | None = None  # when, CPU ns, waits, steal
        self.waited: dict[int, float] = {}  # phase (-1: the load, i: test i) -> seconds its run waited for a CPU
        self.lacked: dict[int, float] = {}  # phase -> seconds of its looks' intervals not filled with CPU time
        self.spent: dict[int, float] = {}  # phase -> its time when its report (test i) or "loaded" (-1) arrived

    stolen = staticmethod(cgroups.stolen)  # CPU -> ns its host has taken from it (the host's steal time)

    def credit(self, phase: int) -> float:
        """Seconds the phase's time leaves out (class docstring)."""
        return max(0.0, min(self.waited.get(phase, 0.0), self.lacked.get(phase, 0.0)))

    def feed(self, data: bytes, now: float) -> None:
        limit = 2 * self.n + 8
        if self.lines >= limit:
            return
        if self.skip:  # the rest of a line too long to be a report
            cut = data.find(b"\n")
            if cut < 0:
                return
            data, self.skip, self.lines = data[cut + 1 :], False, self.lines + 1
        self.buf += data
        while self.lines < limit and b"\n" in self.buf:
            end = self.buf.index(b"\n")
            raw = bytes(self.buf[:end]) if end <= self.line_max else b""
            del self.buf[: end + 1]
            self.lines += 1
            if self.lines == 1:
                self.ready = now if raw == b'{"ready": 1}' else None
                if self.ready is None:
                    self.lines = limit  # not the harness: nothing more is read
                continue
            item = _parse(raw)
            if item is None:
                continue
            if item.get("loaded") == 1 and self.loaded is None:
                self.spent[-1] = self._spent(-1, now)
                self.loaded = now
            case = item.get("case")
            if type(case) is int and 0 <= case < self.n:
                if case not in self.first:
                    self.spent[case] = math.inf if self.start(case) is None else self._spent(case, now)
                self.first.setdefault(case, now)
                if item.get("timeout") is True or item.get("error") == "timeout" or self.late(case, now):
                    self.over = min(self.over, now)  # the first test over its time ends the run
            self.items.append((item, now))
        if len(self.buf) > self.line_max:  # no report is this long: the rest of the line is dropped as it comes
            self.buf.clear()
            self.skip = True

    def _spent(self, phase: int, now: float) -> float:
        """The phase's time at ``now``; a fresh look first when without it the phase would be over its time."""
        if now - self.start(phase) - self.credit(phase) > self.limit(phase):
            self.look(now)
        return now - self.start(phase) - self.credit(phase)

    def limit(self, phase: int) -> float:
        """The time the phase has: the load a test's time, a test that and, in stdio, SLACK for its report."""
        return self.timeout + (SLACK if self.kind == "stdio" and phase >= 0 else 0.0)

    def attach(self, cgroup) -> None:
        if self.idle is not None:
            self.idle.attach(cgroup)
        if cgroup is not None and cgroup.usage() is not None:
            self.cgroup, self.poll = cgroup, POLL

    def tick(self, now: float) -> None:
        if self.idle is not None:
            self.idle.tick(now)
            if not self.idle.slot.held:
                self.poll = math.inf  # no more credit, nothing more to watch for
                return
        if self.last is None or now - self.last[0] >= POLL or now >= self.deadline():
            self.look(now)  # also before the run is ended at its deadline: the credit may move it

    def look(self, now: float) -> None:
        """Add to the running phase's waits and lacks since the last look (class docstring)."""
        if self.cgroup is None or self.ready is None or (self.idle is not None and not self.idle.slot.held):
            return  # a run that gave its slot back gets no more credit
        usage = self.cgroup.usage()
        if usage is None:
            return
        cpu, waits = usage
        steal = self.stolen()
        phase = self.phase()
        if self.last is not None and phase is not None:
            then, cpu_then, waits_then, steal_then = self.last
            waited = max((w - waits_then.get(t, 0) for t, w in waits.items()), default=0)
            # the host takes a CPU while it has work: of the time the most stolen CPU was stolen, the run's share
            # is its CPU time over the time that CPU ran (a sleeping run loses nothing)
            stolen = max(0, max((s - steal_then.get(c, s) for c, s in steal.items()), default=0))
            ran = max(1.0, (now - then) * 1e9 - stolen)
            waited += min(stolen, (cpu - cpu_then) * stolen / ran)
            self.waited[phase] = self.waited.get(phase, 0.0) + max(0.0, waited / 1e9)
            self.lacked[phase] = self.lacked.get(phase, 0.0) + max(0.0, now - then - (cpu - cpu_then) / 1e9)
        self.last = (now, cpu, waits, steal)

    def phase(self) -> int | None:
        """The phase running now: -1 while the program loads (a call-style module runs, a stdio program
        compiles), else the earliest test without a report (None before ready and after the last report)."""
        if self.ready is None:
            return None
        if self.loaded is None:
            return -1
        return next((i for i in range(self.n) if i not in self.first), None)

    def start(self, i: int) -> float | None:
        """When phase ``i`` started (test ``i``, or -1 the load; None: not yet)."""
        if i > 0:
            return self.first.get(i - 1)
        return self.loaded if i == 0 else self.ready

    def deadline(self) -> float:
        if self.over < math.inf:
            return self.over
        if self.ready is None:
            return math.inf  # the run's wall clock covers the start
        phase = self.phase()
        if phase is None:
            return self.first[self.n - 1] + GRACE  # for "done"
        return self.start(phase) + self.limit(phase) + self.credit(phase)

    def late(self, i: int, arrived: float) -> bool:
        """Whether the report of test ``i`` arriving at ``arrived`` came after the test's time (its wall time less
        its credit)."""
        start = self.start(i)
        if start is None:
            return True
        spent = self.spent.get(i, arrived - start - self.credit(i))
        return spent > self.limit(i)

    def load_over(self) -> bool:
        """Whether the program's load (a call-style module's run, a stdio program's compilation) took more than a
        test's time."""
        return self.loaded is not None and self.spent.get(-1, 0.0) > self.limit(-1)


def _parse(raw: bytes) -> dict | None:
    if not raw.startswith(b"{"):
        return None
    try:
        item = json.loads(raw, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None
    return item if isinstance(item, dict) else None


def _judge(result, clock: CaseClock, suite: TestSuite, cases: tuple[TestCase, ...]) -> Score | None:
    """Compare the harness's reports with the expected outputs (in this process; they never entered the sandbox)."""
    if clock.ready is None:
        return None
    reports: dict[int, list[tuple[dict, float]]] = {}
    flags = set()
    for item, arrived in clock.items:
        if "syntax_error" in item:
            return Score.of(0, len(cases), "syntax_error")
        if "missing" in item:
            return Score.of(0, len(cases), "no_entry_point")
        if item.get("done") == 1:
            flags.add("done")
        case = item.get("case")
        if type(case) is int and 0 <= case < len(cases):
            reports.setdefault(case, []).append((item, arrived))
    if clock.loaded is None:
        reports = {}  # the program never finished loading: the run's end says why
    elif clock.load_over():
        flags.add("case_timeout")  # the module itself ran over a test's time: no test counts
        reports = {}
    passed = 0
    for i, case in enumerate(cases):
        got = reports.get(i, [])
        if len(got) != 1:  # missing, or forged beside the harness's own report
            continue
        item, arrived = got[0]
        if item.get("timeout") is True or item.get("error") == "timeout" or clock.late(i, arrived):
            flags.add("case_timeout")
            continue
        if suite.kind == "call":
            passed += "value" in item and same_value(item["value"], case.expected)
        else:
            complete = item.get("timeout") is False and item.get("truncated") is False
            passed += complete and isinstance(item.get("stdout"), str) and same_output(item["stdout"], case.expected)
    if result.timed_out or "case_timeout" in flags:
        status = "timeout"
    elif result.truncated:
        status = "output_limit"
    elif "done" not in flags:
        status = "crashed"
    else:
        status = "ok"
    return Score.of(passed, len(cases), status)


def _refuse(name: str):
    raise ValueError(f"{name} is not JSON")


def same_value(got: Any, expected: Any) -> bool:
    """Equality of JSON values, strict on types (True is not 1, "1" is not 1; tuples are lists). An expected int
    matches only that int, or a float exactly equal to it (``3.0`` for 3; ``1000000006.0`` never for
    1000000007); an expected float matches an int or float within 1e-9 relative or absolute."""
    if isinstance(expected, tuple):
        expected = list(expected)
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if type(expected) is int:
        return (type(got) is int or type(got) is float) and got == expected  # int == float compares exactly
    if type(expected) is float and type(got) in (int, float):
        try:
            return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
        except OverflowError:  # an int past float's range: never close to a finite float
            return False
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(map(same_value, got, expected))
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and got.keys() == expected.keys()
            and all(same_value(got[k], expected[k]) for k in expected)
        )
    return type(got) is type(expected) and got == expected


def same_output(got: str, expected: str) -> bool:
    """Stdout equality line by line, trailing whitespace of each line and trailing empty lines ignored."""

    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(got) == lines(expected)
