"""The clip-family baselines with TROLL's call shape: PPO/GRPO clipping (with DAPO's clip-higher, dual-clip and
GSPO's sequence level) and CISPO. Swapping ``troll_loss`` for ``clip_loss`` changes one word.

Their metrics include the KL between the old and the current policy that the step actually reaches (the
sparse-support KL when ``old`` is a SparseLogProbs, else the k3 estimate at the sampled tokens), to show that
clipping the ratio does not bound it.
"""

from __future__ import annotations

import torch

from troll._checks import check_choice, check_lse, check_positive
from troll.categorical.batch import (
    aggregate,
    check_logits_batch,
    check_old,
    masked_mean,
    masked_stats,
    sequence_weight,
)
from troll.categorical.defaults import AGGREGATIONS, CISPO_EPS_HIGH, CLIP_EPS, DELTA, LEVELS, TOP_K
from troll.categorical.policy import DenseLogits
from troll.categorical.projection import compute_dtype, kl_divergence
from troll.categorical.settings import check_delta, check_top_k
from troll.categorical.sparse import SparseLogProbs
from troll.categorical.sparse_projection import coarse_support
from troll.output import LossOutput


def _policy_terms(logits, old, tokens, advantages, mask):
    """Validated inputs and the per-token new / old log-probs (B, T) shared by the baselines."""
    tokens, adv, mask = check_logits_batch(logits, tokens, advantages, mask)
    bsz, seq, vocab = logits.shape
    if isinstance(old, SparseLogProbs):
        check_old(old, bsz, seq, vocab)
    elif not torch.is_tensor(old) or tuple(old.shape) != (bsz, seq):
        raise ValueError(
            f"old must be a SparseLogProbs (B, T, K) or old per-token log-probs of shape ({bsz}, {seq}); "
            f"got {type(old).__name__} {tuple(getattr(old, 'shape', ()))}."
        )
    x = logits.to(compute_dtype(logits.dtype))
    lse = torch.logsumexp(x, dim=-1)
    check_lse("logits", lse)
    old_tok = (old.token_logp(tokens) if isinstance(old, SparseLogProbs) else old.detach().double()).to(x.dtype)
    # A sampled token the old policy excludes is dropped from the loss (as in troll_loss; docs/numerics.md).
    excluded = mask & torch.isneginf(old_tok)
    mask = mask & ~excluded
    # Select, never multiply: padded / dropped positions get log-prob 0 and ratio 1 before any arithmetic.
    logp = torch.where(mask, x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - lse, 0.0)
    old_tok = torch.where(mask, old_tok, 0.0)
    return tokens, adv.to(logp.dtype), mask, excluded, x, lse, logp, old_tok


def _kl_metrics(x, lse, old, tokens, mask, logp, old_tok, *, top_k, delta) -> dict[str, torch.Tensor]:
    """KL(pi~ || pi_old) per token: over the sparse support (the caller's top_k / delta) if we have it, else the
    k3 estimate."""
    with torch.no_grad():
        if isinstance(old, SparseLogProbs):
            bsz, seq, vocab = x.shape
            new = DenseLogits(x.reshape(-1, vocab).detach(), lse.reshape(-1, 1).detach())
            _, _, a, b = coarse_support(new, old.flatten(), top_k=top_k, delta=delta, extra=tokens.reshape(-1, 1))
            kl = kl_divergence(a, b).reshape(bsz, seq)
        else:
            log_r = (old_tok - logp).double()
            kl = log_r.exp() - 1 - log_r  # k3: unbiased for KL(pi~ || pi_old) under pi~ sampling
        return masked_stats("kl", kl, mask, ("mean", "max"))


