"""TROLL: Trust Region Optimization for Large Language models (arXiv 2510.03817), in PyTorch.

Replaces the PPO/GRPO clipped surrogate with a differentiable per-token KL trust-region projection of the
next-token distribution over a sparse support of its most probable tokens. The method is in docs/method.md,
the numerical choices in docs/numerics.md, the layout of the package in docs/architecture.md. The Gaussian
projections are in :mod:`troll.gaussian`, episodic RL (TCE) in :mod:`troll.episodic`
(the library) and :mod:`troll.tce` (its command line).

The names below are imported on first use, so that ``import troll`` (and the ``troll`` command line, which
validates its input before anything heavy loads) does not import torch until a function needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# name -> module that defines it
_EXPORTS = {
    "AGGREGATIONS": "troll.categorical.defaults",
    "ChunkedLMHead": "troll.categorical.lm_head",
    "LossOutput": "troll.output",
    "Projection": "troll.categorical.projection",
    "SparseLogProbs": "troll.categorical.sparse",
    "SparseProjection": "troll.categorical.sparse_projection",
    "aggregate": "troll.categorical.batch",
    "cispo_loss": "troll.categorical.baselines",
    "clip_loss": "troll.categorical.baselines",
    "infeasible": "troll.categorical.projection",
    "old_token_logp": "troll.categorical.sparse",
    "project": "troll.categorical.projection",
    "project_sparse": "troll.categorical.sparse_projection",
    "sparsify": "troll.categorical.sparse",
    "sparsify_from_hidden": "troll.categorical.lm_head",
    "troll_loss": "troll.categorical.losses",
    "troll_loss_from_hidden": "troll.categorical.losses",
}
__all__ = [
    "AGGREGATIONS",
    "ChunkedLMHead",
    "LossOutput",
    "Projection",
    "SparseLogProbs",
    "SparseProjection",
    "aggregate",
    "cispo_loss",
    "clip_loss",
    "infeasible",
    "old_token_logp",
    "project",
    "project_sparse",
    "sparsify",
    "sparsify_from_hidden",
    "troll_loss",
    "troll_loss_from_hidden",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from troll.categorical.baselines import cispo_loss, clip_loss
    from troll.categorical.batch import aggregate
    from troll.categorical.defaults import AGGREGATIONS
    from troll.categorical.lm_head import ChunkedLMHead, sparsify_from_hidden
    from troll.categorical.losses import troll_loss, troll_loss_from_hidden
    from troll.categorical.projection import Projection, infeasible, project
    from troll.categorical.sparse import SparseLogProbs, old_token_logp, sparsify
    from troll.categorical.sparse_projection import SparseProjection, project_sparse
    from troll.output import LossOutput


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'troll' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
