"""Meta-World 3 tasks (``metaworld/<task>-v3``) behind an end-effector position-tracking controller.

The environment is ``gymnasium.make("Meta-World/MT1", env_name=task, seed=seed)``: MT1 draws a set of 50 task
variations (goal and object positions) from ``seed`` when it is built and, being a multi-task benchmark, shows the
goal in the observation. Each episode picks one of the 50 uniformly from its own seed (MT1's own per-reset pick
uses an RNG state from before ``reset(seed=...)`` reseeds it, so we pick and ``set_task`` ourselves). The paper
used Meta-World v2 tasks with goals drawn afresh at every reset; v3 MT1 keeps a finite set. 500 steps of
dt = 0.0125 s (the tasks' ``max_path_length``, MT1's time limit); the success flag is ``info["success"]`` after
the last step. We step the unwrapped env: the time limit is our horizon, and MT1's wrappers (task sampling,
statistics, checkers) only cost time.

Observation (39): hand xyz (0:3), gripper opening (3), object 1 xyz + quaternion and object 2 xyz + quaternion,
zero-padded (4:18), the previous frame's 18 entries (18:36), the goal xyz (36:39). At reset the previous frame
repeats the current one.
Context: the entries of the reset observation's current frame and goal (0:18, 36:39) that differ between MT1's 50
variations of the task, found by resetting 10 of them when the runner is built: for reach-v3 and pick-place-v3 the
object xy and the goal xyz (C = 5), for push-v3 the object xy and the goal xy (C = 4). The rest is the same in
every episode (hand start, quaternions, padding) and would only be noise to normalise.
State: the full 39-entry observation (S = 39).

Controller (Meta-World's action is a mocap displacement: xyz in [-1, 1], times action_scale = 0.01 m per step,
the hand following the mocap through a weld):  a_xyz(t) = clip(K (y_d(t+1) - x_t), -1, 1) with x_t the observed
hand position. K = 50 per metre, from a tracking-error check on reach-v3 (minimum-jerk moves from the hand's start
to the goal in 100 and 400 steps, K in {25 .. 300}): K = 100 would move the mocap by the whole remaining error
every step, but the hand lags the mocap by ~5 steps, so K >= 75 overshoots and oscillates (errors of 3-4 cm on
the slow move); K = 50 kept the error under 1 cm on the fast move and 2 mm on the slow one, and ended every move
on the goal.
Gripper: by default a 4th tracked DoF whose desired position is the gripper command itself (-1 open, +1 closed),
applied as a_4(t) = clip(y_d4(t+1), -1, 1); its initial position is -1 (the command Meta-World's reset holds the
hand with) and its initial velocity 0. With ``gripper=<float>`` the command is held at that value and D = 3.
The hand's initial velocity is the observation's finite difference, 0 at reset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from troll.episodic.envs.base import check_finite
from troll.episodic.envs.workers import EpisodeResult, RunnerSpec

# Of the 39 observation entries: the current frame and the goal (the previous frame repeats the current at reset).
_CONTEXT_CANDIDATES = np.r_[0:18, 36:39]


@dataclass(frozen=True)
class MetaWorldConfig:
    """Options of ``metaworld/<task>``: the MT1 seed of the 50 task variations, the xyz gain, the gripper."""

    task: str
    seed: int = 0
    gain: float = 50.0
    gripper: float | None = None

    def __post_init__(self):
        if self.gain <= 0:
            raise ValueError(f"metaworld/{self.task}: gain must be > 0, got {self.gain}")
        if self.gripper is not None and not -1.0 <= self.gripper <= 1.0:
            raise ValueError(f"metaworld/{self.task}: gripper must be None (tracked) or in [-1, 1], got {self.gripper}")


class MetaWorldRunner:
    """One Meta-World MT1 task in a worker. D = 4 (hand xyz, gripper command) or 3, T = 500, dt = 0.0125, S = 39.

    final: "distance" (info["obj_to_target"] at the end: hand to goal for reach, object to goal otherwise),
    "success_any" (1 if the success flag was set at any step), "return".
    """

    def __init__(self, config: MetaWorldConfig):
        import gymnasium as gym
        import metaworld  # noqa: F401 -- registers the Meta-World/* environments

        self.config = config
        self.env = gym.make("Meta-World/MT1", env_name=config.task, seed=config.seed, disable_env_checker=True)
        self.tasks = list(self.env.get_wrapper_attr("tasks"))
        self.sim = self.env.unwrapped
        self.name = f"metaworld/{config.task}"
        self._starts: dict[tuple[int, int], np.ndarray] = {}
        self.context_index = self._varying_entries()
        dof = 4 if config.gripper is None else 3
        horizon = int(self.sim.max_path_length)
        self.spec = RunnerSpec(self.name, dof, horizon, float(self.sim.dt), len(self.context_index), 39, True)

    def _varying_entries(self) -> np.ndarray:
        """Observation indices (among the current frame and the goal) that differ between the task variations."""
        # 10 of the 50 variations are enough: the randomised entries are drawn from continuous distributions, so any
        # two variations differ in all of them (and resets cost ~20 ms each)
        first = np.stack([self._reset_to(task) for task in self.tasks[:10]])[:, _CONTEXT_CANDIDATES]
        spread = first.max(0) - first.min(0)
        return _CONTEXT_CANDIDATES[spread > 1e-6]

    def _reset_to(self, task) -> np.ndarray:
        self.sim.set_task(task)
        obs, _ = self.sim.reset()
        return obs

    def _start(self, episode: int, seed: int, *, first: bool) -> np.ndarray:
        """Reset to the episode's task variation, drawn from its seed. ``run`` resets again rather than keep E
        live simulators: ``first`` records the reset observation, and the second reset must reproduce it."""
        task = int(np.random.default_rng(seed).integers(len(self.tasks)))
        self.sim.seed(seed)  # Meta-World's resets draw nothing once the task is set; seeded all the same
        obs = self._reset_to(self.tasks[task])
        check_finite(self.name, episode, 0, observation=obs)
        if first:
            if len(self._starts) > 4096:  # resets never followed by a run
                self._starts.clear()
            self._starts[(episode, seed)] = obs
        elif not np.array_equal(self._starts.pop((episode, seed), obs), obs):
            raise RuntimeError(f"{self.name}: episode {episode} reset to a different state in run() than in reset()")
        return obs

    def reset(self, episode: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs = self._start(episode, seed, first=True)
        pos = obs[:3] if self.config.gripper is not None else np.r_[obs[:3], -1.0]
        return obs[self.context_index], pos.copy(), np.zeros_like(pos)

    def run(self, episode: int, seed: int, pos: np.ndarray, vel: np.ndarray) -> EpisodeResult:
        horizon, gain = self.spec.horizon, self.config.gain
        states = np.empty((horizon + 1, 39))
        rewards, success = np.empty(horizon), np.zeros(horizon, bool)
        obs = states[0] = self._start(episode, seed, first=False)
        action = np.full(4, -1.0 if self.config.gripper is None else self.config.gripper)
        for t in range(horizon):
            action[:3] = np.clip(gain * (pos[t + 1, :3] - obs[:3]), -1.0, 1.0)
            if self.config.gripper is None:
                action[3] = np.clip(pos[t + 1, 3], -1.0, 1.0)
            obs, reward, _, _, info = self.sim.step(action)
            check_finite(self.name, episode, t + 1, observation=obs, reward=reward)
            states[t + 1], rewards[t], success[t] = obs, reward, info["success"] > 0
        final = {
            "distance": float(info["obj_to_target"]),
            "success_any": float(success.any()),
            "return": float(rewards.sum()),
        }
        return EpisodeResult(states, rewards, np.zeros(horizon, bool), bool(success[-1]), final)

    def close(self) -> None:
        self.env.close()
