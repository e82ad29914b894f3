"""fancy_gym 0.3.0's box pushing (the TCE paper's task) written on MuJoCo's own API: model, reset, step, rewards.

The model is fancy_gym's ``box_pushing.xml`` (a 7-DoF Franka Panda holding a rod, a 10 x 10 cm box with walls, a goal
marker; MIT licence, the fancy-gym 0.3.0 wheel's assets: :func:`load_model`). fancy_gym itself is never imported
(it pins mujoco 2.3.3 and gymnasium < 1): its files are found through the wheel's installed metadata, checked
against the wheel's RECORD hashes, and the one attribute mujoco 3 refuses, ``<option collision="all">`` (the
default value of an option since removed), is dropped from the XML text in memory.

Task, as ``fancy/BoxPushingRandomInit{Dense,TemporalSparse}-v0`` (``random_init=False``: ``fancy/BoxPushing*-v0``):

- Reset: box and goal poses drawn as (x, y) ~ U([0.3, 0.6] x [-0.45, 0.45]), z = -0.01, yaw theta ~ U(0, 2 pi) with
  quaternion (sin theta/2, 0, 0, cos theta/2) (fancy_gym's convention), the goal redrawn until it lies >= 0.3 m
  from the box; the box first (random_init) or fixed at (0.4, 0.3, -0.01), quaternion (0, 0, 0, 1). The arm is put
  by :func:`offline_ik` with its rod's tool point 15 cm above the box centre, pointing down: the rod starts in
  the box. Draws come from ``numpy.random.default_rng(seed)``, the generator gymnasium's ``reset(seed=seed)`` seeds.
- Step (dt = 0.02 s = 10 substeps of 2 ms): action a in [-1, 1]^7 -> joint torques
  tau = clip(10 clip(a, -1, 1) + b(q, q'), -tau_max, tau_max), b the bias forces (gravity and Coriolis) of the
  state before the step; T = 100 steps.
- Observation (28): q (0:7), q' (7:14), box position (14:17) and quaternion (17:21), goal position (21:24) and
  quaternion (24:28), read after the step as fancy_gym reads them (positions of the bodies from the last substep's
  kinematics).
- Rewards: :func:`dense_reward`, :func:`sparse_reward`; success: :func:`success`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from troll.episodic.envs.fancy_wheel import INSTALL_STEP, REINSTALL_STEP, WHEEL, WHEEL_VERSION

HORIZON, FRAME_SKIP, DT = 100, 10, 0.02  # fancy_gym's MAX_EPISODE_STEPS_BOX_PUSHING, frame_skip, 10 x 2 ms
ASSETS = "fancy_gym/envs/mujoco/box_pushing/assets"
ACTION_SCALE = 10.0
Q_MAX = np.array([2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973])
Q_MIN = np.array([-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973])
QD_MAX = np.array([2.1750, 2.1750, 2.1750, 2.1750, 2.6100, 2.6100, 2.6100])
TORQUE_MAX = np.array([90.0, 90.0, 90.0, 90.0, 12.0, 12.0, 12.0])
ROD_QUAT = np.array([0.0, 1.0, 0.0, 0.0])  # the rod pointing straight down
POS_BOUNDS = np.array([[0.3, -0.45, -0.01], [0.6, 0.45, -0.01]])
FIXED_BOX = np.array([0.4, 0.3, -0.01, 0.0, 0.0, 0.0, 1.0])
INIT_QPOS = np.array([0.0, 0.0, 0.0, -1.5, 0.0, 1.5, 0.0, 0.0, 0.0, 0.6, 0.45, 0.0, 1.0, 0.0, 0.0, 0.0])
MIN_GOAL_DISTANCE = 0.3
SUCCESS_POS, SUCCESS_ROT = 0.05, 0.5  # m, rad: both strict (<), after the last step
# Sparse reward's terminal weights: 3.5 x 100 per metre, 100 / pi per radian, 50 per rad/s of joint speed
SPARSE_POS, SPARSE_ROT, SPARSE_QVEL = 350.0, 100.0, 50.0


class AssetError(ImportError):
    """The box-pushing assets of the fancy-gym wheel are missing or damaged; the message names the install step."""


def asset_files() -> tuple[Path, dict[str, str]]:
    """(assets folder, relative name -> expected sha256 in RECORD's urlsafe base64) of the installed fancy-gym
    wheel, found through its metadata without importing it. AssetError when it is missing or not 0.3.0."""
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        msg = (
            f"box pushing needs the MuJoCo assets of the fancy-gym 0.3.0 wheel, which is not installed: {INSTALL_STEP}."
        )
        raise AssetError(msg) from None
    if dist.version != WHEEL_VERSION:
        raise AssetError(f"box pushing needs fancy-gym {WHEEL_VERSION}'s assets, found {dist.version}: {INSTALL_STEP}.")
    prefix = ASSETS + "/"
    files = {str(f)[len(prefix) :]: f.hash.value for f in dist.files or () if str(f).startswith(prefix) and f.hash}
    root = Path(str(dist.locate_file(ASSETS)))
    if "box_pushing.xml" not in files:
        raise AssetError(
            f"the fancy-gym wheel's record lists no {ASSETS}/box_pushing.xml; reinstall: {REINSTALL_STEP}."
        )
    return root, files


def read_assets() -> dict[str, bytes]:
    """Every XML and mesh of the box-pushing assets, checked against the wheel's RECORD hashes (AssetError naming
    the first missing or changed file and the reinstall command)."""
    import base64

    root, files = asset_files()
    out = {}
    for name, digest in sorted(files.items()):
        if not name.endswith((".xml", ".stl")):
            continue
        try:
            data = (root / name).read_bytes()
        except OSError as err:
            raise AssetError(
                f"box-pushing asset {root / name} cannot be read ({err}); reinstall: {REINSTALL_STEP}."
            ) from None
        got = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if got != digest:
            raise AssetError(
                f"box-pushing asset {root / name} is damaged (its sha256 differs from the wheel's "
                f"record); reinstall: {REINSTALL_STEP}."
            )
        out[name] = data
    return out


def load_model():
    """The MjModel of fancy_gym 0.3.0's box_pushing.xml as mujoco 2.3.3 (its pin) simulated it.

    ``collision="all"`` is removed (mujoco >= 3 refuses the attribute; "all" was its default), the included files
    and meshes are given from memory, and MuJoCo's native convex collision (the default since 3.2) is switched off
    for libccd, which 2.3.3 used: the rod is a cylinder, and its contacts with the box walls go through that code.
    With native collision the box ended up to 1.2 cm from where 2.3.3 puts it after 100 tracked steps; with libccd,
    within 1e-7 m (tests/episodic/envs/test_box_pushing.py).
    """
    import mujoco

    assets = read_assets()
    xml = assets.pop("box_pushing.xml").decode()
    if xml.count(' collision="all"') != 1:
        raise AssetError(
            f"fancy-gym's box_pushing.xml is not the 0.3.0 file this code patches; reinstall: {REINSTALL_STEP}."
        )
    model = mujoco.MjModel.from_xml_string(xml.replace(' collision="all"', ""), assets)
    native = getattr(mujoco.mjtDisableBit, "mjDSBL_NATIVECCD", None)  # none before 3.2: libccd is the only one
    if native is not None:
        model.opt.disableflags |= native
    return model


# ---------------------------------------------------------------------------------------------- geometry


def rotation_distance(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The angle between two unit quaternions (..., 4), 2 arccos |p . q| in [0, pi]; |p . q| is clipped to 1,
    where rounding can push it past 1 (fancy_gym's formula would give NaN there)."""
    if p.ndim == 1:  # one pair, every step: Python floats (numpy's scalar calls cost more than the math)
        return 2.0 * math.acos(min(abs(float(p @ q)), 1.0))
    return 2.0 * np.arccos(np.minimum(np.abs(np.sum(p * q, axis=-1)), 1.0))


