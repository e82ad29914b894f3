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
Context (option ``context``): "varying" (default) the entries of the reset observation's current frame and goal
(0:18, 36:39) that differ between the task's variations, found by resetting 10 of them when the env is built: for
reach-v3 and pick-place-v3 the object xy and the goal xyz (C = 5), for push-v3 the object xy and the goal xy
(C = 4); the rest is the same in every episode (hand start, quaternions, padding) and would only be noise to
normalise. "full": the whole 39-entry reset observation (C = 39), as the TCE authors feed their policy.
State: the full 39-entry observation (S = 39).

Controller: control.py (options ``controller``, ``gain``, ``gripper``, ``gripper_start``). The default, "hand"
with K = 50 per metre, comes from a tracking-error check on reach-v3 (minimum-jerk moves from the hand's start to
the goal in 100 and 400 steps, K in {25 .. 300}): the hand lags the mocap by ~5 steps, so K >= 75 overshoots and
oscillates (errors of 3-4 cm on the slow move); K = 50 kept the error under 1 cm on the fast move and 2 mm on the
slow one, and ended every move on the goal. The TCE authors drive the mocap instead ("mocap", K = 100).

final: "distance" (info["obj_to_target"] after the last step: hand to goal for reach, object to goal otherwise)
only for the tasks that define it: :data:`NO_DISTANCE` report a hard-coded 0 there; "success_any" (1 if the
success flag was set at any step: Meta-World's own evaluation), "return". ``success`` is the flag after the last
step (the TCE authors' metric).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from troll.episodic.envs.base import check_finite
from troll.episodic.envs.control import ControlConfig, Controller
from troll.episodic.envs.options import Option
from troll.episodic.envs.workers import EpisodeResult, RunnerSpec

# Of the 39 observation entries: the current frame and the goal (the previous frame repeats the current at reset).
CONTEXT_CANDIDATES = np.r_[0:18, 36:39]
# tasks whose info["obj_to_target"] is a hard-coded 0 in metaworld 3.1.1 (a test checks the list against the source)
NO_DISTANCE = frozenset({"assembly-v3", "box-close-v3", "disassemble-v3", "door-open-v3", "hammer-v3"})

# the options of metaworld/<task> in both backends (envpool.py adds none; "backend" is make_env's)
OPTIONS = {
    "controller": Option("choice", choices=("hand", "mocap"), help="track the observed hand or the mocap target"),
    "gain": Option("float", 1e-3, 1e4, help="K per metre of position error"),
    "gripper": Option("float", -1.0, 1.0, optional=True, help="null: tracked 4th DoF; a number: held command"),
    "gripper_start": Option("choice", choices=("command", "fingers"), help="initial gripper DoF: -1, or ~0"),
    "context": Option("choice", choices=("varying", "full"), help="the policy's input: varying entries or all 39"),
}


@dataclass(frozen=True)
class MetaWorldConfig:
    """Options of ``metaworld/<task>`` (checked by registry.make_env against :data:`OPTIONS`): the MT1 seed of the
    50 task variations (Python backend), the controller (control.py) and the context."""

    task: str
    seed: int = 0
    controller: str = "hand"
    gain: float = 50.0
    gripper: float | None = None
    gripper_start: str = "command"
    context: str = "varying"

    @property
    def control(self) -> ControlConfig:
        return ControlConfig(self.controller, self.gain, self.gripper, self.gripper_start)


def task_bounds(task: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The task's hand_init_pos, mocap_low and mocap_high (3,) each, read from metaworld's class (they differ
    between tasks; EnvPool ports them)."""
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    sim = ALL_V3_ENVIRONMENTS[task]()
    try:
        return tuple(np.array(v, dtype=np.float64) for v in (sim.hand_init_pos, sim.mocap_low, sim.mocap_high))
    finally:
        sim.close()


def varying_entries(first_obs: np.ndarray) -> np.ndarray:
    """Observation indices (among the current frame and the goal) that differ between reset observations (N, 39)
    of different task variations."""
    first = first_obs[:, CONTEXT_CANDIDATES]
    return CONTEXT_CANDIDATES[first.max(0) - first.min(0) > 1e-6]


def final_metrics(task: str, obj_to_target: float | np.ndarray, success: np.ndarray, rewards: np.ndarray) -> dict:
    """final of an episode batch: success (T, ...) per step, rewards (T, ...); "distance" only where defined."""
    out = {"success_any": success.any(0).astype(np.float64), "return": rewards.sum(0)}
    if task not in NO_DISTANCE:
        out["distance"] = np.asarray(obj_to_target, dtype=np.float64)
    return out


class MetaWorldRunner:
    """One Meta-World MT1 task in a worker. D = 4 (hand xyz, gripper) or 3, T = 500, dt = 0.0125, S = 39."""

    def __init__(self, config: MetaWorldConfig):
        import gymnasium as gym
        import metaworld  # noqa: F401 -- registers the Meta-World/* environments

        self.config = config
        self.env = gym.make("Meta-World/MT1", env_name=config.task, seed=config.seed, disable_env_checker=True)
        self.tasks = list(self.env.get_wrapper_attr("tasks"))
        self.sim = self.env.unwrapped
        self.name = f"metaworld/{config.task}"
        self._starts: dict[tuple[int, int], np.ndarray] = {}
        # 10 of the 50 variations are enough: the randomised entries are drawn from continuous distributions, so any
        # two variations differ in all of them (and resets cost ~20 ms each)
        self.varying = varying_entries(np.stack([self._reset_to(task) for task in self.tasks[:10]]))
        self.context_index = self.varying if config.context == "varying" else np.arange(39)
        bounds = (self.sim.hand_init_pos, self.sim.mocap_low, self.sim.mocap_high)
        self.controller = Controller(config.control, *bounds)
        horizon = int(self.sim.max_path_length)
        dof = config.control.dof
        self.spec = RunnerSpec(self.name, dof, horizon, float(self.sim.dt), len(self.context_index), 39, True)

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
        pos, vel = self.controller.start(obs[None])
        return obs[self.context_index], pos[0], vel[0]

    def run(self, episode: int, seed: int, pos: np.ndarray, vel: np.ndarray) -> EpisodeResult:
        horizon = self.spec.horizon
        states = np.empty((horizon + 1, 39))
        rewards, success = np.empty(horizon), np.zeros(horizon, bool)
        obs = states[0] = self._start(episode, seed, first=False)
        self.controller.start(obs[None])
        for t in range(horizon):
            action = self.controller.action(pos[None, t + 1], obs[None])[0]
            obs, reward, _, _, info = self.sim.step(action)
            check_finite(self.name, episode, t + 1, observation=obs, reward=reward)
            states[t + 1], rewards[t], success[t] = obs, reward, info["success"] > 0
        final = final_metrics(self.config.task, info["obj_to_target"], success, rewards)
        final = {k: float(v) for k, v in final.items()}
        return EpisodeResult(states, rewards, np.zeros(horizon, bool), bool(success[-1]), final)

    def close(self) -> None:
        self.env.close()
