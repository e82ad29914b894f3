"""Differentiable trust-region projections for Gaussian policies (TRPL: Otto et al., ICLR 2021), in pure PyTorch.

The projected policy pi^ of the network's pi~ = N(mu, Sigma) lies within a mean bound and a covariance bound of the
old policy (KL, W2 or Frobenius); the surrogate is taken on pi^ and a regression term pulls pi~ towards it. Batched
over states, with a per-state or one global covariance (projected once). The math, the numerics and the measured
benchmarks are in docs/gaussian.md. Needs torch alone.

    from troll.gaussian import Gaussian, project, trpl_loss
    new = Gaussian.from_chol(mean, chol)                       # mean (B, D), chol (B, D, D) or (D, D)
    proj = project(new, old, mean_bound=0.05, cov_bound=5e-4)  # proj.policy: the projected Gaussian
"""

from troll.gaussian.distances import DISTANCES, cov_distance, mean_distance, total_distance
from troll.gaussian.entropy import SCHEDULES, EntropySchedule, control_entropy
from troll.gaussian.loss import projection_metrics, regression, trpl_loss
from troll.gaussian.policy import KINDS, Gaussian
from troll.gaussian.projection import GaussianProjection, project

__all__ = [
    "DISTANCES",
    "KINDS",
    "SCHEDULES",
    "EntropySchedule",
    "Gaussian",
    "GaussianProjection",
    "control_entropy",
    "cov_distance",
    "mean_distance",
    "project",
    "projection_metrics",
    "regression",
    "total_distance",
    "trpl_loss",
]
