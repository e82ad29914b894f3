"""Scoring: program extraction, suite validation, the comparison rules, and correct and partial solutions of both
test styles scored in the real sandbox (hand-computed fractions), the first-10 cut and deduplication."""

from __future__ import annotations

import math
import os

import pytest
from sandbox_helpers import Recording, fenced

from troll.sandbox import (
    BubblewrapSandbox,
    Limits,
    RunResult,
    Sandbox,
    SandboxError,
    Score,
    TestCase,
    TestSuite,
    cgroups,
    extract_program,
    score_completions,
    scoring,
)
from troll.sandbox.scoring import same_output, same_value


@pytest.fixture(scope="module")
def sandbox():
    return BubblewrapSandbox()  # bwrap is a hard requirement: a missing one fails here, never skips


ADD = TestSuite("call", [TestCase([1, 2], 3), TestCase([2, 2], 4), TestCase([0, 0], 0), TestCase([5, -5], 0)], "add")
SUM = TestSuite(
    "stdio",
    [TestCase("1 2\n", "3\n"), TestCase("5 5\n", "10"), TestCase("0 1", "1"), TestCase("-1 1\n", "0  \n\n")],
    timeout=2.0,
)


def test_extract_program():
    assert extract_program("```python\nx = 1\n```") == "x = 1\n"
    assert extract_program("a\n```\nx = 1\n```\nb\n```py\ny = 2\n```\nc") == "y = 2\n"  # the last block
    assert extract_program("text\n```python\ndef f():\n    return 1") == "def f():\n    return 1\n"  # unclosed
    assert extract_program("```python\nx = 1\n```\n```bash\nls\n```") == "x = 1\n"  # not Python: skipped
    assert extract_program("no code here") is None
    assert extract_program("```python\n   \n```") is None
    assert extract_program("") is None


def test_suite_validation_names_the_field():
    with pytest.raises(ValueError, match="kind"):
        TestSuite("shell", [TestCase("", "")])
    with pytest.raises(ValueError, match="entry_point"):
        TestSuite("call", [TestCase([1], 1)])
    with pytest.raises(ValueError, match=r"cases\[0\].input"):
        TestSuite("call", [TestCase(1, 1)], "f")
    with pytest.raises(ValueError, match=r"cases\[1\].expected"):
        TestSuite("stdio", [TestCase("", ""), TestCase("", 3)])
    with pytest.raises(ValueError, match=r"cases\[0\].expected must be JSON"):
        TestSuite("call", [TestCase([1], float("nan"))], "f")
    with pytest.raises(ValueError, match=r"cases\[0\].input must be JSON .*dict key"):
        TestSuite("call", [TestCase([{1: 2}], 1)], "f")
    with pytest.raises(ValueError, match=r"cases\[0\].expected must be JSON .*a set"):
        TestSuite("call", [TestCase([], {1})], "f")
    with pytest.raises(ValueError, match="timeout"):
        TestSuite("stdio", [TestCase("", "")], timeout=0)
    with pytest.raises(ValueError, match="cases"):
        TestSuite("stdio", [])
    with pytest.raises(ValueError, match="slots"):
        score_completions([], [], slots=0)
    with pytest.raises(ValueError, match="one entry each"):
        score_completions(["x"], [])


def test_suites_and_cases_hash_by_value():
    assert hash(ADD) == hash(TestSuite("call", list(ADD.cases), "add")) and ADD == TestSuite("call", ADD.cases, "add")
    assert len({TestCase([1, [2]], 3), TestCase([1, [2]], 3)}) == 1


def test_comparison_rules():
    assert same_value([1, [2.0, "a"]], (1, (2, "a")))  # tuples are lists; 2 == 2.0
    assert not same_value(True, 1) and not same_value(1, True) and not same_value("1", 1)
    assert same_value(0.1 + 0.2, 0.3) and not same_value(0.31, 0.3)
    assert same_value({"a": [1]}, {"a": [1]}) and not same_value({"a": 1}, {"a": 1, "b": 2})
    # an int beyond any float (a model may return 10**400) is unequal to a float, not an error of the scorer
    assert not same_value(10**400, 1.5) and not same_value(1.5, -(10**400)) and not same_value([10**400], [1e308])
    assert same_output("3  \n4\n\n", "3\n4") and not same_output("3\n4", "3 4") and not same_output("", "0")