def cross_matrix(v: np.ndarray) -> np.ndarray:
    """The matrix [v]x (3, 3) with [v]x u = v x u."""
    x, y, z = v
    return np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])


def quaternion_error(current: np.ndarray, desired: np.ndarray, cross: np.ndarray | None = None) -> np.ndarray:
    """Orientation error (3,) of unit quaternions (w, x, y, z): w_c v_d - w_d v_c - [v_d]x v_c (Siciliano et al.,
    Robotics, eq. 3.91), the cross product as its matrix (the reset's IK reproduces fancy_gym's rounding with it).
    ``cross`` is cross_matrix(desired[1:]), for a caller that makes it once for many errors."""
    if cross is None:
        cross = cross_matrix(desired[1:])
    return current[0] * desired[1:] - desired[0] * current[1:] - cross @ current[1:]


def yaw_quaternion(theta: float) -> np.ndarray:
    """fancy_gym's quaternion of a box at yaw draw theta: (sin theta/2, 0, 0, cos theta/2)."""
    return np.array([np.sin(theta / 2.0), 0.0, 0.0, np.cos(theta / 2.0)])


def sample_pose(rng: np.random.Generator) -> np.ndarray:
    """A box or goal pose (7,): xyz uniform in POS_BOUNDS (three draws), then the yaw (one draw)."""
    pos = rng.uniform(low=POS_BOUNDS[0], high=POS_BOUNDS[1])
    return np.concatenate([pos, yaw_quaternion(rng.uniform(low=0.0, high=2.0 * np.pi))])


