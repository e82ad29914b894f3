"""Record fancy_gym 0.3.0's sparse hopper jump once, into tests/episodic/envs/data/hopper_jump_golden.npz, for
tests/episodic/envs/test_hopper_jump.py to compare with.

Run in a scratch environment with fancy_gym's own pins (it pins mujoco 2.3.3 and needs gymnasium < 1, so it cannot
share troll's environment):

    python3 -m venv /tmp/fancy && /tmp/fancy/bin/pip install torch fancy-gym==0.3.0 mujoco==2.3.3 \
        gymnasium==0.29.1 "numpy<2"
    /tmp/fancy/bin/python tests/support/record_hopper_jump.py tests/episodic/envs/data/hopper_jump_golden.npz

What it records (float64 unless noted):
- reset_obs (10, 16): ``fancy/HopperJumpSparse-v0``'s reset observation for seeds 0..9.
- steps: for the seeds ``step_seeds`` and fixed action sequences ``step_actions`` (K, 250, 3) (zeros, uniform in
  [-1, 1], uniform in [-1, 1] scaled by 0.6 with a push phase), the observations ``step_obs`` (K, 251, 16), rewards
  ``step_rewards`` (K, 250) and the info entries height, max_height, goal_dist, contact_dist, healthy_reward
  (``step_info_<key>`` (K, 250)) and x_pos (``step_info_x_pos`` (K, 250, 3)).
- tracking: ``fancy_ProDMP/HopperJumpSparse-v0`` (fancy_gym's ProDMP over the PD controller p = 1, d = 0.1) for
  the seeds ``track_seeds`` and ProDMP parameters drawn from N(0, 1): its desired positions and velocities
  ``track_pos``, ``track_vel`` (K, 250, 3) (sample k at time (k + 1) dt), the clipped actions ``track_actions``
  (K, 250, 3), observations ``track_obs`` (K, 250, 16) after each step, and rewards ``track_rewards`` (K, 250).
- a jump: from the seed ``jump_seed``, a PD controller (p = 1, d = 0.1, as above) tracking three phases of constant
  joint targets ``jump_pos`` (251, 3) (sample k at time k dt; zero desired velocity) sends the clipped actions
  ``jump_actions`` (250, 3): the foot touches down from the drop and stays down until the hopper takes off, the torso
  climbs above its 1.5 m start, and the foot first lands after the peak. Those actions replayed from the same reset
  give the observations ``jump_obs`` (251, 16), rewards ``jump_rewards`` (250) and every info entry
  (``jump_info_<key>`` (250, ...), healthy as 0 or 1).
"""

from __future__ import annotations

import sys

import fancy_gym  # noqa: F401 -- registers fancy/* and fancy_ProDMP/*
import gymnasium as gym
import mujoco
import numpy as np

INFO_KEYS = ("height", "max_height", "goal_dist", "contact_dist", "healthy_reward")
ALL_INFO_KEYS = ("height", "x_pos", "max_height", "goal", "goal_dist", "height_rew", "healthy_reward", "healthy",
                 "contact_dist")  # fmt: skip
STEP_SEEDS = (0, 1, 2)
TRACK_SEEDS = (3, 4, 5)
JUMP_SEED = 0
# joint targets (thigh, leg, foot) before sample 15, before sample 40, then to the end: a cross-entropy search over
# three phases of constant targets in troll's rebuild of the env (the highest peak whose first landing follows it),
# rounded to 0.01
JUMP_SWITCHES = (15, 40)
JUMP_TARGETS = ((2.4, 5.07, 2.37), (1.47, 0.19, 0.44), (-0.11, 1.72, -3.49))


def action_sequences() -> np.ndarray:
    rng = np.random.default_rng(2024)
    zeros = np.zeros((250, 3))
    uniform = rng.uniform(-1, 1, (250, 3))
    push = 0.6 * rng.uniform(-1, 1, (250, 3))
    push[60:90] = [-1.0, -1.0, 1.0]  # crouch, then extend: a hop that lands (under the start)
    push[90:110] = [1.0, 1.0, -1.0]
    return np.stack([zeros, uniform, push])


