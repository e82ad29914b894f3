"""gymnasium's ``Reacher-v5`` (MuJoCo) behind a joint-space PD tracking controller: ``gym/reacher`` (the env's
dense reward) and ``gym/reacher-sparse`` (all reward at the last step), on two simulators (option ``backend``):
"envpool", EnvPool's C++ port of Reacher-v5 (:class:`EnvPoolReacher`, all E episodes in this process on EnvPool's
threads), or "python", gymnasium's own (:class:`ReacherRunner`, one episode at a time in worker processes).

Reacher-v5: a 2-link planar arm (joint angles q; 0.1 m to the elbow, 0.11 m on to the fingertip), a target drawn
uniformly in the disc of radius 0.2, initial q and q' drawn near zero; 50 steps (its registered time limit) of
dt = 0.02 s (2 RK4 substeps of 0.01 s); action = two motor commands in [-1, 1] (gear 200); reward of a step =
- ||fingertip - target|| - ||a||^2, measured after the step; it never terminates. On gymnasium we step the unwrapped
env (the time limit is our horizon, and the checker wrappers only cost time).

Controller, per step t (q, q' measured before the step; :func:`pd_action`, batched over E on EnvPool):
    a_t = clip(kp (q_d(t) - q_t) + kd (q'_d(t) - q'_t), -1, 1).
Gains kp = 8, kd = 0.3 (damping ratio ~0.75 with the joints' armature 1, damping 1 and gear 200) come from a
tracking-error check: minimum-jerk moves of up to 1.5 rad per joint in 0.8 s, from 20 reset states, tracked with
kp in {0.5 .. 16} and damping ratios 0.7 and 1. Tracking error fell with kp (max 0.09 rad at kp 0.5, 0.006 rad at
kp 8), kp 16 with ratio 1 was unstable at this dt (kd * gear * dt > 2), and aiming at q_d(t + 1) instead of q_d(t)
made it worse at high gains; kp 8, kd 0.3 keeps a factor of ~2 from that limit.

Sparse variant (ours; Reacher has none): reward 0 at every step but the last, which gets
    sum_t (- ||a_t||^2)  -  T ||fingertip_T - target||,
so its total equals the dense total when the fingertip stays at its final distance all episode: the control cost
is the same and the distance is charged for all T steps, but only where the arm ends up. Success (ours as well):
final distance <= 0.02 m (fingertip and target spheres have radii 0.01 and 0.009).

Observation (both simulators, 10 float64 entries; tests/episodic/envs/test_reacher_envpool.py checks the layout):
cos q (0:2), sin q (2:4), target xy (4:6), q' (6:8), fingertip - target xy (8:10). The Python backend reads q and q'
from MuJoCo's qpos and qvel; EnvPool exposes only the observation, so :class:`JointAngles` recovers q from cos / sin,
continued across steps (joint 0 is unlimited: atan2 alone would jump by 2 pi where the arm passes +-pi, and the PD
error with it), and q' is the observation's qvel itself.
Seeding: each backend draws episode i's start (q, q', target) from (reset seed, i) alone, but with its own
generator: the backends agree in distribution, not episode by episode (envpool_backend.py; the test above).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from troll.episodic.envs.base import Episodes, EpisodeStart, check_finite
from troll.episodic.envs.envpool_backend import EnvPoolEnv
from troll.episodic.envs.options import Option
from troll.episodic.envs.workers import EpisodeResult, RunnerSpec

HORIZON, DT = 50, 0.02  # Reacher-v5's time limit and frame_skip 2 x 0.01 s (ReacherRunner reads them from gymnasium)

# the options of gym/reacher (registry.check_options); kp * gear * dt stays below the stability limit ~2 at 0.5
OPTIONS = {
    "kp": Option("float", 0.0, 100.0, help="P gain per rad"),
    "kd": Option("float", 0.0, 0.5, help="D gain per rad/s (kd * 200 * 0.02 > 2 is unstable)"),
    "success_radius": Option("float", 1e-4, 1.0, help="success: final distance <= this (m)"),
}


@dataclass(frozen=True)
class ReacherConfig:
    """Options of ``gym/reacher``: the sparse reward, PD gains, the success radius (m)."""

    sparse: bool = False
    kp: float = 8.0
    kd: float = 0.3
    success_radius: float = 0.02

    def __post_init__(self):
        if self.kp < 0 or self.kd < 0 or self.success_radius <= 0:
            raise ValueError(f"gym/reacher needs kp, kd >= 0 and success_radius > 0, got {self}")

    @property
    def name(self) -> str:
        return "gym/reacher-sparse" if self.sparse else "gym/reacher"


def pd_action(config: ReacherConfig, q_d, qd_d, q, qd) -> np.ndarray:
    """a = clip(kp (q_d - q) + kd (q'_d - q'), -1, 1): desired and measured joint angles and velocities (E, 2)."""
    return np.clip(config.kp * (q_d - q) + config.kd * (qd_d - qd), -1.0, 1.0)


def outcomes(config: ReacherConfig, rewards: np.ndarray, ctrl: np.ndarray, distance: np.ndarray):
    """(rewards (E, T), success (E,), final) of E episodes from the env's rewards (E, T), its control rewards
    ``info["reward_ctrl"]`` = -||a_t||^2 (E, T) and the final fingertip-target distance (E,): the sparse variant's
    rewards (module docstring), success = distance <= success_radius, final "distance", "ctrl_cost", "return"."""
    if config.sparse:
        rewards = np.zeros_like(rewards)
        rewards[:, -1] = ctrl.sum(1) - rewards.shape[1] * distance
    final = {"distance": distance, "ctrl_cost": -ctrl.sum(1), "return": rewards.sum(1)}
    return rewards, distance <= config.success_radius, final


def joint_angles(obs: np.ndarray) -> np.ndarray:
    """atan2(sin q, cos q) in (-pi, pi] (E, 2) of observations (E, 10)."""
    return np.arctan2(obs[:, 2:4], obs[:, 0:2])


class JointAngles:
    """q and q' (E, 2) of one rollout's observations (E, 10), fed in order: ``q, qd = angles(obs)`` once a step.

    q' is the observation's qvel (entries 6:8) itself. q: the first observation's atan2 (Reacher's reset draws q in
    [-0.1, 0.1], so this is q itself); afterwards atan2 + 2 pi k, with k the integer that brings it nearest the
    trapezoid prediction q_{t-1} + dt (q'_{t-1} + q'_t) / 2. That holds while the prediction is within pi of q: its
    error stayed under 0.12 rad on runs at full torque (joint 0 at up to 31 rad/s, joint 1 striking its limits;
    tests/episodic/envs/test_reacher_envpool.py), where the bare q_{t-1} would hold only below pi / dt = 157 rad/s.
    """

    def __init__(self, dt: float):
        self.dt = dt
        self.q: np.ndarray | None = None
        self.qd: np.ndarray | None = None

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        wrapped, qd = joint_angles(obs), np.asarray(obs[:, 6:8], dtype=np.float64)
        if self.q is None:
            q = wrapped
        else:
            guess = self.q + 0.5 * self.dt * (self.qd + qd)
            q = wrapped + 2 * np.pi * np.round((guess - wrapped) / (2 * np.pi))
        self.q, self.qd = q, qd
        return q, qd


class ReacherRunner:
    """One gymnasium Reacher-v5 in a worker (the "python" backend). D = 2 (joint angles), T = 50, dt = 0.02,
    C = S = 10.

    context = the reset observation, state = the observation (module docstring). final: "distance" (fingertip to
    target at the end), "ctrl_cost" (sum of ||a||^2), "return".
    """

    def __init__(self, config: ReacherConfig):
        import gymnasium as gym

        self.config = config
        self.env = gym.make("Reacher-v5", disable_env_checker=True)
        self.sim = self.env.unwrapped
        horizon = int(self.env.spec.max_episode_steps)
        self.spec = RunnerSpec(config.name, 2, horizon, float(self.sim.dt), 10, 10, has_success=True)

    def _start(self, episode: int, seed: int) -> np.ndarray:
        obs, _ = self.sim.reset(seed=seed)
        check_finite(self.spec.name, episode, 0, observation=obs)
        return obs

    def reset(self, episode: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs = self._start(episode, seed)
        return obs, self.sim.data.qpos[:2].copy(), self.sim.data.qvel[:2].copy()

    def run(self, episode: int, seed: int, pos: np.ndarray, vel: np.ndarray) -> EpisodeResult:
        name, horizon = self.spec.name, self.spec.horizon
        states = np.empty((horizon + 1, 10))
        rewards, ctrl = np.empty((1, horizon)), np.empty((1, horizon))
        states[0] = self._start(episode, seed)
        data = self.sim.data
        for t in range(horizon):
            action = pd_action(self.config, pos[t], vel[t], data.qpos[:2], data.qvel[:2])
            obs, reward, _, _, info = self.sim.step(action)
            check_finite(name, episode, t + 1, observation=obs, reward=reward)
            states[t + 1], rewards[0, t], ctrl[0, t] = obs, reward, info["reward_ctrl"]
        distance = np.array([-float(info["reward_dist"])])  # the env's distance weight is 1
        rewards, success, final = outcomes(self.config, rewards, ctrl, distance)
        final = {k: float(v[0]) for k, v in final.items()}
        return EpisodeResult(states, rewards[0], np.zeros(horizon, bool), bool(success[0]), final)

    def close(self) -> None:
        self.env.close()


class EnvPoolReacher(EnvPoolEnv):
    """E Reacher-v5 episodes on EnvPool (the "envpool" backend), ``threads`` EnvPool threads, a pool built per reset
    (envpool_backend.py). D = 2, T = 50, dt = 0.02, C = S = 10; context, state, final as :class:`ReacherRunner`'s."""

    INFO_KEYS = ("reward_ctrl", "reward_dist")

    def __init__(self, config: ReacherConfig, *, num_episodes: int, threads: int = 1):
        super().__init__(num_episodes=num_episodes, threads=threads)
        self.config = config
        self.name = config.name
        self.dof, self.horizon, self.dt, self.context_dim, self.state_dim = 2, HORIZON, DT, 10, 10

    def _make(self, seeds: list[int]):
        import envpool

        return envpool.make_gymnasium("Reacher-v5", num_envs=len(seeds), env_seed=seeds,
                                      num_threads=min(self.threads, len(seeds)), max_episode_steps=HORIZON)  # fmt: skip

    def _starts(self, obs: np.ndarray) -> EpisodeStart:
        as_t = lambda x: torch.from_numpy(np.ascontiguousarray(x)).float()  # noqa: E731
        return EpisodeStart(context=as_t(obs), pos=as_t(joint_angles(obs)), vel=as_t(obs[:, 6:8]))

    def _controller(self, pos: np.ndarray, vel: np.ndarray, obs: np.ndarray):
        angles = JointAngles(self.dt)
        return lambda t, obs: pd_action(self.config, pos[:, t], vel[:, t], *angles(obs))

    def _episodes(self, states: np.ndarray, rewards: np.ndarray, info: dict[str, np.ndarray]) -> Episodes:
        distance = -info["reward_dist"][-1]  # the env's distance weight is 1
        rewards, success, final = outcomes(self.config, rewards, info["reward_ctrl"].T, distance)
        as_t = lambda x: torch.from_numpy(np.ascontiguousarray(x)).float()  # noqa: E731
        return Episodes(
            states=as_t(states),
            rewards=as_t(rewards),
            dones=torch.zeros(rewards.shape, dtype=torch.bool),
            success=torch.from_numpy(success),
            final={k: as_t(v) for k, v in final.items()},
        )
