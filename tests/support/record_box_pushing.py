"""Record fancy_gym 0.3.0's box pushing as golden data for tests/episodic/envs/test_box_pushing.py.

fancy_gym 0.3.0 pins mujoco 2.3.3 and needs gymnasium < 1, so it runs in a scratch environment of its own, never in
troll's (the output, tests/episodic/envs/data/box_pushing_golden.npz, is what the tests read; this script remakes it):

    python3.11 -m venv /tmp/fancy-venv
    /tmp/fancy-venv/bin/pip install fancy-gym==0.3.0 mujoco==2.3.3 gymnasium==0.29.1 "numpy<2"
    /tmp/fancy-venv/bin/python tests/support/record_box_pushing.py

with torch's default threads (two on the machine that made the file): on one thread, fancy_gym's ProDMP rounds its
desired trajectory differently (1e-7), and the black-box episodes, chaotic, end elsewhere.

It records, on fancy_gym's ``fancy/BoxPushingRandomInit{Dense,TemporalSparse}-v0`` (the TCE paper's box pushing):

- ``reset_obs`` (10, 28): the reset observation of seeds 0-9;
- ``raw_*``: seeds 0 and 1 stepped with fixed torque commands (``raw_actions`` (2, 100, 7): sines of amplitude 0.1,
  and zeros, the arm held by gravity compensation alone):
  observations (2, 101, 28), rewards of the dense and the sparse variant (2, 100) and the last step's infos;
- ``bb_*``: seeds 2 and 3 through fancy_gym's black-box ProDMP wrapper (``fancy_ProDMP/...``) with fixed parameters:
  the desired positions and velocities it tracked (2, 100, 7; entry t is the target of step t, at time (t + 1) dt),
  the observations after each step (2, 100, 28), the step rewards of both variants and the last infos;
- ``push_*``: seeds 4 and 9 pushed to the goal by :func:`scripted_push` (closed loop, on fancy_gym's own state;
  both end about 2 cm from the goal, seed 4 turned 3.0 rad from it, a failure, seed 9 0.3 rad, a success): its
  torque commands (2, 100, 7), the observations (2, 101, 28), the rewards of both variants (2, 100), every step's
  ``is_success`` (2, 100; fancy_gym sets it at the last step only) and the last step's infos (the distances and
  the energy, which fancy_gym fills at the last step only). The commands are replayed open loop, and a contact can
  part the two simulators: with seed 11, the first success after 9, the box pose is 7e-4 apart after step 20 on
  mujoco 3.3.0 and the replay loses the success (set ``PUSH_SEEDS`` to (4, 11) and rerun the tests to see it);
- ``context_mask`` (28,): the observation entries fancy_gym's ProDMP wrapper passes to the policy (random starts).

The dense and the sparse variants share their physics: the script checks that their observations are identical.
The inputs (actions, desired trajectories) are stored as float64: contacts make the runs sensitive to 1e-8
changes of them. The observations are stored as float32 (1e-7 relative, far under the tests' tolerances).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

VARIANTS = {"dense": "BoxPushingRandomInitDense-v0", "sparse": "BoxPushingRandomInitTemporalSparse-v0"}
INFO_KEYS = ("box_goal_pos_dist", "box_goal_rot_dist", "episode_energy", "is_success")
RAW_SEEDS, RAW_AMPLITUDES, BB_SEEDS, PUSH_SEEDS = (0, 1), (0.1, 0.0), (2, 3), (4, 9)
OUT = Path(__file__).parents[1] / "episodic" / "envs" / "data" / "box_pushing_golden.npz"


def raw_actions(seed: int, amplitude: float) -> np.ndarray:
    """(100, 7) smooth commands: a sine per joint with a seeded phase and frequency. Small: larger torques throw the
    box about (0.4 lifts it by 4 cm), and such runs are chaotic, so that any simulator change decides them."""
    rng = np.random.default_rng(1000 + seed)
    t = np.arange(100)[:, None] * 0.02
    freq, phase = rng.uniform(0.3, 1.0, 7), rng.uniform(0, 2 * np.pi, 7)
    return amplitude * np.sin(2 * np.pi * freq * t + phase)


def record_raw(gym, variant: str, seed: int, actions: np.ndarray):
    env = gym.make("fancy/" + VARIANTS[variant]).unwrapped
    obs, _ = env.reset(seed=seed)
    states, rewards = [obs], []
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        states.append(obs)
        rewards.append(reward)
    last = [float(info[k]) for k in INFO_KEYS] + [float(terminated), float(truncated)]
    env.close()
    return np.array(states), np.array(rewards), np.array(last)


def orientation_error(current: np.ndarray, desired: np.ndarray) -> np.ndarray:
    """w_c v_d - w_d v_c - v_d x v_c of unit quaternions (w, x, y, z): about half the rotation vector from
    ``current`` to ``desired`` (world frame) for small errors (Siciliano et al., Robotics, eq. 3.91)."""
    return current[0] * desired[1:] - desired[0] * current[1:] - np.cross(desired[1:], current[1:])


def scripted_push(mujoco, model, data, tip: int, rod: int, obs: np.ndarray, step) -> tuple[np.ndarray, list]:
    """Push the box to the goal by Jacobian-transpose control of the rod tip, whatever simulates it: ``model`` and
    ``data`` are the live MuJoCo state that ``step(action)`` advances; ``tip`` and ``rod`` the ids of the rod-tip
    site and the rod body; ``obs`` the reset observation (box at 14:16, goal at 21:23). The rod starts inside the
    box, whose walls it drags: the tip follows a smoothstep from the box to 3 cm past the goal (the wall gap the box
    lags by) in 70 steps at its first height, the rod held pointing down; torque = J_p^T f + J_r^T m - q' (divided by
    the env's action scale, 10). Returns the 100 actions (100, 7) and what ``step`` returned for each."""
    down = np.array([0.0, 1.0, 0.0, 0.0])
    box0, goal = obs[14:16].copy(), obs[21:23].copy()
    lead = 0.03 * (goal - box0) / np.linalg.norm(goal - box0)
    height = data.site_xpos[tip][2]
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    actions, outputs = [], []
    for t in range(100):
        s = min(1.0, t / 70)
        x_d = np.r_[box0 + (goal + lead - box0) * (3 * s**2 - 2 * s**3), height]
        mujoco.mj_jacSite(model, data, jacp, jacr, tip)
        jp, jr, qd = jacp[:, :7], jacr[:, :7], data.qvel[:7]
        force = 800.0 * (x_d - data.site_xpos[tip]) - 60.0 * (jp @ qd)
        quat = data.xquat[rod] * np.sign(data.xquat[rod] @ down)
        moment = 40.0 * orientation_error(quat, down) - 4.0 * (jr @ qd)
        actions.append((jp.T @ force + jr.T @ moment - qd) / 10.0)
        outputs.append(step(actions[-1]))
    return np.array(actions), outputs