# ---------------------------------------------------------------------------------------------- rewards


@dataclass(frozen=True)
class StepState:
    """What a reward reads after a step: box, goal, rod tip (3,) positions; box, goal, rod (4,) quaternions;
    q, q' (7,); the applied torque command ``action`` = 10 clip(a, -1, 1) (7,), before the bias forces."""

    box_pos: np.ndarray
    box_quat: np.ndarray
    goal_pos: np.ndarray
    goal_quat: np.ndarray
    rod_tip: np.ndarray
    rod_quat: np.ndarray
    qpos: np.ndarray
    qvel: np.ndarray
    action: np.ndarray


def joint_limit_penalty(qpos: np.ndarray, qvel: np.ndarray) -> float:
    """-(sum of position excesses over the joint limits) - (sum of speed excesses over QD_MAX), each >= 0."""
    over = float(np.maximum(qpos - Q_MAX, 0.0).sum()) + float(np.maximum(Q_MIN - qpos, 0.0).sum())
    return -over - float(np.maximum(np.abs(qvel) - QD_MAX, 0.0).sum())


def rod_tilt_penalty(rod_quat: np.ndarray) -> float:
    """-angle / pi for a rod tilted by more than pi / 4 from straight down, else 0."""
    angle = float(rotation_distance(rod_quat, ROD_QUAT))
    return -angle / np.pi if angle > np.pi / 4 else 0.0


def _norm(x: np.ndarray) -> float:
    """||x|| of a vector as numpy's norm computes it (sqrt of the dot product), without its overhead."""
    return math.sqrt(float(x @ x))


def rod_box_term(s: StepState) -> float:
    """-2 clip(||box - rod tip||, 0.05, 100): no gain from bringing the tip closer than 5 cm to the box centre."""
    return -2.0 * min(max(_norm(s.box_pos - s.rod_tip), 0.05), 100.0)


