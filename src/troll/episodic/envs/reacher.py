"""gymnasium's ``Reacher-v5`` (MuJoCo) behind a joint-space PD tracking controller: ``gym/reacher`` (the env's
dense reward) and ``gym/reacher-sparse`` (all reward at the last step).

Reacher-v5: a 2-link planar arm (joint angles q, both links 0.1 m), a target drawn uniformly in the disc of radius
0.2, initial q and q' drawn near zero; 50 steps (its registered time limit) of dt = 0.02 s (2 RK4 substeps of
0.01 s); action = two motor commands in [-1, 1] (gear 200); reward of a step = - ||fingertip - target|| -
||a||^2, measured after the step; it never terminates. We step the unwrapped env (the time limit is our horizon,
and the checker wrappers only cost time).

Controller, per step t (q, q' measured before the step):  a_t = clip(kp (q_d(t) - q_t) + kd (q'_d(t) - q'_t), -1, 1).
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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from troll.episodic.envs.base import check_finite
from troll.episodic.envs.options import Option
from troll.episodic.envs.workers import EpisodeResult, RunnerSpec

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


class ReacherRunner:
    """One Reacher-v5 in a worker. D = 2 (joint angles), T = 50, dt = 0.02, C = S = 10.

    context = the reset observation, state = the observation: [cos q (2), sin q (2), target xy (2), q' (2),
    fingertip - target xy (2)]. final: "distance" (fingertip to target at the end), "ctrl_cost" (sum of
    ||a||^2), "return".
    """

    def __init__(self, config: ReacherConfig):
        import gymnasium as gym

        self.config = config
        self.env = gym.make("Reacher-v5", disable_env_checker=True)
        self.sim = self.env.unwrapped
        name = "gym/reacher-sparse" if config.sparse else "gym/reacher"
        horizon = int(self.env.spec.max_episode_steps)
        self.spec = RunnerSpec(name, 2, horizon, float(self.sim.dt), 10, 10, has_success=True)

    def _start(self, episode: int, seed: int) -> np.ndarray:
        obs, _ = self.sim.reset(seed=seed)
        check_finite(self.spec.name, episode, 0, observation=obs)
        return obs

    def reset(self, episode: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs = self._start(episode, seed)
        return obs, self.sim.data.qpos[:2].copy(), self.sim.data.qvel[:2].copy()

    def run(self, episode: int, seed: int, pos: np.ndarray, vel: np.ndarray) -> EpisodeResult:
        name, horizon, cfg = self.spec.name, self.spec.horizon, self.config
        states = np.empty((horizon + 1, 10))
        rewards, ctrl = np.empty(horizon), np.empty(horizon)
        states[0] = self._start(episode, seed)
        data = self.sim.data
        for t in range(horizon):
            action = np.clip(cfg.kp * (pos[t] - data.qpos[:2]) + cfg.kd * (vel[t] - data.qvel[:2]), -1.0, 1.0)
            obs, reward, _, _, info = self.sim.step(action)
            check_finite(name, episode, t + 1, observation=obs, reward=reward)
            states[t + 1], rewards[t], ctrl[t] = obs, reward, info["reward_ctrl"]
        distance = -float(info["reward_dist"])  # the env's distance weight is 1
        if cfg.sparse:
            rewards[:] = 0.0
            rewards[-1] = ctrl.sum() - horizon * distance
        final = {"distance": distance, "ctrl_cost": -float(ctrl.sum()), "return": float(rewards.sum())}
        return EpisodeResult(states, rewards, np.zeros(horizon, bool), distance <= cfg.success_radius, final)

    def close(self) -> None:
        self.env.close()