def record_push(gym, mujoco, variant: str, seed: int, actions: np.ndarray | None):
    """One pushed episode: closed loop (``actions`` None), or replaying the given ``actions`` (the sparse variant
    replays the dense one's, so that both see the same torques)."""
    env = gym.make("fancy/" + VARIANTS[variant]).unwrapped
    obs, _ = env.reset(seed=seed)
    if actions is None:
        tip = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_SITE, "rod_tip")
        rod = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_BODY, "push_rod")
        actions, outputs = scripted_push(mujoco, env.model, env.data, tip, rod, obs, env.step)
    else:
        outputs = [env.step(a) for a in actions]
    env.close()
    states = np.array([obs] + [o[0] for o in outputs])
    rewards = np.array([o[1] for o in outputs])
    successes = np.array([float(o[4]["is_success"]) for o in outputs])
    info, terminated, truncated = outputs[-1][4], outputs[-1][2], outputs[-1][3]
    last = [float(info[k]) for k in INFO_KEYS] + [float(terminated), float(truncated)]
    return actions, states, rewards, successes, np.array(last)


def context_mask(gym) -> np.ndarray:
    """The ``context_mask`` of fancy_gym's wrapper around the randomly started box pushing."""
    wrapper = gym.make("fancy_ProDMP/" + VARIANTS["dense"])
    while not hasattr(type(wrapper), "context_mask"):
        wrapper = wrapper.env
    return np.asarray(wrapper.context_mask, dtype=bool)


def black_box(gym, variant: str):
    env = gym.make("fancy_ProDMP/" + VARIANTS[variant])
    wrapper = env
    while type(wrapper).__name__ != "BlackBoxWrapper":
        wrapper = wrapper.env
    wrapper.verbose = 2  # keeps the desired trajectory and every step's observation and reward in the infos
    return env


