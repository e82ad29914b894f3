"""Meta-World's tracking controller, batched in numpy over E episodes: both backends (metaworld.py in-process or in
workers with E = 1, envpool.py over all E at once) step through this one rule, so they track alike.

Meta-World's action is a mocap displacement: a_xyz in [-1, 1], the mocap target moving by a_xyz * action_scale
(0.01 m) per step, clipped to the task's mocap bounds, the hand following it through a weld (it lags it by ~5
steps); a_4 is the gripper command (-1 open, +1 closed). Per step t, with y_d(t+1) the desired position:

    controller="hand"  (default):  a_xyz(t) = clip(K (y_d(t+1) - x_t), -1, 1),  x_t the observed hand (obs[0:3]);
    controller="mocap" (the TCE authors'): a_xyz(t) = clip(K (y_d(t+1) - m_t), -1, 1), m_t the mocap target.

m_t is integrated here as Meta-World does it: mocap_0 = the task's hand_init_pos (where reset leaves the mocap),
mocap_{t+1} = clip(mocap_t + clip(a_xyz(t), -1, 1) * action_scale, mocap_low, mocap_high) (checked against the
Python env's data.mocap_pos in tests/episodic/envs/test_envpool_backend.py). It is expressed in the frame of the
observed hand (Meta-World's end effector, the hand body the mocap drags through the weld; the centre between the
finger pads is 4.5 cm below it): m_t = x_0 + mocap_t - mocap_0, so a desired trajectory that starts at x_0 gives no
error at t = 0.
Gripper: tracked (D = 4, a_4 = clip(y_d4(t+1), -1, 1)) unless ``gripper`` holds it at a fixed command (D = 3); its
initial position is the command -1 (``gripper_start="command"``) or the finger joint's position at reset
(``"fingers"``, the TCE authors' choice: :data:`FINGER_START`, so that about half the samples around it close).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# r_close's joint position after Meta-World's reset (the same in every v3 task:
# tests/episodic/envs/test_envpool_backend.py); EnvPool does not expose qpos, so both backends use this constant
FINGER_START = -1.7191e-4
ACTION_SCALE = 0.01  # SawyerXYZEnv.action_scale, the same in all 50 v3 tasks


@dataclass(frozen=True)
class ControlConfig:
    """controller: "hand" or "mocap"; gain K per metre; gripper: None (tracked) or a fixed command in [-1, 1];
    gripper_start: "command" (-1) or "fingers" (FINGER_START)."""

    controller: str = "hand"
    gain: float = 50.0
    gripper: float | None = None
    gripper_start: str = "command"

    @property
    def dof(self) -> int:
        return 4 if self.gripper is None else 3


class Controller:
    """One rollout's controller over E episodes; ``start(obs0)`` then ``action(target, obs)`` once per step.

    hand_init, low, high (3,): the task's hand_init_pos, mocap_low and mocap_high (they differ between tasks:
    metaworld.task_bounds reads them); unused by controller="hand" and then may be left out.
    """

    def __init__(self, config: ControlConfig, hand_init=(0.0, 0.6, 0.2), low=(-1.0,) * 3, high=(1.0,) * 3):
        self.config = config
        self.hand_init, self.low, self.high = (np.asarray(v, dtype=np.float64) for v in (hand_init, low, high))
        self.mocap = self.offset = None

    def start(self, obs0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Initial tracked position and velocity (E, D) from the reset observations (E, 39)."""
        obs0 = np.asarray(obs0, dtype=np.float64)
        self.mocap = np.broadcast_to(self.hand_init, obs0[:, :3].shape).copy()
        self.offset = obs0[:, :3] - self.hand_init
        pos = obs0[:, :3].copy()
        if self.config.gripper is None:
            first = -1.0 if self.config.gripper_start == "command" else FINGER_START
            pos = np.concatenate([pos, np.full((len(pos), 1), first)], axis=1)
        return pos, np.zeros_like(pos)

    def action(self, target: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """(E, 4) actions for desired positions ``target`` (E, D) = y_d(t+1) and observations (E, 39) at t."""
        cfg = self.config
        here = obs[:, :3] if cfg.controller == "hand" else self.mocap + self.offset
        action = np.empty((len(target), 4))
        action[:, :3] = np.clip(cfg.gain * (target[:, :3] - here), -1.0, 1.0)
        action[:, 3] = np.clip(target[:, 3], -1.0, 1.0) if cfg.gripper is None else cfg.gripper
        self.mocap = np.clip(self.mocap + action[:, :3] * ACTION_SCALE, self.low, self.high)
        return action
