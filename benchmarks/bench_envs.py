"""Environment throughput: env steps per second of each episodic environment, on both backends (EnvPool and the
Python package, for Reacher and Meta-World), on one core and on N.

For each environment, backend and mode (python: ``workers=0``, every episode in this process, or ``workers=N``
processes; envpool: 1 or N EnvPool threads, all in this process), build it once, then time ``--repeats`` rounds of
reset(seed) + run(desired trajectory) of a batch of E episodes, the modes of one environment taking turns within
each round (so that a change of a shared machine's load falls on all of them alike), and report the medians: reset
and run seconds, the whole batch (what a TCE iteration spends in the environment; on EnvPool it includes building
the pool, which every reset does: envpool_backend.py), env steps per second of the run (E * T / run seconds) and of
the batch (E * T / batch seconds); for the one-core modes also per CPU second of this process (EnvPool's threads
included), of the run and of the batch (reset + run, a pool build included): what one idle core would do whatever
else the machine runs. The desired trajectory is a smooth move away from the start (the toy: its hand-made
via-point solution), so that the controllers work as in training. The toy env is vectorised in-process and has a
single mode. With envpool among the backends each env also gets a row of EnvPool alone (its own pool stepped with
random actions on one thread, no project code): the simulator's ceiling against which the EnvPool rows' overhead shows.
Hopper jump (one simulator, the Python package) gets a row of MuJoCo alone on its model instead (mj_step with random
commands, no project code): its "python, one process" row per CPU second should stay within 20 % of it.
Box pushing (Python only) gets a row of MuJoCo alone instead: the same episodes' joint torques replayed by
``mj_step`` from the same starts, no controller, rewards or observations; the line printed after the table gives
the env's run steps per CPU second as a share of it (the env code's overhead).

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
from troll.episodic.envs.registry import has_backends
from troll.episodic.envs.toy import straight_through

RESULTS = Path(__file__).parent / "results"
DEFAULT_ENVS = (
    "toy/viapoint",
    "gym/reacher",
    "metaworld/reach-v3",
    "metaworld/push-v3",
    "metaworld/pick-place-v3",
    "fancy/hopper-jump",
    "fancy/box-pushing-dense",
    "fancy/box-pushing-sparse",
)
BOX = ("fancy/box-pushing-dense", "fancy/box-pushing-sparse")
QUICK_ENVS = ("metaworld/push-v3", "metaworld/reach-v3", "gym/reacher", "fancy/hopper-jump")


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


def _mode(name: str, backend: str, workers: int) -> tuple[str, bool]:
    """The row's mode label, and whether it runs on one core."""
    if name.startswith("toy/"):
        return "in-process (vectorised)", True
    if backend == "envpool":
        return f"envpool, {workers} thread{'s' if workers > 1 else ''}", workers == 1
    return ("python, one process", True) if workers == 0 else (f"python, {workers} workers", False)


def measure(name: str, cells: list[tuple[str, int]], *, episodes: int, repeats: int) -> list[dict]:
    """Build ``name`` once per (backend, workers) cell, then ``repeats`` rounds (after a warm-up round, not counted)
    in which every cell does one reset + run in turn, the order rotating from round to round: a change of the
    machine's load falls on all cells alike. One row per cell, with the medians over the rounds."""
    envs, builds = [], []
    try:
        for backend, workers in cells:
            t0 = time.perf_counter()
            options = {} if name.startswith("toy/") else {"backend": backend}
            envs.append(make_env(name, num_episodes=episodes, workers=workers, **options))
            builds.append(time.perf_counter() - t0)
        times = [{"reset": [], "run": [], "cpu": [], "batch_cpu": [], "load": []} for _ in cells]
        for r in range(repeats + 1):
            for k in range(len(cells)):
                i = (k + r) % len(cells)
                t0, c0 = time.perf_counter(), time.process_time()
                start = envs[i].reset(seed=r)
                t1 = time.perf_counter()
                pos, vel = trajectory(envs[i], start)
                t2, c2 = time.perf_counter(), time.process_time()
                envs[i].run(pos, vel)
                t3, c3 = time.perf_counter(), time.process_time()
                if r:
                    values = (t1 - t0, t3 - t2, c3 - c2, c3 - c0, os.getloadavg()[0])
                    for key, value in zip(("reset", "run", "cpu", "batch_cpu", "load"), values):
                        times[i][key].append(value)
    finally:
        for env in envs:
            env.close()
    rows = []
    for (backend, workers), env, build, t in zip(cells, envs, builds, times):
        reset_s, run_s, cpu_s, batch_cpu_s = (statistics.median(t[k]) for k in ("reset", "run", "cpu", "batch_cpu"))
        mode, one_core = _mode(name, backend, workers)
        steps = episodes * env.horizon
        rows.append({
            "env": name,
            "mode": mode,
            "workers": workers,
            "episodes x steps": f"{episodes} x {env.horizon}",
            "build_s": round(build, 2),
            "reset_s": round(reset_s, 3),
            "run_s": round(run_s, 3),
            "batch_s": round(reset_s + run_s, 3),
            "steps_per_s": round(steps / run_s),
            "batch_steps_per_s": round(steps / (reset_s + run_s)),
            # one-core modes only: CPU time of this process, i.e. what the run would take on an idle core
            "steps_per_cpu_s": round(steps / cpu_s) if one_core else "",
            "batch_steps_per_cpu_s": round(steps / batch_cpu_s) if one_core else "",
            "load_avg_1min": round(statistics.median(t["load"]), 2),
        })  # fmt: skip
    return rows


