"""troll's sandbox against verl's ``prime_code`` scorer on the same completions: completions per second, honest and
with a hostile quarter.

The batch: B distinct correct stdin/stdout programs (a + b, T tests each, APPS form ``{"inputs", "outputs"}``).
The hostile mix replaces every fourth one with a program that fights the clock (ignores SIGALRM and sleeps,
swallows the timer's exception, spins): the kind of program both scorers are meant to survive without a sandbox,
so it is safe to run under ``prime_code``, which runs programs on the host (a fork bomb or shared-memory hog would
not be). The heavy mix puts, where the hostile mix has its spinning programs, a correct program that computes for
0.7 s of CPU on its first test (the one whose b is 0) and then answers (the others stay honest): until then it
cannot be told from the spinning one, so what a scorer spends on the heavy batch while scoring every program 1.0 is
less than it must spend on the hostile one if it is not to fail correct programs that need most of a test's time.
troll scores with ``score_completions`` (bubblewrap, ``--slots`` runs at once, 1 s per test, the default
budget); ``prime_code.compute_score`` (verl 0.9.1, ``continuous=True`` as verl's ``default_compute_score``
calls it: 5 s for all tests, then 10 s per test on a failure, a process per check) runs in verl's own
environment (``.venv-verl``) in a subprocess, ``--workers`` completions at once in a process pool, as verl's
``PrimeRewardManager`` does, and times itself there (its interpreter's start and imports excluded). Each scorer
scores each batch ``--repeats`` times after one warm-up, taking turns (``prime_code`` the hostile batch once: it
takes minutes); the table gives the median seconds, completions per second, the ratio to the scorer's honest
batch, the mean reward of the correct programs (of the last repeat), how many of them scored below 1.0 (the most in one
repeat) and the 1-minute load average.

    python benchmarks/bench_sandbox_peer.py             # B = 16, T = 10, troll at 2 and 4 slots, 3 repeats
    python benchmarks/bench_sandbox_peer.py --quick     # B = 8, 1 repeat
    python benchmarks/bench_sandbox_peer.py --batch 64 --slots 2 4 16 --skip-peer-hostile
Writes benchmarks/results/bench_sandbox_peer.csv (--quick: bench_sandbox_peer-quick.csv) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from _report import quick_path, write_results

from troll.integrations.code_reward import parse_tests, to_suite
from troll.sandbox import BubblewrapSandbox, score_completions

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
VERL_PYTHON = ROOT / ".venv-verl" / "bin" / "python"
CORRECT = "# solution {i}\na, b = map(int, input().split())\nprint(a + b)"
HOSTILE = [
    "# hostile {i}\nimport signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(100)",
    "# hostile {i}\nimport time\ntry:\n    time.sleep(100)\nexcept BaseException:\n    time.sleep(100)",
    "# hostile {i}\nwhile True:\n    pass",
]
HEAVY = (
    "# heavy {i}\nimport time\na, b = map(int, input().split())\nif b == 0:\n"
    "    start = time.process_time()\n    while time.process_time() - start < 0.7:\n        pass\nprint(a + b)"
)
PRIME = """
import json, sys, time
from concurrent.futures import ProcessPoolExecutor
from verl.utils.reward_score import prime_code

def one(args):  # as verl's default_compute_score calls it
    return float(prime_code.compute_score(*args, continuous=True)[0])

job = json.loads(sys.stdin.read())
with ProcessPoolExecutor(max_workers=job["workers"]) as pool:
    list(pool.map(one, [("x", job["tests"][0])] * job["workers"]))  # the workers started
    start = time.perf_counter()
    rewards = list(pool.map(one, zip(job["completions"], job["tests"])))
    print(json.dumps({"seconds": time.perf_counter() - start, "rewards": rewards}))
