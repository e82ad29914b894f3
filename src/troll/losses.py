"""Policy-gradient losses on per-token logits: TROLL and the clip-family baselines, with one call shape.

Shapes: B sequences, T response positions, V vocabulary, K stored old ids.
    logits     (B, T, V)  current policy, already divided by the sampling temperature
    old        SparseLogProbs (B, T, K) of the old policy (clip losses also take old per-token log-probs (B, T))
    tokens     (B, T)     sampled ids
    advantages (B,) or (B, T)
    mask       (B, T)     True on response tokens
Each returns a :class:`LossOutput`: the scalar ``loss`` and a dict of detached scalar ``metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from troll._checks import (
    check_choice,
    check_delta,
    check_ids,
    check_int,
    check_lse,
    check_number,
    check_shape,
    check_sparse,
    check_tensor,
    check_top_k,
)
from troll._common import check_logits_batch, check_old, masked_mean, masked_stats, sequence_weight
from troll.defaults import ALPHA, DELTA, KL_BOUND, TOP_K
from troll.policy import DenseLogits, coarse_support
from troll.projection import infeasible, kl_divergence, project_log_probs
from troll.sparse import SparseLogProbs

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LEVELS = ("token", "sequence")


@dataclass
class LossOutput:
    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def aggregate(values: torch.Tensor, mask: torch.Tensor, agg: str, *, max_len: int | None = None) -> torch.Tensor:
    """Reduce per-token ``values`` (B, T) over ``mask`` (B, T) to a scalar.

    token-mean:              sum(v m) / sum(m)                                (DAPO; the paper's GRPO)
    seq-mean-token-mean:     mean over non-empty sequences of sum_t(v m) / sum_t(m)   (original GRPO)
    seq-mean-token-sum:      mean over non-empty sequences of sum_t(v m)
    seq-mean-token-sum-norm: sum(v m) / (B * max_len), max_len defaults to T   (Dr. GRPO)
    Empty denominators give 0, so an all-masked batch has loss 0.
    """
    check_choice("agg", agg, AGGREGATIONS)
    if max_len is not None:
        check_int("max_len", max_len, hint="; pass the maximum completion length, or None for T")
    # Select, never multiply by the mask: a NaN / inf at a padded position must not reach the sum.
    per_seq = torch.where(mask, values, 0.0).sum(-1)
    count = mask.to(values.dtype).sum(-1)
    if agg == "token-mean":
        return per_seq.sum() / count.sum().clamp_min(1)
    if agg == "seq-mean-token-sum-norm":
        length = values.shape[-1] if max_len is None else max_len
        if length < values.shape[-1]:
            raise ValueError(
                f"max_len={max_len} is shorter than the sequences (T = {values.shape[-1]}); Dr. GRPO's constant is the "
                "maximum completion length, at least T. Pass that, or None for T."
            )
        return per_seq.sum() / (values.shape[0] * length)
    nonempty = count > 0
    if agg == "seq-mean-token-mean":
        per_seq = per_seq / count.clamp_min(1)
    return per_seq.sum() / nonempty.sum().clamp_min(1)


def check_troll_args(*, kl_bound, alpha, top_k, delta, level, agg) -> None:
    """The hyper-parameter checks shared by every TROLL loss entry point."""
    check_number("kl_bound", kl_bound, hint="; the paper uses kl_bound=0.05")
    check_number("alpha", alpha, strict=False, hint="; the paper uses alpha=1.0")
    check_top_k(top_k)
    check_delta(delta)
    check_choice("level", level, LEVELS)
    check_choice("agg", agg, AGGREGATIONS)


def troll_loss(
    logits: torch.Tensor,
    old: SparseLogProbs,
    tokens: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_bound: float = KL_BOUND,
    alpha: float = ALPHA,
    top_k: int = TOP_K,
    delta: float = DELTA,
    level: str = "token",
    agg: str = "token-mean",
    max_len: int | None = None,
) -> LossOutput:
    """The TROLL loss (docs/method.md, "The loss") on the sparse support with a rest bucket.

    Per token t, with pi the projection of pi~ = softmax(logits) onto KL(pi || pi_old) <= kl_bound::

        pg_t  = -A_t * pi(o_t) / pi_old(o_t)        (level="sequence": the GSPO-token weight instead)
        reg_t = KL(pi~_t || sg(pi_t))               (0 where the projection is inactive)
        loss  = agg(pg) + alpha * agg(reg)

    Metrics: kl_before/kl_after (mean, max), projected_frac, eta (mean, max), support (mean), ratio (mean, min,
    max), loss/pg and loss/reg, all over response tokens.
    """
    params = dict(kl_bound=kl_bound, alpha=alpha, top_k=top_k, delta=delta, level=level, agg=agg)
    check_troll_args(**params)
    tokens, adv, mask = check_logits_batch(logits, tokens, advantages, mask)
    bsz, seq, vocab = logits.shape
    check_old(old, bsz, seq, vocab)

    new = DenseLogits(logits.reshape(-1, vocab))
    check_lse("logits", new.lse)
    out = troll_loss_from_policy(new, old.flatten(), tokens, adv, mask, **params, max_len=max_len)
    return LossOutput(out.loss if logits.dtype == torch.float64 else out.loss.float(), out.metrics)


def troll_loss_from_policy(new, old, tokens, adv, mask, *, kl_bound, alpha, top_k, delta, level, agg, max_len):
    """The TROLL loss for a validated batch; ``new`` is a :class:`DenseLogits` or a stand-in over B*T rows.

    old: flat SparseLogProbs (B*T, K); tokens, adv, mask: (B, T). Returns a fp64 :class:`LossOutput`.
    """
    bsz, seq = tokens.shape
    ids, support, a, b = coarse_support(new, old, top_k=top_k, delta=delta, extra=tokens.reshape(-1, 1))
    at = (ids == tokens.reshape(-1, 1)).long().argmax(-1, keepdim=True)  # the sampled id's slot in U
    # A sampled token the old policy excludes is a data error (sampler and old policy disagree): it is dropped
    # from the loss and counted in old_excluded_frac (docs/numerics.md).
    with torch.no_grad():
        old_zero = torch.isneginf(b.gather(-1, at).reshape(bsz, seq))
        old_zero |= torch.isneginf(_old_token_logp(old, tokens.reshape(-1)).reshape(bsz, seq))
    excluded = mask & old_zero
    kept = mask & ~excluded
    # Positions outside the loss get old = new: inactive, finite, and no solver work.
    b = torch.where(kept.reshape(-1, 1), b, a.detach())
    proj = project_log_probs(a, b, kl_bound)

    def tok(t):  # select, so that a -inf at a padded position never reaches the arithmetic
        return torch.where(kept, t.gather(-1, at).reshape(bsz, seq), 0.0)

    logp_tok, old_tok = tok(proj.logp), tok(b)
    mask = kept
    if level == "token":
        weight = torch.exp(logp_tok - old_tok)
    else:
        weight = sequence_weight(logp_tok, old_tok, mask)
    pg = -adv.to(weight.dtype) * weight
    reg = kl_divergence(a, proj.logp.detach()).reshape(bsz, seq)
    pg_loss = aggregate(pg, mask, agg, max_len=max_len)
    reg_loss = aggregate(reg, mask, agg, max_len=max_len)
    loss = pg_loss + alpha * reg_loss

    with torch.no_grad():
        view = {k: t.reshape(bsz, seq) for k, t in zip(("eta", "kl_before", "kl_after"), proj[1:])}
        bad = infeasible(view["kl_after"], kl_bound)
        metrics = {
            **masked_stats("kl_before", view["kl_before"], mask, ("mean", "max")),
            **masked_stats("kl_after", view["kl_after"], mask, ("mean", "max")),
            "projected_frac": masked_mean((view["eta"] > 0).double(), mask),
            "infeasible_frac": masked_mean(bad.double(), mask),
            "old_excluded_frac": masked_mean(excluded.double(), excluded | mask),
            # eta of an infeasible row is the end of the path (~1e26), not a step size: left out of its statistics
            **masked_stats("eta", view["eta"], mask & ~bad, ("mean", "max")),
            "support/mean": masked_mean(support[:, :-1].sum(-1).reshape(bsz, seq).double(), mask),
            **masked_stats("ratio", torch.exp(logp_tok - old_tok), mask, ("mean", "min", "max")),
            "loss/pg": pg_loss.detach(),
            "loss/reg": reg_loss.detach(),
        }
    return LossOutput(loss, metrics)


def old_token_logp(old: SparseLogProbs | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Old per-token log-probs (B, T): the stored value at the sampled id, else its share of the unkept mass."""
    check_tensor("tokens", tokens)
    if torch.is_tensor(old):
        check_shape("old", old, tuple(tokens.shape), " (one old log-prob per token)")
        return old.detach().double()
    if not isinstance(old, SparseLogProbs):
        raise ValueError(f"old must be a SparseLogProbs (from troll.sparsify) or a tensor, got {type(old).__name__}.")
    check_shape("old.ids", old.ids[..., 0], tuple(tokens.shape), " (old must cover the same positions as tokens)")
    check_sparse(old, old.vocab_size)
    check_ids("tokens", tokens, old.vocab_size)
    return _old_token_logp(old, tokens)


def _old_token_logp(old: SparseLogProbs | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """:func:`old_token_logp` on inputs the caller has checked."""
    if torch.is_tensor(old):
        return old.detach().double()
    hit = (old.ids == tokens.unsqueeze(-1)) & old.mask
    stored = torch.where(hit, old.logp.double(), 0.0).sum(-1)
    n_tail = (old.vocab_size - old.mask.sum(-1)).double().clamp_min(1)
    return torch.where(hit.any(-1), stored, old.log_rest_mass() - n_tail.log())
