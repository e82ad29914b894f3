"""EnvPool's C++ simulators as episodic envs: the rule all EnvPool backends share (:class:`EnvPoolEnv`: a pool
per reset, its seeding, the batched rollout loop) and Meta-World on it, ``metaworld/<task>`` with
``backend="envpool"`` (the default). Reacher on EnvPool (``Reacher-v5``) is reacher.py's :class:`EnvPoolReacher`.

EnvPool steps E environments on its own threads, so one process drives all E episodes: no worker processes, and
the controller runs batched in numpy over E.

Seeding. EnvPool fixes each env's seed when the pool is built (``env_seed``; ``reset(seed=)`` is ignored) and
draws the env's initial state (Meta-World: the task variation, goal and object positions, uniform over the task's
random reset space; Reacher: joint angles, velocities and target) afresh at every reset from that env's own
generator. So ``reset(seed)`` builds a new pool whose env i has seed :func:`pool_seeds` ``(seed, E)[i]`` =
``episode_seeds(seed, E)[i] >> 1`` (EnvPool takes int32 seeds) and resets it once: episode i starts from the first
draw of a generator seeded from (seed, i) alone, whatever the thread count, the same at every evaluation, and the
same after a resume. A second ``run`` of one reset rebuilds the pool from the same seeds (and checks that it
resets to the same states).
Building the pool costs ~0.3-0.6 s per reset for E = 16 Meta-World tasks and ~0.03 s for 16 Reachers (under load)
on this machine (benchmarks/bench_envs.py; docs/tce.md, "Speed").

Meta-World (EnvPool 1.2's ``MetaWorld/<CamelCase>-v3``, Meta-World v3's 50 Sawyer tasks): we pass
``partially_observable=False`` (EnvPool hides the goal by default; MT1 shows it) and step exactly the 500 steps of
its time limit; the controller is control.py's. The Python backend (metaworld.py) instead picks, from the
episode's seed, one of the 50 variations that MT1 draws from the same space when the env is built. Both are draws
from one distribution, but not the same draws: the two backends agree in distribution
(tests/episodic/envs/test_equivalence.py), not episode by episode. Observation layout, reward,
``info["success"]`` and ``info["obj_to_target"]`` are Meta-World's (tested against the Python backend); the
context, controller options and final metrics are metaworld.py's.
"""

from __future__ import annotations

import abc

import numpy as np
import torch
from torch import Tensor

from troll.episodic.envs.base import Episodes, EpisodeStart, EpisodicEnv, check_episodes_finite, episode_seeds
from troll.episodic.envs.control import Controller
from troll.episodic.envs.metaworld import MetaWorldConfig, final_metrics, task_bounds, varying_entries

HORIZON, DT = 500, 0.0125  # Meta-World's max_path_length and frame_skip 5 x 0.0025 s


def task_id(task: str) -> str:
    """EnvPool's id of a Meta-World task: ``push-back-v3`` -> ``MetaWorld/PushBack-v3``."""
    name, version = task.rsplit("-", 1)
    return "MetaWorld/" + "".join(p[:1].upper() + p[1:] for p in name.split("-")) + f"-{version}"


def pool_seeds(seed: int, num_episodes: int) -> list[int]:
    """EnvPool's ``env_seed`` of each of E episodes: ``episode_seeds(seed, E)[i] >> 1`` (EnvPool takes int32
    seeds), a function of (seed, i) alone."""
    return [s >> 1 for s in episode_seeds(seed, num_episodes)]


