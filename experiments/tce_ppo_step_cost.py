"""What EnvPool could save SB3's PPO on Meta-World: the CPU cost of one PPO env step, and of its simulator part.

docs/tce.md, "PPO".

``troll tce train --algo ppo`` steps the metaworld package through :class:`troll.tce.ppo` 's StepTask, one env,
SB3's defaults. This script times, in CPU microseconds per env step (``time.process_time``, so another job on the
machine changes little), in alternating rounds:

- ``python env``: StepTask.step with random actions (what PPO's env costs today, resets included);
- ``envpool env``: EnvPool's own Meta-World env of the same task, one env, stepped from Python with random actions
  (the least an EnvPool path could cost: no wrapper at all);
- ``ppo``: ``PPO("MlpPolicy").learn`` over ``--steps`` env steps on StepTask (rollout collection, the policy's
  forward passes and the 10 epochs of updates: the whole cost of an env step to PPO).

It prints the medians and the best case of an EnvPool path: (python env - envpool env) / ppo, the share of a PPO
step that moving PPO onto EnvPool could save at most.

    OMP_NUM_THREADS=1 python experiments/tce_ppo_step_cost.py --task reach-v3
Writes experiments/results/tce_ppo_step_cost.csv.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from troll.episodic.envs.envpool_backend import task_id
from troll.episodic.envs.step import make_step_task

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' CSV writer
from _report import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def cpu_us_per_step(fn, steps: int) -> float:
    start = time.process_time()
    fn(steps)
    return (time.process_time() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="reach-v3")
    parser.add_argument("--env-steps", type=int, default=5000, help="env steps a round of each env timing")
    parser.add_argument("--steps", type=int, default=4096, help="env steps a round of PPO.learn (2 rollouts)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import envpool
    from stable_baselines3 import PPO

    task = make_step_task(f"metaworld/{args.task}", seed=0)
    task.reset(seed=0)
    rng = np.random.default_rng(0)
    pool = envpool.make_gymnasium(task_id(args.task), num_envs=1, num_threads=1, partially_observable=False)
    pool.reset()

    def python_env(n: int) -> None:
        for _ in range(n):
            _, _, done, cut, _ = task.step(rng.uniform(-1, 1, 4).astype(np.float32))
            if done or cut:
                task.reset()

    def envpool_env(n: int) -> None:
        for _ in range(n):  # EnvPool resets an env by itself after its last step
            pool.step(rng.uniform(-1, 1, (1, 4)).astype(np.float32))

    def ppo(n: int) -> None:
        PPO("MlpPolicy", task, device="cpu", seed=0).learn(n)

    timed = {"python env": (python_env, args.env_steps), "envpool env": (envpool_env, args.env_steps),
             "ppo": (ppo, args.steps)}  # fmt: skip
    samples: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(args.rounds):
        for name, (fn, n) in timed.items():
            samples[name].append(cpu_us_per_step(fn, n))
    med = {name: statistics.median(v) for name, v in samples.items()}
    load = os.getloadavg()[0]
    rows = [
        {"task": args.task, "what": name, "cpu_us_per_step": round(med[name], 1),
         "rounds": ", ".join(f"{v:.0f}" for v in samples[name]), "load": round(load, 2)}
        for name in timed
    ]  # fmt: skip
    saving = (med["python env"] - med["envpool env"]) / med["ppo"]
    header = (f"PPO on metaworld/{args.task}: CPU microseconds per env step (median of {args.rounds} rounds). "
              f"An EnvPool path could save at most {saving:.0%} of a PPO step.")  # fmt: skip
    write_results(rows, RESULTS / "tce_ppo_step_cost.csv", header)


if __name__ == "__main__":
    main()
