"""The code reward's share of a ``troll train`` step on a code task.

A ``troll train --task code`` run scores each rollout batch once, in the optimiser step that samples it: the batch's
completions run on their items' tests in the sandbox (``troll.lm.code_data.CodeTaskReward``, 2 slots). This script
reads a finished run folder (its config.json and the ``step_time`` TRL logs in metrics.jsonl), rebuilds a rollout
batch of the same shape (prompts x generations, the run's own training items and tests) and times the reward on it
``--repeats`` times after a warm-up. The completions are distinct programs that define the item's function and
return a wrong value, so that every test runs (a program that fails early would cost less). The share is the
reward's median seconds over the run's mean seconds per rollout batch (the sum of its steps' times).

    python benchmarks/bench_code_reward.py --run studies/code-X/troll/seed0   # any code-task run folder
    python benchmarks/bench_code_reward.py --quick                            # no run: the reward's time alone
Writes benchmarks/results/bench_code_reward.csv (--quick: bench_code_reward-quick.csv) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from _report import quick_path, write_results

from troll.lm import code_tasks
from troll.lm.code_data import CodeTaskReward

RESULTS = Path(__file__).parent / "results"


def rollout_batch(task: str, seed: int, prompts: int, generations: int) -> tuple[CodeTaskReward, list[str], list]:
    """The reward of ``prompts`` training items of ``task`` and ``generations`` distinct wrong programs each."""
    items = code_tasks.items(task, seed=seed, size=prompts)
    completions, index = [], []
    for i, it in enumerate(items):
        name = it["tests"]["entry_point"]
        for g in range(generations):
            completions.append(f"```python\n# sample {g}\ndef {name}(*args):\n    return None\n```")
            index.append(i)
    return CodeTaskReward(items), completions, index


def run_times(run: Path) -> tuple[dict, float]:
    """The run's options and its mean seconds per rollout batch (the steps' logged step_time, summed a batch)."""
    config = json.loads((run / "config.json").read_text())
    options = config.get("options", config)
    times = [
        r["step_time"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "step_time" in r
    ]
    per = int(options["steps_per_rollout"])
    batches = [sum(times[i : i + per]) for i in range(0, len(times) - per + 1, per)]
    if not batches:
        raise SystemExit(f"{run}: no step_time in metrics.jsonl (is it a finished troll train run?)")
    return options, statistics.mean(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="a troll train run folder of a code task")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one repeat; without --run, the reward's time alone")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    if args.run is not None:
        options, batch_s = run_times(args.run)
        task, seed = options["task"], int(options["seed"])
        prompts, generations = int(options["prompts_per_step"]), int(options["generations"])  # one rollout batch
    else:
        task, seed, prompts, generations, batch_s = "code", 0, 4, 4, None
    reward, completions, index = rollout_batch(task, seed, prompts, generations)
    reward.reward(None, completions[:1], tests=[reward.items[0]["tests"]])  # warm-up: the sandbox's self-test
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        scores = reward(completions=completions, rg_index=index)
        times.append(time.perf_counter() - t0)
        assert all(s == 0.0 for s in scores), scores  # every test ran and failed; None would be a sandbox failure
    reward_s = statistics.median(times)
    row = {
        "task": task, "completions": len(completions), "reward_s": round(reward_s, 3),
        "rollout_batch_s": "" if batch_s is None else round(batch_s, 1),
        "share": "" if batch_s is None else round(reward_s / batch_s, 4),
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }  # fmt: skip
    out = quick_path(RESULTS / "bench_code_reward.csv") if args.quick else RESULTS / "bench_code_reward.csv"
    write_results([row], out, f"# code reward's share of a troll train step ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
