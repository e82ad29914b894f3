"""The TRPL loss on Gaussian policies: surrogate on the projection + regression to it (docs/gaussian.md, "The loss").

Shapes: B states, D action dimensions.
    new, old     Gaussian policies (mean (B, D); a per-state or global factor)
    actions      (B, D)  sampled actions (a step-based policy), or None with ``log_prob``
    log_prob     Gaussian -> (B, ...) log-probabilities of what was sampled (TCE: segment pairs, (E, K))
    advantages   (B,) with actions, else the shape of log_prob's output
    old_log_prob the shape of advantages: log pi_old at sampling time (optional: computed from ``old`` otherwise)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real

import torch

from troll._checks import check_choice, check_number, check_shape, check_tensor
from troll.gaussian.distances import DISTANCES
from troll.gaussian.distances import cov_part as cov_distance_unchecked
from troll.gaussian.distances import mean_part as mean_distance_unchecked
from troll.gaussian.entropy import control_entropy
from troll.gaussian.policy import Gaussian, all_finite, check_comparable
from troll.gaussian.projection import GaussianProjection, check_metrics_args, project
from troll.output import LossOutput

BOUND_RTOL = 1e-6  # a distance above bound * (1 + this) counts as exceeding it (bound_exceeded_frac)


def regression(new: Gaussian, projected: Gaussian, *, distance: str) -> torch.Tensor:
    """d(pi~(s), sg(pi^(s))) per state, (B,): the same distance as the projection (mean part + covariance part).

    Pulls the network output towards its projection. Where the projection left a mean or a covariance unchanged
    (the same values) its part is exactly 0, value and gradient (not a rounding residue of L^-1 L). A global
    covariance part is added to every state's value.
    """
    check_choice("distance", distance, DISTANCES)
    check_comparable("new", new, "projected", projected)  # once: the two parts below do not check again
    target = projected.detach()
    mean_part = mean_distance_unchecked(new.mean, target, distance=distance)
    cov_part = cov_distance_unchecked(new, target, distance=distance)
    same_mean = (new.mean.detach() == target.mean).all(-1)
    per_row = 1 if new.kind == "diag" else 2  # the factor dims of one state (or of the global covariance)
    same_cov = (new.factor.detach() == target.factor).flatten(-per_row).all(-1)
    return torch.where(same_mean, 0.0, mean_part) + torch.where(same_cov, 0.0, cov_part)


@torch.no_grad()
def projection_metrics(proj: GaussianProjection, *, mean_bound: float, cov_bound: float) -> dict[str, torch.Tensor]:
    """Detached scalars of a projection: distances before/after (mean, max), projected shares, omega, eta, entropy.

    ``bound_exceeded_frac`` is the share of states whose returned mean or covariance is above its bound by more than
    1e-6 relative (0 unless float32 rounding defeated the margin; docs/gaussian.md, "Numerics").
    """
    check_metrics_args(proj, mean_bound, cov_bound)
    m = {}
    for name, value in (
        ("mean_dist_before", proj.mean_before),
        ("mean_dist_after", proj.mean_after),
        ("cov_dist_before", proj.cov_before),
        ("cov_dist_after", proj.cov_after),
        ("omega", proj.omega),
        ("eta", proj.eta),
    ):
        value = value.detach().double()
        m[f"{name}/mean"], m[f"{name}/max"] = value.mean(), value.max()
    mean_on, cov_on = proj.omega.detach() > 0, proj.eta.detach() > 0
    m["projected_frac/mean"] = mean_on.double().mean()
    m["projected_frac/cov"] = cov_on.double().mean()
    over = (proj.mean_after.double() > mean_bound * (1 + BOUND_RTOL)) | (
        proj.cov_after.double() > cov_bound * (1 + BOUND_RTOL)
    )
    m["bound_exceeded_frac"] = over.double().mean()
    m["entropy/mean"] = proj.policy.entropy().detach().double().mean()
    return m


def trpl_loss(
    new: Gaussian,
    old: Gaussian,
    actions: torch.Tensor | None,
    advantages: torch.Tensor,
    *,
    mean_bound: float,
    cov_bound: float,
    distance: str = "kl",
    alpha: float = 1.0,
    old_log_prob: torch.Tensor | None = None,
    log_prob: Callable[[Gaussian], torch.Tensor] | None = None,
    entropy_bound: float | None = None,
) -> LossOutput:
    """The TRPL loss (docs/gaussian.md, "The loss"): with pi^ the projection of pi~ = ``new`` around ``old``,

        loss = -mean[ exp(log pi^(x) - log pi_old(x)) A ]  +  alpha * mean_s[ d(pi~(s), sg(pi^(s))) ]

    What is scored, ``x``, is given one of two ways:
    - ``actions`` (B, D): a step-based policy's sampled actions, ``log pi(x) = policy.log_prob(actions)`` (B,);
    - ``log_prob``: a function of a Gaussian (the projected policy, or ``old``) returning log-probabilities of any
      shape (B, ...) that ``advantages`` shares, e.g. TCE's segment-pair likelihoods (E, K); pass
      ``actions=None``. It must be differentiable w.r.t. the Gaussian's mean and factor.
    ``old_log_prob`` (the shape of ``advantages``): log pi_old(x) recorded at sampling time; computed from ``old``
    under no_grad when omitted. The surrogate's mean runs over every entry of ``advantages``. No clipping.
    ``entropy_bound`` (e.g. ``EntropySchedule.bound(step)``; -inf: none) raises the entropy of pi^ to at least that
    value before both terms. Metrics: :func:`projection_metrics` plus loss/pg, loss/reg and ratio (mean, min, max).
    """
    check_number("alpha", alpha, strict=False, hint="; TRPL and TCE use alpha=1.0")
    proj = project(new, old, mean_bound=mean_bound, cov_bound=cov_bound, distance=distance)
    score, old_log_prob = _scoring(new, old, actions, advantages, old_log_prob, log_prob)
    policy = proj.policy
    if entropy_bound is not None:
        if not isinstance(entropy_bound, Real) or isinstance(entropy_bound, bool) or not entropy_bound < math.inf:
            raise ValueError(
                f"entropy_bound must be a number or None, got {entropy_bound!r}; a real number, -inf (no control) "
                "or None, e.g. EntropySchedule(...).bound(step)."
            )
        policy = control_entropy(policy, entropy_bound)
    lp = score(policy)
    if lp.shape != advantages.shape:
        raise ValueError(f"log_prob returned shape {tuple(lp.shape)} but advantages have {tuple(advantages.shape)}.")
    ratio = (lp - old_log_prob.detach().to(lp.dtype)).exp()
    pg = -(ratio * advantages.to(ratio.dtype)).mean()
    reg = regression(new, policy, distance=distance).mean()
    metrics = projection_metrics(proj._replace(policy=policy), mean_bound=mean_bound, cov_bound=cov_bound)
    with torch.no_grad():
        r = ratio.detach().double()
        metrics |= {"loss/pg": pg.detach().double(), "loss/reg": reg.detach().double()}
        metrics |= {"ratio/mean": r.mean(), "ratio/min": r.min(), "ratio/max": r.max()}
    return LossOutput(pg + alpha * reg, metrics)


def _scoring(new: Gaussian, old: Gaussian, actions, advantages, old_log_prob, log_prob):
    """Checks what is scored; returns the log-probability function and old_log_prob (advantages' shape)."""
    if (actions is None) == (log_prob is None):
        raise ValueError(
            "pass exactly one of actions (B, D) (a step-based policy) and log_prob (a function of the projected "
            "Gaussian, e.g. TCE's segment likelihoods, with actions=None)."
        )
    check_tensor("advantages", advantages)
    if actions is not None:
        bsz, dim = new.mean.shape
        check_tensor("actions", actions)
        if not actions.is_floating_point():  # a bool or integer tensor is no sample of a Gaussian: refuse, not cast
            raise ValueError(
                f"actions must be a floating-point tensor of sampled continuous actions, got dtype {actions.dtype}; "
                "pass the actions the policy sampled (e.g. new.mean.dtype), not a mask or indices."
            )
        check_shape("actions", actions, (bsz, dim), " (new.mean's shape, one action per state)")
        check_shape("advantages", advantages, (bsz,), " (one advantage per state)")

        def log_prob(policy: Gaussian) -> torch.Tensor:
            return policy.log_prob(actions.to(policy.mean.dtype))

        checked = (("actions", actions), ("advantages", advantages))
    else:
        if not callable(log_prob):
            raise ValueError(f"log_prob must be a function Gaussian -> tensor, got {type(log_prob).__name__}.")
        if advantages.dim() < 1 or advantages.shape[0] != new.mean.shape[0]:
            raise ValueError(
                f"advantages has shape {tuple(advantages.shape)} but (B, ...) with B = {new.mean.shape[0]} (new.mean's "
                "rows) is expected."
            )
        checked = (("advantages", advantages),)
    if old_log_prob is None:
        with torch.no_grad():
            old_log_prob = log_prob(old)
    check_tensor("old_log_prob", old_log_prob)
    what = " (one log-prob per state)" if actions is not None else " (the shape of advantages)"
    check_shape("old_log_prob", old_log_prob, tuple(advantages.shape), what)
    for name, t in (*checked, ("old_log_prob", old_log_prob)):
        if not all_finite(t.detach()):
            raise ValueError(f"{name} contains NaN or inf; check the rollout buffer.")
    return log_prob, old_log_prob