def alone_row(name: str, mode: str, workers: int, episodes: int, horizon: int, walls, cpus, loads) -> dict:
    """The table row of a simulator run alone (no project code): medians of the timed rounds of ``episodes``
    episodes of ``horizon`` steps each, per second and per CPU second."""
    steps = episodes * horizon
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    return {
        "env": name, "mode": mode, "workers": workers,
        "episodes x steps": f"{episodes} x {horizon}", "build_s": "", "reset_s": "", "run_s": round(wall, 3),
        "batch_s": "", "steps_per_s": round(steps / wall), "batch_steps_per_s": "",
        "steps_per_cpu_s": round(steps / cpu), "batch_steps_per_cpu_s": "",
        "load_avg_1min": round(statistics.median(loads), 2),
    }  # fmt: skip


def raw_envpool(name: str, *, episodes: int, repeats: int) -> dict:
    """EnvPool alone, no controller and no project code: one thread steps ``episodes`` envs of ``name`` for T steps of
    uniform random actions in [-1, 1], ``repeats`` times after a warm-up; the simulator's own ceiling on this
    machine for the rows above (medians)."""
    import envpool
    import numpy as np

    from troll.episodic.envs.envpool_backend import task_id

    env_id, horizon = ("Reacher-v5", 50) if name.startswith("gym/") else (task_id(name.split("/", 1)[1]), 500)
    extra = {} if name.startswith("gym/") else {"partially_observable": False}
    pool = envpool.make_gymnasium(env_id, num_envs=episodes, num_threads=1, env_seed=list(range(episodes)),
                                  max_episode_steps=horizon, **extra)  # fmt: skip
    rng = np.random.default_rng(0)
    walls, cpus, loads = [], [], []
    try:
        dim = pool.action_space.shape[0]
        for r in range(repeats + 1):
            pool.reset()
            actions = rng.uniform(-1, 1, (horizon, episodes, dim)).astype(np.float32)
            t0, c0 = time.perf_counter(), time.process_time()
            for t in range(horizon - 1):  # the last step would end the episodes and auto-reset
                pool.step(actions[t])
            if r:
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
                loads.append(os.getloadavg()[0])
    finally:
        pool.close()
    return alone_row(name, "EnvPool alone, random actions, 1 thread", 1, episodes, horizon - 1, walls, cpus, loads)


