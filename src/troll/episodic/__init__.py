"""Episodic RL with movement primitives, the library: ProDMP trajectories (``prodmp``), the agent's settings and
presets (``config``), the context policy over the primitive's weights (``policy``), the critic and its normaliser
(``critic``, ``normalize``), the segments of TCE's per-segment advantages (``segments``), the update that calls
:func:`troll.gaussian.trpl_loss` (``agent``), and the environments that track a desired trajectory (``envs``).
The ``troll tce`` command line (:mod:`troll.tce`) stands on it; it never imports the command line.

docs/tce.md describes the method and the results. The package needs torch alone to import; the MuJoCo
environments import gymnasium, mujoco and metaworld only when they are built (``pip install troll[episodic]``).
The names below are imported on first use, so that importing a torch-free submodule (the command line's flags read
:mod:`troll.episodic.config` and :mod:`troll.episodic.envs.registry`) does not import torch through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> module that defines it
_EXPORTS = {
    "BBRL": "troll.episodic.algorithm",
    "TCE": "troll.episodic.algorithm",
    "EpisodicEnv": "troll.episodic.envs.base",
    "FromGymnasium": "troll.episodic.envs.adapter",
    "register": "troll.episodic.envs.registry",
    "make_env": "troll.episodic.envs.registry",
    "LinearMap": "troll.episodic.prodmp",
    "Marginals": "troll.episodic.prodmp",
    "ProDMP": "troll.episodic.prodmp",
    "TCEConfig": "troll.episodic.config",
    "gather_times": "troll.episodic.prodmp",
}
__all__ = [
    "BBRL",
    "EpisodicEnv",
    "FromGymnasium",
    "LinearMap",
    "Marginals",
    "ProDMP",
    "TCE",
    "TCEConfig",
    "gather_times",
    "make_env",
    "register",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from troll.episodic.algorithm import BBRL, TCE
    from troll.episodic.config import TCEConfig
    from troll.episodic.envs.adapter import FromGymnasium
    from troll.episodic.envs.base import EpisodicEnv
    from troll.episodic.envs.registry import make_env, register
    from troll.episodic.prodmp import LinearMap, Marginals, ProDMP, gather_times


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'troll.episodic' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
