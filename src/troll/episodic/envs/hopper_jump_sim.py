"""fancy_gym 0.3.0's sparse hopper jump as a subclass of gymnasium's Hopper-v5, and its episode runner.

Imported only where the simulator runs (worker processes, the renderer): it imports gymnasium and mujoco. The
task, its reward terms and the controller are described in hopper_jump.py, whose pure functions this applies.
"""

from __future__ import annotations

import mujoco
import numpy as np
from gymnasium.envs.mujoco.hopper_v5 import HopperEnv
from gymnasium.spaces import Box

from troll.episodic.envs import hopper_jump as hj
from troll.episodic.envs.base import check_finite
from troll.episodic.envs.workers import EpisodeResult, RunnerSpec


class HopperJumpEnv(HopperEnv):
    """Hopper-v5 on fancy_gym's hopper-jump model: the start, observation and sparse reward of
    ``fancy/HopperJumpSparse-v0`` (hopper_jump.py). ``step`` returns fancy_gym's info keys height, x_pos,
    max_height, goal, goal_dist, height_rew, healthy_reward, healthy, contact_dist."""

    def __init__(self, **kwargs):
        super().__init__(xml_file=str(hj.model_path()), frame_skip=4, healthy_reward=hj.HEALTHY_REWARD,
                         terminate_when_unhealthy=False, healthy_z_range=(hj.HEALTHY_Z, float("inf")),
                         healthy_angle_range=(-float("inf"), float("inf")),
                         exclude_current_positions_from_observation=False, **kwargs)  # fmt: skip
        self.observation_space = Box(-np.inf, np.inf, (hj.STATE_DIM,), np.float64)
        self.init_qpos[1] = hj.START_Z
        self.foot, self.torso = self.data.site("foot_site"), self.data.body("torso")
        self.goal_body = self.model.body("goal_site_body")
        self.floor = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, "floor")
        self.foot_geom = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, "foot_geom")
        self.goal_x = 0.0
        self._new_episode()

    def _new_episode(self) -> None:
        self.steps, self.max_height = 0, 0.0
        self.phase = hj.ContactPhase()
        self.landing_dist: float | None = None

    def foot_floor_contact(self) -> bool:
        """Whether a contact of this step pairs the floor with the foot (a Python list test: 1 us, where numpy's
        comparisons of the (ncon, 2) array cost 20)."""
        n = self.data.ncon
        if n == 0:
            return False
        pairs = self.data.contact.geom[:n].tolist()
        return [self.floor, self.foot_geom] in pairs or [self.foot_geom, self.floor] in pairs

    def _get_obs(self) -> np.ndarray:
        return hj.observation(self.data.qpos, self.data.qvel, self.foot.xpos, self.goal_x)

    def reset_model(self) -> np.ndarray:
        rng = self.np_random
        self.goal_x = float(rng.uniform(*hj.GOAL_RANGE, 1)[0])
        self.goal_body.pos[:] = (self.goal_x, 0.0, 0.0)
        qpos = self.init_qpos + rng.uniform(hj.JOINT_NOISE_LOW, hj.JOINT_NOISE_HIGH, size=self.model.nq)
        self.set_state(qpos, self.init_qvel)
        self._new_episode()
        return self._get_obs()

    def step(self, action):
        self.steps += 1
        self.do_simulation(action, self.frame_skip)
        height = float(self.torso.xpos[2])  # gymnasium's get_body_com: data.xpos, from before the last substep
        self.max_height = max(self.max_height, height)
        contact = False if self.phase.landed else self.foot_floor_contact()
        goal_dist = float(np.linalg.norm(self.foot.xpos - (self.goal_x, 0.0, 0.0)))
        if self.phase.update(contact):
            self.landing_dist = goal_dist
        healthy = hj.is_healthy(self.data.qpos, self.data.qvel)
        reward = -float(hj.control_cost(action))
        if self.steps >= hj.HORIZON:
            reward += hj.final_reward(self.max_height, goal_dist, self.landing_dist, healthy)
        info = {"height": height, "x_pos": self.foot.xpos.copy(), "max_height": self.max_height,
                "goal": np.array([self.goal_x]), "goal_dist": goal_dist, "height_rew": self.max_height,
                "healthy_reward": hj.HEALTHY_REWARD * healthy, "healthy": healthy,
                "contact_dist": self.landing_dist or 0.0}  # fmt: skip
        return self._get_obs(), reward, False, False, info