def test_both_styles_score_correct_and_partial_solutions(sandbox):
    add_ok = fenced("def add(a, b):\n    return a + b")
    add_half = fenced("def add(a, b):\n    return a + b if b > 0 else 7")  # passes tests 1 and 2 of 4
    sum_ok = fenced("a, b = map(int, input().split())\nprint(a + b)")
    sum_quarter = fenced("print(0)")  # right only on the last test
    scores = score_completions([add_ok, add_half, sum_ok, sum_quarter], [ADD, ADD, SUM, SUM], sandbox=sandbox)
    assert scores[0] == Score(4, 4, 1.0, True, "ok")
    assert scores[1] == Score(2, 4, 0.5, False, "ok")
    assert scores[2] == Score(4, 4, 1.0, True, "ok")
    assert scores[3] == Score(1, 4, 0.25, False, "ok")


def test_only_the_first_max_tests_count(sandbox):
    cases = [TestCase([i], i * i) for i in range(12)]
    suite = TestSuite("call", cases, "sq")
    first_ten = fenced("def sq(x):\n    return x * x if x < 10 else -1")  # wrong only on tests 11 and 12
    wrong_third = fenced("def sq(x):\n    return -1 if x == 2 else x * x")
    scores = score_completions([first_ten, wrong_third], [suite, suite], sandbox=sandbox)
    assert scores[0] == Score(10, 10, 1.0, True, "ok")
    assert scores[1] == Score(9, 10, 0.9, False, "ok")
    assert score_completions([wrong_third], [suite], sandbox=sandbox, max_tests=3)[0] == Score(2, 3, 2 / 3, False, "ok")


def test_identical_programs_run_once(sandbox):
    recording = Recording(sandbox)
    add = "def add(a, b):\n    return a + b"
    other = TestSuite("call", [TestCase([1, 1], 2)], "add")
    completions = [fenced(add), "Sure!\n" + fenced(add), fenced(add, tag=""), fenced(add), "no code"]
    scores = score_completions(completions, [ADD, ADD, ADD, other, ADD], sandbox=recording, slots=2)
    assert len(recording.results) == 2  # one run for the same code with ADD, one with the other suite
    assert [s.reward for s in scores] == [1.0, 1.0, 1.0, 1.0, 0.0] and scores[-1].status == "no_code"


class _Broken(Sandbox):
    """A backend failing as a sandbox can: raising, or returning without the harness's ready report."""

    def __init__(self, raises: bool):
        self.raises = raises

    def run(self, program: str, stdin: bytes, limits: Limits) -> RunResult:
        if self.raises:
            raise SandboxError("backend down")
        return RunResult(b"", b"bwrap: cannot mount", 1, False, False, 0.01)


@pytest.mark.parametrize("raises", [True, False])
def test_a_failing_sandbox_gives_none_and_model_failures_give_zero(raises):
    completions = [fenced("def add(a, b):\n    return a + b"), "no code at all"]
    scores = score_completions(completions, [ADD, ADD], sandbox=_Broken(raises))
    assert scores == [None, Score(0, 4, 0.0, False, "no_code")]


def judged(stdout: bytes, suite: TestSuite) -> Score | None:
    """The score of a run that wrote ``stdout`` all at once."""
    clock = scoring.CaseClock(suite.kind, len(suite.cases), suite.timeout)
    clock.feed(stdout, 100.0)
    return scoring._judge(RunResult(stdout, b"", 0, False, False, 0.1), clock, suite, suite.cases)