class EnvPoolEnv(EpisodicEnv):
    """E episodes on ``threads`` EnvPool threads, a pool built per reset (module docstring).

    A subclass sets name, dof, horizon, dt, context_dim, state_dim and :attr:`INFO_KEYS` (the per-step info
    entries its results need), and supplies the pool (:meth:`_make`), the episodes' start (:meth:`_starts`), the
    controller (:meth:`_controller`) and the results (:meth:`_episodes`).
    """

    INFO_KEYS: tuple[str, ...] = ()

    def __init__(self, *, num_episodes: int, threads: int):
        self.num_episodes = num_episodes
        self.threads = max(1, min(int(threads), num_episodes))
        self._env = None
        self._seeds: list[int] | None = None
        self._start: np.ndarray | None = None
        self._fresh = False  # the pool is at its first reset, not stepped yet

    @abc.abstractmethod
    def _make(self, seeds: list[int]):
        """A gymnasium-API EnvPool env of len(seeds) envs, env i seeded ``seeds[i]``, on min(threads, E) threads."""

    @abc.abstractmethod
    def _starts(self, obs: np.ndarray) -> EpisodeStart:
        """The EpisodeStart of reset observations (E, S) float64."""

    @abc.abstractmethod
    def _controller(self, pos: np.ndarray, vel: np.ndarray, obs: np.ndarray):
        """``act(t, obs) -> (E, A)`` actions of step t, given the desired pos, vel (E, T+1, D) float64 and the reset
        observations (E, S); called once per run, then once per step with the observation at t."""

    @abc.abstractmethod
    def _episodes(self, states: np.ndarray, rewards: np.ndarray, info: dict[str, np.ndarray]) -> Episodes:
        """The Episodes of a run: states (E, T+1, S), rewards (E, T), info[key] (T, E) for each of INFO_KEYS."""

    def _reset_pool(self, seeds: list[int]) -> np.ndarray:
        self.close()
        self._env = self._make(seeds)
        obs, _ = self._env.reset()
        self._fresh = True
        return np.asarray(obs, dtype=np.float64)

    def reset(self, seed: int) -> EpisodeStart:
        """Start E episodes; episode i's initial state is drawn from (seed, i) alone (module docstring)."""
        seeds = pool_seeds(seed, self.num_episodes)
        obs = self._reset_pool(seeds)
        check_episodes_finite(self.name, torch.from_numpy(obs[:, None]), torch.zeros(len(obs), 1))
        self._seeds, self._start = seeds, obs
        return self._starts(obs)

    def run(self, pos: Tensor, vel: Tensor) -> Episodes:
        """Track pos, vel (E, T+1, D) in the episodes of the last reset (a second run rebuilds them from their
        seeds). Raises NonFiniteError at the first step with a NaN or an infinity, before the controller sees it."""
        if self._seeds is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before run()")
        self.check_trajectory(pos, vel)
        if not self._fresh:
            again = self._reset_pool(self._seeds)
            if not np.array_equal(again, self._start):
                raise RuntimeError(f"{self.name}: the episodes reset to different states in run() than in reset()")
        self._fresh = False
        as_np = lambda x: x.detach().cpu().double().numpy()  # noqa: E731
        act = self._controller(as_np(pos), as_np(vel), self._start)
        e, horizon = self.num_episodes, self.horizon
        states, rewards = np.empty((e, horizon + 1, self.state_dim)), np.empty((e, horizon))
        kept = {key: np.empty((horizon, e)) for key in self.INFO_KEYS}
        obs = states[:, 0] = self._start
        for t in range(horizon):
            obs, reward, _, _, info = self._env.step(act(t, obs))
            states[:, t + 1], rewards[:, t] = obs, reward
            for key in self.INFO_KEYS:
                kept[key][t] = info[key]
            if not (np.isfinite(obs).all() and np.isfinite(reward).all()):  # stop before a NaN reaches the controller
                check_episodes_finite(
                    self.name, torch.from_numpy(states[:, : t + 2]), torch.from_numpy(rewards[:, : t + 1])
                )
        if not np.array_equal(info["env_id"], np.arange(e)):
            raise RuntimeError(f"{self.name}: EnvPool returned the episodes out of order: {info['env_id']}")
        return self._episodes(states, rewards, kept)

    def close(self) -> None:
        """Close the current pool (a later reset builds a new one)."""
        if self._env is not None:
            self._env.close()
            self._env = None


class EnvPoolMetaWorld(EnvPoolEnv):
    """E episodes of one Meta-World task on ``threads`` EnvPool threads. D = 4 (or 3), T = 500, S = 39."""

    INFO_KEYS = ("success", "obj_to_target")

    def __init__(self, config: MetaWorldConfig, *, num_episodes: int, threads: int = 1):
        super().__init__(num_episodes=num_episodes, threads=threads)
        self.config = config
        self.name = f"metaworld/{config.task}"
        self.dof, self.horizon, self.dt, self.state_dim = config.control.dof, HORIZON, DT, 39
        # the context entries, as the Python backend finds them: from 10 variations
        probe = self._make(list(range(10**6, 10**6 + 10)))
        try:
            self.varying = varying_entries(probe.reset()[0])
        finally:
            probe.close()
        self.context_index = self.varying if config.context == "varying" else np.arange(39)
        self.context_dim = len(self.context_index)
        bounds = task_bounds(config.task) if config.controller == "mocap" else ()
        self.controller = Controller(config.control, *bounds)

    def _make(self, seeds: list[int]):
        import envpool

        return envpool.make_gymnasium(
            task_id(self.config.task), num_envs=len(seeds), env_seed=seeds, num_threads=min(self.threads, len(seeds)),
            partially_observable=False, max_episode_steps=HORIZON,
        )  # fmt: skip

    def _starts(self, obs: np.ndarray) -> EpisodeStart:
        pos, vel = self.controller.start(obs)
        as_t = lambda x: torch.from_numpy(x).float()  # noqa: E731
        return EpisodeStart(context=as_t(obs[:, self.context_index]), pos=as_t(pos), vel=as_t(vel))

    def _controller(self, pos: np.ndarray, vel: np.ndarray, obs: np.ndarray):
        self.controller.start(obs)
        return lambda t, obs: self.controller.action(pos[:, t + 1], obs).astype(np.float32)

    def _episodes(self, states: np.ndarray, rewards: np.ndarray, info: dict[str, np.ndarray]) -> Episodes:
        success = info["success"] > 0
        final = final_metrics(self.config.task, info["obj_to_target"][-1], success, rewards.T)
        return Episodes(
            states=torch.from_numpy(states).float(),
            rewards=torch.from_numpy(rewards).float(),
            dones=torch.zeros(rewards.shape, dtype=torch.bool),
            success=torch.from_numpy(success[-1].copy()),
            final={k: torch.from_numpy(np.asarray(v)).float() for k, v in final.items()},
        )
