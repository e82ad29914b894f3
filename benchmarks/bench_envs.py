"""Environment throughput: env steps per second of each episodic environment, on both Meta-World backends, on one
core and on N.

For each environment, backend and mode (python: ``workers=0``, every episode in this process, or ``workers=N``
processes; envpool: 1 or N EnvPool threads, all in this process), build it once, then time ``--repeats`` rounds of
reset(seed) + run(desired trajectory) of a batch of E episodes and report the medians: reset and run seconds, the
whole batch (what a TCE iteration spends in the environment; on EnvPool it includes building the pool, which every
reset does: envpool_backend.py), env steps per second of the run (E * T / run seconds) and of the batch (E * T /
batch seconds); for the one-core modes also per CPU second of this process (EnvPool's threads included), what one
idle core would do whatever else the machine runs. The desired trajectory is a smooth move away from the start
(the toy: its hand-made via-point solution), so that the controllers work as in training. The toy env is
vectorised in-process and has a single mode.

    OMP_NUM_THREADS=1 python benchmarks/bench_envs.py                       # all, E = 16 (toy: 1024), 2 workers
    OMP_NUM_THREADS=1 python benchmarks/bench_envs.py --quick               # push, reach, reacher: E = 4, 1 core
Writes benchmarks/results/bench_envs.csv (--quick: bench_envs-quick.csv) and prints a markdown table. The load
average printed with each row says how busy the machine was: on a shared machine the figures are preliminary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from _report import quick_path, write_results

from troll.episodic.envs import make_env
from troll.episodic.envs.toy import straight_through

RESULTS = Path(__file__).parent / "results"
DEFAULT_ENVS = ("toy/viapoint", "gym/reacher", "metaworld/reach-v3", "metaworld/push-v3", "metaworld/pick-place-v3")
QUICK_ENVS = ("metaworld/push-v3", "metaworld/reach-v3", "gym/reacher")


def trajectory(env, start) -> tuple[torch.Tensor, torch.Tensor]:
    """(E, T+1, D) desired positions and velocities: a minimum-jerk move over 60% of the episode, then rest."""
    if env.name.startswith("toy/"):
        return straight_through(start.pos, start.context[:, :2], start.context[:, 2:], env.horizon, env.dt)
    offset = torch.full((env.dof,), 0.5 if env.name.startswith("gym/") else 0.1)
    if env.dof == 4:
        offset[3] = 0.0  # Meta-World's gripper command stays open
    move = int(0.6 * env.horizon)
    s = (torch.arange(env.horizon + 1).clamp(max=move) / move)[None, :, None]
    pos = start.pos[:, None] + offset * (10 * s**3 - 15 * s**4 + 6 * s**5)
    vel = offset * (30 * s**2 - 60 * s**3 + 30 * s**4) / (move * env.dt)
    return pos, vel.expand_as(pos).contiguous()


def measure(name: str, *, episodes: int, workers: int, repeats: int, backend: str = "python") -> dict:
    """Build ``name`` once, then the medians over ``repeats`` batches of reset + run."""
    t0 = time.perf_counter()
    options = {"backend": backend} if name.startswith("metaworld/") else {}
    env = make_env(name, num_episodes=episodes, workers=workers, **options)
    build = time.perf_counter() - t0
    resets, runs, cpus = [], [], []
    with env:
        for r in range(repeats + 1):  # the first round warms up (imports, caches) and is not counted
            t0 = time.perf_counter()
            start = env.reset(seed=r)
            t1 = time.perf_counter()
            pos, vel = trajectory(env, start)
            t2, c2 = time.perf_counter(), time.process_time()
            env.run(pos, vel)
            t3, c3 = time.perf_counter(), time.process_time()
            if r:
                resets.append(t1 - t0)
                runs.append(t3 - t2)
                cpus.append(c3 - c2)
    reset_s, run_s, cpu_s = statistics.median(resets), statistics.median(runs), statistics.median(cpus)
    one_core = workers <= 1 if backend == "envpool" else workers == 0
    if name.startswith("toy/"):
        mode, one_core = "in-process (vectorised)", True
    elif backend == "envpool":
        mode = f"envpool, {max(workers, 1)} thread{'s' if workers > 1 else ''}"
    else:
        mode = "python, one process" if workers == 0 else f"python, {workers} workers"
    return {
        "env": name,
        "mode": mode,
        "workers": workers if not name.startswith("toy/") else 0,
        "episodes x steps": f"{episodes} x {env.horizon}",
        "build_s": round(build, 2),
        "reset_s": round(reset_s, 3),
        "run_s": round(run_s, 3),
        "batch_s": round(reset_s + run_s, 3),
        "steps_per_s": round(episodes * env.horizon / run_s),
        "batch_steps_per_s": round(episodes * env.horizon / (reset_s + run_s)),
        # one-core modes only: CPU time of this process, i.e. what the run would take on an idle core
        "steps_per_cpu_s": round(episodes * env.horizon / cpu_s) if one_core else "",
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }


def measure_envpool_reacher(episodes: int, repeats: int) -> dict:
    """EnvPool's Reacher-v5, as an envpool backend of gym/reacher would run it (a pool built per reset, so that each
    episode's seed fixes its start): build + reset + 50 steps of E episodes with a zero action, 1 thread. Compare its
    batch seconds with gym/reacher's python rows."""
    import envpool
    import numpy as np

    batches, runs, cpus = [], [], []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        seeds = list(range(r * episodes, (r + 1) * episodes))
        env = envpool.make_gymnasium("Reacher-v5", num_envs=episodes, env_seed=seeds, num_threads=1)
        env.reset()
        t1, c1 = time.perf_counter(), time.process_time()
        for _ in range(50):
            env.step(np.zeros((episodes, 2), np.float32))
        t2, c2 = time.perf_counter(), time.process_time()
        env.close()
        if r:
            batches.append(t2 - t0)
            runs.append(t2 - t1)
            cpus.append(c2 - c1)
    run_s, batch_s = statistics.median(runs), statistics.median(batches)
    return {"env": "Reacher-v5 (raw EnvPool)", "mode": "envpool, 1 thread, pool per reset", "workers": 1,
            "episodes x steps": f"{episodes} x 50", "build_s": "", "reset_s": round(batch_s - run_s, 3),
            "run_s": round(run_s, 3), "batch_s": round(batch_s, 3), "steps_per_s": round(episodes * 50 / run_s),
            "batch_steps_per_s": round(episodes * 50 / batch_s),
            "steps_per_cpu_s": round(episodes * 50 / statistics.median(cpus)),
            "load_avg_1min": round(os.getloadavg()[0], 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS))
    parser.add_argument("--episodes", type=int, default=16, help="E for the MuJoCo envs (TCE: 16 on Meta-World)")
    parser.add_argument("--toy-episodes", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    parser.add_argument("--backends", default="envpool,python", help="Meta-World backends (default: both)")
    parser.add_argument("--quick", action="store_true", help="push-v3, reach-v3, reacher; E = 4, one core, 1 repeat")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    envs, modes, repeats = args.envs, (0, args.workers), args.repeats
    if args.quick:
        envs, modes, repeats, args.episodes = QUICK_ENVS, (0,), 1, 4
    rows = []
    for name in envs:
        if name.startswith("toy/"):
            rows.append(measure(name, episodes=args.toy_episodes, workers=0, repeats=repeats))
            continue
        backends = args.backends.split(",") if name.startswith("metaworld/") else ["python"]
        for backend in backends:
            for workers in modes:
                workers = max(workers, 1) if backend == "envpool" else workers
                rows.append(measure(name, episodes=args.episodes, workers=workers, repeats=repeats, backend=backend))
        if name.startswith("gym/reacher") and "envpool" in args.backends:
            rows.append(measure_envpool_reacher(args.episodes, repeats))
    out = quick_path(RESULTS / "bench_envs.csv") if args.quick else RESULTS / "bench_envs.csv"
    write_results(rows, out, f"# episodic env throughput ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
