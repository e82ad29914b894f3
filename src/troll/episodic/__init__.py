"""Episodic RL with movement primitives: ProDMP trajectories, environments that track them, and the TCE agent.

docs/tce.md describes the method and the results. The package needs torch alone to import; the MuJoCo
environments import gymnasium, mujoco and metaworld only when they are built (``pip install troll[episodic]``).
The names below are imported on first use, so that importing a submodule that needs no torch (the command line's
provider, :mod:`troll.episodic.cli`, which ``troll --help`` loads) does not import torch through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> module that defines it
_EXPORTS = {
    "LinearMap": "troll.episodic.tce.prodmp",
    "Marginals": "troll.episodic.tce.prodmp",
    "ProDMP": "troll.episodic.tce.prodmp",
    "TCEConfig": "troll.episodic.tce.config",
    "gather_times": "troll.episodic.tce.prodmp",
}
__all__ = ["LinearMap", "Marginals", "ProDMP", "TCEConfig", "gather_times"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from troll.episodic.tce.config import TCEConfig
    from troll.episodic.tce.prodmp import LinearMap, Marginals, ProDMP, gather_times


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'troll.episodic' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