def reward_terms(s: StepState, *, sparse: bool, last: bool) -> dict[str, float]:
    """Every term of a step's reward (their sum is the reward).

    Both variants, every step: "joint_limit", "rod_box", "rod_tilt", and "energy" = -w ||action||^2 with w = 5e-4
    (dense) or 0.02 (sparse). Dense, every step: "goal_pos" = -3.5 ||box - goal||, "goal_rot" = -angle(box, goal)
    / pi. Sparse, only at the last step (``last``): "goal_pos" = -350 ||box - goal||, "goal_rot" = -100 angle /
    pi, "joint_speed" = -50 ||q'||.
    """
    terms = {
        "joint_limit": joint_limit_penalty(s.qpos, s.qvel),
        "rod_box": rod_box_term(s),
        "energy": -(0.02 if sparse else 5e-4) * float((s.action * s.action).sum()),
        "rod_tilt": rod_tilt_penalty(s.rod_quat),
    }
    distance = _norm(s.box_pos - s.goal_pos)
    angle = float(rotation_distance(s.box_quat, s.goal_quat))
    if not sparse:
        terms |= {"goal_pos": -3.5 * distance, "goal_rot": -angle / np.pi}
    elif last:
        speed = _norm(s.qvel)
        terms |= {"goal_pos": -SPARSE_POS * distance, "goal_rot": -SPARSE_ROT * angle / np.pi,
                  "joint_speed": -SPARSE_QVEL * speed}  # fmt: skip
    return terms


def dense_reward(s: StepState) -> float:
    """fancy_gym's BoxPushingDense reward of one step (:func:`reward_terms`)."""
    return float(sum(reward_terms(s, sparse=False, last=False).values()))


def sparse_reward(s: StepState, *, last: bool) -> float:
    """fancy_gym's BoxPushingTemporalSparse reward of one step: shaping every step, the goal terms at the last."""
    return float(sum(reward_terms(s, sparse=True, last=last).values()))


def success(box_pos, box_quat, goal_pos, goal_quat) -> bool:
    """Success after the last step: box within 5 cm of the goal and within 0.5 rad of its orientation (strict)."""
    distance = float(np.linalg.norm(np.asarray(box_pos) - np.asarray(goal_pos)))
    angle = float(rotation_distance(np.asarray(box_quat), np.asarray(goal_quat)))
    return distance < SUCCESS_POS and angle < SUCCESS_ROT


# ---------------------------------------------------------------------------------------------- reset: IK

# fancy_gym's offline IK: task-space gains (position 3, orientation 3), the null-space posture and its gains
IK_GAIN = np.array([33.9403713446798, 30.9403713446798, 33.9403713446798, 27.69370238555632, 33.98706171459314,
                    30.9185531893281])  # fmt: skip
IK_NULL_POSTURE = np.array([3.57795216e-09, 1.74532920e-01, 3.30500960e-08, -8.72664630e-01, -1.14096181e-07,
                            1.22173047e00, 7.85398126e-01])  # fmt: skip
IK_NULL_GAIN = 5.0 * np.array([7.675519770796831, 2.676935478437176, 8.539040163444975, 1.270446361314313,
                               8.87752182480855, 2.186782233762969, 4.414432577659688])  # fmt: skip
IK_LIMIT_GAIN, IK_LIMIT_MARGIN, IK_DAMPING, IK_TOL, IK_MAX_ITER = 20.0, 0.1, 1e-6, 1e-5, 1000
TOOL_QUAT = np.array([0.0, 1.0, 0.0, 0.0])  # the tool point ("tcp") pointing down
TOOL_ABOVE_BOX = np.array([0.0, 0.0, 0.15])


