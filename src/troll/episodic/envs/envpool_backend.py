"""Meta-World on EnvPool's C++ simulators: ``metaworld/<task>`` with ``backend="envpool"`` (the default).

EnvPool (envpool 1.2, ``MetaWorld/<CamelCase>-v3``) ports Meta-World v3's 50 Sawyer tasks to C++ and steps E of
them on its own threads, so one process drives all E episodes: no worker processes, and the controller
(control.py) runs batched in numpy over E. We pass ``partially_observable=False`` (EnvPool hides the goal by
default; MT1 shows it) and step exactly the 500 steps of its time limit.

Seeding and task variations. EnvPool fixes each env's seed when the pool is built (``env_seed``; ``reset(seed=)``
is ignored) and draws the env's task variation (goal and object positions, uniform over the task's random reset
space) afresh at every reset from that env's own generator. So ``reset(seed)`` builds a new pool whose env i has
seed ``episode_seeds(seed, E)[i] >> 1`` (EnvPool takes int32 seeds) and resets it once: episode i's variation is
the first draw of a generator seeded from (seed, i) alone, whatever the thread count, the same at every evaluation,
and the same after a resume.
The Python backend (metaworld.py) instead picks, from the episode's seed, one of the 50 variations that MT1 draws
from the same space when the env is built. Both are draws from one distribution, but not the same draws: the two
backends agree in distribution (tests/episodic/test_envpool_equivalence.py), not episode by episode.
Building the pool costs ~0.3-0.6 s per reset for E = 16 on this machine (benchmarks/bench_envs.py).

Observation layout, reward, ``info["success"]`` and ``info["obj_to_target"]`` are Meta-World's (tested against
the Python backend); the context, controller options and final metrics are metaworld.py's.
"""

from __future__ import annotations

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


class EnvPoolMetaWorld(EpisodicEnv):
    """E episodes of one Meta-World task on ``threads`` EnvPool threads. D = 4 (or 3), T = 500, S = 39."""

    def __init__(self, config: MetaWorldConfig, *, num_episodes: int, threads: int = 1):
        self.config = config
        self.name = f"metaworld/{config.task}"
        self.num_episodes = num_episodes
        self.threads = max(1, min(int(threads), num_episodes))
        self.dof, self.horizon, self.dt, self.state_dim = config.control.dof, HORIZON, DT, 39
        # the context entries, as the Python backend finds them: from 10 variations
        probe = self._pool(list(range(10**6, 10**6 + 10)))
        try:
            self.varying = varying_entries(probe.reset()[0])
        finally:
            probe.close()
        self.context_index = self.varying if config.context == "varying" else np.arange(39)
        self.context_dim = len(self.context_index)
        bounds = task_bounds(config.task) if config.controller == "mocap" else ()
        self.controller = Controller(config.control, *bounds)
        self._env = None
        self._seeds: list[int] | None = None
        self._start: np.ndarray | None = None
        self._fresh = False  # the pool is at its first reset, not stepped yet

    def _pool(self, seeds: list[int]):
        import envpool

        return envpool.make_gymnasium(
            task_id(self.config.task), num_envs=len(seeds), env_seed=seeds, num_threads=min(self.threads, len(seeds)),
            partially_observable=False, max_episode_steps=HORIZON,
        )  # fmt: skip

    def _reset_pool(self, seeds: list[int]) -> np.ndarray:
        self.close()
        self._env = self._pool(seeds)
        obs, _ = self._env.reset()
        self._fresh = True
        return np.asarray(obs, dtype=np.float64)

    def reset(self, seed: int) -> EpisodeStart:
        """Start E episodes; episode i's variation is drawn from (seed, i) alone (module docstring)."""
        seeds = [s >> 1 for s in episode_seeds(seed, self.num_episodes)]  # EnvPool takes int32 seeds
        obs = self._reset_pool(seeds)
        check_episodes_finite(self.name, torch.from_numpy(obs[:, None]), torch.zeros(len(obs), 1))
        self._seeds, self._start = seeds, obs
        pos, vel = self.controller.start(obs)
        as_t = lambda x: torch.from_numpy(x).float()  # noqa: E731
        return EpisodeStart(context=as_t(obs[:, self.context_index]), pos=as_t(pos), vel=as_t(vel))

    def run(self, pos: Tensor, vel: Tensor) -> Episodes:
        """Track pos (E, T+1, D) in the episodes of the last reset (a second run rebuilds them from their seeds)."""
        if self._seeds is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before run()")
        self.check_trajectory(pos, vel)
        if not self._fresh:
            again = self._reset_pool(self._seeds)
            if not np.array_equal(again, self._start):
                raise RuntimeError(f"{self.name}: the episodes reset to different states in run() than in reset()")
        self._fresh = False
        target = pos.detach().cpu().double().numpy()
        e, horizon = self.num_episodes, self.horizon
        states, rewards, success = np.empty((e, horizon + 1, 39)), np.empty((e, horizon)), np.empty((horizon, e), bool)
        obs = states[:, 0] = self._start
        self.controller.start(obs)
        for t in range(horizon):
            action = self.controller.action(target[:, t + 1], obs)
            obs, reward, _, _, info = self._env.step(action.astype(np.float32))
            states[:, t + 1], rewards[:, t], success[t] = obs, reward, info["success"] > 0
            if not (np.isfinite(obs).all() and np.isfinite(reward).all()):  # stop before a NaN reaches the controller
                check_episodes_finite(
                    self.name, torch.from_numpy(states[:, : t + 2]), torch.from_numpy(rewards[:, : t + 1])
                )
        if not np.array_equal(info["env_id"], np.arange(e)):
            raise RuntimeError(f"{self.name}: EnvPool returned the episodes out of order: {info['env_id']}")
        states_t, rewards_t = torch.from_numpy(states).float(), torch.from_numpy(rewards).float()
        check_episodes_finite(self.name, torch.from_numpy(states), torch.from_numpy(rewards))
        final = final_metrics(self.config.task, info["obj_to_target"], success, rewards.T)
        return Episodes(
            states=states_t,
            rewards=rewards_t,
            dones=torch.zeros(e, horizon, dtype=torch.bool),
            success=torch.from_numpy(success[-1].copy()),
            final={k: torch.from_numpy(np.asarray(v)).float() for k, v in final.items()},
        )

    def close(self) -> None:
        """Close the current pool (a later reset builds a new one)."""
        if self._env is not None:
            self._env.close()
            self._env = None
