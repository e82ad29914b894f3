"""Entropy control after the trust-region projection (docs/gaussian.md, "Entropy control").

If the entropy H of the projected policy is below a bound beta_t, its covariance factor is scaled by
exp((beta_t - H) / D), which sets H = beta_t exactly (scaling the factor by c adds D log c to H). beta_t follows a
schedule from the initial entropy H0 towards a target (:class:`EntropySchedule`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import torch

from troll._checks import check_choice, check_int, check_number
from troll.gaussian.policy import Gaussian, check_gaussian

SCHEDULES = ("none", "linear", "exponential")


@dataclass(frozen=True)
class EntropySchedule:
    """beta_t, the lower bound on the entropy of the projected policy at step t (t = 0, 1, ...).

    none:         beta_t = -inf (no control)
    linear:       beta_t = H0 + min(t, T) / T (H_target - H0)
    exponential:  beta_t = H_target + (H0 - H_target) rate^(t / T)   (the gap is ``rate`` times the first one at T)

    ``initial`` is H0 (typically the entropy of the initial policy), ``target`` H_target, ``total_steps`` T.
    """

    kind: str = "none"
    initial: float = 0.0
    target: float = 0.0
    total_steps: int = 1
    rate: float = 0.01

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, SCHEDULES)
        hint = "; entropies of Gaussians are any real number (Gaussian.entropy() of the initial policy is a start)"
        check_number("initial", self.initial, low=-math.inf, hint=hint)
        check_number("target", self.target, low=-math.inf, hint=hint)
        check_int("total_steps", self.total_steps, hint="; pass the number of updates over which to reach target")
        check_number("rate", self.rate, hint="; rate in (0, 1) is the remaining share of the gap at total_steps")
        if not self.rate < 1:
            raise ValueError(f"rate must lie in (0, 1), got {self.rate!r}; e.g. rate=0.01.")

    def bound(self, step: int) -> float:
        """beta_t at update ``step`` >= 0."""
        check_int("step", step, low=0)
        if self.kind == "none":
            return -math.inf
        frac = min(step, self.total_steps) / self.total_steps
        if self.kind == "linear":
            return self.initial + frac * (self.target - self.initial)
        return self.target + (self.initial - self.target) * self.rate ** (step / self.total_steps)


def control_entropy(policy: Gaussian, bound: float) -> Gaussian:
    """Raise the entropy of ``policy`` to ``bound`` where it is below: factor * exp((bound - H) / D).

    policy: any kind; a global covariance is scaled once. Rows at or above the bound keep their factor exactly.
    The gradient flows through H as well as through the factor. ``bound = -inf`` returns ``policy`` itself.
    """
    check_gaussian("policy", policy)
    if not isinstance(bound, Real) or isinstance(bound, bool) or math.isnan(bound) or bound == math.inf:
        raise ValueError(f"bound must be a real number or -inf (no control), got {bound!r}; see EntropySchedule.")
    if bound == -math.inf:
        return policy
    h = policy.entropy()  # (B,) or ()
    scale = torch.where(h < bound, ((bound - h) / policy.dim).exp(), 1.0)
    scale = scale.unsqueeze(-1) if policy.kind == "diag" else scale.unsqueeze(-1).unsqueeze(-1)
    return Gaussian(policy.mean, policy.factor * scale, policy.kind)
