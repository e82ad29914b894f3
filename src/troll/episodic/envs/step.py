"""One episodic task as a step-based gymnasium env, for step-based agents (stable-baselines3's PPO in
:mod:`troll.tce.ppo`): the simulator's own observation and action, no movement primitive, no controller.

:func:`make_step_task` builds it on the Python packages (gymnasium's Reacher-v5, the metaworld package) for
``gym/reacher[-sparse]`` and ``metaworld/<task>``, on box pushing's own task for ``fancy/box-pushing-*`` (seven
joint torques, gravity compensated) and on hopper jump's Hopper-v5 subclass for ``fancy/hopper-jump`` (its three
motor commands in [-1, 1], torques of 200 a N m: Hopper's own action, no PD controller); the toy task has no step
interface (it simulates whole trajectories in torch). The task is the episodic env's: the same T steps
(:func:`troll.episodic.envs.registry.horizon`), rewards (gym/reacher-sparse pays the whole episode at its last step;
hopper jump's sparse terms arrive at its last step too), success rule at the end of an episode and non-finite
checks; an episode seed starts the episode the episodic env starts from it.

Why the simulator's action and not the episodic task's tracking controller: the PD gains of box pushing and hopper
jump belong to the movement-primitive wrapper (they turn a desired trajectory into torques), and a step-based policy
has no desired trajectory to track; it sends what the controller would have sent. The task's reward, its control
cost included, is the same function of that action.
"""

from __future__ import annotations

import numpy as np

from troll.episodic.envs.base import check_finite
from troll.episodic.envs.registry import BOX_PUSHING, GYM, HOPPER, METAWORLD, horizon

TRAIN_STREAM = 0x99  # training episode k draws its task from (seed, TRAIN_STREAM, k)


