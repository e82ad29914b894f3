r"""Environment throughput: env steps per second of each episodic environment, on both backends (EnvPool and the
Python package, for Reacher and Meta-World), on one core and on N.

For each environment, backend and mode (python: ``workers=0``, every episode in this process, or ``workers=N``
processes; envpool: 1 or N EnvPool threads, all in this process), build it once, then time ``--repeats`` rounds of
reset(seed) + run(desired trajectory) of a batch of E episodes, the modes of one environment taking turns within
each round (so that a change of a shared machine's load falls on all of them alike), and report the medians: reset
and run seconds, the whole batch (what a TCE iteration spends in the environment; on EnvPool it includes building
the pool, which every reset does: envpool_backend.py), env steps per second of the run (E * T / run seconds) and of
the batch (E * T / batch seconds); for the one-core modes also per CPU second of this process (EnvPool's threads
included), of the run and of the batch (reset + run, a pool build included; the desired trajectory, the algorithm's
work, is not counted), and the reset's share of the batch's CPU time: what one idle core would do whatever else the
machine runs. The desired trajectory is a smooth move away from the start (the toy: its hand-made via-point
solution), so that the controllers work as in training. The toy env is vectorised in-process and has a single mode.
With envpool among the backends each env also gets a row of EnvPool alone (its own pool stepped with random actions
on one thread, no project code): the simulator's ceiling against which the EnvPool rows' overhead shows.
Hopper jump and box pushing (Python only) get a row of MuJoCo alone instead: the commands the env's own episodes
(the same seeds and trajectory) gave MuJoCo, recorded in an untimed pass, replayed by ``mj_step`` from the same
starts (ending in the env's final states, checked), without the controller, observations or rewards. Its whole
episodes add the MuJoCo calls of the episodes' first resets (box pushing's reset runs fancy_gym's inverse
kinematics: docs/tce-tasks.md), replayed from the states they were made in, without the code between them. The lines
printed after the table give the env's one-process steps per CPU second as shares of it, of the run alone and of
whole episodes (reset + run), and the reset's share of an episode.

    OMP_NUM_THREADS=1 python benchmarks/bench_envs.py                       # all, E = 16 (toy: 1024), 2 workers
    OMP_NUM_THREADS=1 python benchmarks/bench_envs.py --quick               # push, reach, reacher: E = 4, 1 core
    OMP_NUM_THREADS=1 python benchmarks/bench_envs.py --envs fancy/hopper-jump fancy/box-pushing-dense \
        fancy/box-pushing-sparse --workers 0 --repeats 5                      # the fancy/* envs, one process
Writes benchmarks/results/bench_envs.csv (--quick: bench_envs-quick.csv) and prints a markdown table. The load
average printed with each row says how busy the machine was: on a shared machine the figures are preliminary.
"""

from __future__ import annotations

import argparse
import contextlib
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
FANCY = ("fancy/hopper-jump", "fancy/box-pushing-dense", "fancy/box-pushing-sparse")  # Python only, vs MuJoCo alone
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
        times = [{"reset": [], "run": [], "cpu": [], "reset_cpu": [], "load": []} for _ in cells]
        for r in range(repeats + 1):
            for k in range(len(cells)):
                i = (k + r) % len(cells)
                t0, c0 = time.perf_counter(), time.process_time()
                start = envs[i].reset(seed=r)
                t1, c1 = time.perf_counter(), time.process_time()
                pos, vel = trajectory(envs[i], start)  # not timed: the algorithm's work, not the env's
                t2, c2 = time.perf_counter(), time.process_time()
                envs[i].run(pos, vel)
                t3, c3 = time.perf_counter(), time.process_time()
                if r:
                    values = (t1 - t0, t3 - t2, c3 - c2, c1 - c0, os.getloadavg()[0])
                    for key, value in zip(("reset", "run", "cpu", "reset_cpu", "load"), values):
                        times[i][key].append(value)
    finally:
        for env in envs:
            env.close()
    rows = []
    for (backend, workers), env, build, t in zip(cells, envs, builds, times):
        reset_s, run_s, cpu_s, reset_cpu_s = (statistics.median(t[k]) for k in ("reset", "run", "cpu", "reset_cpu"))
        batch_cpu_s = statistics.median(a + b for a, b in zip(t["reset_cpu"], t["cpu"]))
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
            "reset_share_cpu": round(statistics.median(a / (a + b) for a, b in zip(t["reset_cpu"], t["cpu"])), 3)
                               if one_core else "",
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
        "steps_per_cpu_s": round(steps / cpu), "batch_steps_per_cpu_s": "", "reset_share_cpu": "",
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