def offline_ik(model, data, body: int, pos_d: np.ndarray, quat_d: np.ndarray) -> np.ndarray:
    """Joint angles (7,) that put body ``body`` at pos_d with orientation quat_d, by fancy_gym's iteration (the
    reset must reproduce its arm pose, which depends on the path, as it stops at a tolerance).

    From q = data.qpos[:7], with e = [clip(pos_d - x, +-0.1), clip(quaternion_error, +-0.5)] and the squared error
    n = ||clip(pos_d - x)||^2 + ||quat - quat_d||^2 (quat sign-aligned with quat_d): a step q <- clip(q + h q'_d,
    Q_MIN, Q_MAX) is kept if n did not grow (then h <- 1.025 h) and undone otherwise (h <- 0.7 h, h_0 = 1e-3 s);
    after each kept step q'_d = J^T (J J^T + 1e-6 I)^-1 (K e - J q'_0) + q'_0, J the body's 6 x 7 Jacobian,
    q'_0 = K_0 (q_null - q) plus K_limit (limit -+ margin - q) on joints within 0.1 rad of a limit. Stops when
    n < 1e-5 or after 1000 kept steps; ``data.qpos[:7]`` is left at the result, its kinematics computed.
    """
    import mujoco

    # the loop's arithmetic is fancy_gym's, operation for operation (np.clip as maximum then minimum, norms as the
    # square root of a dot product, as numpy computes them); what does not change between iterations is made once
    forward, forward_from_acceleration, jac_body = mujoco.mj_forward, mujoco.mj_forwardSkip, mujoco.mj_jacBody
    cross_d = cross_matrix(quat_d[1:])
    xpos, xquat = data.xpos[body], data.xquat[body]  # views of the simulator's arrays, updated by each forward pass
    q, qd_d, h, previous, kept = data.qpos[:7].copy(), np.zeros(7), 1e-3, np.inf, 0
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    while True:
        q_prev = q
        q = np.minimum(np.maximum(q + h * qd_d, Q_MIN), Q_MAX)
        data.qpos[:7] = q
        forward(model, data)
        pos_err = np.minimum(np.maximum(pos_d - xpos, -0.1), 0.1)
        quat = xquat.copy()
        minus, plus = quat - quat_d, quat + quat_d
        if math.sqrt(minus.dot(minus)) > math.sqrt(plus.dot(plus)):
            quat = -quat
        rot_err = quaternion_error(quat, quat_d, cross_d)
        err = np.concatenate([pos_err, np.minimum(np.maximum(rot_err, -0.5), 0.5)])
        norm = np.sum(pos_err**2) + np.sum((quat - quat_d) ** 2)
        if norm > previous:
            q, h = q_prev, 0.7 * h
            continue
        h *= 1.025
        if norm < IK_TOL or kept > IK_MAX_ITER:
            return q
        previous = norm
        # fancy_gym runs mj_forward again here on the same state. Its kinematics and contacts come out the same, but
        # each pass leaves the constraint solver's warm start to the next one, so the reset (and every step after
        # it) matches fancy_gym's to rounding only with the solve repeated; the repeat skips the position and
        # velocity stages (a seventh of a pass's time), which recompute the same values from the same qpos and qvel
        forward_from_acceleration(model, data, mujoco.mjtStage.mjSTAGE_VEL, 0)
        jac_body(model, data, jacp, jacr, body)
        jac = np.concatenate([jacp[:, :7], jacr[:, :7]])
        null = IK_NULL_GAIN * (IK_NULL_POSTURE - q)
        high, low = q > Q_MAX - IK_LIMIT_MARGIN, q < Q_MIN + IK_LIMIT_MARGIN
        if high.any():
            null[high] += IK_LIMIT_GAIN * (Q_MAX - IK_LIMIT_MARGIN - q)[high]
        if low.any():
            null[low] += IK_LIMIT_GAIN * (Q_MIN + IK_LIMIT_MARGIN - q)[low]
        # J W J^T and W J^T with fancy_gym's weight W = I written out: the products then round as fancy_gym's do
        # (a transposed view and a copy sum in different orders)
        task = np.linalg.solve((jac @ _EYE7) @ jac.T + _DAMPING_6, IK_GAIN * err - jac @ null)
        qd_d = (_EYE7 @ jac.T) @ task + null
        kept += 1


_EYE7, _DAMPING_6 = np.eye(7), IK_DAMPING * np.eye(6)


# ---------------------------------------------------------------------------------------------- the simulator


