"""One episodic task as a step-based gymnasium env, for step-based agents (stable-baselines3's PPO in
:mod:`troll.tce.ppo`): the simulator's own observation and action, no movement primitive, no controller.

:func:`make_step_task` builds it on the Python packages (gymnasium's Reacher-v5, the metaworld package) for
``gym/reacher[-sparse]`` and ``metaworld/<task>``, on box pushing's own task for ``fancy/box-pushing-*`` (seven
joint torques, gravity compensated) and on hopper jump's Hopper-v5 subclass for ``fancy/hopper-jump`` (its three
motor commands in [-1, 1], torques of 200 a N m: Hopper's own action, no PD controller); the toy task has no step
interface (it simulates whole trajectories in torch). The task is the episodic env's: the same T steps
(:func:`troll.episodic.envs.registry.horizon`), rewards (gym/reacher-sparse pays the whole episode at its last step;
hopper jump's sparse terms arrive at its last step too), success rule at the end of an episode and non-finite
checks; an episode seed starts the episode the episodic env starts from it. An episode ends after T steps as a
truncation, but box pushing's ends as a termination when it succeeds, as fancy_gym's does (no value is bootstrapped
past a success).

Why the simulator's action and not the episodic task's tracking controller: the PD gains of box pushing and hopper
jump belong to the movement-primitive wrapper (they turn a desired trajectory into torques), and a step-based policy
has no desired trajectory to track; it sends what the controller would have sent. The task's reward, its control
cost included, is the same function of that action.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from troll.episodic.envs.base import check_finite
from troll.episodic.envs.registry import BOX_PUSHING, GYM, HOPPER, METAWORLD, horizon

TRAIN_STREAM = 0x99  # training episode k draws its task from (seed, TRAIN_STREAM, k)


class StepTask(gym.Env):
    """One episodic task, stepped. observation: the simulator's (Reacher 10, Meta-World 39, box pushing 28,
    hopper jump 16); action: its own (module docstring). ``physics`` is the MuJoCo simulator (``model``, ``data``)
    the task steps, ``dt`` the seconds of one step: what ``troll tce render`` draws.

    ``reset()`` starts training episode k (k counts resets; ``start_index`` sets the first) from the seed (seed,
    TRAIN_STREAM, k); ``reset(options={"episode_seed": s})`` starts the episode the episodic env starts from
    episode seed s. Episodes last exactly T steps (module docstring for how they end). The last step's info holds
    the episodic env's final metrics: "is_success" (not on hopper jump, which has no success rule), "distance" and
    "episode_return"; hopper jump's also "max_height", "landing_distance" and "healthy". A family is a subclass
    that builds its simulator (``_build``), starts an episode (``_start``) and steps it (``_step``).
    """

    def __init__(self, name: str, *, seed: int, sparse: bool | None = None):
        self.name, self.seed_, self.index = name, seed, 0
        self.sparse = name.endswith("-sparse") if sparse is None else sparse
        self.horizon = horizon(name)
        self.t, self.total = 0, 0.0
        self._build()

    def _build(self) -> None:  # pragma: no cover - each family's
        raise NotImplementedError

    def _start(self, episode_seed: int) -> np.ndarray:  # pragma: no cover - each family's
        raise NotImplementedError

    def _step(self, action) -> tuple[np.ndarray, float, bool, dict]:  # pragma: no cover - each family's
        """(observation, reward, success at the last step, final metrics at the last step) of one step."""
        raise NotImplementedError

    def start(self, episode_seed: int) -> np.ndarray:
        """Reset to the episode the episodic env starts from ``episode_seed`` (envs/reacher.py, metaworld.py)."""
        self.t, self.total = 0, 0.0
        obs = self._start(episode_seed)
        check_finite(self.name, self.index, 0, observation=obs)
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options and "episode_seed" in options:
            return self.start(int(options["episode_seed"])), {}
        episode = int(np.random.SeedSequence([self.seed_, TRAIN_STREAM, self.index]).generate_state(1)[0])
        self.index += 1
        return self.start(episode), {}

    def step(self, action):
        self.t += 1
        last = self.t >= self.horizon
        obs, reward, success, final = self._step(action)
        check_finite(self.name, self.index, self.t, observation=obs, reward=reward)
        self.total += float(reward)
        if not last:
            return obs, float(reward), False, False, {}
        terminated = self.terminates_on_success and success
        return obs, float(reward), terminated, not terminated, {**final, "episode_return": self.total}

    terminates_on_success = False

    def close(self):
        self.env.close()


class _GymnasiumTask(StepTask):
    """Reacher-v5 (gymnasium) and Meta-World's MT1 (the metaworld package), stepped unwrapped."""

    def _build(self) -> None:
        if self.name in GYM:
            self.env = gym.make("Reacher-v5", disable_env_checker=True)
            self.ctrl = 0.0
        else:
            import metaworld  # noqa: F401 -- registers Meta-World/*

            task = self.name.split("/", 1)[1]
            self.env = gym.make("Meta-World/MT1", env_name=task, seed=self.seed_, disable_env_checker=True)
            self.tasks = list(self.env.get_wrapper_attr("tasks"))
        self.sim = self.physics = self.env.unwrapped
        self.observation_space, self.action_space = self.sim.observation_space, self.sim.action_space
        self.dt = float(self.sim.dt)

    def _start(self, episode_seed: int) -> np.ndarray:
        if self.name in GYM:
            self.ctrl = 0.0
            return self.sim.reset(seed=episode_seed)[0]
        task = int(np.random.default_rng(episode_seed).integers(len(self.tasks)))
        self.sim.seed(episode_seed)
        self.sim.set_task(self.tasks[task])
        return self.sim.reset()[0]

    def _step(self, action):
        obs, reward, _, _, info = self.sim.step(action)
        if self.name in METAWORLD:
            distance = float(info["obj_to_target"])
            return obs, reward, info["success"] > 0, {"is_success": bool(info["success"] > 0), "distance": distance}
        self.ctrl += float(info["reward_ctrl"])
        distance = -float(info["reward_dist"])
        if self.sparse:  # the episodic env's sparse reward (envs/reacher.py): all of it at the last step
            reward = self.ctrl - self.horizon * distance if self.t >= self.horizon else 0.0
        return obs, reward, distance <= 0.02, {"is_success": distance <= 0.02, "distance": distance}


