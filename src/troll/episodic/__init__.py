"""Episodic RL with movement primitives: ProDMP trajectories, environments that track them, and the TCE agent.

docs/tce.md describes the method and the results. The package needs torch alone to import; the MuJoCo
environments import gymnasium, mujoco and metaworld only when they are built (``pip install troll[episodic]``).
"""

from troll.episodic.config import TCEConfig
from troll.episodic.prodmp import LinearMap, Marginals, ProDMP, gather_times

__all__ = ["LinearMap", "Marginals", "ProDMP", "TCEConfig", "gather_times"]