class BoxPushingSim:
    """One box-pushing simulator: ``reset(seed)`` -> observation (28,); ``step(a)`` -> (observation, StepState).

    ``random_init``: the box starts at a random pose (the TCE paper's task) or at FIXED_BOX. ``model``: an MjModel
    of :func:`load_model` (its goal bodies are moved at every reset, so each simulator needs its own).
    """

    # the free camera a video takes (troll.tce.render): from the far side of the table, 60 degrees down at the
    # near side of the area box and goal are drawn from, close enough that the 10 cm box is about 25 pixels of 320 wide
    VIEW = ((0.4, 0.0, 0.0), 1.4, -60.0, 180.0)

    def __init__(self, random_init: bool = True, model=None):
        import mujoco

        self.random_init = random_init
        self.model = load_model() if model is None else model
        self.data = mujoco.MjData(self.model)
        body = lambda name: mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, name)  # noqa: E731
        self.box, self.goal = body("box_0"), body("replan_target_pos")
        self.rod, self.tcp = body("push_rod"), body("tcp")
        self.goal_bodies = (body("target_pos"), self.goal)
        self.rod_tip = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, "rod_tip")
        self.box_qpos = int(self.model.jnt_qposadr[mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT,
                                                                       "box_joint")])  # fmt: skip
        self.t, self.energy = 0, 0.0
        self.saved: tuple | None = None

    def observation(self) -> np.ndarray:
        d = self.data
        return np.concatenate([d.qpos[:7], d.qvel[:7], d.xpos[self.box], d.xquat[self.box], d.xpos[self.goal],
                               d.xquat[self.goal]])  # fmt: skip

    def draw(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Box and goal poses (7,) each of episode ``seed``."""
        rng = np.random.default_rng(seed)
        box = sample_pose(rng) if self.random_init else FIXED_BOX.copy()
        goal = sample_pose(rng)
        while np.linalg.norm(goal[:2] - box[:2]) < MIN_GOAL_DISTANCE:
            goal = sample_pose(rng)
        return box, goal

    def reset(self, seed: int) -> np.ndarray:
        """Start the episode of ``seed`` (module docstring); its first observation."""
        import mujoco

        box, goal = self.draw(seed)
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        d.qpos[:], d.qvel[:] = INIT_QPOS, 0.0
        mujoco.mj_forward(m, d)
        d.qpos[self.box_qpos : self.box_qpos + 7] = box
        self.place_goal(goal)
        d.qpos[:7] = offline_ik(m, d, self.tcp, box[:3] + TOOL_ABOVE_BOX, TOOL_QUAT)
        # what the last forward pass reads: a copy restores this start exactly (box_pushing.BoxPushingTask)
        self.saved = (d.qpos.copy(), d.qvel.copy(), d.qacc_warmstart.copy(), goal)
        mujoco.mj_forward(m, d)
        self.t, self.energy = 0, 0.0
        return self.observation()

    def place_goal(self, goal: np.ndarray) -> None:
        """Move the goal marker bodies (fancy_gym's target_pos and replan_target_pos) to the pose goal (7,)."""
        for b in self.goal_bodies:
            self.model.body_pos[b], self.model.body_quat[b] = goal[:3], goal[3:]

    def step(self, action: np.ndarray) -> tuple[np.ndarray, StepState]:
        """Apply 10 clip(a, -1, 1) plus the bias forces (clipped to TORQUE_MAX) for 10 substeps."""
        import mujoco

        d = self.data
        command = ACTION_SCALE * np.minimum(np.maximum(action, -1.0), 1.0)  # np.clip's values, without its overhead
        d.ctrl[:] = np.minimum(np.maximum(command + d.qfrc_bias[:7], -TORQUE_MAX), TORQUE_MAX)
        mujoco.mj_step(self.model, d, nstep=FRAME_SKIP)
        self.t += 1
        self.energy += float((command * command).sum())
        state = StepState(box_pos=d.xpos[self.box].copy(), box_quat=d.xquat[self.box].copy(),
                          goal_pos=d.xpos[self.goal].copy(), goal_quat=d.xquat[self.goal].copy(),
                          rod_tip=d.site_xpos[self.rod_tip].copy(), rod_quat=d.xquat[self.rod].copy(),
                          qpos=d.qpos[:7].copy(), qvel=d.qvel[:7].copy(), action=command)  # fmt: skip
        return self.observation(), state
