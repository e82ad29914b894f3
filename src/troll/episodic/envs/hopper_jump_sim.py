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
        """Whether a contact of this step pairs the floor with the foot."""
        n = self.data.ncon
        if n == 0:
            return False
        pairs = self.data.contact.geom[:n]
        return bool(np.any(((pairs[:, 0] == self.floor) & (pairs[:, 1] == self.foot_geom))
                           | ((pairs[:, 0] == self.foot_geom) & (pairs[:, 1] == self.floor))))  # fmt: skip

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
    C = 4 ("varying") or 16 ("full"); no success rule."""

    def __init__(self, config: hj.HopperJumpConfig):
        self.config = config
        self.sim = HopperJumpEnv()
        self.context_index = hj.CONTEXT_INDEX[config.context]
        dt = float(self.sim.dt)
        if abs(dt - hj.DT) > 1e-12:
            raise RuntimeError(f"fancy/hopper-jump: the model's step is {dt} s, not {hj.DT} s: a changed model file")
        self.spec = RunnerSpec(config.name, 3, hj.HORIZON, dt, len(self.context_index), hj.STATE_DIM, False)

    def _start(self, episode: int, seed: int) -> np.ndarray:
        obs, _ = self.sim.reset(seed=seed)
        check_finite(self.spec.name, episode, 0, observation=obs)
        return obs

    def reset(self, episode: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs = self._start(episode, seed)
        data = self.sim.data
        return obs[self.context_index], data.qpos[3:6].copy(), data.qvel[3:6].copy()

    def run(self, episode: int, seed: int, pos: np.ndarray, vel: np.ndarray) -> EpisodeResult:
        name, horizon = self.spec.name, self.spec.horizon
        states, rewards = np.empty((horizon + 1, hj.STATE_DIM)), np.empty(horizon)
        states[0] = self._start(episode, seed)
        data, step = self.sim.data, self.sim.step
        for t in range(horizon):
            action = hj.pd_action(self.config, pos[t + 1], vel[t + 1], data.qpos[3:6], data.qvel[3:6])
            obs, reward, _, _, info = step(action)
            check_finite(name, episode, t + 1, observation=obs, reward=reward)
            states[t + 1], rewards[t] = obs, reward
        final = {"max_height": info["max_height"], "distance": info["goal_dist"],
                 "landing_distance": info["contact_dist"], "healthy": float(info["healthy"]),
                 "return": float(rewards.sum())}  # fmt: skip
        return EpisodeResult(states, rewards, np.zeros(horizon, bool), None, final)

    def close(self) -> None:
        self.sim.close()
