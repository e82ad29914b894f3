"""Record fancy_gym 0.3.0's box pushing as golden data for tests/episodic/envs/test_box_pushing.py.

fancy_gym 0.3.0 pins mujoco 2.3.3 and needs gymnasium < 1, so it runs in a scratch environment of its own, never in
troll's (the output, tests/episodic/envs/data/box_pushing_golden.npz, is what the tests read; this script remakes it):

    python3.11 -m venv /tmp/fancy-venv
    /tmp/fancy-venv/bin/pip install fancy-gym==0.3.0 mujoco==2.3.3 gymnasium==0.29.1 "numpy<2"
    /tmp/fancy-venv/bin/python tests/support/record_box_pushing.py

It records, on fancy_gym's ``fancy/BoxPushingRandomInit{Dense,TemporalSparse}-v0`` (the TCE paper's box pushing):

- ``reset_obs`` (10, 28): the reset observation of seeds 0-9;
- ``raw_*``: seeds 0 and 1 stepped with fixed torque commands (``raw_actions`` (2, 100, 7): sines of amplitude 0.1,
  and zeros, the arm held by gravity compensation alone):
  observations (2, 101, 28), rewards of the dense and the sparse variant (2, 100) and the last step's infos;
- ``bb_*``: seeds 2 and 3 through fancy_gym's black-box ProDMP wrapper (``fancy_ProDMP/...``) with fixed parameters:
  the desired positions and velocities it tracked (2, 100, 7; entry t is the target of step t, at time (t + 1) dt),
  the observations after each step (2, 100, 28), the step rewards of both variants and the last infos.

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
RAW_SEEDS, RAW_AMPLITUDES, BB_SEEDS = (0, 1), (0.1, 0.0), (2, 3)
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
    np.savez_compressed(OUT, **data)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): {data['versions'][0]}")
    for v in VARIANTS:
        print(v, "raw returns", data[f"raw_rewards_{v}"].sum(1), "bb returns", data[f"bb_rewards_{v}"].sum(1))


if __name__ == "__main__":
    main()
