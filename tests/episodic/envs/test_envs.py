"""The episodic environments: the toy via-point task, Reacher-v5 and Meta-World behind tracking controllers, the
factory, non-finite detection and the worker pool (crash propagation, parallel == serial, clean shutdown).

The MuJoCo tests skip without gymnasium / mujoco / metaworld; each builds its envs once (module fixtures) and keeps
the episodes few: a Meta-World episode is 500 steps, ~0.5 s on one core.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial

import numpy as np
import pytest
import torch

from troll.episodic.envs import ENV_NAMES, EnvWorkerError, NonFiniteError, make_env
from troll.episodic.envs.registry import horizon
from troll.episodic.envs.toy import ViaPointEnv, straight_through
from troll.episodic.envs.workers import EpisodeResult, PooledEnv, RunnerSpec


def min_jerk(start: torch.Tensor, end: torch.Tensor, horizon: int, dt: float, move: int, begin: int = 0):
    """(E, T+1, D) positions and velocities: at rest at start (E, D) until step ``begin``, a minimum-jerk move to
    end in ``move`` steps, then at rest."""
    k = (torch.arange(horizon + 1, dtype=torch.float64) - begin).clamp(0, move)
    s = (k / move)[None, :, None]
    delta = (end - start).double()[:, None]
    pos = start.double()[:, None] + delta * (10 * s**3 - 15 * s**4 + 6 * s**5)
    vel = delta * (30 * s**2 - 60 * s**3 + 30 * s**4) / (move * dt)
    return pos.float(), vel.float()


def via_then_goal(start, via, goal, horizon, dt, *, at_via: int, leave: int, at_goal: int):
    """Minimum-jerk start -> via (arriving at step at_via), rest until ``leave``, via -> goal (arriving at at_goal)."""
    p1, v1 = min_jerk(start, via, horizon, dt, move=at_via)
    p2, v2 = min_jerk(via, goal, horizon, dt, move=at_goal - leave, begin=leave)
    first = (torch.arange(horizon + 1) < leave)[None, :, None]
    return torch.where(first, p1, p2), torch.where(first, v1, v2)


# ---------------------------------------------------------------- toy


def test_toy_shapes_and_solution():
    env = make_env("toy/viapoint", num_episodes=64)
    assert (env.dof, env.horizon, env.context_dim, env.state_dim) == (2, 100, 4, 8)
    start = env.reset(seed=0)
    assert start.context.shape == (64, 4) and start.pos.shape == start.vel.shape == (64, 2)
    assert torch.all(start.pos == 0) and torch.all(start.context.abs() <= 1)
    pos, vel = straight_through(start.pos, start.context[:, :2], start.context[:, 2:], env.horizon, env.dt)
    ep = env.run(pos, vel)
    assert ep.states.shape == (64, 101, 8) and ep.rewards.shape == (64, 100) and ep.dones.shape == (64, 100)
    assert ep.dones.dtype == torch.bool and not ep.dones.any()
    assert ep.success.all(), ep.final
    assert torch.equal(ep.states[:, :, 4:], start.context[:, None].expand(-1, 101, -1))  # the task is in the state
    assert (ep.states[:, :, :2] - pos).norm(dim=-1).max() < 0.05  # PD + feedforward tracks the hand-made path
    zero = env.run(torch.zeros_like(pos), torch.zeros_like(vel))
    assert not zero.success.any()
    assert (zero.final["return"] < ep.final["return"]).all()


def test_toy_is_deterministic_per_seed():
    env = ViaPointEnv(num_episodes=16)
    a, b, c = env.reset(3), env.reset(3), env.reset(4)
    assert torch.equal(a.context, b.context) and not torch.equal(a.context, c.context)
    pos, vel = straight_through(a.pos, a.context[:, :2], a.context[:, 2:], env.horizon, env.dt)
    env.reset(3)
    first = env.run(pos, vel)
    env.reset(3)
    second = env.run(pos, vel)
    assert torch.equal(first.states, second.states) and torch.equal(first.rewards, second.rewards)


def test_toy_reward_and_success_rules():
    env = ViaPointEnv(num_episodes=256)
    start = env.reset(seed=1)
    via, goal = start.context[:, :2], start.context[:, 2:]
    good = via_then_goal(start.pos, via, goal, env.horizon, env.dt, at_via=50, leave=50, at_goal=90)
    early = via_then_goal(start.pos, via, goal, env.horizon, env.dt, at_via=15, leave=20, at_goal=28)
    g = torch.Generator().manual_seed(0)
    rand = min_jerk(start.pos, torch.rand(256, 2, generator=g) * 2 - 1, env.horizon, env.dt, move=80)
    phase = torch.arange(1, env.horizon + 1) / env.horizon
    weight = torch.exp(-0.5 * ((phase - 0.5) / 0.1) ** 2)
    for pos, vel in (good, early, rand):
        ep = env.run(pos, vel)
        x, v = ep.states[..., :2], ep.states[..., 2:4]
        via_dist = (x[:, 1:] - via[:, None]).norm(dim=-1)
        goal_dist, speed = (x[:, -1] - goal).norm(dim=-1), v[:, -1].norm(dim=-1)
        expect = -(via_dist * weight / weight.sum()).sum(-1) - goal_dist - 0.2 * speed
        torch.testing.assert_close(ep.final["return"], expect)
        closest = via_dist[:, (phase - 0.5).abs() <= 0.2 + 1e-6].min(-1).values
        assert torch.equal(ep.success, (closest <= 0.1) & (goal_dist <= 0.1) & (speed <= 0.25))
    assert env.run(*good).success.all()
    assert env.run(*rand).success.float().mean() < 0.02  # a context-blind policy does not solve it
    # passing the via-point early, outside the middle 40% of the episode, is not passing it
    far = (via - goal).norm(dim=-1) > 0.2
    assert not env.run(*early).success[far].any() and far.sum() > 200


def test_toy_sparse_reward_at_the_end():
    dense, sparse = ViaPointEnv(num_episodes=32), make_env("toy/viapoint-sparse", num_episodes=32)
    start = dense.reset(2)
    sparse.reset(2)
    g = torch.Generator().manual_seed(1)
    pos, vel = min_jerk(start.pos, torch.rand(32, 2, generator=g) * 2 - 1, 100, 0.02, move=70)
    d, s = dense.run(pos, vel), sparse.run(pos, vel)
    assert torch.equal(d.states, s.states) and not s.rewards[:, :-1].any()
    expect = -(s.final["via_distance"] + s.final["distance"] + 0.2 * s.final["speed"])
    torch.testing.assert_close(s.rewards[:, -1], expect)


def test_toy_bad_input_and_non_finite(monkeypatch):
    env = ViaPointEnv(num_episodes=4)
    with pytest.raises(RuntimeError, match="reset"):
        env.run(torch.zeros(4, 101, 2), torch.zeros(4, 101, 2))
    env.reset(0)
    with pytest.raises(ValueError, match=r"\(E, T\+1, D\) = \(4, 101, 2\)"):
        env.run(torch.zeros(4, 100, 2), torch.zeros(4, 100, 2))
    bad = torch.zeros(4, 101, 2)
    bad[2, 7, 1] = float("nan")
    with pytest.raises(ValueError, match="episode 2, time index 7, dof 1"):
        env.run(bad, torch.zeros_like(bad))
    real = env._rollout

    def poisoned(p_d, v_d):
        x, v = real(p_d, v_d)
        x[1, 40, 0] = float("inf")
        return x, v

    monkeypatch.setattr(env, "_rollout", poisoned)
    with pytest.raises(NonFiniteError, match=r"toy/viapoint: non-finite observation at step 40 of episode 1"):
        env.run(torch.zeros(4, 101, 2), torch.zeros(4, 101, 2))


# ---------------------------------------------------------------- factory


def test_make_env_reports_a_missing_simulator_before_starting(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "metaworld" else real(name, *a))
    with pytest.raises(ImportError, match=r"metaworld/push-v3 needs metaworld: pip install troll\[episodic\]"):
        make_env("metaworld/push-v3", num_episodes=2)


def test_make_env_errors():
    with pytest.raises(ValueError, match=r"Did you mean 'metaworld/reach-v3'") as err:
        make_env("metaworld/reach-v2", num_episodes=2)
    assert "toy/viapoint" in str(err.value) and "gym/reacher-sparse" in str(err.value) and "push-v3" in str(err.value)
    with pytest.raises(ValueError, match="unknown episodic environment 'atari/pong'"):
        make_env("atari/pong", num_episodes=2)
    with pytest.raises(ValueError, match="num_episodes"):
        make_env("toy/viapoint", num_episodes=0)
    with pytest.raises(ValueError, match="workers"):
        make_env("gym/reacher", num_episodes=2, workers=-1)
    with pytest.raises(ValueError, match=r"unknown option 'gian'. Did you mean 'gain'\? This env takes: controller"):
        make_env("metaworld/push-v3", num_episodes=2, gian=10.0)
    with pytest.raises(ValueError, match="kp"):
        make_env("gym/reacher", num_episodes=2, workers=0, kp=-1.0)
    with pytest.raises(ValueError, match=r"toy/viapoint has one backend, 'python': the task is torch code"):
        make_env("toy/viapoint", num_episodes=2, backend="envpool")
    assert len(ENV_NAMES) == 57


def test_toy_and_factory_need_torch_alone():
    code = (
        "import sys; from troll.episodic.envs import make_env\n"
        "env = make_env('toy/viapoint', num_episodes=2); env.reset(0)\n"
        "loaded = [m for m in ('gymnasium', 'mujoco', 'metaworld') if m in sys.modules]\n"
        "assert not loaded, loaded"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0, out.stderr[-2000:]


def test_metaworld_names_match_the_package():
    env_dict = pytest.importorskip("metaworld.env_dict")
    from troll.episodic.envs.registry import METAWORLD_TASKS

    assert sorted(METAWORLD_TASKS) == sorted(env_dict.ALL_V3_ENVIRONMENTS)


# ---------------------------------------------------------------- worker pool with a fake simulator


class FakeRunner:
    """A numpy 'simulator' for the pool tests: state = [episode, seed % 1000, t, desired pos]; ``fault`` makes it
    fail at step 3 of episode 2: "nan" (a NaN reward), "raise" (an exception), "exit" (the process dies)."""

    def __init__(self, fault: str | None = None):
        self.fault = fault
        self.spec = RunnerSpec("fake/env", 1, 5, 0.1, 2, 4, has_success=False)

    def reset(self, episode, seed):
        return np.array([episode, seed % 1000.0]), np.zeros(1), np.zeros(1)

    def run(self, episode, seed, pos, vel):
        states, rewards = np.zeros((6, 4)), np.zeros(5)
        for t in range(5):
            states[t + 1] = [episode, seed % 1000, t + 1, pos[t + 1, 0]]
            rewards[t] = -abs(pos[t + 1, 0] - episode)
            if episode == 2 and t == 3 and self.fault:
                if self.fault == "nan":
                    from troll.episodic.envs.base import check_finite

                    check_finite(self.spec.name, episode, t + 1, reward=float("nan"))
                if self.fault == "raise":
                    raise RuntimeError("the fake simulator broke")
                os._exit(3)
        threads = {"torch_threads": torch.get_num_threads(), "omp_threads": int(os.environ.get("OMP_NUM_THREADS", 0))}
        return EpisodeResult(states, rewards, np.zeros(5, bool), None, {"return": float(rewards.sum()), **threads})

    def close(self):
        pass


def _fake_env(fault=None, workers=2):
    return PooledEnv(partial(FakeRunner, fault), name="fake/env", num_episodes=5, workers=workers)


def test_pool_parallel_equals_serial_and_closes():
    pos = torch.arange(5.0)[:, None, None].expand(5, 6, 1).contiguous()
    with _fake_env(workers=0) as serial, _fake_env(workers=2) as parallel:
        assert parallel.workers == 2 and serial.workers == 0
        procs = list(parallel._pool.procs)
        a, b = serial.reset(7), parallel.reset(7)
        assert torch.equal(a.context, b.context) and a.context[:, 0].tolist() == [0, 1, 2, 3, 4]
        ra, rb = serial.run(pos, pos), parallel.run(pos, pos)
        assert torch.equal(ra.states, rb.states) and torch.equal(ra.rewards, rb.rewards)
        assert ra.success is None and torch.equal(ra.final["return"], torch.zeros(5))
        assert torch.all(rb.final["torch_threads"] == 1) and torch.all(rb.final["omp_threads"] == 1)
    assert not any(p.is_alive() for p in procs)
    with pytest.raises(RuntimeError, match="closed"):
        parallel.reset(0)


def test_pool_workers_leave_stop_signals_to_the_run():
    """A cluster may signal every process of a job: SIGTERM and SIGUSR1 to the workers (as to SIGINT) change
    nothing, the run that owns them stops them after its checkpoint (troll.runs.protocol.stop_requests)."""
    import signal

    pos = torch.arange(5.0)[:, None, None].expand(5, 6, 1).contiguous()
    with _fake_env(workers=0) as serial, _fake_env(workers=2) as parallel:
        for proc in parallel._pool.procs:
            for name in ("SIGTERM", "SIGUSR1", "SIGINT"):
                os.kill(proc.pid, getattr(signal, name))
        time.sleep(0.5)
        assert all(p.is_alive() for p in parallel._pool.procs)
        serial.reset(7), parallel.reset(7)
        assert torch.equal(serial.run(pos, pos).states, parallel.run(pos, pos).states)


@pytest.mark.parametrize(
    ("fault", "error", "match"),
    [
        (
            "raise",
            EnvWorkerError,
            r"(?s)worker 1 .* failed during run: RuntimeError: the fake simulator broke.*"
            r"worker traceback:.*in run",
        ),
        ("nan", NonFiniteError, r"(?s)fake/env: non-finite reward at step 4 of episode 2.*worker 1 .*traceback"),
        ("exit", EnvWorkerError, r"worker 1 \(pid \d+\) died during run with exit code 3"),
    ],
)
def test_pool_worker_failure_propagates(fault, error, match):
    env = _fake_env(fault)
    procs = list(env._pool.procs)
    env.reset(0)
    pos = torch.zeros(5, 6, 1)
    with pytest.raises(error, match=match):
        env.run(pos, pos)
    assert not any(p.is_alive() for p in procs)  # the pool is shut down, not left hanging
    with pytest.raises(RuntimeError, match="closed"):
        env.run(pos, pos)


def test_pool_build_failure_propagates():
    with pytest.raises(EnvWorkerError, match=r"(?s)failed during build: TypeError.*worker traceback"):
        PooledEnv(partial(FakeRunner, "raise", "unexpected"), name="fake/env", num_episodes=2, workers=1)


# ---------------------------------------------------------------- Reacher-v5

BACKENDS = ["envpool", "python"]


@pytest.fixture(scope="module", params=BACKENDS)
def reachers(request):
    """Reacher on each backend: in one process / on one EnvPool thread, and on two workers / two threads."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("mujoco")
    if request.param == "envpool":
        pytest.importorskip("envpool")
    b = request.param
    envs = {
        "dense": make_env("gym/reacher", num_episodes=4, workers=0, backend=b),
        "sparse": make_env("gym/reacher-sparse", num_episodes=4, workers=0, backend=b),
        "parallel": make_env("gym/reacher", num_episodes=4, workers=2, backend=b),
    }
    yield envs
    for env in envs.values():
        env.close()


