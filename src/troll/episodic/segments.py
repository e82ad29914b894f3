"""TCE's segments: time-index pairs, their likelihoods under a Gaussian over theta, their advantages (docs/tce.md).

Shapes: E episodes, T env steps, D DoF, P parameters, K segments (pairs) per episode, 2D the two times' positions.

Indices. K + 1 step indices per episode at a fixed interval ``floor(T / K)`` starting at a random offset in
[0, T - K interval] (per episode), i.e. ``t_k = offset + k interval``; pair k is (t_k, t_{k+1}). The pairs cover
K intervals of the T steps; the steps before t_0 and after t_K enter no advantage in this update (another offset
covers them in another). Two edges, both handled without special cases:
- t_0 = 0 (offset 0): the desired position at step 0 is y0 whatever theta, so its part of the pair likelihood is a
  constant (ProDMP.marginals gives it variance 1 and a mean equal to the value) and cancels in every ratio; the
  pair then scores the position at t_1 alone, which is still what the segment's rewards depend on.
- t_K = T (the largest offset): V(s_T) = 0 (the episode is over, critic.py), so the last segment's advantage is
  its rewards minus V(s_{t_{K-1}}): nothing is bootstrapped past the end.

Likelihood of a pair (docs/tce.md, "What TCE is"): the desired positions at (t_k, t_{k+1}) are jointly Gaussian,
N(H_k mu + xi_k, H_k Sigma H_k^T) (ProDMP.marginals), computed in float64: in float32 the nearly singular pair
covariances are off by nats (prodmp.py).

Advantage of a segment ("value subtraction"), with V = 0 at dead states (critic.alive_mask):
    A_k = sum_{t=t_k}^{t_{k+1}-1} gamma^(t - t_k) r_t + gamma^(t_{k+1} - t_k) V(s_{t_{k+1}}) - V(s_{t_k})
"""

from __future__ import annotations

import math

import torch

from troll.episodic.prodmp import ProDMP
from troll.gaussian import Gaussian

LOG_2PI = math.log(2 * math.pi)


def segment_index(
    episodes: int, horizon: int, num_segments: int, *, random_offset: bool = True, shared: bool = False, generator=None
) -> torch.Tensor:
    """(E, K, 2) int64 step indices of the K consecutive pairs of each episode (module docstring).

    interval = floor(T / K) >= 1; offsets uniform in {0, ..., T - K interval} per episode, or one for all episodes
    (``shared``, TCE's Meta-World setting), 0 without ``random_offset``. Every index lies in [0, T].
    """
    if not 1 <= num_segments <= horizon:
        raise ValueError(
            f"num_segments={num_segments} must lie in [1, horizon={horizon}]: K pairs need K + 1 distinct step "
            "indices; lower num_segments (TCE: 24 for 500 steps)."
        )
    interval = horizon // num_segments
    slack = horizon - num_segments * interval
    if random_offset and slack > 0:
        offset = torch.randint(0, slack + 1, (1 if shared else episodes, 1), generator=generator)
        offset = offset.expand(episodes, 1)
    else:
        offset = torch.zeros(episodes, 1, dtype=torch.int64)
    ticks = offset + interval * torch.arange(num_segments + 1)  # (E, K + 1)
    return torch.stack([ticks[:, :-1], ticks[:, 1:]], -1)


def pair_log_prob(
    dmp: ProDMP,
    policy: Gaussian,
    y0: torch.Tensor,
    v0: torch.Tensor,
    index: torch.Tensor,
    values: torch.Tensor,
) -> torch.Tensor:
    """log N(values_k; H_k mu + xi_k, H_k Sigma H_k^T) per episode and pair, (E, K) float64.

    policy: a Gaussian over theta of kind "chol" (mean (E, P), factor (P, P) or (E, P, P)) or "diag"; y0, v0 (E, D);
    index (E, K, 2); values (E, K, 2D) the desired positions at the pair's times, time-major
    (``prodmp.gather_times(pos, index)``). Differentiable w.r.t. the policy's mean and factor.
    """
    factor = _factor(policy)
    marg = dmp.marginals(policy.mean.double(), y0.double(), v0.double(), index, scale_tril=factor)
    return _log_normal(values.double(), marg)