def test_a_flood_of_result_lines_costs_the_scorer_little(monkeypatch):
    """The channel carries at most one line per test and three more; a program writing millions of short lines
    (within the output cap) must not make the scorer parse them all (seconds of its CPU per completion)."""
    suite = TestSuite("call", [TestCase([i], i) for i in range(3)], "f")
    honest = b'{"ready": 1}\n{"loaded": 1}\n' + b"".join(b'{"case": %d, "value": %d}\n' % (i, i) for i in range(3))
    calls = []
    loads = scoring.json.loads
    monkeypatch.setattr(scoring.json, "loads", lambda *a, **k: calls.append(1) or loads(*a, **k))
    flood = honest + b'{"case": 9}\n' * 100_000 + b"ab\n" * 100_000 + b'{"done": 1}\n'
    score = judged(flood, suite)
    assert score.passed == 3 and len(calls) <= 2 * 3 + 8, len(calls)
    assert judged(honest + b'{"done": 1}\n', suite) == Score(3, 3, 1.0, True, "ok")


def test_a_line_too_long_to_be_a_report_is_dropped_unread(monkeypatch):
    """A program that writes a huge line on the result channel (call style can reach it) costs the scorer neither
    the parsing nor the memory: the line is dropped as it arrives, and the reports after it still count."""
    suite = TestSuite("call", [TestCase([1], 1)], "f")
    clock = scoring.CaseClock("call", 1, 1.0, line_max=1000)
    calls = []
    loads = scoring.json.loads
    monkeypatch.setattr(scoring.json, "loads", lambda *a, **k: calls.append(1) or loads(*a, **k))
    clock.feed(b'{"ready": 1}\n{"loaded": 1}\n{"x": [', 0.0)
    for _ in range(100):
        clock.feed(b"0," * 50_000, 0.0)
        assert len(clock.buf) <= 1000 + 100_000
    clock.feed(b'0]}\n{"case": 0, "value": 1}\n{"done": 1}\n', 0.1)
    assert len(calls) == 3 and not clock.buf  # loaded, the case, done
    result = RunResult(b"", b"", 0, False, False, 0.1)
    assert scoring._judge(result, clock, suite, suite.cases) == Score(1, 1, 1.0, True, "ok")


def test_a_report_without_a_start_is_late_now_and_when_judged():
    """A forged report of test 1 in the same read as test 0's: it has no start when it arrives, so it is late then
    and stays late when the run is judged (test 1 fails), whatever test 0's report set afterwards."""
    suite = TestSuite("call", [TestCase([1], 1), TestCase([2], 2)], "f", timeout=1.0)
    clock = scoring.CaseClock("call", 2, 1.0)
    clock.feed(b'{"ready": 1}\n{"loaded": 1}\n{"case": 1, "value": 2}\n{"case": 0, "value": 1}\n', 0.5)
    assert clock.late(1, 0.5) and clock.over == 0.5
    result = RunResult(b"", b"", -9, True, False, 0.5)
    assert scoring._judge(result, clock, suite, suite.cases) == Score(1, 2, 0.5, False, "timeout")


def test_the_parent_s_clock_over_the_reports():
    """Test i starts when test i - 1's report arrives; a call-style report later than the test's time fails it and
    ends the run, and so does a test without a report once it is over its time; a stdio report may come SLACK
    later (the harness reaps the program first); after the last report the harness has GRACE to say it is done."""
    slack, grace = scoring.SLACK, scoring.GRACE
    suite = TestSuite("call", [TestCase([1], 1), TestCase([2], 2)], "f", timeout=1.0)
    clock = scoring.CaseClock("call", 2, 1.0)
    clock.feed(b'{"ready": 1}\n', 10.0)
    assert clock.deadline() == 10.0 + 1.0  # the module's load
    clock.feed(b'{"loaded": 1}\n{"case": 0, "val', 10.1)
    assert clock.deadline() == 10.1 + 1.0
    clock.feed(b'ue": 1}\n', 10.5)
    assert clock.deadline() == 10.5 + 1.0 and clock.over == math.inf
    clock.feed(b'{"case": 1, "value": 2}\n', 11.6)  # 1.1 s after its start: over its time
    assert clock.deadline() == 11.6
    result = RunResult(b"", b"", -9, True, False, 1.6)
    assert scoring._judge(result, clock, suite, suite.cases) == Score(1, 2, 0.5, False, "timeout")
    stdio = scoring.CaseClock("stdio", 2, 1.0)
    stdio.feed(b'{"ready": 1}\n', 0.0)
    assert stdio.deadline() == 1.0  # the program's compilation
    stdio.feed(b'{"loaded": 1}\n', 0.0)
    assert stdio.deadline() == 1.0 + slack
    assert not stdio.late(0, 1.0 + slack) and stdio.late(0, 1.01 + slack)
    stdio.feed(b'{"case": 0, "stdout": "", "timeout": false, "truncated": false}\n', 0.5)
    stdio.feed(b'{"case": 1, "stdout": "", "timeout": false, "truncated": false}\n', 0.7)
    assert stdio.deadline() == 0.7 + grace