def test_horizon_before_building_matches_the_built_envs(reachers):
    """registry.horizon (what a study checks its cells against) is each env's own T."""
    assert horizon("toy/viapoint") == ViaPointEnv(num_episodes=1).horizon == 100
    assert horizon("toy/viapoint-sparse", {"horizon": 20}) == ViaPointEnv(num_episodes=1, horizon=20).horizon == 20
    assert horizon("gym/reacher") == reachers["dense"].horizon == 50
    assert horizon("gym/reacher-sparse") == reachers["sparse"].horizon == 50
    with pytest.raises(ValueError, match="unknown episodic environment"):
        horizon("gym/reachr")


def _reacher_move(env, seed):
    start = env.reset(seed)
    target = start.pos + torch.tensor([0.8, -0.6])
    return start, min_jerk(start.pos, target, env.horizon, env.dt, move=40)


def test_reacher_tracks_a_smooth_trajectory(reachers):
    env = reachers["dense"]
    assert (env.dof, env.horizon, env.dt, env.context_dim, env.state_dim) == (2, 50, 0.02, 10, 10)
    start, (pos, vel) = _reacher_move(env, 0)
    angles = torch.atan2(start.context[:, 2:4], start.context[:, :2])
    torch.testing.assert_close(angles, start.pos)  # pos = the joint angles behind the observation's cos / sin
    ep = env.run(pos, vel)
    assert ep.states.shape == (4, 51, 10) and torch.equal(ep.states[:, 0], start.context)
    q = torch.atan2(ep.states[..., 2:4], ep.states[..., :2])
    assert (q - pos).abs().max() < 0.02  # rad, over a 0.8 / 0.6 rad move in 0.8 s
    assert not ep.dones.any() and ep.success.shape == (4,)
    torch.testing.assert_close(ep.final["distance"], ep.states[:, -1, 8:].norm(dim=-1))
    assert torch.equal(ep.success, ep.final["distance"] <= 0.02)


