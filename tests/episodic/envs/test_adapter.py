"""FromGymnasium: gymnasium's Reacher-v5 through the adapter tracks exactly as troll's own Reacher runner does; an
episode that terminates early is padded; a user's env is found by register(), by module:function, and by name."""

from __future__ import annotations

import sys
import types

import gymnasium as gym
import numpy as np
import pytest
import torch

from troll.episodic import FromGymnasium, make_env, register
from troll.episodic.envs.base import episode_seeds
from troll.episodic.envs.reacher import ReacherConfig, ReacherRunner


def _reacher(num_episodes: int) -> FromGymnasium:
    return FromGymnasium(
        lambda: gym.make("Reacher-v5", disable_env_checker=True),
        context=lambda env, obs: obs,
        position=lambda env, obs: env.unwrapped.data.qpos[:2].copy(),
        velocity=lambda env, obs: env.unwrapped.data.qvel[:2].copy(),
        num_episodes=num_episodes,
        name="user/reacher",
        kp=8.0,
        kd=0.3,
    )


def test_reacher_through_the_adapter_is_trolls_reacher():
    """The same seeds, the same PD rule (kp 8, kd 0.3, clipped to the action bounds [-1, 1]): the reference is
    reacher.ReacherRunner, troll's gymnasium backend of gym/reacher, written without the adapter."""
    env = _reacher(2)
    assert (env.horizon, env.dt, env.dof, env.context_dim, env.state_dim) == (50, 0.02, 2, 10, 10)
    start = env.reset(seed=7)
    t = torch.linspace(0, 1, 51, dtype=torch.float64)[None, :, None]
    goal = torch.tensor([[0.8, -0.6], [-1.2, 0.4]], dtype=torch.float64)[:, None]
    pos = start.pos.double()[:, None] + goal * (10 * t**3 - 15 * t**4 + 6 * t**5)  # minimum jerk to the goal
    vel = torch.gradient(pos, spacing=0.02, dim=1)[0]
    got = env.run(pos, vel)
    runner = ReacherRunner(ReacherConfig())
    for i, seed in enumerate(episode_seeds(7, 2)):
        obs, q, qd = runner.reset(i, seed)
        torch.testing.assert_close(start.context[i], torch.from_numpy(obs).float(), rtol=0, atol=0)
        torch.testing.assert_close(start.pos[i], torch.from_numpy(q).float(), rtol=0, atol=0)
        want = runner.run(i, seed, pos[i].numpy(), vel[i].numpy())
        torch.testing.assert_close(got.states[i], torch.from_numpy(want.states).float(), rtol=0, atol=0)
        torch.testing.assert_close(got.rewards[i], torch.from_numpy(want.rewards).float(), rtol=0, atol=0)
    assert not got.dones.any() and got.success is None
    torch.testing.assert_close(got.final["return"], got.rewards.sum(1))
    runner.close()
    env.close()


class _Falls(gym.Env):
    """1-D: x' = a; terminates once x > 1; reward 1 a step; the observation (x, x')."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.v = 0.0, 0.0
        return np.array([self.x, self.v]), {}

    def step(self, action):
        self.v = float(action[0])
        self.x += self.v * 0.5
        return np.array([self.x, self.v]), 1.0, self.x > 1.0, False, {"far": self.x > 1.0}


def _falls(num_episodes: int, seed: int = 0, **options) -> FromGymnasium:
    read = lambda k: lambda env, obs: obs[k : k + 1]  # noqa: E731
    return FromGymnasium(_Falls, context=read(0), position=read(0), velocity=read(1), num_episodes=num_episodes,
                         name="mine/falls", horizon=6, dt=0.5, kp=options.get("kp", 10.0),
                         success=lambda env, info: info["far"])  # fmt: skip


def test_an_episode_that_terminates_is_padded_and_the_controller_is_clipped():
    env = _falls(2)
    start = env.reset(seed=0)
    pos = torch.zeros(2, 7, 1, dtype=torch.float64)
    pos[0] = 10.0  # far away: a = clip(10 * 10, -2, 2) = 2, x = 1, 2 (> 1: terminated at step 1)
    got = env.run(pos, torch.zeros_like(pos))
    assert got.states[0, :, 0].tolist() == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert got.rewards[0].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert got.dones[0].tolist() == [False, True, True, True, True, True]
    assert got.rewards[1].tolist() == [1.0] * 6 and not got.dones[1].any()  # held at 0
    assert got.success.tolist() == [True, False] and start.context.shape == (2, 1)
    with pytest.raises(ValueError, match="does not say its dt; pass dt=... to FromGymnasium"):
        FromGymnasium(_Falls, context=None, position=None, velocity=None, num_episodes=1, horizon=3)


def test_a_users_env_is_found_by_register_by_module_function_and_refused_by_name(monkeypatch):
    register("mine/falls", _falls)
    with make_env("mine/falls", num_episodes=3, kp=5.0) as env:
        assert (env.num_episodes, env.kp, env.horizon) == (3, 5.0, 6)
    module = types.ModuleType("my_envs")
    module.make = _falls
    module.wrong = lambda num_episodes, seed=0: "not an env"
    monkeypatch.setitem(sys.modules, "my_envs", module)
    with make_env("my_envs:make", num_episodes=2) as env:
        assert env.name == "mine/falls"
    with pytest.raises(TypeError, match="returned a str, not an EpisodicEnv"):
        make_env("my_envs:wrong", num_episodes=1)
    with pytest.raises(ValueError, match="cannot import nothing from my_envs"):
        make_env("my_envs:nothing", num_episodes=1)
    with pytest.raises(ValueError, match="unknown episodic environment 'mine/other'.*'module:function'"):
        make_env("mine/other", num_episodes=1)
    with pytest.raises(ValueError, match="unknown episodic environment 'gym/falls'"):
        register("gym/falls", _falls)  # troll's families are troll's