class _Cgroup:
    """A run's cgroup whose ``usage()`` is ``reading``: (CPU ns, thread id -> ns waited for a CPU)."""

    def __init__(self):
        self.reading = (0, {})

    def usage(self):
        return self.reading


def test_a_test_s_time_leaves_out_what_the_run_lacked_of_a_cpu():
    """A test's credit = min(the sum over looks of the longest wait of a thread for a CPU, the sum of the parts of
    the looks' intervals the run did not fill with a core's CPU time); the deadline and the lateness of a report
    move by it; a run filling a core or more (its own threads waiting for each other) gets none; a run that gave
    its slot back gets none."""
    ms = 1_000_000
    suite = TestSuite("call", [TestCase([1], 1), TestCase([2], 2)], "f", timeout=1.0)
    cgroup, clock = _Cgroup(), scoring.CaseClock("call", 2, 1.0)
    clock.stolen = dict  # a host that steals nothing
    clock.attach(cgroup)
    assert clock.poll == scoring.POLL
    clock.feed(b'{"ready": 1}\n{"loaded": 1}\n', 10.0)  # test 0 starts at 10.0
    clock.tick(10.0)  # the first look
    cgroup.reading = (50 * ms, {7: 400 * ms})
    clock.tick(10.0 + scoring.POLL / 2)  # too soon for another look
    cgroup.reading = (100 * ms, {7: 400 * ms})
    clock.tick(10.5)  # 0.5 s, 0.1 s of CPU: lacked 0.4, waited 0.4
    assert clock.credit(0) == pytest.approx(0.4) and clock.deadline() == pytest.approx(11.0 + 0.4)
    cgroup.reading = (600 * ms, {7: 400 * ms})
    clock.tick(11.0)  # a full core: nothing lacked
    cgroup.reading = (620 * ms, {7: 550 * ms, 8: 300 * ms})
    clock.tick(11.2)  # waited 0.3 (a new thread), lacked 0.18: sums 0.7 and 0.58
    assert clock.credit(0) == pytest.approx(0.58)
    cgroup.reading = (900 * ms, {7: 550 * ms})
    clock.feed(b'{"case": 0, "value": 1}\n', 11.5)  # 1.5 s of wall, 0.92 s of time: in time
    assert not clock.late(0, 11.5) and clock.over == math.inf
    cgroup.reading = (1900 * ms, {7: 950 * ms, 9: 500 * ms})
    clock.tick(12.0)  # 1.28 s of CPU in 0.8 s: its own threads waited for each other, nothing lacked
    assert clock.credit(1) == 0.0 and clock.deadline() == 11.5 + 1.0
    cgroup.reading = (2500 * ms, {7: 950 * ms, 9: 500 * ms})
    clock.feed(b'{"case": 1, "value": 2}\n{"done": 1}\n', 12.6)  # 1.1 s, a fresh look: still no credit, late
    assert clock.last[0] == 12.6 and clock.credit(1) == 0.0
    result = RunResult(b"", b"", 0, False, False, 2.6)
    assert scoring._judge(result, clock, suite, suite.cases) == Score(1, 2, 0.5, False, "timeout")

    class Idle:  # a run that gave its slot back
        slot = type("Slot", (), {"held": False})()

        def tick(self, now):
            pass

        def attach(self, cgroup):
            pass

    cgroup, clock = _Cgroup(), scoring.CaseClock("stdio", 1, 1.0, idle=Idle())
    clock.stolen = dict
    clock.attach(cgroup)
    clock.feed(b'{"ready": 1}\n{"loaded": 1}\n', 0.0)
    cgroup.reading = (0, {5: 900 * ms})
    clock.tick(1.0)
    assert clock.credit(0) == 0.0 and clock.poll == math.inf and clock.deadline() == 1.0 + scoring.SLACK