def test_reacher_dense_and_sparse_rewards_agree(reachers):
    dense, sparse = reachers["dense"], reachers["sparse"]
    _, (pos, vel) = _reacher_move(dense, 5)
    _reacher_move(sparse, 5)
    d, s = dense.run(pos, vel), sparse.run(pos, vel)
    assert torch.equal(d.states, s.states)  # same physics, only the reward differs
    assert not s.rewards[:, :-1].any() and not d.dones.any() and not s.dones.any()
    tip = d.states[:, 1:, 8:].double().norm(dim=-1)  # fingertip - target after each step
    torch.testing.assert_close(
        d.rewards.double().sum(-1), -tip.sum(-1) - d.final["ctrl_cost"].double(), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(s.final["return"], -s.final["ctrl_cost"] - 50 * s.final["distance"])
    torch.testing.assert_close(d.final["distance"], s.final["distance"])


def test_reacher_parallel_equals_serial(reachers):
    """Two workers (python) or two EnvPool threads give the episodes of one process / one thread, bit for bit."""
    serial, parallel = reachers["dense"], reachers["parallel"]
    assert getattr(parallel, "workers", None) == 2 or getattr(parallel, "threads", None) == 2
    a, (pos, vel) = _reacher_move(serial, 11)
    b = parallel.reset(11)
    assert torch.equal(a.context, b.context) and torch.equal(a.pos, b.pos)
    ra, rb = serial.run(pos, vel), parallel.run(pos, vel)
    assert torch.equal(ra.states, rb.states) and torch.equal(ra.rewards, rb.rewards)
    again = serial.run(pos, vel)  # a second run of one reset plays the same episodes
    assert torch.equal(ra.states, again.states) and torch.equal(ra.final["return"], again.final["return"])
    c = serial.reset(12)
    assert not torch.equal(a.context, c.context)


# ---------------------------------------------------------------- Meta-World


@pytest.fixture(scope="module", params=BACKENDS)
def reach(request):
    pytest.importorskip("metaworld")
    with make_env("metaworld/reach-v3", num_episodes=2, workers=2, backend=request.param) as env:
        env.backend = request.param
        yield env


def test_metaworld_horizon_before_building(reach):
    assert horizon("metaworld/reach-v3") == reach.horizon == 500


def _to_goal(env, start, goal):
    """Hand to 3 cm above the goal in 300 steps, gripper open: the hand is 4.5 cm above the fingertips' centre
    that reach-v3 measures success at."""
    end = torch.cat([goal + torch.tensor([0.0, 0.0, 0.03]), -torch.ones(len(goal), 1)], 1)
    return min_jerk(start.pos, end, env.horizon, env.dt, move=300)


def test_metaworld_reach_tracks_to_the_goal(reach):
    assert (reach.dof, reach.horizon, reach.dt, reach.state_dim) == (4, 500, 0.0125, 39)
    start = reach.reset(seed=0)
    assert reach.context_dim == 5 and start.context.shape == (2, 5) and start.pos.shape == (2, 4)
    assert torch.all(start.vel == 0) and torch.all(start.pos[:, 3] == -1)
    goal = start.context[:, 2:]  # reach: object xy, then the goal xyz
    pos, vel = _to_goal(reach, start, goal)
    ep = reach.run(pos, vel)
    assert ep.states.shape == (2, 501, 39) and ep.rewards.shape == (2, 500) and not ep.dones.any()
    torch.testing.assert_close(ep.states[:, 0, 36:39], goal)  # the goal is visible, and it is in the context
    torch.testing.assert_close(ep.states[:, 0, [4, 5, 36, 37, 38]], start.context)
    assert (ep.states[:, 1:, :3] - pos[:, 1:, :3]).norm(dim=-1).max() < 0.01  # K = 50 tracks within 1 cm
    assert ep.success.all() and ep.final["success_any"].all() and (ep.final["distance"] < 0.05).all()
    assert (ep.final["return"] > 0).all()
    stay = reach.run(start.pos[:, None].expand(-1, 501, -1).contiguous(), torch.zeros_like(pos))
    assert not stay.success.any() and (stay.final["return"] < ep.final["return"]).all()


def test_metaworld_parallel_equals_serial_and_seeds(reach):
    a, b, c = reach.reset(3), reach.reset(3), reach.reset(4)
    assert torch.equal(a.context, b.context) and not torch.equal(a.context, c.context)
    # python: 2 worker processes against in-process; envpool: 2 threads against 1
    with make_env("metaworld/reach-v3", num_episodes=2, workers=0, backend=reach.backend) as serial:
        s = serial.reset(3)
        assert torch.equal(a.context, s.context) and torch.equal(a.pos, s.pos)
        pos, vel = _to_goal(serial, s, s.context[:, 2:])
        reach.reset(3)
        ra, rs = reach.run(pos, vel), serial.run(pos, vel)
    assert torch.equal(ra.states, rs.states) and torch.equal(ra.rewards, rs.rewards)
    assert torch.equal(ra.success, rs.success)


@pytest.mark.parametrize("backend", BACKENDS)
def test_metaworld_push_with_a_held_gripper(backend):
    pytest.importorskip("metaworld")
    with make_env("metaworld/push-v3", num_episodes=1, workers=0, gripper=1.0, backend=backend) as push:
        assert (push.dof, push.context_dim) == (3, 4)  # object xy, goal xy: push's goal height is fixed
        start = push.reset(0)
        assert start.pos.shape == (1, 3)
        hold = start.pos[:, None].expand(1, 501, 3).contiguous()
        ep = push.run(hold, torch.zeros_like(hold))
    assert ep.states.shape == (1, 501, 39) and not ep.success.any()
    assert (ep.states[:, -1, 3] < ep.states[:, 0, 3] - 0.1).all()  # the held command +1 closed the gripper


def _through(points: list[torch.Tensor], horizon: int, dt: float):
    """(E, T+1, D) positions and velocities: minimum-jerk moves through ``points`` (each (E, D)) in equal shares of
    the episode, then at rest; each move is :func:`min_jerk` of its displacement, and the moves add up."""
    n = horizon // len(points)
    pos = points[0][:, None].expand(-1, horizon + 1, -1).clone()
    vel = torch.zeros_like(pos)
    for i, (a, b) in enumerate(zip(points[:-1], points[1:], strict=True)):
        p, v = min_jerk(torch.zeros_like(a), b - a, horizon, dt, move=n, begin=i * n)
        pos, vel = pos + p, vel + v
    return pos, vel


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("task", ["push-v3", "pick-place-v3"])
def test_metaworld_hand_made_trajectories_solve_push_and_pick_place(task, backend):
    """The wrapper can solve the tasks TCE trains on: a scripted trajectory (push: from behind the puck along the
    line to the goal; pick-place: down to the object, close, lift, carry to the goal) succeeds through the tracking
    controller, so a run that does not succeed is short of samples, not of a reachable solution."""
    pytest.importorskip("metaworld")
    with make_env(f"metaworld/{task}", num_episodes=2, workers=0, backend=backend) as env:
        start = env.reset(seed=0)
        hold = start.pos[:, None].expand(-1, env.horizon + 1, -1).contiguous()
        rest = env.run(hold, torch.zeros_like(hold))
        assert not rest.success.any()  # resting does not solve it
        hand, obj, goal = rest.states[:, 0, 0:3], rest.states[:, 0, 4:7], rest.states[:, 0, 36:39]
        up = torch.tensor([0.0, 0.0, 1.0])
        if task == "push-v3":
            way = torch.cat([goal[:, :2] - obj[:, :2], torch.zeros(2, 1)], 1)
            way = way / way.norm(dim=1, keepdim=True)
            behind = obj - 0.06 * way
            short_of_goal = torch.cat([goal[:, :2], obj[:, 2:]], 1) - 0.02 * way  # at the puck's height
            xyz = [hand, behind + 0.1 * up, behind, short_of_goal]
            grip = [-1.0, -1.0, -1.0, -1.0]
        else:
            xyz = [hand, obj + 0.1 * up, obj, obj, obj + 0.18 * up, goal]
            grip = [-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]
        points = [torch.cat([x, torch.full((2, 1), g)], 1) for x, g in zip(xyz, grip, strict=True)]
        env.reset(seed=0)
        ep = env.run(*_through(points, env.horizon, env.dt))
    assert ep.success.all() and (ep.final["distance"] < 0.05).all(), ep.final["distance"]