"""


def batch(size: int, tests: int, mix: str) -> tuple[list[str], list[str], list[bool]]:
    """(completions, tests as APPS JSON, which are correct): ``size`` programs; in the "hostile" mix every fourth
    is hostile, in the "heavy" mix those that spin there are correct ones that need 0.7 s of CPU on their first test."""
    completions, apps, correct = [], [], []
    for i in range(size):
        kind = (i // 4) % len(HOSTILE) if i % 4 == 3 else None
        bad = mix == "hostile" and kind is not None
        heavy = mix == "heavy" and kind == len(HOSTILE) - 1
        code = HOSTILE[kind] if bad else HEAVY if heavy else CORRECT
        completions.append(f"```python\n{code.format(i=i)}\n```")
        pairs = [(f"{i + j} {j}\n", f"{i + 2 * j}\n") for j in range(tests)]
        apps.append(json.dumps({"inputs": [p[0] for p in pairs], "outputs": [p[1] for p in pairs]}))
        correct.append(not bad)
    return completions, apps, correct


def troll(sandbox, completions: list[str], apps: list[str], slots: int) -> tuple[float, list[float]]:
    suites = [to_suite(parse_tests(t)) for t in apps]
    start = time.perf_counter()
    scores = score_completions(completions, suites, sandbox=sandbox, slots=slots)
    return time.perf_counter() - start, [0.0 if s is None else s.reward for s in scores]


def prime(completions: list[str], apps: list[str], workers: int) -> tuple[float, list[float]]:
    job = json.dumps({"completions": completions, "tests": apps, "workers": workers})
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run([str(VERL_PYTHON), "-c", PRIME], input=job, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"prime_code failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["seconds"], result["rewards"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="B, completions per batch")
    parser.add_argument("--tests", type=int, default=10, help="T, tests per completion")
    parser.add_argument("--slots", type=int, nargs="+", default=[2, 4], help="troll's runs at once (one row each)")
    parser.add_argument("--workers", type=int, default=2, help="prime_code's processes at once")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="B = 8, 1 repeat")
    parser.add_argument("--skip-peer-hostile", action="store_true",
                        help="prime_code scores only the honest batch (its hostile one takes B/4 x 110 s)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.batch, args.repeats = 8, 1
    if not VERL_PYTHON.exists():
        raise SystemExit(f"{VERL_PYTHON} is missing: `make test` (or the Makefile's verl environment) builds it")
    sandbox = BubblewrapSandbox()
    scorers = {
        f"troll ({sandbox.mode}, {slots} slots)": lambda c, t, slots=slots: troll(sandbox, c, t, slots)
        for slots in args.slots
    }
    scorers[f"verl prime_code ({args.workers} processes)"] = lambda c, t: prime(c, t, args.workers)
    times, rewards, below, loads = {}, {}, {}, {}
    for round_ in range(args.repeats + 1):  # round 0 warms up
        for mix in ("honest", "hostile quarter", "heavy quarter"):
            completions, apps, correct = batch(args.batch, args.tests, mix.split()[0])
            for name, score in scorers.items():
                if name.startswith("verl") and mix == "hostile quarter" and (round_ != 1 or args.skip_peer_hostile):
                    continue  # minutes a batch: scored once
                seconds, got = score(completions, apps)
                if round_:
                    times.setdefault((name, mix), []).append(seconds)
                    rewards[(name, mix)] = statistics.mean(r for r, ok in zip(got, correct) if ok)
                    below[(name, mix)] = max(below.get((name, mix), 0), sum(r < 1 for r, ok in zip(got, correct) if ok))
                    loads[(name, mix)] = os.getloadavg()[0]
                    assert all(r == 0.0 for r, ok in zip(got, correct) if not ok), (name, got)
    table = []
    for (name, mix), values in times.items():
        median = statistics.median(values)
        honest = statistics.median(times[(name, "honest")])
        table.append(
            {
                "scorer": name,
                "batch": f"{mix}: {args.batch} x {args.tests} tests",
                "seconds": round(median, 3),
                "completions_per_s": round(args.batch / median, 1),
                "vs_honest": round(median / honest, 2),
                "correct_reward": round(rewards[(name, mix)], 3),
                "correct_below_1": below[(name, mix)],  # the most in one repeat
                "load_1min": round(loads[(name, mix)], 2),
            }
        )
    out = RESULTS / f"bench_sandbox_peer{'' if args.batch == 16 else f'-b{args.batch}'}.csv"
    cores, uid = os.cpu_count(), os.geteuid()
    header = f"# troll sandbox vs verl prime_code ({cores} cores, median of {args.repeats}, uid {uid})"
    write_results(table, quick_path(out) if args.quick else out, header)


if __name__ == "__main__":
    main()
