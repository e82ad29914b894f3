"""TCE on an environment of your own: a gymnasium env written here, made episodic, trained, saved and loaded.

The env is a point mass on a plane (a double integrator: the action is a force, clipped to [-1, 1] per axis) that
must end on a goal drawn at reset; reward -|x - goal| each step, success when the final distance is under 5 cm.
Three functions say what TCE needs of it (docs/tce.md, "Your own environment"): the context (the goal), and the
position and velocity a PD controller tracks along the desired trajectory TCE's policy draws once per episode.

    python examples/user_env.py                      # trains ~20 s, saves user_env.pt, evaluates it in a new process
    PYTHONPATH=examples troll tce train --env user_env:make_point_reach --steps 20000 --out runs/point

The second line is the command line on the same env: ``--env module:function`` names the factory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

from troll.episodic import TCE, FromGymnasium, register

HORIZON, DT = 50, 0.05  # steps of an episode, seconds per step


class PointReach(gym.Env):
    """obs = (x (2), x' (2), goal (2)); x'' = 4 a, a in [-1, 1]^2; the goal uniform in [-0.5, 0.5]^2."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float64)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.v = np.zeros(2), np.zeros(2)
        self.goal = self.np_random.uniform(-0.5, 0.5, 2)
        return self._obs(), {}

    def step(self, action):
        self.v = self.v + 4.0 * np.clip(action, -1.0, 1.0) * DT
        self.x = self.x + self.v * DT
        distance = float(np.linalg.norm(self.x - self.goal))
        return self._obs(), -distance, False, False, {"distance": distance}

    def _obs(self):
        return np.concatenate([self.x, self.v, self.goal])


def make_point_reach(num_episodes: int, seed: int = 0, **options) -> FromGymnasium:
    """The factory troll calls: ``num_episodes`` episodes a reset, PD gains from ``options`` (kp, kd)."""
    return FromGymnasium(
        PointReach,
        context=lambda env, obs: obs[4:6],
        position=lambda env, obs: obs[0:2],
        velocity=lambda env, obs: obs[2:4],
        num_episodes=num_episodes,
        name="mine/point-reach",
        horizon=HORIZON,
        dt=DT,
        kp=options.get("kp", 20.0),
        kd=options.get("kd", 2.0),
        success=lambda env, info: info["distance"] < 0.05,
    )


register("mine/point-reach", make_point_reach)  # TCE("mine/point-reach") and make_env find it in this process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40_000, help="env steps to train")
    parser.add_argument("--out", default="user_env.pt", help="the saved model")
    parser.add_argument("--evaluate", metavar="FILE", help="only load FILE and print its evaluation as JSON")
    args = parser.parse_args()
    if args.evaluate:
        print(json.dumps(TCE.load(args.evaluate).evaluate()))
        return
    model = TCE(
        "mine/point-reach",
        seed=0,
        preset="default",
        episodes=16,
        eval_episodes=16,
        num_segments=10,
        policy_hidden=(32, 32),
        critic_hidden=(32, 32),
        policy_epochs=20,
        critic_epochs=20,
        workers=0,
    )
    model.learn(args.steps, progress_bar=False)
    here = model.evaluate()
    model.save(args.out)
    loaded = subprocess.run(
        [sys.executable, __file__, "--evaluate", args.out], capture_output=True, text=True, check=True
    )  # a new process: the file alone holds the model
    there = json.loads(loaded.stdout)
    print(f"trained {model.iteration} iterations; evaluation here {json.dumps(here)}")
    print(f"loaded from {Path(args.out)} in a new process: {json.dumps(there)}")
    if there != here:
        raise SystemExit("the loaded model evaluates differently")
    print("same numbers")


if __name__ == "__main__":
    main()
