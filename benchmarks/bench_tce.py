"""Seconds of one TCE update and one iteration (docs/benchmarks.md, "Episodic environments and TCE").

Update: the preset's ``critic_epochs`` + ``policy_epochs`` (TCE 50 + 50, ``bbrl`` 100 + 100) on the synthetic
Meta-World-sized batch of ``tests/support/_tce_batch.py`` (E = 16 episodes of T = 500 steps, S = 39 state entries,
C = 39 context entries, the preset's ``context="full"``), for D = 4 DoF (P = 36, Meta-World's xyz + gripper) and
D = 7 (P = 63, a 7-joint arm), num_basis 8; BBRL's update on the same batch for comparison. The update's cost does
not depend on the batch's values. Iteration: rollout (16 episodes of 500 steps of ``--env``, default
metaworld/push-v3, on each backend: EnvPool on ``--workers`` threads, the Python package over ``--workers``
processes) + update, split into rollout and update seconds, and the evaluation of the mean trajectory (16 more
episodes, every ``eval_every`` iterations in a run) on its own row.

``--baseline SRC`` compares this tree's TCE update with another tree's (e.g. the commit before a speed change):
each of ``--rounds`` rounds times every tree once in a fresh process, in alternating order, so that a load change
on a shared machine hits both alike; the rows give the median over rounds of each tree's median update.

    OMP_NUM_THREADS=1 python benchmarks/bench_tce.py                  # everything, 3 repeats, medians
    OMP_NUM_THREADS=1 python benchmarks/bench_tce.py --quick          # one TCE update, the iteration on both backends
    OMP_NUM_THREADS=1 python benchmarks/bench_tce.py --skip-env       # updates only (no MuJoCo needed)
    git archive <commit> src | tar -x -C /tmp/base                    # the tree to compare against
    OMP_NUM_THREADS=1 python benchmarks/bench_tce.py --baseline /tmp/base/src --rounds 6
Writes benchmarks/results/bench_tce.csv (--quick: bench_tce-quick.csv; --baseline: bench_tce-baseline.csv) and
prints a markdown table with the 1-minute load average at the end.
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

import torch
from _report import quick_path, write_results

from troll.episodic.agent import TCEAgent, reset_seed
from troll.episodic.config import TCEConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the batch builder the golden tests use
from _tce_batch import synthetic_batch  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TARGET_S = 10.0  # the speed goal for one Meta-World iteration (rollout + update) on this machine
CONTEXT_DIM = 39  # the metaworld preset's context: all 39 entries of the reset observation (context "full")


def time_update(algo: str, dof: int, repeats: int) -> dict:
    cfg = TCEConfig.preset("metaworld/push-v3", algo=algo)
    agent = TCEAgent(cfg, context_dim=CONTEXT_DIM, state_dim=39, dof=dof, horizon=500, dt=0.0125, total_iterations=100)
    batch = synthetic_batch(agent, 0)
    agent.update(batch)  # warm-up: first-call costs (linalg, allocator)
    totals, critic, policy, cpu = [], [], [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        m = agent.update(batch)
        totals.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        critic.append(m["time/critic"])
        policy.append(m["time/policy"])
    return {
        "what": f"{algo} update ({cfg.critic_epochs} critic + {cfg.policy_epochs} policy epochs)",
        "sizes": f"E=16 T=500 D={dof} P={agent.dmp.num_params}",
        "seconds": round(statistics.median(totals), 3),
        "critic_s": round(statistics.median(critic), 3),
        "policy_s": round(statistics.median(policy), 3),
        "rollout_s": "",
        "update_s": round(statistics.median(totals), 3),
        "cpu_s": round(statistics.median(cpu), 3),
    }


def compare_trees(baseline: str, algo: str, rounds: int, repeats: int) -> list[dict]:
    """Rows of this tree's and ``baseline``'s ``algo`` update at D = 4, each round in fresh alternating processes."""
    trees = {"this": str(ROOT / "src"), "baseline": baseline}
    per: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for name in order:
            env = {**os.environ, "PYTHONPATH": trees[name], "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            cmd = [sys.executable, __file__, "--child", algo, "--repeats", str(repeats)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            per[name].append(json.loads(out.strip().splitlines()[-1]))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {per[n][-1]['seconds']:.3f} s" for n in order), flush=True)
    rows = []
    for name, runs in per.items():
        row = dict(runs[0], what=f"{runs[0]['what']}, {name} tree ({trees[name]})")
        for key in ("seconds", "critic_s", "policy_s", "update_s", "cpu_s"):
            row[key] = round(statistics.median(x[key] for x in runs), 3)
        rows.append(row)
    print(f"baseline / this (median update): {rows[1]['seconds'] / rows[0]['seconds']:.2f}x")
    return rows


def time_iteration(env_name: str, backend: str, workers: int, repeats: int, episodes: int | None = None) -> list[dict]:
    """Rollout + update and evaluation rows of ``env_name``; ``episodes`` replaces the preset's E (both kinds)."""
    from troll.episodic.envs import make_env

    sizes = {"episodes": episodes, "eval_episodes": episodes} if episodes else {}
    cfg = TCEConfig.preset(env_name, workers=workers, **sizes)
    rows = []
    options = {**cfg.env_options, "backend": backend}  # the preset's (before 2026-11-27: metaworld's own, see docs)
    with make_env(cfg.env, num_episodes=cfg.episodes, workers=workers, seed=cfg.seed, **options) as env:
        agent = TCEAgent.for_env(cfg, env)
        agent.update(agent.rollout(env, reset_seed(0, 0)))  # warm-up
        its, rollouts, updates, evals = [], [], [], []
        for r in range(repeats):
            t0 = time.perf_counter()
            batch = agent.rollout(env, reset_seed(0, r + 1))
            t1 = time.perf_counter()
            agent.update(batch)
            t2 = time.perf_counter()
            agent.evaluate(env, reset_seed(0, 10_000))
            t3 = time.perf_counter()
            its.append(t2 - t0)
            rollouts.append(t1 - t0)
            updates.append(t2 - t1)
            evals.append(t3 - t2)
    unit = "threads" if backend == "envpool" else "workers"
    sizes = f"E={cfg.episodes} T={env.horizon} D={env.dof} P={agent.dmp.num_params} {backend} {unit}={workers}"
    rows.append(
        {
            "what": f"tce iteration on {env_name} (rollout + update)",
            "sizes": sizes,
            "seconds": round(statistics.median(its), 3),
            "critic_s": "",
            "policy_s": "",
            "rollout_s": round(statistics.median(rollouts), 3),
            "update_s": round(statistics.median(updates), 3),
            "cpu_s": "",
        }
    )
    rows.append(
        {
            "what": f"evaluation of the mean trajectory ({cfg.eval_episodes} episodes)",
            "sizes": sizes,
            "seconds": round(statistics.median(evals), 3),
            "critic_s": "",
            "policy_s": "",
            "rollout_s": "",
            "update_s": "",
            "cpu_s": "",
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-env", action="store_true", help="only the updates (no MuJoCo)")
    parser.add_argument("--env", default="metaworld/push-v3", help="the iteration's env (default metaworld/push-v3)")
    parser.add_argument("--backends", default="envpool,python", help="Meta-World backends (default: both)")
    parser.add_argument("--quick", action="store_true", help="one TCE update and the iteration on both backends; E = 4")
    parser.add_argument("--baseline", help="src/ folder of a tree whose TCE update to compare with this tree's")
    parser.add_argument("--algo", default="tce", choices=("tce", "bbrl", "bbrl-cov"), help="--baseline's update")
    parser.add_argument("--rounds", type=int, default=4, help="--baseline: alternating rounds")
    parser.add_argument("--child", choices=("tce", "bbrl", "bbrl-cov"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 1 if args.quick else args.repeats
    if args.child:  # one tree's update, in the process --baseline started with that tree on PYTHONPATH
        print(json.dumps(time_update(args.child, 4, repeats)))
        return
    out = RESULTS / "bench_tce.csv"
    if args.baseline:
        rows = compare_trees(args.baseline, args.algo, args.rounds, repeats)
        out = out.with_name("bench_tce-baseline.csv")
    else:
        rows = [time_update("tce", dof, repeats) for dof in ((4,) if args.quick else (4, 7))]
        if not args.quick:
            rows.append(time_update("bbrl", 4, repeats))
        if not args.skip_env:
            for backend in args.backends.split(","):
                # quick: one core (EnvPool on 1 thread, the Python package in this process), E = 4
                workers, episodes = (int(backend == "envpool"), 4) if args.quick else (args.workers, None)
                rows += time_iteration(args.env, backend, workers, repeats, episodes)
    header = (
        f"TCE timings (medians of {repeats}; target: one Meta-World iteration under {TARGET_S:g} s). "
        f"torch {torch.__version__}, 1 torch thread, {os.cpu_count()} cores, "
        f"load average (1 min) at the end {os.getloadavg()[0]:.2f}."
    )
    write_results(rows, quick_path(out) if args.quick else out, header)


if __name__ == "__main__":
    main()
