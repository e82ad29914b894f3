"""``fancy/hopper-jump``: fancy_gym 0.3.0's sparse hopper jump (``fancy/HopperJumpSparse-v0``, the TCE paper's
task) behind its PD tracking controller; the reward terms here as pure numpy functions, the simulator in
hopper_jump_sim.py (a subclass of gymnasium's Hopper-v5, imported only in the worker processes).

Model: gymnasium's Hopper (a planar torso, thigh, leg and foot; three hinge joints driven with gear 200 and
actions in [-1, 1]) plus a foot site and a goal marker, the XML fancy_gym 0.3.0 ships (MIT;
``pip install --no-deps fancy-gym==0.3.0``, a step of the Makefile's install: :func:`model_path` finds it without
importing fancy_gym, which pins mujoco 2.3.3). qpos = (x, z, pitch, thigh, leg, foot); z is the torso's height.

Episode: T = 250 steps of dt = 0.008 s (4 RK4 substeps of 0.002 s), never terminated. Reset (seeded by the episode's
seed through gymnasium's generator, in this order): the goal x ~ U(0.3, 1.35), then the joint angles thigh ~ U(-0.5,
0), leg ~ U(-0.2, 0), foot ~ U(0, 0.785) added to the model's rest pose with z = 1.5 (a 0.25 m drop), at rest.

Observation (S = 16): qpos (0:6), clip(qvel, -10, 10) (6:12), foot site - goal (12:15), goal x (15).
Context (option ``context``): "varying" (default; fancy_gym's context mask, the entries a reset randomises): the
joint angles and the goal x, obs[3:6] and obs[15] (C = 4); "full": the whole observation (C = 16).

Controller (fancy_gym's black-box wrapper, p = 1, d = 0.1): step t tracks the desired point of time (t + 1) dt,
    a_t = clip(kp (q_d(t+1) - q_t) + kd (q'_d(t+1) - q'_t), -1, 1),  q, q' = qpos[3:6], qvel[3:6] before the step.

Reward (fancy_gym's sparse variant): every step pays -1e-3 ||a_t||^2 (:func:`control_cost`); the last step adds
    10 max_t z_t - 3 ||foot_T - goal|| - 2 d_land + 2 [healthy_T]   (:func:`final_reward`),
with z_t the torso frame's height after step t as MuJoCo last computed it (data.xpos, which mj_step computes
before its last substep; so are the foot site and the observation's foot - goal) and max z starting at 0,
goal = (goal x, 0, 0), d_land the foot-goal distance at the first landing after the foot has touched the floor and
left it (:class:`ContactPhase`; 5 when it never lands again), healthy = z > 0.5 and every qpos[2:], qvel entry in
(-100, 100) (:func:`is_healthy`).
There is no success rule: final metrics "max_height", "distance" (foot to goal at the end), "landing_distance"
(d_land, 0 when it never landed: fancy_gym's info), "healthy" and "return".
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from troll.episodic.envs.fancy_wheel import INSTALL_STEP, REINSTALL_STEP
from troll.episodic.envs.options import Option, check

HORIZON, DT = 250, 0.008  # fancy_gym's MAX_EPISODE_STEPS_HOPPERJUMP; frame_skip 4 x the model's 0.002 s
STATE_DIM = 16
CONTEXT_INDEX = {"varying": np.array([3, 4, 5, 15]), "full": np.arange(STATE_DIM)}

# fancy_gym 0.3.0's HopperJumpEnv(sparse=True) weights
CTRL_COST_WEIGHT = 1e-3
HEIGHT_WEIGHT, DIST_WEIGHT, CONTACT_WEIGHT, HEALTHY_REWARD = 10.0, 3.0, 2.0, 2.0
NO_LANDING_DISTANCE = 5.0  # d_land when the hopper never lands after leaving the floor
HEALTHY_Z, HEALTHY_STATE = 0.5, 100.0
START_Z = 1.5
GOAL_RANGE = (0.3, 1.35)
JOINT_NOISE_LOW = np.array([0.0, 0.0, 0.0, -0.5, -0.2, 0.0])  # added to qpos at reset, per qpos entry
JOINT_NOISE_HIGH = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.785])

# the asset, from fancy-gym's wheel (its RECORD's hash): a different file is refused rather than simulated
ASSET = "envs/mujoco/hopper_jump/assets/hopper_jump.xml"
ASSET_SHA256 = "47ad7e3fdac1a6a46027412b1ff7efc08b4969e79694250e4699eb80f47924b4"

OPTIONS = {
    "kp": Option("float", 0.0, 100.0, help="P gain per rad (fancy_gym: 1)"),
    "kd": Option("float", 0.0, 10.0, help="D gain per rad/s (fancy_gym: 0.1)"),
    "context": Option("choice", choices=("varying", "full"), help="policy input: joint angles + goal x, or all 16"),
}


class AssetError(FileNotFoundError):
    """fancy_gym's hopper-jump XML is missing or not the file of fancy-gym 0.3.0."""


