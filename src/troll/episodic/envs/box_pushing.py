"""Box pushing, the TCE paper's robot task: ``fancy/box-pushing-dense`` and ``fancy/box-pushing-sparse``.

fancy_gym 0.3.0's ``BoxPushingRandomInitDense-v0`` and ``BoxPushingRandomInitTemporalSparse-v0`` (the ids the TCE
authors' configs name, behind their ProDMP wrapper), rewritten on MuJoCo's API (box_pushing_sim.py: model, reset,
step, rewards) and checked against recordings of fancy_gym itself (tests/episodic/envs/test_box_pushing.py):
a Franka Panda pushes a box with a rod to a goal pose on the table within T = 100 steps of dt = 0.02 s.

Tracking controller, fancy_gym's for this task (its black-box wrapper with the task's PD gains): at step t,
    a_t = clip(K_p (q_d(t + 1) - q_t) + K_d (q'_d(t + 1) - q'_t), -1, 1),
K_p = 0.01 [120, 120, 120, 120, 50, 30, 10], K_d = 0.01 [10, 10, 10, 10, 6, 5, 3], q_d the desired joint angles
sampled at t_k = k dt (fancy_gym's wrapper aims step t at the trajectory's point at (t + 1) dt); the simulator
turns a_t into 10 a_t N m plus gravity compensation. D = 7, and the tracked position and velocity at reset are
q_0 and q'_0 = 0.

Context (option ``context``): "mask" (default), the entries fancy_gym's wrapper shows the policy: q (0:7), the box
pose (14:21) and the goal pose (21:28), C = 21 (the goal pose alone, C = 7, with ``random_init`` false, where the box
always starts at the same place); "full", the 28-entry observation. State: the observation (S = 28).
Rewards: dense, every step: shaping (rod to box, energy, joint limits, rod tilt) and the goal terms; sparse, the
shaping every step and the goal terms (350 per metre, 100 / pi per radian, 50 per rad/s of joint speed) at the
last step only (box_pushing_sim.reward_terms). Success: after the last step, the box within 5 cm and 0.5 rad of
the goal. final: "distance" (box to goal, m), "rotation" (rad), "energy" (sum of ||10 a_t||^2), "return".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from troll.episodic.envs.base import check_finite
from troll.episodic.envs.box_pushing_sim import (
    DT,
    HORIZON,
    BoxPushingSim,
    dense_reward,
    rotation_distance,
    sparse_reward,
    success,
)
from troll.episodic.envs.options import Option
from troll.episodic.envs.workers import EpisodeResult, RunnerSpec

NAMES = ("fancy/box-pushing-dense", "fancy/box-pushing-sparse")
KP = 0.01 * np.array([120.0, 120.0, 120.0, 120.0, 50.0, 30.0, 10.0])
KD = 0.01 * np.array([10.0, 10.0, 10.0, 10.0, 6.0, 5.0, 3.0])
OBS_DIM = 28
CONTEXT = {(True, "mask"): np.r_[0:7, 14:28], (False, "mask"): np.r_[21:28]}

OPTIONS = {
    "random_init": Option("bool", help="the box starts at a random pose (the TCE paper's task) or at a fixed one"),
    "context": Option("choice", choices=("mask", "full"), help="fancy_gym's context entries, or all 28"),
}


@dataclass(frozen=True)
class BoxPushingConfig:
    """Options of ``fancy/box-pushing-*`` (:data:`OPTIONS`, checked by registry.make_env)."""

    sparse: bool = False
    random_init: bool = True
    context: str = "mask"

    def __post_init__(self):
        if self.context not in ("mask", "full") or not isinstance(self.random_init, bool):
            raise ValueError(f"box pushing takes context 'mask' or 'full' and a bool random_init, got {self}")

    @property
    def name(self) -> str:
        return NAMES[1] if self.sparse else NAMES[0]

    @property
    def context_index(self) -> np.ndarray:
        return CONTEXT.get((self.random_init, self.context), np.arange(OBS_DIM))


def pd_action(pos_d: np.ndarray, vel_d: np.ndarray, q: np.ndarray, qd: np.ndarray) -> np.ndarray:
    """a = clip(K_p (q_d - q) + K_d (q'_d - q'), -1, 1) for desired and measured angles and velocities (..., 7)."""
    return np.minimum(np.maximum(KP * (pos_d - q) + KD * (vel_d - qd), -1.0), 1.0)


class BoxPushingTask:
    """One simulator stepped with the task's rewards: ``start(seed)`` then ``step(a)`` T times (PPO's step
    interface and the episodic runner both stand on it). ``step`` returns (observation, reward, info); info holds
    "is_success", "distance", "rotation", "energy" after the last step."""

    def __init__(self, config: BoxPushingConfig):
        self.config = config
        self.sim = BoxPushingSim(random_init=config.random_init)
        self._starts: dict[int, tuple] = {}
        self.t = 0

    def start(self, seed: int) -> np.ndarray:
        """Reset to the episode of ``seed``. The reset's inverse kinematics costs about a quarter of an episode, so
        the state it ends in (before its last forward pass, whose solver warm start it keeps) is remembered and
        restored when the same seed starts again: the same first observation and the same steps, to the bit."""
        import mujoco

        sim, d = self.sim, self.sim.data
        saved = self._starts.get(seed)
        if saved is None:
            obs = sim.reset(seed)
            if len(self._starts) > 4096:  # starts never run again
                self._starts.clear()
            self._starts[seed] = sim.saved
        else:
            qpos, qvel, warm, goal = saved
            mujoco.mj_resetData(sim.model, d)
            d.qpos[:], d.qvel[:], d.qacc_warmstart[:] = qpos, qvel, warm
            sim.place_goal(goal)
            mujoco.mj_forward(sim.model, d)
            sim.t, sim.energy = 0, 0.0
            obs = sim.observation()
        self.t = 0
        return obs

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, dict]:
        obs, state = self.sim.step(action)
        self.t += 1
        last = self.t >= HORIZON
        reward = sparse_reward(state, last=last) if self.config.sparse else dense_reward(state)
        info = {}
        if last:
            angle = float(rotation_distance(state.box_quat, state.goal_quat))
            info = {"is_success": success(state.box_pos, state.box_quat, state.goal_pos, state.goal_quat),
                    "distance": float(np.linalg.norm(state.box_pos - state.goal_pos)), "rotation": angle,
                    "energy": self.sim.energy}  # fmt: skip
        return obs, reward, info

    def close(self) -> None:
        self._starts.clear()


class BoxPushingRunner:
    """Box pushing in a worker (workers.PooledEnv): D = 7, T = 100, dt = 0.02, C = 21 (or 7, 28), S = 28."""

    def __init__(self, config: BoxPushingConfig):
        self.config = config
        self.task = BoxPushingTask(config)
        self.context_index = config.context_index
        self.spec = RunnerSpec(config.name, 7, HORIZON, DT, len(self.context_index), OBS_DIM, has_success=True)

    @property
    def sim(self) -> BoxPushingSim:
        """The simulator (``model``, ``data``, ``step``): what ``troll tce render`` draws after each step."""
        return self.task.sim

    def reset(self, episode: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs = self.task.start(seed)
        check_finite(self.spec.name, episode, 0, observation=obs)
        return obs[self.context_index], obs[:7].copy(), obs[7:14].copy()

    def run(self, episode: int, seed: int, pos: np.ndarray, vel: np.ndarray) -> EpisodeResult:
        """Track pos, vel (T+1, 7) from the episode's start."""
        name, task, d = self.spec.name, self.task, self.task.sim.data
        states, rewards = np.empty((HORIZON + 1, OBS_DIM)), np.empty(HORIZON)
        states[0] = task.start(seed)
        for t in range(HORIZON):
            states[t + 1], rewards[t], info = task.step(pd_action(pos[t + 1], vel[t + 1], d.qpos[:7], d.qvel[:7]))
        if not (np.isfinite(states).all() and np.isfinite(rewards).all()):  # once an episode: the first bad step
            bad = int(np.flatnonzero(~(np.isfinite(states[1:]).all(1) & np.isfinite(rewards)))[0])
            check_finite(name, episode, bad + 1, observation=states[bad + 1], reward=rewards[bad])
        final = {"distance": info["distance"], "rotation": info["rotation"], "energy": info["energy"],
                 "return": float(rewards.sum())}  # fmt: skip
        return EpisodeResult(states, rewards, np.zeros(HORIZON, bool), bool(info["is_success"]), final)

    def close(self) -> None:
        self.task.close()