class _BoxPushingTask(StepTask):
    """Box pushing on the episodic env's own task (box_pushing.py): its reward, dense or sparse, and its info after
    the last step; a success there ends the episode as a termination (fancy_gym's rule)."""

    terminates_on_success = True

    def _build(self) -> None:
        from gymnasium import spaces

        from troll.episodic.envs.box_pushing import BoxPushingConfig, BoxPushingTask
        from troll.episodic.envs.box_pushing_sim import DT

        self.env = self.sim = BoxPushingTask(BoxPushingConfig(sparse=self.sparse))
        self.observation_space = spaces.Box(-np.inf, np.inf, (28,), np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.physics, self.dt = self.sim.sim, DT

    def _start(self, episode_seed: int) -> np.ndarray:
        return self.sim.start(episode_seed)

    def _step(self, action):
        obs, reward, info = self.sim.step(np.asarray(action, dtype=np.float64))
        if self.t < self.horizon:
            return obs, reward, False, {}
        return obs, reward, bool(info["is_success"]), {"is_success": info["is_success"], "distance": info["distance"]}


class _HopperJumpTask(StepTask):
    """Hopper jump: the simulator's step (hopper_jump_sim.py: its control cost every step, the sparse terms at the
    last) and the episodic env's final metrics after the last (HopperJumpRunner's: contact_dist is 0 when it never
    landed); no success rule."""

    def _build(self) -> None:
        from troll.episodic.envs.hopper_jump_sim import HopperJumpEnv

        self.env = HopperJumpEnv()
        self.sim = self.physics = self.env.unwrapped
        self.observation_space, self.action_space = self.sim.observation_space, self.sim.action_space
        self.dt = float(self.sim.dt)

    def _start(self, episode_seed: int) -> np.ndarray:
        return self.sim.reset(seed=episode_seed)[0]

    def _step(self, action):
        obs, reward, _, _, info = self.sim.step(action)
        if self.t < self.horizon:
            return obs, reward, False, {}
        final = {"distance": info["goal_dist"], "max_height": info["max_height"],
                 "landing_distance": info["contact_dist"], "healthy": bool(info["healthy"])}  # fmt: skip
        return obs, reward, False, final


def make_step_task(name: str, *, seed: int, sparse: bool | None = None) -> StepTask:
    """The :class:`StepTask` of ``name`` (gym/reacher[-sparse], metaworld/<task>, fancy/box-pushing-* or
    fancy/hopper-jump)."""
    if name in GYM + METAWORLD:
        return _GymnasiumTask(name, seed=seed, sparse=sparse)
    if name in BOX_PUSHING:
        return _BoxPushingTask(name, seed=seed, sparse=sparse)
    if name in HOPPER:
        return _HopperJumpTask(name, seed=seed, sparse=sparse)
    raise ValueError(
        f"env {name!r} has no step interface; choose gym/reacher[-sparse], metaworld/<task>, "
        "fancy/box-pushing-dense / -sparse or fancy/hopper-jump."
    )