def raw_mujoco_hopper(*, episodes: int, repeats: int) -> dict:
    """MuJoCo alone on hopper jump's model, no project code: ``episodes`` episodes of 250 steps (4 substeps each)
    from the 1.5 m start, each step setting a uniform random command in [-1, 1] and calling mj_step, ``repeats``
    times after a warm-up; the ceiling of the "python, one process" row (medians, per CPU second)."""
    import mujoco
    import numpy as np

    from troll.episodic.envs import hopper_jump as hj

    model = mujoco.MjModel.from_xml_path(str(hj.model_path()))
    data = mujoco.MjData(model)
    actions = np.random.default_rng(0).uniform(-1, 1, (hj.HORIZON, 3))
    walls, cpus, loads = [], [], []
    for r in range(repeats + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(episodes):
            mujoco.mj_resetData(model, data)
            data.qpos[1] = hj.START_Z
            mujoco.mj_forward(model, data)
            for t in range(hj.HORIZON):
                data.ctrl[:] = actions[t]
                mujoco.mj_step(model, data, 4)
        if r:
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            loads.append(os.getloadavg()[0])
    mode = "MuJoCo alone, random commands, one process"
    return alone_row("fancy/hopper-jump", mode, 0, episodes, hj.HORIZON, walls, cpus, loads)


def raw_mujoco(name: str, *, episodes: int, repeats: int) -> dict:
    """MuJoCo alone on the box-pushing model: the episodes the env's rows run (the same seeds and trajectory), their
    joint torques recorded in an untimed pass, then replayed from the same starts by ``mj_step`` (10 substeps) with
    nothing else: the same physics without the env code (controller, bias forces, observations, rewards, checks)."""
    import types

    import mujoco
    import numpy as np

    from troll.episodic.envs.base import EpisodeStart, episode_seeds
    from troll.episodic.envs.box_pushing import BoxPushingConfig, BoxPushingTask, pd_action
    from troll.episodic.envs.box_pushing_sim import DT, FRAME_SKIP, HORIZON

    task = BoxPushingTask(BoxPushingConfig(sparse=name.endswith("-sparse")))
    d, shape = task.sim.data, types.SimpleNamespace(name=name, dof=7, horizon=HORIZON, dt=DT)
    walls, cpus, loads = [], [], []
    for r in range(repeats + 1):
        seeds = episode_seeds(r, episodes)
        q0 = torch.tensor(np.stack([task.start(s)[:7] for s in seeds]))
        pos, vel = (x.numpy() for x in trajectory(shape, EpisodeStart(q0, q0, torch.zeros_like(q0))))
        torques = np.empty((episodes, HORIZON, 7))
        for e, s in enumerate(seeds):  # untimed: the torques the env applies
            task.start(s)
            for t in range(HORIZON):
                task.step(pd_action(pos[e, t + 1], vel[e, t + 1], d.qpos[:7], d.qvel[:7]))
                torques[e, t] = d.ctrl
        wall = cpu = 0.0
        for e, s in enumerate(seeds):
            task.start(s)
            t0, c0 = time.perf_counter(), time.process_time()
            for t in range(HORIZON):
                d.ctrl[:] = torques[e, t]
                mujoco.mj_step(task.sim.model, d, nstep=FRAME_SKIP)
            wall, cpu = wall + time.perf_counter() - t0, cpu + time.process_time() - c0
        if r:
            walls.append(wall)
            cpus.append(cpu)
            loads.append(os.getloadavg()[0])
    return alone_row(name, "MuJoCo alone, the same torques, one process", 0, episodes, HORIZON, walls, cpus, loads)


def overhead_lines(rows: list[dict]) -> list[str]:
    """For each box-pushing env: its one-process run steps per CPU second as a share of MuJoCo alone's."""
    lines = []
    for name in BOX:
        env = [r for r in rows if r["env"] == name and r["mode"] == "python, one process"]
        raw = [r for r in rows if r["env"] == name and r["mode"].startswith("MuJoCo alone")]
        if env and raw:
            share = env[0]["steps_per_cpu_s"] / raw[0]["steps_per_cpu_s"]
            lines.append(f"{name}: the env runs {env[0]['steps_per_cpu_s']} steps per CPU second, MuJoCo alone "
                         f"{raw[0]['steps_per_cpu_s']}: {share:.0%} of it ({1 - share:+.0%} overhead)")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS))
    parser.add_argument("--episodes", type=int, default=16, help="E for the MuJoCo envs (TCE: 16 on Meta-World)")
    parser.add_argument("--toy-episodes", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    parser.add_argument("--backends", default="envpool,python", help="backends of gym/* and metaworld/* "
                        "(default: both)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="push-v3, reach-v3, reacher; E = 4, one core, 1 repeat")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    envs, modes, repeats = args.envs, (0, args.workers), args.repeats
    if args.quick:
        envs, modes, repeats, args.episodes = QUICK_ENVS, (0,), 1, 4
    rows = []
    for name in envs:
        if name.startswith("toy/"):
            rows += measure(name, [("python", 0)], episodes=args.toy_episodes, repeats=repeats)
            continue
        if name in BOX:  # Python only: compared with MuJoCo stepping the same model
            rows += measure(name, [("python", w) for w in modes], episodes=args.episodes, repeats=repeats)
            rows.append(raw_mujoco(name, episodes=args.episodes, repeats=repeats))
            continue
        backends = args.backends.split(",") if has_backends(name) else ["python"]
        cells = [(b, max(w, 1) if b == "envpool" else w) for b in backends for w in modes]
        rows += measure(name, list(dict.fromkeys(cells)), episodes=args.episodes, repeats=repeats)
        if "envpool" in backends:
            rows.append(raw_envpool(name, episodes=args.episodes, repeats=repeats))
        if name == "fancy/hopper-jump":
            rows.append(raw_mujoco_hopper(episodes=args.episodes, repeats=repeats))
    out = quick_path(RESULTS / "bench_envs.csv") if args.quick else RESULTS / "bench_envs.csv"
    write_results(rows, out, f"# episodic env throughput ({os.cpu_count()} cores)")
    for line in overhead_lines(rows):
        print(line)


if __name__ == "__main__":
    main()