class HopperJumpRunner:
    """One hopper-jump simulator in a worker. D = 3 (thigh, leg, foot angles), T = 250, dt = 0.008, S = 16,
    C = 4 ("varying") or 16 ("full"); no success rule.

    ``run`` is the fast path of :meth:`HopperJumpEnv.step` (the reference it is tested against, step for step):
    the loop only sets the PD command and steps MuJoCo, recording qpos, qvel, the torso and foot positions and
    the first landing; actions, rewards and observations are then computed for the whole episode at once. The
    command is left unclipped in ``data.ctrl``: MuJoCo clamps it to the actuators' ctrlrange [-1, 1], which is
    the clip of :func:`hopper_jump.pd_action`, and the control cost uses the clipped action. MuJoCo's
    mj_rnePostConstraint, which gymnasium's step adds, computes contact forces nothing here reads. ``step_hook``
    (None), when set, is called after every step (the renderer's frames).
    """

    def __init__(self, config: hj.HopperJumpConfig):
        self.config = config
        self.sim = HopperJumpEnv()
        self.context_index = hj.CONTEXT_INDEX[config.context]
        dt = float(self.sim.dt)
        if abs(dt - hj.DT) > 1e-12:
            raise RuntimeError(f"fancy/hopper-jump: the model's step is {dt} s, not {hj.DT} s: a changed model file")
        self.spec = RunnerSpec(config.name, 3, hj.HORIZON, dt, len(self.context_index), hj.STATE_DIM, False)
        self.step_hook = None

    def _start(self, episode: int, seed: int) -> np.ndarray:
        obs, _ = self.sim.reset(seed=seed)
        check_finite(self.spec.name, episode, 0, observation=obs)
        return obs

    def reset(self, episode: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs = self._start(episode, seed)
        data = self.sim.data
        return obs[self.context_index], data.qpos[3:6].copy(), data.qvel[3:6].copy()

    def run(self, episode: int, seed: int, pos: np.ndarray, vel: np.ndarray) -> EpisodeResult:
        sim, cfg, horizon = self.sim, self.config, self.spec.horizon
        first = self._start(episode, seed)
        model, data = sim.model, sim.data
        qpos, qvel, ctrl, xpos, site_xpos = data.qpos, data.qvel, data.ctrl, data.xpos, data.site_xpos
        torso, foot = sim.torso.id, sim.foot.id
        # kp q_d(t+1) + kd q'_d(t+1), then per step minus kp q_t + kd q'_t; MuJoCo clamps it to [-1, 1]
        target = cfg.kp * pos[1:] + cfg.kd * vel[1:]
        qs, qds = np.empty((horizon + 1, 6)), np.empty((horizon + 1, 6))
        feet, heights = np.empty((horizon, 3)), np.empty(horizon)
        qs[0], qds[0] = qpos, qvel
        phase, landing, hook, step = hj.ContactPhase(), -1, self.step_hook, mujoco.mj_step
        kp, kd, joints, rates = cfg.kp, cfg.kd, qpos[3:6], qvel[3:6]
        foot_xpos, torso_xpos = site_xpos[foot], xpos[torso]
        for t in range(horizon):
            ctrl[:] = target[t] - kp * joints - kd * rates
            step(model, data, 4)
            qs[t + 1], qds[t + 1], feet[t], heights[t] = qpos, qvel, foot_xpos, torso_xpos[2]
            if landing < 0 and phase.update(data.ncon > 0 and sim.foot_floor_contact()):
                landing = t
            if hook is not None:
                hook()
        return self._episode(episode, first, qs, qds, feet, heights, landing, pos, vel)

    def _episode(self, episode, first, qs, qds, feet, heights, landing, pos, vel) -> EpisodeResult:
        """Actions, rewards, observations and final metrics of a recorded episode (module docstring)."""
        horizon, goal = self.spec.horizon, np.array([self.sim.goal_x, 0.0, 0.0])
        actions = hj.pd_action(self.config, pos[1:], vel[1:], qs[:-1, 3:6], qds[:-1, 3:6])
        rewards = -hj.control_cost(actions)
        goal_dist = np.linalg.norm(feet - goal, axis=1)
        max_height = max(0.0, float(heights.max()))
        landing_dist = float(goal_dist[landing]) if landing >= 0 else None
        healthy = hj.is_healthy(qs[-1], qds[-1])
        rewards[-1] += hj.final_reward(max_height, float(goal_dist[-1]), landing_dist, healthy)
        states = np.empty((horizon + 1, hj.STATE_DIM))
        states[0] = first
        states[1:, :6], states[1:, 6:12] = qs[1:], np.clip(qds[1:], -10.0, 10.0)
        states[1:, 12:15], states[1:, 15] = feet - goal, goal[0]
        for label, values, offset in (("observation", states, 0), ("reward", rewards, 1)):
            bad = ~np.isfinite(values.reshape(len(values), -1)).all(1)
            if bad.any():  # the first bad step, named as the reference's per-step check names it
                check_finite(self.spec.name, episode, int(bad.argmax()) + offset, **{label: values[bad.argmax()]})
        final = {"max_height": max_height, "distance": float(goal_dist[-1]), "landing_distance": landing_dist or 0.0,
                 "healthy": float(healthy), "return": float(rewards.sum())}  # fmt: skip
        return EpisodeResult(states, rewards, np.zeros(horizon, bool), None, final)

    def close(self) -> None:
        self.sim.close()