def record_bb(gym, variant: str, seed: int, params: np.ndarray):
    env = black_box(gym, variant)
    env.reset(seed=seed)
    _, _, terminated, truncated, info = env.step(params)
    last = [float(info[k][-1]) for k in INFO_KEYS] + [float(terminated), float(truncated)]
    env.close()
    out = (info["positions"], info["velocities"], info["step_observations"], info["step_rewards"])
    return (*(np.asarray(x) for x in out), np.array(last))


def main() -> None:
    warnings.filterwarnings("ignore")
    import fancy_gym  # noqa: F401 -- registers fancy/* and fancy_ProDMP/*
    import gymnasium as gym
    import mujoco

    data: dict[str, np.ndarray] = {
        "versions": np.array(
            [
                f"fancy_gym 0.3.0, mujoco {mujoco.__version__}, gymnasium {gym.__version__}, "
                f"numpy {np.__version__}, python {sys.version.split()[0]}"
            ]
        ),
    }
    resets = {}
    for variant in VARIANTS:
        env = gym.make("fancy/" + VARIANTS[variant]).unwrapped
        resets[variant] = np.array([env.reset(seed=s)[0] for s in range(10)])
        env.close()
    assert np.array_equal(resets["dense"], resets["sparse"])
    data["reset_obs"] = resets["dense"]

    actions = np.stack([raw_actions(s, a) for s, a in zip(RAW_SEEDS, RAW_AMPLITUDES)])
    raw = {v: [record_raw(gym, v, s, a) for s, a in zip(RAW_SEEDS, actions)] for v in VARIANTS}
    for (sd, *_), (ss, *_) in zip(raw["dense"], raw["sparse"]):
        assert np.array_equal(sd, ss)
    data["raw_actions"] = actions
    data["raw_obs"] = np.stack([r[0] for r in raw["dense"]]).astype(np.float32)
    for v in VARIANTS:
        data[f"raw_rewards_{v}"] = np.stack([r[1] for r in raw[v]])
        data[f"raw_last_{v}"] = np.stack([r[2] for r in raw[v]])

    params = np.random.default_rng(7).normal(0.0, 1.0, size=(len(BB_SEEDS), 42))
    bb = {v: [record_bb(gym, v, s, p) for s, p in zip(BB_SEEDS, params)] for v in VARIANTS}
    for rd, rs in zip(bb["dense"], bb["sparse"]):
        assert all(np.array_equal(x, y) for x, y in zip(rd[:3], rs[:3]))
    data["bb_params"] = params
    data["bb_pos"] = np.stack([r[0] for r in bb["dense"]])
    data["bb_vel"] = np.stack([r[1] for r in bb["dense"]])
    data["bb_obs"] = np.stack([r[2] for r in bb["dense"]]).astype(np.float32)
    for v in VARIANTS:
        data[f"bb_rewards_{v}"] = np.stack([r[3] for r in bb[v]])
        data[f"bb_last_{v}"] = np.stack([r[4] for r in bb[v]])
    push = {"dense": [record_push(gym, mujoco, "dense", s, None) for s in PUSH_SEEDS]}
    push["sparse"] = [record_push(gym, mujoco, "sparse", s, p[0]) for s, p in zip(PUSH_SEEDS, push["dense"])]
    for rd, rs in zip(push["dense"], push["sparse"]):
        assert np.array_equal(rd[1], rs[1])
    data["push_actions"] = np.stack([r[0] for r in push["dense"]])
    data["push_obs"] = np.stack([r[1] for r in push["dense"]]).astype(np.float32)
    for v in VARIANTS:
        data[f"push_rewards_{v}"] = np.stack([r[2] for r in push[v]])
        data[f"push_success_{v}"] = np.stack([r[3] for r in push[v]])
        data[f"push_last_{v}"] = np.stack([r[4] for r in push[v]])
    data["context_mask"] = context_mask(gym)
    np.savez_compressed(OUT, **data)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): {data['versions'][0]}")
    for v in VARIANTS:
        print(v, "raw returns", data[f"raw_rewards_{v}"].sum(1), "bb returns", data[f"bb_rewards_{v}"].sum(1))
        print(v, "pushed: final distances", data[f"push_last_{v}"][:, 0], "success", data[f"push_last_{v}"][:, 3])


if __name__ == "__main__":
    main()
