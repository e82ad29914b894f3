"""Seconds of one TCE update, this tree against another (e.g. the commit before a speed change), in alternating rounds.

One update = the Meta-World preset's 50 critic + 50 policy epochs on a synthetic push-v3-sized batch: E = 16
episodes of T = 500 steps, S = 39 state entries, the full 39-entry observation as the context, D = 4 DoF (P = 36).
The batch is random (states, rewards) with theta sampled from the policy: the update's cost does not depend on
the values. Each round runs every tree once, in a fresh process (``--child``), in alternating order, so that a
load change on the shared machine hits both alike; the table gives the median over rounds of each tree's median
update, and the ratio of the medians.

    git archive <commit> src | tar -x -C /tmp/base          # the tree to compare against
    OMP_NUM_THREADS=1 python benchmarks/bench_tce_update.py --baseline /tmp/base/src --rounds 6
    OMP_NUM_THREADS=1 python benchmarks/bench_tce_update.py --quick      # smoke run: this tree, 1 round x 1 update
Writes benchmarks/results/bench_tce_update.csv (--quick: bench_tce_update-quick.csv) and prints a markdown table (with
the 1-minute load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SRC = Path(__file__).resolve().parent.parent / "src"


def child(algo: str, repeats: int) -> dict:
    """Time ``repeats`` updates (after a warm-up) in this process; the tree is whatever PYTHONPATH holds."""
    import torch

    from troll.episodic.envs import Episodes, EpisodeStart
    from troll.episodic.tce.agent import Rollout, TCEAgent
    from troll.episodic.tce.config import TCEConfig

    torch.set_num_threads(1)
    cfg = TCEConfig.preset("metaworld/push-v3", algo=algo, env_options={})
    agent = TCEAgent(cfg, context_dim=39, state_dim=39, dof=4, horizon=500, dt=0.0125, total_iterations=100)
    g = torch.Generator().manual_seed(0)
    e, t = cfg.episodes, 500
    start = EpisodeStart(torch.randn(e, 39, generator=g), torch.randn(e, 4, generator=g) * 0.1, torch.zeros(e, 4))
    agent.policy.update_normalizer(start.context)
    theta, pos, vel = agent.trajectories(start)
    states, rewards = torch.randn(e, t + 1, 39, generator=g), torch.rand(e, t, generator=g)
    episodes = Episodes(states, rewards, torch.zeros(e, t, dtype=torch.bool), None, {})
    batch = Rollout(start, theta, pos, vel, episodes)
    agent.update(batch)  # warm-up: first-call costs (linalg, allocator)
    total, critic, policy = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        m = agent.update(batch)
        total.append(time.perf_counter() - t0)
        critic.append(m["time/critic"])
        policy.append(m["time/policy"])
    return {k: statistics.median(v) for k, v in (("update_s", total), ("critic_s", critic), ("policy_s", policy))}


def run_round(trees: dict[str, str], order: list[str], algo: str, repeats: int) -> dict[str, dict]:
    out = {}
    for name in order:
        env = {**os.environ, "PYTHONPATH": trees[name], "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        cmd = [sys.executable, __file__, "--child", "--algo", algo, "--repeats", str(repeats)]
        text = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        out[name] = json.loads(text.strip().splitlines()[-1])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", help="src/ folder of the tree to compare against (omit: this tree alone)")
    p.add_argument("--algo", default="tce", choices=("tce", "bbrl", "bbrl-cov"))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="updates timed per process (median)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round of 1 timed update")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.rounds, args.repeats = 1, 1
    if args.child:
        print(json.dumps(child(args.algo, args.repeats)))
        return
    trees = {"this": str(SRC)} | ({"baseline": args.baseline} if args.baseline else {})
    names = list(trees)
    per = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name, row in run_round(trees, order, args.algo, args.repeats).items():
            per[name].append(row)
        print(
            f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {per[n][-1]['update_s']:.3f} s" for n in order),
            flush=True,
        )
    load = round(os.getloadavg()[0], 2)
    rows = []
    for name in names:
        med = {k: round(statistics.median(x[k] for x in per[name]), 3) for k in ("update_s", "critic_s", "policy_s")}
        rows.append(
            {"tree": name, "path": trees[name], "algo": args.algo, "rounds": args.rounds, **med, "load_1min": load}
        )
    if "baseline" in per:
        ratio = rows[1]["update_s"] / rows[0]["update_s"]
        print(f"baseline / this (median update): {ratio:.2f}x")
    print("| tree | algo | update s | critic s | policy s | rounds | load (1 min) |\n|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['tree']} | {row['algo']} | {row['update_s']} | {row['critic_s']} | {row['policy_s']} | "
              f"{row['rounds']} | {row['load_1min']} |")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / ("bench_tce_update-quick.csv" if args.quick else "bench_tce_update.csv"), "w") as f:
        f.write(",".join(rows[0]) + "\n")
        for row in rows:
            f.write(",".join(str(v) for v in row.values()) + "\n")


if __name__ == "__main__":
    main()