def clip_loss(
    logits: torch.Tensor,
    old: SparseLogProbs | torch.Tensor,
    tokens: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = CLIP_EPS,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    level: str = "token",
    agg: str = "token-mean",
    max_len: int | None = None,
    top_k: int = TOP_K,
    delta: float = DELTA,
) -> LossOutput:
    """PPO/GRPO clipped surrogate: per token ``max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``.

    ``eps_high`` defaults to ``eps_low`` (DAPO's clip-higher sets it larger, e.g. 0.28). ``dual_clip`` = c > 1
    caps the loss of negative-advantage tokens at ``-c A`` (Ye et al. 2020; the paper's baseline uses c = 10).
    ``level="sequence"`` is GSPO: r is the sequence's geometric-mean ratio, applied through the GSPO-token weight.
    ``top_k`` / ``delta`` set the sparse support of the kl metric only (as in :func:`troll.troll_loss`).
    Metrics: clip/low_frac, clip/high_frac, clip/region_frac, clip/dual_frac, ratio (mean, min, max), kl (mean, max),
    old_excluded_frac (sampled tokens the old policy gives probability 0: dropped from the loss).
    """
    check_positive("eps_low", eps_low)
    eps_high = eps_low if eps_high is None else eps_high
    check_positive("eps_high", eps_high)
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip!r}; the usual value is 3 to 10.")
    check_choice("level", level, LEVELS)
    check_choice("agg", agg, AGGREGATIONS)
    check_top_k(top_k)
    check_delta(delta)
    tokens, adv, mask, excluded, x, lse, logp, old_tok = _policy_terms(logits, old, tokens, advantages, mask)
    ratio = torch.exp(logp - old_tok) if level == "token" else sequence_weight(logp, old_tok, mask)
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    per_token = torch.maximum(-adv * ratio, -adv * clipped)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -dual_clip * adv), per_token)
    loss = aggregate(per_token, mask, agg, max_len=max_len)
    with torch.no_grad():
        r = ratio.detach()
        low = (r < 1 - eps_low) & (adv < 0)
        high = (r > 1 + eps_high) & (adv > 0)
        dual = (adv < 0) & (-adv * r > -dual_clip * adv) if dual_clip is not None else torch.zeros_like(low)
        metrics = {
            "clip/low_frac": masked_mean(low.double(), mask),
            "clip/high_frac": masked_mean(high.double(), mask),
            "clip/region_frac": masked_mean((low | high).double(), mask),
            "clip/dual_frac": masked_mean(dual.double(), mask),
            **masked_stats("ratio", r, mask, ("mean", "min", "max")),
            "old_excluded_frac": masked_mean(excluded.double(), excluded | mask),
            **_kl_metrics(x, lse, old, tokens, mask, logp, old_tok, top_k=top_k, delta=delta),
        }
    return LossOutput(loss, metrics)


def cispo_loss(
    logits: torch.Tensor,
    old: SparseLogProbs | torch.Tensor,
    tokens: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_high: float = CISPO_EPS_HIGH,
    agg: str = "token-mean",
    max_len: int | None = None,
    top_k: int = TOP_K,
    delta: float = DELTA,
) -> LossOutput:
    """CISPO (MiniMax-M1): ``-sg(min(r, eps_high)) * A * log pi(o_t)``; every token keeps its gradient.

    ``eps_high`` caps the importance weight itself, as in TRL's ``loss_type="cispo"``.
    ``top_k`` / ``delta``: the kl metric's sparse support. Metrics: clip/high_frac (weights capped), ratio (mean, min,
    max), kl (mean, max), old_excluded_frac (as in :func:`clip_loss`).
    """
    check_positive("eps_high", eps_high)
    check_choice("agg", agg, AGGREGATIONS)
    check_top_k(top_k)
    check_delta(delta)
    tokens, adv, mask, excluded, x, lse, logp, old_tok = _policy_terms(logits, old, tokens, advantages, mask)
    ratio = torch.exp(logp - old_tok).detach()
    # A token the current policy bans has weight 0; select so that 0 * (-inf) never happens.
    per_token = -ratio.clamp(max=eps_high) * adv * torch.where(ratio > 0, logp, 0.0)
    loss = aggregate(per_token, mask, agg, max_len=max_len)
    with torch.no_grad():
        metrics = {
            "clip/high_frac": masked_mean((ratio > eps_high).double(), mask),
            **masked_stats("ratio", ratio, mask, ("mean", "min", "max")),
            "old_excluded_frac": masked_mean(excluded.double(), excluded | mask),
            **_kl_metrics(x, lse, old, tokens, mask, logp, old_tok, top_k=top_k, delta=delta),
        }
    return LossOutput(loss, metrics)
