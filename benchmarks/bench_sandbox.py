"""Sandbox throughput: what the bubblewrap sandbox costs a code reward.

Three rows per slot count: one empty run (bwrap and the interpreter starting and ending: the fixed overhead of a
completion), a batch of B distinct completions of a call-style task with T tests each (one run per completion,
the tests in-process), and the same batch as stdin/stdout programs (one forked child per test). Every batch is
timed ``--repeats`` times after one warm-up, the slot counts taking turns within each round (so that a change of
a shared machine's load falls on all alike); the table gives the median seconds, completions per second and the
1-minute load average of the machine when the row finished. Completions differ by a comment, so that the
deduplication of scoring does not shorten the batch.

    python benchmarks/bench_sandbox.py              # B = 16, T = 10, slots 1 and 2, 5 repeats
    python benchmarks/bench_sandbox.py --quick      # B = 4, 1 repeat
Writes benchmarks/results/bench_sandbox.csv (--quick: bench_sandbox-quick.csv) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from _report import quick_path, write_results

from troll.sandbox import BubblewrapSandbox, Limits, TestCase, TestSuite, score_completions

RESULTS = Path(__file__).parent / "results"


def batches(size: int, tests: int) -> dict[str, tuple[list[str], list[TestSuite]]]:
    """The call-style and stdio batches: ``size`` distinct right solutions of ``tests`` tests each."""
    call = TestSuite("call", [TestCase([list(range(i, i + 5))], sum(range(i, i + 5)) * 2) for i in range(tests)], "f")
    stdio = TestSuite("stdio", [TestCase(f"{i} {i + 1}\n", f"{2 * i + 1}\n") for i in range(tests)])
    call_code = "```python\n# solution {}\ndef f(xs):\n    return 2 * sum(xs)\n```"
    stdio_code = "```python\n# solution {}\na, b = map(int, input().split())\nprint(a + b)\n```"
    return {
        "call": ([call_code.format(i) for i in range(size)], [call] * size),
        "stdio": ([stdio_code.format(i) for i in range(size)], [stdio] * size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="B, completions per batch")
    parser.add_argument("--tests", type=int, default=10, help="T, tests per completion")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="B = 4, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.repeats = 4, 1
    sandbox = BubblewrapSandbox()
    work = batches(args.batch, args.tests)
    times: dict[tuple[str, int], list[float]] = {}
    loads: dict[tuple[str, int], float] = {}
    for round_ in range(args.repeats + 1):  # round 0 warms up
        for slots in args.slots:
            start = time.perf_counter()
            for _ in range(slots):
                sandbox.run("pass", b"", Limits())
            empty = (time.perf_counter() - start) / slots
            rows = {"empty run": empty}
            for kind, (completions, suites) in work.items():
                start = time.perf_counter()
                scores = score_completions(completions, suites, sandbox=sandbox, slots=slots)
                rows[kind] = time.perf_counter() - start
                assert all(s is not None and s.all_passed for s in scores), scores
            for kind, seconds in rows.items():
                if round_:
                    times.setdefault((kind, slots), []).append(seconds)
                    loads[(kind, slots)] = os.getloadavg()[0]
    table = []
    for (kind, slots), values in times.items():
        median = statistics.median(values)
        n = 1 if kind == "empty run" else args.batch
        table.append(
            {
                "workload": kind if kind == "empty run" else f"{kind}: {args.batch} x {args.tests} tests",
                "slots": slots,
                "seconds": round(median, 3),
                "completions_per_s": round(n / median, 1),
                "load_1min": round(loads[(kind, slots)], 2),
            }
        )
    out = RESULTS / "bench_sandbox.csv"
    header = f"# sandbox throughput ({os.cpu_count()} cores, median of {args.repeats}, bwrap as uid {os.geteuid()})"
    write_results(table, quick_path(out) if args.quick else out, header)


if __name__ == "__main__":
    main()