def _runner(name: str):
    """The episodic runner of a fancy/* env, in this process (what a worker of make_env builds)."""
    if name == "fancy/hopper-jump":
        from troll.episodic.envs.hopper_jump import HopperJumpConfig
        from troll.episodic.envs.hopper_jump_sim import HopperJumpRunner

        return HopperJumpRunner(HopperJumpConfig())
    from troll.episodic.envs.box_pushing import BoxPushingConfig, BoxPushingRunner

    return BoxPushingRunner(BoxPushingConfig(sparse=name.endswith("-sparse")))


@contextlib.contextmanager
def _recorded(calls: list[list], **entries):
    """Within the block, each call of a MuJoCo function named in ``entries`` (mj_step, say) first appends
    entries[name](data, *args, **kwargs) to calls[-1], then runs the function: the calls a simulator makes (they
    look the functions up on the module when they call them), recorded without changing them."""
    import mujoco

    real = {name: getattr(mujoco, name) for name in entries}

    def recording(name):
        def call(model, data, *args, **kwargs):
            calls[-1].append(entries[name](data, *args, **kwargs))
            real[name](model, data, *args, **kwargs)

        return call

    for name in entries:
        setattr(mujoco, name, recording(name))
    try:
        yield
    finally:
        for name, function in real.items():
            setattr(mujoco, name, function)


def _commands(runner, seeds: list[int], pos, vel) -> tuple[list[list[tuple]], list]:
    """The (command, substeps) of every mj_step call of the runner's episodes (E, T+1, D desired trajectories),
    recorded for one untimed pass, and the qpos each episode ends in."""
    calls, ends = [], []
    with _recorded(calls, mj_step=lambda data, nstep=1: (data.ctrl.copy(), nstep)):
        for e, seed in enumerate(seeds):
            calls.append([])
            runner.run(e, seed, pos[e], vel[e])
            ends.append(runner.sim.data.qpos.copy())
    return calls, ends


STATE = ("qpos", "qvel", "ctrl", "qacc_warmstart")  # what a forward pass of the reset reads and the reset sets


def _reset_calls(name: str, seeds: list[int]) -> list[list[tuple]]:
    """The MuJoCo calls of a first reset of each seed (box pushing's inverse kinematics), recorded in a runner of its
    own, which has not seen the seeds yet: (MuJoCo function, the state a forward pass was made in or None, the
    arguments after model and data). The forward passes (mj_forward, mj_forwardSkip) keep their state: qpos, qvel,
    ctrl and the solver's warm start."""
    import mujoco

    def state(data):
        return tuple(getattr(data, key).copy() for key in STATE)

    calls, runner = [], _runner(name)
    try:
        with _recorded(
            calls,
            mj_forward=lambda data: ("mj_forward", state(data), ()),
            mj_forwardSkip=lambda data, stage, sensor: ("mj_forwardSkip", state(data), (stage, sensor)),
            mj_jacBody=lambda data, jacp, jacr, body: ("mj_jacBody", None, (jacp, jacr, body)),
        ):
            for e, seed in enumerate(seeds):
                calls.append([])
                runner.reset(e, seed)
    finally:
        runner.close()
    # the functions themselves (restored on leaving the block), so that the timed replay looks up nothing
    return [[(getattr(mujoco, name), saved, args) for name, saved, args in reset] for reset in calls]


def raw_mujoco(name: str, *, episodes: int, repeats: int) -> dict:
    """MuJoCo alone on a fancy/* env's own model: the episodes the env's rows run (the same seeds and trajectory),
    their commands recorded in an untimed pass, then replayed from the same starts by ``mj_step`` (the same
    substeps) with nothing else: the same physics without the env code (controller, bias forces, observations,
    rewards, checks). Its whole episodes add the MuJoCo calls of the seeds' first resets (box pushing's inverse
    kinematics: its forward passes from the same states, ``mj_jacBody``), replayed without the code between them."""
    import types

    import mujoco
    import numpy as np

    from troll.episodic.envs.base import EpisodeStart, episode_seeds

    runner = _runner(name)
    spec = runner.spec
    model, data = runner.sim.model, runner.sim.data
    shape = types.SimpleNamespace(name=name, dof=spec.dof, horizon=spec.horizon, dt=spec.dt)
    walls, cpus, reset_cpus, loads = [], [], [], []
    try:
        for r in range(repeats + 1):
            seeds = episode_seeds(r, episodes)
            resets = _reset_calls(name, seeds)
            q0 = torch.tensor(np.stack([runner.reset(e, s)[1] for e, s in enumerate(seeds)]))
            pos, vel = (x.numpy() for x in trajectory(shape, EpisodeStart(q0, q0, torch.zeros_like(q0))))
            commands, ends = _commands(runner, seeds, pos, vel)
            wall = cpu = reset_cpu = 0.0
            for e, seed in enumerate(seeds):
                runner.reset(e, seed)  # the seed's goal bodies (the reset moves them in the model); then its calls
                c0 = time.process_time()
                for function, state, args in resets[e]:
                    if state is not None:
                        for key, value in zip(STATE, state):
                            getattr(data, key)[:] = value
                    function(model, data, *args)
                reset_cpu += time.process_time() - c0
                runner.reset(e, seed)
                t0, c0 = time.perf_counter(), time.process_time()
                for command, nstep in commands[e]:
                    data.ctrl[:] = command
                    mujoco.mj_step(model, data, nstep)
                wall, cpu = wall + time.perf_counter() - t0, cpu + time.process_time() - c0
                if not np.array_equal(data.qpos, ends[e]):  # the replay is the env's episode, to the bit
                    raise RuntimeError(f"{name}: replaying episode {e}'s commands ended elsewhere than the env")
            if r:
                walls.append(wall)
                cpus.append(cpu)
                reset_cpus.append(reset_cpu)
                loads.append(os.getloadavg()[0])
    finally:
        runner.close()
    mode = "MuJoCo alone, the env's commands (whole episodes: and the resets' MuJoCo calls), one process"
    row = alone_row(name, mode, 0, episodes, spec.horizon, walls, cpus, loads)
    steps = episodes * spec.horizon
    row["batch_steps_per_cpu_s"] = round(steps / statistics.median(a + b for a, b in zip(reset_cpus, cpus)))
    row["reset_share_cpu"] = round(statistics.median(a / (a + b) for a, b in zip(reset_cpus, cpus)), 3)
    return row