def replay(env, seed: int, actions: np.ndarray, keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, dict]:
    """From the reset of ``seed``, step ``actions``: the observations (T + 1, 16), rewards (T,) and the info entries
    ``keys`` (each (T, ...), float64 copies: x_pos is a view of MjData)."""
    obs, _ = env.reset(seed=seed)
    obs_seq, rew_seq, per = [obs], [], {k: [] for k in keys}
    for a in actions:
        obs, r, terminated, truncated, info = env.step(a)
        assert not terminated and not truncated
        obs_seq.append(obs)
        rew_seq.append(r)
        for k in keys:
            per[k].append(np.array(info[k], dtype=np.float64))
    return np.array(obs_seq), np.array(rew_seq), {k: np.array(v) for k, v in per.items()}


def record_steps(actions: np.ndarray) -> dict:
    env = gym.make("fancy/HopperJumpSparse-v0").unwrapped
    keys = (*INFO_KEYS, "x_pos")
    runs = [replay(env, seed, seq, keys) for seed, seq in zip(STEP_SEEDS, actions)]
    out = {"step_seeds": np.array(STEP_SEEDS), "step_actions": actions, "step_obs": np.array([r[0] for r in runs]),
           "step_rewards": np.array([r[1] for r in runs])}  # fmt: skip
    out.update({f"step_info_{k}": np.array([r[2][k] for r in runs]) for k in keys})
    return out


def jump_targets() -> np.ndarray:
    """The desired joint positions (251, 3): sample k is the target at time k dt."""
    pos = np.empty((251, 3))
    (s1, s2), (a, b, c) = JUMP_SWITCHES, JUMP_TARGETS
    pos[:s1], pos[s1:s2], pos[s2:] = a, b, c
    return pos


def jump_actions(env, pos: np.ndarray) -> np.ndarray:
    """The clipped actions of the PD controller p = 1, d = 0.1 tracking ``pos`` with zero desired velocity, step t
    tracking sample t + 1 (fancy_gym's black-box wrapper), from the reset of ``JUMP_SEED``."""
    env.reset(seed=JUMP_SEED)
    actions = []
    for target in pos[1:]:
        a = np.clip(1.0 * (target - env.data.qpos[3:6]) + 0.1 * (0.0 - env.data.qvel[3:6]), -1.0, 1.0)
        env.step(a)
        actions.append(a)
    return np.array(actions)


def record_jump() -> dict:
    """The PD controller's actions on :func:`jump_targets`, replayed: observations, rewards, every info entry."""
    env = gym.make("fancy/HopperJumpSparse-v0").unwrapped
    pos = jump_targets()
    actions = jump_actions(env, pos)
    obs, rewards, info = replay(env, JUMP_SEED, actions, ALL_INFO_KEYS)
    assert info["max_height"][-1] > 1.5 and info["contact_dist"][-1] > 0, "no jump above the start with a landing"
    out = {"jump_seed": np.array(JUMP_SEED), "jump_pos": pos, "jump_actions": actions, "jump_obs": obs,
           "jump_rewards": rewards}  # fmt: skip
    out.update({f"jump_info_{k}": v for k, v in info.items()})
    return out


def record_tracking() -> dict:
    env = gym.make("fancy_ProDMP/HopperJumpSparse-v0", mp_config_override={"black_box_kwargs": {"verbose": 2}})
    rng = np.random.default_rng(7)
    keys = ("positions", "velocities", "step_actions", "step_observations", "step_rewards")
    rows = {k: [] for k in keys}
    params = []
    for seed in TRACK_SEEDS:
        env.reset(seed=seed)
        theta = rng.normal(size=env.action_space.shape)
        params.append(theta)
        _, _, _, _, info = env.step(theta)
        assert info["trajectory_length"] == 250
        for k in keys:
            rows[k].append(np.asarray(info[k], dtype=np.float64))
    names = ("track_pos", "track_vel", "track_actions", "track_obs", "track_rewards")
    out = {name: np.array(rows[k]) for name, k in zip(names, keys)}
    return {"track_seeds": np.array(TRACK_SEEDS), "track_params": np.array(params), **out}


def main(path: str) -> None:
    env = gym.make("fancy/HopperJumpSparse-v0").unwrapped
    reset_obs = np.array([env.reset(seed=s)[0] for s in range(10)])
    data = {"reset_obs": reset_obs, **record_steps(action_sequences()), **record_tracking(), **record_jump()}
    data["versions"] = np.array([f"fancy_gym 0.3.0, mujoco {mujoco.__version__}, gymnasium {gym.__version__}"])
    np.savez_compressed(path, **data)
    for k, v in data.items():
        print(k, v.shape)


if __name__ == "__main__":
    main(sys.argv[1])
