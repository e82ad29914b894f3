"""The episodic environment interface: reset E episodes with a context, run one desired trajectory each.

An episodic policy picks the parameters of a movement primitive once per episode, from the episode's context; the
primitive gives a desired trajectory for the whole episode, and the environment's own tracking controller follows
it. So an environment here is not stepped by the agent: ``reset`` starts E episodes and ``run`` plays all T steps
of all E episodes from their desired trajectories and returns every step's state, reward and done (TCE's critic
scores segments of them). Shapes: E episodes, T env steps, D tracked coordinates, C context entries, S state
entries. All tensors returned are float32 (bool for dones and success) on the CPU.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


class NonFiniteError(ValueError):
    """An environment produced a NaN or an infinity in an observation or a reward."""


@dataclass
class EpisodeStart:
    """What ``reset`` returns for E new episodes.

    context: (E, C) what the policy conditions on: the initial observation, or its task-dependent part (each env
             documents which), without anything the tracking wrapper appends.
    pos:     (E, D) initial position of the tracked coordinates (joint angles, or end-effector xyz (+ gripper)).
    vel:     (E, D) initial velocity of the same.
    """

    context: Tensor
    pos: Tensor
    vel: Tensor


@dataclass
class Episodes:
    """What ``run`` returns: every step of E episodes of T steps.

    states:  (E, T+1, S) the observation at every step, the first (after reset) and the last included; the agent
             appends time itself.
    rewards: (E, T) reward of step t, i.e. of the transition states[:, t] -> states[:, t+1].
    dones:   (E, T) bool, a true termination at step t. The time limit at T is a truncation, not a done. None of
             the environments here terminates early; one that does pads the steps after its termination (the
             terminal state repeated, reward 0, done True).
    success: (E,) bool at the end of the episode, or None for a task without a success rule.
    final:   name -> (E,) task metrics at the end of the episode, e.g. "distance", "return".
    """

    states: Tensor
    rewards: Tensor
    dones: Tensor
    success: Tensor | None
    final: dict[str, Tensor]


class EpisodicEnv(abc.ABC):
    """E episodes at a time: ``reset(seed)`` starts them, ``run(pos, vel)`` tracks one desired trajectory each.

    Attributes every environment sets: name, dof (D), horizon (T env steps), dt (seconds per env step),
    context_dim (C), state_dim (S), num_episodes (E). The desired trajectory passed to ``run`` is sampled at
    t_k = k * dt, k = 0..T. Use as a context manager, or call ``close`` (worker processes stop with it).
    """

    name: str
    dof: int
    horizon: int
    dt: float
    context_dim: int
    state_dim: int
    num_episodes: int

    @abc.abstractmethod
    def reset(self, seed: int) -> EpisodeStart:
        """Start E new episodes, drawing their task variations (goals, via-points, ...) deterministically from
        ``seed``."""

    @abc.abstractmethod
    def run(self, pos: Tensor, vel: Tensor) -> Episodes:
        """Track the desired positions and velocities (E, T+1, D) in the E episodes started by the last reset."""

    def close(self) -> None:  # noqa: B027 -- optional: only envs that hold processes or files override it
        """Release what the environment holds (worker processes); a no-op by default."""

    def __enter__(self) -> EpisodicEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, num_episodes={self.num_episodes}, dof={self.dof}, "
            f"horizon={self.horizon}, dt={self.dt}, context_dim={self.context_dim}, state_dim={self.state_dim})"
        )

    def check_trajectory(self, pos: Tensor, vel: Tensor) -> None:
        """Raise a ValueError unless pos and vel are finite (E, T+1, D) tensors for this env."""
        want = (self.num_episodes, self.horizon + 1, self.dof)
        for label, x in (("pos", pos), ("vel", vel)):
            if not isinstance(x, Tensor):
                raise TypeError(f"{self.name}: run() takes torch tensors, got {type(x).__name__} for {label}")
            if tuple(x.shape) != want:
                raise ValueError(
                    f"{self.name}: the desired {label} must have shape (E, T+1, D) = {want} (positions at t_k = k * "
                    f"dt for k = 0..T), got {tuple(x.shape)}"
                )
            if not torch.isfinite(x).all():
                e, k, d = (int(i) for i in (~torch.isfinite(x)).nonzero()[0])
                raise ValueError(
                    f"{self.name}: the desired {label} is not finite (episode {e}, time index {k}, dof {d})"
                )


def episode_seeds(seed: int, num_episodes: int) -> list[int]:
    """One independent 32-bit seed per episode, a function of (seed, episode index) alone, so that how episodes
    are split over worker processes never changes what an episode draws."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"reset() takes an integer seed, got {seed!r}")
    return [int(np.random.SeedSequence([int(seed) % 2**63, i]).generate_state(1)[0]) for i in range(num_episodes)]


def check_finite(env: str, episode: int, step: int, **values) -> None:
    """Raise NonFiniteError naming the env, episode, step and quantity if any of ``values`` is not finite.

    ``values`` are scalars or numpy arrays, e.g. ``observation=obs, reward=r``; step 0 is the reset observation
    and step t + 1 what step t returned.
    """
    for label, value in values.items():
        arr = np.asarray(value, dtype=np.float64)
        if not np.isfinite(arr).all():
            bad = np.flatnonzero(~np.isfinite(arr.reshape(-1)))
            where = f" at entries {bad[:8].tolist()}: {arr.reshape(-1)[bad[:8]].tolist()}" if arr.ndim else f": {arr}"
            raise NonFiniteError(f"{env}: non-finite {label} at step {step} of episode {episode}{where}")


def check_episodes_finite(env: str, states: Tensor, rewards: Tensor) -> None:
    """Batched form of check_finite for (E, T+1, S) states and (E, T) rewards; reports the first bad episode and
    its first bad step."""
    for label, x, offset in (("observation", states, 0), ("reward", rewards, 1)):
        bad = ~torch.isfinite(x.reshape(x.shape[0], x.shape[1], -1)).all(-1)
        if bad.any():
            e, k = (int(i) for i in bad.nonzero()[0])
            # a reward of step k arrives with the observation of step k + 1: name the step the same way
            check_finite(env, e, k + offset, **{label: x[e, k].numpy()})
