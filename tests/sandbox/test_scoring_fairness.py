"""Scoring that means what it says, in the real bubblewrap sandbox: exact comparison of integers, dict subclasses
as dicts, an output cap the caller sets, stdin that costs the program nothing, multiprocessing within the run's
limits, and nothing of the host's installed packages."""

from __future__ import annotations

import os
import site
import sys
import sysconfig

import pytest
from sandbox_hostile import SUM, adds, fenced, sums

from troll.integrations.code_reward import CodeReward
from troll.integrations.verl.reward import compute_score, compute_score_batch
from troll.sandbox import BubblewrapSandbox, TestCase, TestSuite, score_completions
from troll.sandbox.scoring import same_value


@pytest.fixture(scope="module")
def sandbox():
    return BubblewrapSandbox()


def test_an_expected_int_matches_only_that_int():
    assert not same_value(1000000006.0, 1000000007)
    assert not same_value(1000000007.5, 1000000007)
    assert same_value(1000000007, 1000000007) and same_value(1000000007.0, 1000000007)
    assert not same_value(float(2**60), 2**60 + 1) and same_value(float(2**60), 2**60)
    assert same_value(3, 3.0) and same_value(0.1 + 0.2, 0.3)  # an expected float: within 1e-9
    assert not same_value(True, 1) and not same_value("1", 1)
    assert same_value([1, {"a": 2.0}], [1.0, {"a": 2}])


def test_returned_values_compare_exactly_and_dict_subclasses_as_dicts(sandbox):
    big = TestSuite("call", [TestCase([], 1000000007)], "f")
    counted = TestSuite("call", [TestCase(["abca"], {"a": 2, "b": 1, "c": 1})], "f")
    programs = [
        ("def f():\n    return 1000000006.0", big, 0.0),
        ("def f():\n    return 1000000007.0", big, 1.0),
        ("from collections import Counter\ndef f(s):\n    return Counter(s)", counted, 1.0),
        ("from collections import defaultdict\ndef f(s):\n    d = defaultdict(int)\n"
         "    for c in s:\n        d[c] += 1\n    return d", counted, 1.0),
        ("from collections import Counter\nclass C(Counter):\n    def items(self):\n        return [('a', 2), "
         "('b', 1), ('c', 1)]\ndef f(s):\n    return C('z')", counted, 0.0),  # the dict it holds, not its items()
    ]  # fmt: skip
    scores = score_completions([fenced(p) for p, _, _ in programs], [s for _, s, _ in programs], sandbox=sandbox)
    assert [s.reward for s in scores] == [r for _, _, r in programs], scores


def test_the_output_cap_is_the_caller_s(sandbox):
    """150 KiB of output passes by default; 3 MiB passes with a 4 MiB cap, through every wrapper, and fails at
    the 1 MiB default."""
    wide = fenced("print('x' * int(input()))")
    tests = {"kind": "stdio", "cases": [{"input": "3145728\n", "expected": "x" * 3145728 + "\n"}]}
    short = {"kind": "stdio", "cases": [{"input": "153600\n", "expected": "x" * 153600 + "\n"}]}
    reward = CodeReward(sandbox=sandbox)
    assert reward(None, [wide, wide + " "], tests=[short, tests]) == [1.0, 0.0]
    assert CodeReward(sandbox=sandbox, output=4 << 20)(None, [wide], tests=[tests]) == [1.0]
    import json

    assert compute_score("x", wide, json.dumps(tests), output=4 << 20)["score"] == 1.0
    assert compute_score_batch(["x"], [wide], [json.dumps(tests)], output=4 << 20)[0]["score"] == 1.0
    with pytest.raises(ValueError, match="output"):
        CodeReward(output=0)


def test_stdin_is_not_staged_in_the_program_s_files(sandbox):
    """Five 14 MiB inputs (70 MiB, beyond /tmp's 64 MiB and RLIMIT_FSIZE's 16 MiB): all read, nothing left."""
    program = fenced(
        "import os, sys\ndata = sys.stdin.buffer.read()\n"
        "print(len(data), len(os.listdir('/tmp')), sum(1 for _ in os.scandir('/dev/shm')))"
    )
    size = 14 << 20
    suite = TestSuite("stdio", [TestCase(str(i) * size, f"{size} 0 0\n") for i in range(5)], timeout=5.0)
    score = score_completions([program], [suite], sandbox=sandbox)[0]
    assert score.reward == 1.0 and score.status == "ok", score


def test_multiprocessing_works_within_the_run_s_limits(sandbox):
    pool = fenced(
        "import multiprocessing\ndef square(x):\n    return x * x\n"
        "def f(n):\n    with multiprocessing.Pool(2) as p:\n        return sum(p.map(square, range(n)))"
    )
    queue = fenced(
        "import multiprocessing as mp\ndef work(q):\n    q.put(sum(range(10)))\n"
        "if __name__ == '__main__':\n    q = mp.Queue()\n    p = mp.Process(target=work, args=(q,))\n"
        "    p.start()\n    print(q.get())\n    p.join()"
    )
    suites = [TestSuite("call", [TestCase([10], 285)], "f", timeout=5.0), TestSuite("stdio", [TestCase("", "45\n")])]
    scores = score_completions([pool, queue], suites, sandbox=sandbox)
    assert [s.reward for s in scores] == [1.0, 1.0], scores


def host_package_dirs() -> list[str]:
    """Where the host keeps installed packages: this venv's, the base interpreter's, the system's."""
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    dirs = {sysconfig.get_path("purelib"), sysconfig.get_path("purelib", vars=base), *site.getsitepackages()}
    dirs |= {"/usr/lib/python3/dist-packages", f"/usr/local/lib/python3.{sys.version_info.minor}/dist-packages"}
    return sorted(dirs)


def test_only_the_standard_library_is_visible(sandbox):
    dirs = host_package_dirs()
    base_purelib = sysconfig.get_path("purelib", vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    assert any(os.path.isdir(os.path.join(d, "numpy")) for d in dirs), "numpy is installed on the host"
    probe = fenced(
        f"import sys\nsys.path.extend({dirs!r})\n"
        "def f(name):\n    try:\n        __import__(name)\n        return 'escaped'\n    except ImportError:\n"
        "        return 'hidden'"
    )
    suite = TestSuite("call", [TestCase([name], "escaped") for name in ("numpy", "yaml", "networkx")], "f")
    stdlib = TestSuite("call", [TestCase(["json"], "escaped"), TestCase(["sqlite3"], "escaped")], "f")
    scores = score_completions([probe, probe], [suite, stdlib], sandbox=sandbox)
    assert scores[0].reward == 0.0, (scores[0], base_purelib)
    assert scores[1].reward == 1.0, scores[1]


def test_correct_programs_keep_full_marks(sandbox):
    scores = score_completions(
        [fenced(SUM), fenced("def f(a, b):\n    return a + b")], [sums(), adds()], sandbox=sandbox
    )
    assert [s.reward for s in scores] == [1.0, 1.0]


def test_eval_code_takes_the_output_cap_and_checks_it():
    import troll.cli
    from troll.lm.cli import _check_eval_code
    from troll.runs.files import UsageError

    parser = troll.cli.build_parser()
    args = parser.parse_args(["eval-code", "--task", "humaneval", "--output", "0"])
    with pytest.raises(UsageError, match="--output"):
        _check_eval_code(args)
    assert parser.parse_args(["eval-code", "--task", "humaneval", "--output", "4194304"]).output == 4 << 20