def test_the_time_a_host_steals_from_its_cpus_counts_as_a_wait():
    """On a virtual machine the host may take a CPU from a run that has work (steal time): the run lacks that time
    without waiting in the run queue, so each look adds to the wait the run's share of the most stolen from one
    CPU since the last look (by /proc/stat's steal): stolen x the run's CPU time / the time that CPU ran (a
    sleeping run loses nothing), still capped by what the run lacked; a CPU first seen counts from then, and a
    count that went down (renumbered CPUs) counts as nothing."""
    ms = 1_000_000
    cgroup, clock = _Cgroup(), scoring.CaseClock("call", 1, 1.0)
    steal = {"cpu0": 5_000 * ms, "cpu1": 7_000 * ms}
    clock.stolen = lambda: dict(steal)
    clock.attach(cgroup)
    clock.feed(b'{"ready": 1}\n{"loaded": 1}\n', 0.0)
    clock.tick(0.0)
    cgroup.reading, steal["cpu0"], steal["cpu1"] = (600 * ms, {7: 100 * ms}), 5_200 * ms, 7_050 * ms
    clock.tick(1.0)  # 0.4 s lacked; 0.1 s queued + 0.2 stolen from cpu0 x 0.6 s run / 0.8 s it ran: 0.25 in all
    assert clock.credit(0) == pytest.approx(0.25) and clock.deadline() == pytest.approx(1.25)
    cgroup.reading, steal["cpu0"], steal["cpu2"] = (700 * ms, {7: 100 * ms}), 5_300 * ms, 9_000 * ms
    clock.tick(1.2)  # lacked 0.1 more; 0.1 s stolen x 0.1 s run / 0.1 s: 0.1 more (cpu2 is new)
    assert clock.waited[0] == pytest.approx(0.35) and clock.credit(0) == pytest.approx(0.35)
    steal["cpu0"] = 5_700 * ms
    clock.tick(2.0)  # asleep: 0.8 s lacked, 0.4 s stolen while it used no CPU: no more wait
    assert clock.waited[0] == pytest.approx(0.35) and clock.lacked[0] == pytest.approx(1.3)
    cgroup.reading, steal["cpu0"] = (800 * ms, {7: 100 * ms}), 1_000 * ms
    clock.tick(2.2)  # the count went down: nothing
    assert clock.waited[0] == pytest.approx(0.35)
    clock.feed(b'{"case": 0, "value": 1}\n', 2.2)  # 2.2 s of wall, 1.85 s of time: late
    assert clock.late(0, 2.2)


def test_steal_time_is_read_per_cpu_from_proc_stat(monkeypatch):
    """steal is the eighth number of each cpuN line of /proc/stat, in clock ticks; the machine's own file parses."""
    text = "cpu  1 2 3 4 5 6 7 90 0 0\ncpu0 1 2 3 4 5 6 7 40 0 0\ncpu1 1 2 3 4 5 6 7 50 0 0\ncpu2 1 2\n"
    text += "cpu3 1 2 3 4 5 6 7 x 0 0\nintr 12 3\n"  # short and unreadable lines are left out
    tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    real = cgroups.stolen()
    assert real and all(cpu.startswith("cpu") and ns >= 0 for cpu, ns in real.items()), real
    monkeypatch.setattr(cgroups, "_read", lambda path: text if path == "/proc/stat" else "")
    assert cgroups.stolen() == {"cpu0": 40 * tick, "cpu1": 50 * tick}
