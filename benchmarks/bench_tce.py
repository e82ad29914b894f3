"""Seconds of one TCE update and of one TCE iteration at the spec's sizes (docs/tce.md, "Speed").

Update: the preset's ``critic_epochs`` + ``policy_epochs`` (TCE 50 + 50, ``bbrl`` 100 + 100) on one synthetic
Meta-World-sized batch, E = 16 episodes of T = 500 steps, S = 39 state entries, C = 39 context entries (the preset's
``context="full"``; before 2026-11-27, C = 5), for D = 4 DoF (P = 36, Meta-World's xyz + gripper)
and D = 7 (P = 63, a 7-joint arm), num_basis 8; BBRL's update on the same batch for comparison. The batch is
random (states, rewards) with theta sampled from the policy: the update's cost does not depend on the values.
Iteration: rollout (16 episodes of 500 steps of ``--env``, default metaworld/push-v3, on each backend: EnvPool on
``--workers`` threads, the Python package over ``--workers`` processes) + update, split into rollout and update
seconds, and the evaluation of the mean trajectory (16 more episodes, every ``eval_every`` iterations in a run) on
its own row.

    OMP_NUM_THREADS=1 python benchmarks/bench_tce.py                  # everything, 3 repeats, medians
    OMP_NUM_THREADS=1 python benchmarks/bench_tce.py --quick          # the iteration on both backends, E = 4, 1 core
    OMP_NUM_THREADS=1 python benchmarks/bench_tce.py --skip-env       # updates only (no MuJoCo needed)
Writes benchmarks/results/bench_tce.csv (--quick: bench_tce-quick.csv) and prints a markdown table. Each row
carries the 1-minute load average when it was measured: figures taken while other jobs share the machine
are preliminary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from _report import quick_path, write_results

from troll.episodic.envs import Episodes, EpisodeStart
from troll.episodic.tce.agent import Rollout, TCEAgent, reset_seed
from troll.episodic.tce.config import TCEConfig

RESULTS = Path(__file__).parent / "results"
TARGET_S = 10.0  # the speed goal for one Meta-World iteration (rollout + update) on this machine
CONTEXT_DIM = 39  # the metaworld preset's context: all 39 entries of the reset observation (context "full")


def synthetic_batch(agent: TCEAgent, episodes: int, context_dim: int, seed: int = 0) -> Rollout:
    """A Meta-World-sized batch: random contexts, states and rewards; theta sampled from the agent's policy."""
    g = torch.Generator().manual_seed(seed)
    t, d, s = agent.horizon, agent.dof, agent.state_dim
    start = EpisodeStart(
        context=torch.randn(episodes, context_dim, generator=g),
        pos=torch.randn(episodes, d, generator=g) * 0.1,
        vel=torch.zeros(episodes, d),
    )
    theta, pos, vel = agent.trajectories(start)
    ep = Episodes(
        states=torch.randn(episodes, t + 1, s, generator=g),
        rewards=torch.rand(episodes, t, generator=g),
        dones=torch.zeros(episodes, t, dtype=torch.bool),
        success=torch.zeros(episodes, dtype=torch.bool),
        final={},
    )
    return Rollout(start, theta, pos, vel, ep)


def time_update(algo: str, dof: int, repeats: int) -> dict:
    cfg = TCEConfig.preset("metaworld/reach-v3", algo=algo)
    agent = TCEAgent(cfg, context_dim=CONTEXT_DIM, state_dim=39, dof=dof, horizon=500, dt=0.0125)
    batch = synthetic_batch(agent, cfg.episodes, CONTEXT_DIM)
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
        "load_1min": round(os.getloadavg()[0], 2),
    }


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
    load = round(os.getloadavg()[0], 2)
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
            "load_1min": load,
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
            "load_1min": load,
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
    parser.add_argument("--quick", action="store_true", help="only the iteration on both backends; E = 4, 1 core")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 1 if args.quick else args.repeats
    rows = []
    if not args.quick:
        rows += [time_update("tce", dof, repeats) for dof in (4, 7)]
        rows.append(time_update("bbrl", 4, repeats))
    if not args.skip_env:
        for backend in args.backends.split(","):
            # quick: one core (EnvPool on 1 thread, the Python package in this process), E = 4
            workers, episodes = (int(backend == "envpool"), 4) if args.quick else (args.workers, None)
            rows += time_iteration(args.env, backend, workers, repeats, episodes)
    header = (
        f"TCE timings (medians of {repeats}; target: one Meta-World iteration under {TARGET_S:g} s). "
        f"torch {torch.__version__}, 1 torch thread, {os.cpu_count()} cores. Preliminary when load_1min is high."
    )
    write_results(rows, quick_path(RESULTS / "bench_tce.csv") if args.quick else RESULTS / "bench_tce.csv", header)


if __name__ == "__main__":
    main()