def make_step_task(name: str, *, seed: int, sparse: bool | None = None):
    """:class:`StepTask` for ``name`` (gym/reacher[-sparse], metaworld/<task>, fancy/box-pushing-* or
    fancy/hopper-jump), built lazily on gymnasium."""
    import gymnasium as gym

    class StepTask(gym.Env):
        """One episodic task, stepped. observation: the simulator's (Reacher 10, Meta-World 39, box pushing 28,
        hopper jump 16); action: its own (module docstring). ``physics`` is the MuJoCo simulator (``model``,
        ``data``) the task steps, ``dt`` the seconds of one step: what ``troll tce render`` draws.

        ``reset()`` starts training episode k (k counts resets; ``start_index`` sets the first) from the seed
        (seed, TRAIN_STREAM, k); ``reset(options={"episode_seed": s})`` starts the episode the episodic env starts
        from episode seed s. Episodes last exactly T steps (truncated, never terminated). The last step's info
        holds the episodic env's final metrics: "is_success" (not on hopper jump, which has no success rule),
        "distance" and "episode_return"; hopper jump's also "max_height", "landing_distance" and "healthy".
        """

        def __init__(self):
            if name not in GYM + METAWORLD + BOX_PUSHING + HOPPER:
                raise ValueError(
                    f"env {name!r} has no step interface; choose gym/reacher[-sparse], metaworld/<task>, "
                    "fancy/box-pushing-dense / -sparse or fancy/hopper-jump."
                )
            self.name, self.seed_, self.index = name, seed, 0
            self.family = ("gym" if name in GYM else "metaworld" if name in METAWORLD
                           else "hopper" if name in HOPPER else "box-pushing")  # fmt: skip
            self.sparse = name.endswith("-sparse") if sparse is None else sparse
            if self.family == "box-pushing":  # no gymnasium env: the episodic env's own task (box_pushing.py)
                from gymnasium import spaces

                from troll.episodic.envs.box_pushing import BoxPushingConfig, BoxPushingTask
                from troll.episodic.envs.box_pushing_sim import DT

                self.env = self.sim = BoxPushingTask(BoxPushingConfig(sparse=self.sparse))
                self.observation_space = spaces.Box(-np.inf, np.inf, (28,), np.float64)
                self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)
                self.physics, self.dt = self.sim.sim, DT
            elif self.family == "hopper":  # the episodic env's simulator (hopper_jump_sim.py), stepped
                from troll.episodic.envs.hopper_jump_sim import HopperJumpEnv

                self.env = HopperJumpEnv()
            elif self.family == "gym":
                self.env = gym.make("Reacher-v5", disable_env_checker=True)
            else:
                import metaworld  # noqa: F401 -- registers Meta-World/*

                task = name.split("/", 1)[1]
                self.env = gym.make("Meta-World/MT1", env_name=task, seed=seed, disable_env_checker=True)
                self.tasks = list(self.env.get_wrapper_attr("tasks"))
            if self.family != "box-pushing":
                self.sim = self.env.unwrapped
                self.observation_space, self.action_space = self.sim.observation_space, self.sim.action_space
                self.physics, self.dt = self.sim, float(self.sim.dt)
            self.horizon = horizon(name)
            self.t, self.total, self.ctrl = 0, 0.0, 0.0

        def start(self, episode_seed: int) -> np.ndarray:
            """Reset to the episode the episodic env starts from ``episode_seed`` (envs/reacher.py, metaworld.py)."""
            if self.family == "box-pushing":
                obs = self.sim.start(episode_seed)
            elif self.family in ("gym", "hopper"):
                obs, _ = self.sim.reset(seed=episode_seed)
            else:
                task = int(np.random.default_rng(episode_seed).integers(len(self.tasks)))
                self.sim.seed(episode_seed)
                self.sim.set_task(self.tasks[task])
                obs, _ = self.sim.reset()
            check_finite(self.name, self.index, 0, observation=obs)
            self.t, self.total, self.ctrl = 0, 0.0, 0.0
            return obs

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            if options and "episode_seed" in options:
                return self.start(int(options["episode_seed"])), {}
            episode = int(np.random.SeedSequence([self.seed_, TRAIN_STREAM, self.index]).generate_state(1)[0])
            self.index += 1
            return self.start(episode), {}

        def step(self, action):
            if self.family == "box-pushing":
                return self._box_step(action)
            if self.family == "hopper":
                return self._hopper_step(action)
            obs, reward, _, _, info = self.sim.step(action)
            self.t += 1
            check_finite(self.name, self.index, self.t, observation=obs, reward=reward)
            done = self.t >= self.horizon
            out = {}
            if self.family == "gym":
                self.ctrl += float(info["reward_ctrl"])
                distance = -float(info["reward_dist"])
                if self.sparse:  # the episodic env's sparse reward (envs/reacher.py): all of it at the last step
                    reward = self.ctrl - self.horizon * distance if done else 0.0
                success = distance <= 0.02
            else:
                distance, success = float(info["obj_to_target"]), info["success"] > 0
            self.total += float(reward)
            if done:
                out = {"is_success": bool(success), "distance": distance, "episode_return": self.total}
            return obs, float(reward), False, done, out

        def _box_step(self, action):
            """Box pushing: the task's own reward (dense or sparse) and its info after the last step."""
            obs, reward, info = self.sim.step(np.asarray(action, dtype=np.float64))
            self.t += 1
            check_finite(self.name, self.index, self.t, observation=obs, reward=reward)
            self.total += reward
            done = self.t >= self.horizon
            if not done:
                return obs, reward, False, False, {}
            out = {"is_success": info["is_success"], "distance": info["distance"], "episode_return": self.total}
            return obs, reward, False, True, out

        def _hopper_step(self, action):
            """Hopper jump: the simulator's step (its control cost every step, the sparse terms at the last) and the
            episodic env's final metrics after the last (HopperJumpRunner's: contact_dist is 0 when it never landed)."""
            obs, reward, _, _, info = self.sim.step(action)
            self.t += 1
            check_finite(self.name, self.index, self.t, observation=obs, reward=reward)
            self.total += float(reward)
            if self.t < self.horizon:
                return obs, float(reward), False, False, {}
            out = {"distance": info["goal_dist"], "max_height": info["max_height"],
                   "landing_distance": info["contact_dist"], "healthy": bool(info["healthy"]),
                   "episode_return": self.total}  # fmt: skip
            return obs, float(reward), False, True, out

        def close(self):
            self.env.close()

    return StepTask()
