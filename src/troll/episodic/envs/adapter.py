"""``FromGymnasium``: a gymnasium env (MuJoCo or any other) as an episodic env, from three functions of yours.

An episodic env needs what a step-based one does not say by itself (docs/tce.md, "Your own environment"):

    context(env, obs)  -> (C,)  what the policy conditions on, read once at reset (a goal, an object's position);
    position(env, obs) -> (D,)  the coordinates the controller tracks (e.g. joint angles, env.unwrapped.data.qpos);
    velocity(env, obs) -> (D,)  their velocities;

and the control step (``dt``, seconds per env step: a MuJoCo env's ``env.unwrapped.dt``) and the horizon (T env
steps: the registered time limit). The adapter resets the env with one seed per episode (base.episode_seeds), and
plays each episode in this process by tracking the desired trajectory with a PD controller,

    a_t = clip(kp (q_d(t) - q_t) + kd (q'_d(t) - q'_t), low, high),

q and q' read before step t, [low, high] the env's action bounds; or with ``controller(pos_d, vel_d, pos, vel)``
of your own (the same arguments, (D,) arrays, returning the action). The states are the observations (flattened,
S entries); an episode that terminates early is padded as base.Episodes says (terminal state, reward 0, done).
Success is ``success(env, info)`` after the last step, when given.

    env = FromGymnasium(lambda: gym.make("Reacher-v5"), context=lambda env, obs: obs,
                        position=lambda env, obs: env.unwrapped.data.qpos[:2].copy(),
                        velocity=lambda env, obs: env.unwrapped.data.qvel[:2].copy(),
                        num_episodes=16, kp=8.0, kd=0.3)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from troll.episodic.envs.base import Episodes, EpisodeStart, EpisodicEnv, check_finite, episode_seeds

Reader = Callable[[object, np.ndarray], np.ndarray]


class FromGymnasium(EpisodicEnv):
    """E episodes of one gymnasium env, played one after another in this process (module docstring).

    make: builds the gymnasium env (called once); name: the env's name in messages and configs; horizon, dt:
    read from the env (its time limit, ``unwrapped.dt``) when not given; kp, kd: the PD gains, per unit of
    position and velocity; controller: replaces the PD rule; success: ``success(env, info) -> bool`` at the end.
    """

    def __init__(
        self,
        make: Callable[[], object],
        *,
        context: Reader,
        position: Reader,
        velocity: Reader,
        num_episodes: int,
        name: str = "user/gymnasium",
        horizon: int | None = None,
        dt: float | None = None,
        kp: float = 1.0,
        kd: float = 0.0,
        controller: Callable[..., np.ndarray] | None = None,
        success: Callable[[object, dict], bool] | None = None,
    ):
        if not isinstance(num_episodes, int) or num_episodes < 1:
            raise ValueError(f"{name}: num_episodes must be a positive integer, got {num_episodes!r}")
        self.env = make()
        self.name, self.num_episodes = name, num_episodes
        self._context, self._position, self._velocity = context, position, velocity
        self._controller, self._success = controller, success
        self.kp, self.kd = float(kp), float(kd)
        spec_steps = getattr(getattr(self.env, "spec", None), "max_episode_steps", None)
        self.horizon = int(horizon if horizon is not None else _required(spec_steps, "horizon", name))
        self.dt = float(dt if dt is not None else _required(getattr(self.env.unwrapped, "dt", None), "dt", name))
        space = self.env.action_space
        self._low, self._high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        start = self._start(0, 0)
        self.context_dim, self.dof = len(start[0]), len(start[1])
        self.state_dim = len(start[3])
        self._seeds: list[int] = []

    def _start(self, episode: int, seed: int):
        obs, _ = self.env.reset(seed=seed)
        obs = np.asarray(obs, np.float64).reshape(-1)
        check_finite(self.name, episode, 0, observation=obs)
        read = [np.asarray(f(self.env, obs), np.float64).reshape(-1) for f in (self._context, self._position,
                                                                                 self._velocity)]  # fmt: skip
        return (*read, obs)

    def reset(self, seed: int) -> EpisodeStart:
        self._seeds = episode_seeds(seed, self.num_episodes)
        starts = [self._start(i, s) for i, s in enumerate(self._seeds)]
        as_t = lambda k: torch.tensor(np.stack([s[k] for s in starts]), dtype=torch.float32)  # noqa: E731
        return EpisodeStart(context=as_t(0), pos=as_t(1), vel=as_t(2))

    def action(self, pos_d: np.ndarray, vel_d: np.ndarray, pos: np.ndarray, vel: np.ndarray) -> np.ndarray:
        """The action of one step: the PD rule (module docstring) or the ``controller`` given."""
        if self._controller is not None:
            return np.asarray(self._controller(pos_d, vel_d, pos, vel))
        return np.clip(self.kp * (pos_d - pos) + self.kd * (vel_d - vel), self._low, self._high)

    def run(self, pos: torch.Tensor, vel: torch.Tensor) -> Episodes:
        if not self._seeds:
            raise RuntimeError(f"{self.name}: call reset(seed) before run()")
        self.check_trajectory(pos, vel)
        pos_d, vel_d = pos.double().numpy(), vel.double().numpy()
        played = [self._play(i, seed, pos_d[i], vel_d[i]) for i, seed in enumerate(self._seeds)]
        states, rewards, dones, success = (np.stack([p[k] for p in played]) for k in range(4))
        as_t = lambda x: torch.from_numpy(x).float()  # noqa: E731
        return Episodes(
            states=as_t(states),
            rewards=as_t(rewards),
            dones=torch.from_numpy(dones),
            success=torch.from_numpy(success) if self._success is not None else None,
            final={"return": as_t(rewards.sum(1))},
        )

    def _play(self, episode: int, seed: int, pos_d: np.ndarray, vel_d: np.ndarray):
        """One episode: (states (T+1, S), rewards (T,), dones (T,), success ())."""
        states = np.empty((self.horizon + 1, self.state_dim))
        rewards, dones = np.zeros(self.horizon), np.zeros(self.horizon, dtype=bool)
        *_, obs = self._start(episode, seed)
        states[0], info = obs, {}
        for t in range(self.horizon):
            q, qd = (np.asarray(f(self.env, obs), np.float64).reshape(-1) for f in (self._position, self._velocity))
            obs, reward, terminated, _, info = self.env.step(self.action(pos_d[t], vel_d[t], q, qd))
            obs = np.asarray(obs, np.float64).reshape(-1)
            check_finite(self.name, episode, t + 1, observation=obs, reward=reward)
            states[t + 1], rewards[t] = obs, reward
            if terminated:  # pad: the terminal state repeated, reward 0, done from here on
                states[t + 2 :], dones[t:] = obs, True
                break
        success = bool(self._success(self.env, info)) if self._success is not None else False
        return states, rewards, dones, np.array(success)

    def close(self) -> None:
        self.env.close()


def _required(value, what: str, name: str):
    if value is None:
        raise ValueError(f"{name}: the gymnasium env does not say its {what}; pass {what}=... to FromGymnasium.")
    return value