def overhead_lines(rows: list[dict]) -> list[str]:
    """For each fancy/* env: its one-process steps per CPU second, stepping alone (run) and in whole episodes (reset
    + run), as shares of MuJoCo alone's, and the reset's share of an episode's CPU time."""
    lines = []
    for name in FANCY:
        env = [r for r in rows if r["env"] == name and r["mode"] == "python, one process"]
        raw = [r for r in rows if r["env"] == name and r["mode"].startswith("MuJoCo alone")]
        if env and raw:
            (env,), ceiling = env, raw[0]["steps_per_cpu_s"]
            run, whole, whole_ceiling = (
                env["steps_per_cpu_s"],
                env["batch_steps_per_cpu_s"],
                raw[0]["batch_steps_per_cpu_s"],
            )
            lines.append(f"{name}: steps per CPU second, MuJoCo alone {ceiling}; the env's run {run} "
                         f"({run / ceiling:.0%} of it), its whole episodes (reset + run) {whole} "
                         f"({whole / ceiling:.0%}); the reset takes {env['reset_share_cpu']:.1%} of an episode's CPU "
                         f"time. Whole episodes of MuJoCo alone, with the resets' MuJoCo calls: {whole_ceiling}, the "
                         f"env's {whole / whole_ceiling:.0%} of it (the resets' calls {raw[0]['reset_share_cpu']:.1%} "
                         "of their CPU time)")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS))
    parser.add_argument("--episodes", type=int, default=16, help="E for the MuJoCo envs (TCE: 16 on Meta-World)")
    parser.add_argument("--toy-episodes", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2, help="processes of the multi-process rows (0: none, "
                        "the one-process rows alone)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    parser.add_argument("--backends", default="envpool,python", help="backends of gym/* and metaworld/* "
                        "(default: both)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="push-v3, reach-v3, reacher; E = 4, one core, 1 repeat")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    envs, modes, repeats = args.envs, (0, args.workers) if args.workers else (0,), args.repeats
    if args.quick:
        envs, modes, repeats, args.episodes = QUICK_ENVS, (0,), 1, 4
    rows = []
    for name in envs:
        if name.startswith("toy/"):
            rows += measure(name, [("python", 0)], episodes=args.toy_episodes, repeats=repeats)
            continue
        if name in FANCY:  # Python only: compared with MuJoCo stepping the same model with the same commands
            rows += measure(name, [("python", w) for w in modes], episodes=args.episodes, repeats=repeats)
            rows.append(raw_mujoco(name, episodes=args.episodes, repeats=repeats))
            continue
        backends = args.backends.split(",") if has_backends(name) else ["python"]
        cells = [(b, max(w, 1) if b == "envpool" else w) for b in backends for w in modes]
        rows += measure(name, list(dict.fromkeys(cells)), episodes=args.episodes, repeats=repeats)
        if "envpool" in backends:
            rows.append(raw_envpool(name, episodes=args.episodes, repeats=repeats))
    out = quick_path(RESULTS / "bench_envs.csv") if args.quick else RESULTS / "bench_envs.csv"
    write_results(rows, out, f"# episodic env throughput ({os.cpu_count()} cores)")
    for line in overhead_lines(rows):
        print(line)


if __name__ == "__main__":
    main()
