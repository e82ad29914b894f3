"""TROLL: Trust Region Optimization for Large Language models (arXiv 2510.03817), in PyTorch.

Replaces the PPO/GRPO clipped surrogate with a differentiable per-token KL trust-region projection of the
next-token distribution over a sparse support of its most probable tokens. The method is in docs/method.md,
the numerical choices in docs/numerics.md.
"""

from troll.baselines import cispo_loss, clip_loss
from troll.batch import LossOutput, aggregate
from troll.defaults import AGGREGATIONS
from troll.lm_head import ChunkedLMHead, sparsify_from_hidden
from troll.losses import troll_loss, troll_loss_from_hidden
from troll.projection import Projection, infeasible, project
from troll.sparse import SparseLogProbs, old_token_logp, sparsify
from troll.sparse_projection import SparseProjection, project_sparse

__version__ = "0.1.0"

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