def pair_log_prob_fn(dmp: ProDMP, y0: torch.Tensor, v0: torch.Tensor, index: torch.Tensor, values: torch.Tensor):
    """:func:`pair_log_prob` as a function of the policy alone (y0, v0, index and values fixed): what the agent calls
    in every policy epoch. The basis rows and start terms are gathered once (``ProDMP.marginal_map``); the same
    numbers as :func:`pair_log_prob`."""
    marginals = dmp.marginal_map(y0.double(), v0.double(), index)
    values = values.double()

    def log_prob(policy: Gaussian) -> torch.Tensor:  # (E, K)
        return _log_normal(values, marginals(policy.mean.double(), scale_tril=_factor(policy)))

    return log_prob


def _factor(policy: Gaussian) -> torch.Tensor:
    """The Gaussian's factor as a (P, P) or (E, P, P) matrix, float64 (a diagonal std made a diagonal matrix)."""
    if policy.kind not in ("chol", "diag"):
        raise ValueError(f"pair_log_prob needs a Gaussian of kind 'chol' or 'diag', got {policy.kind!r}.")
    factor = policy.factor.double()
    return torch.diag_embed(factor) if policy.kind == "diag" else factor


def _log_normal(values: torch.Tensor, marg) -> torch.Tensor:
    """log N(values; marg.mean, marg.scale_tril marg.scale_tril^T) over the last axis, (E, K)."""
    diff = (values - marg.mean).unsqueeze(-1)  # (E, K, 2D, 1)
    z = torch.linalg.solve_triangular(marg.scale_tril, diff, upper=False).squeeze(-1)
    log_det = marg.scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return -0.5 * (z.square().sum(-1) + values.shape[-1] * LOG_2PI) - log_det


def segment_advantages(
    rewards: torch.Tensor, values: torch.Tensor, alive: torch.Tensor, index: torch.Tensor, *, gamma: float = 1.0
) -> torch.Tensor:
    """A_k (E, K) float64 (module docstring): the segment's (discounted) rewards, plus the value of its end state,
    minus the value of its start state, with V = 0 where ``alive`` (E, T + 1) is False.

    rewards (E, T); values (E, T + 1) V(s_t); index (E, K, 2) with t_k < t_{k+1}.
    """
    r = rewards.double()
    v = torch.where(alive, values.double(), 0.0)
    e, steps = r.shape
    start, end = index[..., 0], index[..., 1]
    if gamma == 1.0:
        cum = torch.cat([torch.zeros(e, 1, dtype=r.dtype), r.cumsum(1)], 1)  # cum[t] = sum_{s<t} r_s
        seg = cum.gather(1, end) - cum.gather(1, start)
        discount = torch.ones_like(seg)
    else:
        # sum_{s=a}^{b-1} gamma^(s-a) r_s = (D[b] - D[a]) / gamma^a with D[t] = sum_{s<t} gamma^s r_s (float64)
        powers = gamma ** torch.arange(steps + 1, dtype=r.dtype)
        cum = torch.cat([torch.zeros(e, 1, dtype=r.dtype), (r * powers[:-1]).cumsum(1)], 1)
        seg = (cum.gather(1, end) - cum.gather(1, start)) / powers[start]
        discount = powers[end - start]
    return seg + discount * v.gather(1, end) - v.gather(1, start)


def normalize(adv: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(adv - mean) / (std + eps) over every entry (the batch of episodes and segments)."""
    if adv.numel() < 2:
        return adv - adv.mean()
    return (adv - adv.mean()) / (adv.std() + eps)
