"""Episodic environments for TCE: reset E episodes with a context, run one desired trajectory per episode, get
every step's states, rewards and dones back (base.py has the interface, registry.py the names).

    from troll.episodic.envs import make_env
    with make_env("metaworld/reach-v3", num_episodes=16, workers=2) as env:
        start = env.reset(seed=0)              # context (E, C), pos (E, D), vel (E, D)
        episodes = env.run(pos_d, vel_d)       # desired (E, T+1, D) at t_k = k * env.dt

The names below are imported on first use, so that the names' checks (registry.py) need no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> module that defines it
_EXPORTS = {
    "ENV_NAMES": "troll.episodic.envs.registry",
    "EnvWorkerError": "troll.episodic.envs.workers",
    "EpisodeStart": "troll.episodic.envs.base",
    "Episodes": "troll.episodic.envs.base",
    "EpisodicEnv": "troll.episodic.envs.base",
    "NonFiniteError": "troll.episodic.envs.base",
    "make_env": "troll.episodic.envs.registry",
    "register": "troll.episodic.envs.registry",
}
__all__ = [
    "ENV_NAMES",
    "EnvWorkerError",
    "EpisodeStart",
    "Episodes",
    "EpisodicEnv",
    "NonFiniteError",
    "make_env",
    "register",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from troll.episodic.envs.base import Episodes, EpisodeStart, EpisodicEnv, NonFiniteError
    from troll.episodic.envs.registry import ENV_NAMES, make_env, register
    from troll.episodic.envs.workers import EnvWorkerError


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'troll.episodic.envs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