def model_path() -> Path:
    """The hopper-jump XML inside the installed fancy-gym 0.3.0 wheel, checked against its SHA-256, found with
    importlib.util.find_spec (which locates the package without running it: fancy_gym itself imports mujoco 2.3.3
    and gymnasium < 1 APIs). AssetError naming the install step when it is missing or differs."""
    spec = importlib.util.find_spec("fancy_gym")
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(f"fancy/hopper-jump needs the hopper-jump model of fancy-gym 0.3.0, which is not installed: "
                         f"{INSTALL_STEP}.")  # fmt: skip
    path = Path(next(iter(spec.submodule_search_locations))) / ASSET
    if not path.is_file():
        raise AssetError(f"fancy/hopper-jump: {path} is missing (a damaged fancy-gym install); reinstall it: "
                         f"{REINSTALL_STEP}.")  # fmt: skip
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != ASSET_SHA256:
        raise AssetError(f"fancy/hopper-jump: {path} is not fancy-gym 0.3.0's hopper-jump model (SHA-256 {digest}); "
                         f"reinstall it: {REINSTALL_STEP}.")  # fmt: skip
    return path


@dataclass(frozen=True)
class HopperJumpConfig:
    """Options of ``fancy/hopper-jump`` (checked by registry.make_env against :data:`OPTIONS`)."""

    kp: float = 1.0
    kd: float = 0.1
    context: str = "varying"

    name = "fancy/hopper-jump"

    def __post_init__(self):  # what make_env checks, for a config built directly
        check(self.name, {"kp": self.kp, "kd": self.kd, "context": self.context}, OPTIONS)


def pd_action(config: HopperJumpConfig, q_d, qd_d, q, qd) -> np.ndarray:
    """a = clip(kp (q_d - q) + kd (q'_d - q'), -1, 1), desired and measured joint angles and velocities (..., 3)."""
    return np.clip(config.kp * (q_d - q) + config.kd * (qd_d - qd), -1.0, 1.0)


def control_cost(action: np.ndarray) -> np.ndarray:
    """1e-3 ||a||^2 over the last axis: the cost every step pays."""
    action = np.asarray(action, dtype=np.float64)
    return CTRL_COST_WEIGHT * np.sum(action * action, axis=-1)


def is_healthy(qpos: np.ndarray, qvel: np.ndarray) -> bool:
    """z = qpos[1] > 0.5 and every entry of (qpos[2:], qvel) strictly inside (-100, 100) (Hopper's health test with
    fancy_gym's z range and no pitch limit)."""
    state = np.concatenate([qpos[2:], qvel])
    return bool(qpos[1] > HEALTHY_Z and np.all(np.abs(state) < HEALTHY_STATE))


def final_reward(max_height: float, goal_dist: float, landing_dist: float | None, healthy: bool) -> float:
    """The last step's sparse terms: 10 max z - 3 ||foot - goal|| - 2 d_land (5 when None) + 2 [healthy]."""
    landing = NO_LANDING_DISTANCE if landing_dist is None else landing_dist
    return HEIGHT_WEIGHT * max_height - DIST_WEIGHT * goal_dist - CONTACT_WEIGHT * landing + HEALTHY_REWARD * healthy


@dataclass
class ContactPhase:
    """The first landing: ``touched`` (the foot has touched the floor), ``left`` (and left it since), ``landed``
    (and touched it again: d_land is measured at that step)."""

    touched: bool = False
    left: bool = False
    landed: bool = False

    def update(self, contact: bool) -> bool:
        """Advance by one step whose foot-floor contact is ``contact``; True at the step of the first landing."""
        if self.landed:
            return False
        if not self.touched:
            self.touched = contact
        elif not self.left:
            self.left = not contact
        elif contact:
            self.landed = True
            return True
        return False


def observation(qpos: np.ndarray, qvel: np.ndarray, foot: np.ndarray, goal_x: float) -> np.ndarray:
    """The 16 observation entries (module docstring) from qpos (6,), qvel (6,), the foot site (3,) and goal x."""
    goal = np.array([goal_x, 0.0, 0.0])
    return np.concatenate([qpos, np.clip(qvel, -10.0, 10.0), foot - goal, goal[:1]])
