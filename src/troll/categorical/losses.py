"""The TROLL loss (docs/method.md, "The loss"), from per-token logits or from the LM head's input.

Shapes: B sequences, T response positions, V vocabulary, K stored old ids, H hidden size.
    logits     (B, T, V)  current policy, already divided by the sampling temperature
    hidden     (B, T, H)  or the LM head's input, with its weight (V, H) (troll_loss_from_hidden)
    old        SparseLogProbs (B, T, K) of the old policy
    tokens     (B, T)     sampled ids
    advantages (B,) or (B, T)
    mask       (B, T)     True on response tokens
Each returns a :class:`troll.output.LossOutput`: the scalar ``loss`` and a dict of detached scalar ``metrics``. The
clip-family baselines, with the same call shape, are in :mod:`troll.categorical.baselines`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from troll._checks import check_lse
from troll._threads import one_thread
from troll.categorical.batch import (
    aggregate,
    check_batch,
    check_logits_batch,
    check_old,
    masked_mean,
    masked_stats,
    sequence_weight,
)
from troll.categorical.defaults import ALPHA, DELTA, KL_BOUND, TAIL, TAIL_FILL, TOP_K
from troll.categorical.lm_head import ChunkedLMHead, check_chunk_size, check_head, head_dtype
from troll.categorical.policy import DenseLogits
from troll.categorical.projection import NEG_INF, infeasible, kl_divergence, project_log_probs
from troll.categorical.settings import check_tail, check_troll_settings
from troll.categorical.sparse import SparseLogProbs
from troll.categorical.sparse_projection import coarse_support
from troll.output import LossOutput

KL_SHARE_TOP = 8  # the kl_share metrics split off the old policy's 8 most probable tokens


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
    tail: str = TAIL,
    fill: float = TAIL_FILL,
) -> LossOutput:
    """The TROLL loss (docs/method.md, "The loss") on the sparse support with a rest bucket.

    Per token t, with pi the projection of pi~ = softmax(logits) onto KL(pi || pi_old) <= kl_bound::

        pg_t  = -A_t * pi(o_t) / pi_old(o_t)        (level="sequence": the GSPO-token weight instead)
        reg_t = KL(pi~_t || sg(pi_t))               (0 where the projection is inactive)
        loss  = agg(pg) + alpha * agg(reg)

    ``tail="renormalize"`` replaces the rest bucket by the paper's representation (each policy's kept tokens
    rescaled to one, ``fill`` for the support ids it did not keep; docs/method.md, "The sparse support").

    Metrics: kl_before/kl_after (mean, max), projected_frac, infeasible_frac, old_excluded_frac, eta (mean, max),
    support (mean), ratio (mean, min, max), loss/pg and loss/reg over response tokens, and over projected tokens the
    shares of their KL before projection from the old policy's 8 most probable tokens, the rest of the support and
    the rest bucket (kl_share/old_top8, kl_share/support, kl_share/rest; :func:`kl_shares`).
    """
    params = dict(kl_bound=kl_bound, alpha=alpha, top_k=top_k, delta=delta, level=level, agg=agg)
    check_troll_settings(**params)
    check_tail(tail, fill)
    params.update(tail=tail, fill=fill)
    tokens, adv, mask = check_logits_batch(logits, tokens, advantages, mask)
    bsz, seq, vocab = logits.shape
    check_old(old, bsz, seq, vocab)

    new = DenseLogits(logits.reshape(-1, vocab))
    check_lse("logits", new.lse)
    out = troll_loss_from_policy(new, old.flatten(), tokens, adv, mask, **params, max_len=max_len)
    return LossOutput(out.loss if logits.dtype == torch.float64 else out.loss.float(), out.metrics)


def troll_loss_from_policy(
    new, old, tokens, adv, mask, *, kl_bound, alpha, top_k, delta, level, agg, max_len, tail=TAIL, fill=TAIL_FILL
):
    """The TROLL loss for a validated batch; ``new`` is a :class:`DenseLogits` or a stand-in over B*T rows.

    old: flat SparseLogProbs (B*T, K); tokens, adv, mask: (B, T). Returns a fp64 :class:`LossOutput`.
    """
    bsz, seq = tokens.shape
    ids, support, a, b, at, kept, excluded = loss_support(
        new, old, tokens, mask, top_k=top_k, delta=delta, tail=tail, fill=fill
    )
    with one_thread():  # small (rows, support) tensors (docs/numerics.md, "Threads")
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
            metrics = _metrics(proj, a, b, ids, old, mask, excluded, support, kl_bound, (bsz, seq))
            metrics.update(
                **masked_stats("ratio", torch.exp(logp_tok - old_tok), mask, ("mean", "min", "max")),
                **{"loss/pg": pg_loss.detach(), "loss/reg": reg_loss.detach()},
            )
        return LossOutput(loss, metrics)


class LossSupport(NamedTuple):
    """What the TROLL loss and its KL metrics are computed on (N = B*T rows, U support ids).

    ids (N, U); support (N, U + 1) real categories, the last the rest; a, b (N, U + 1) fp64 new and old log-probs
    (:func:`troll.categorical.sparse_projection.coarse_support`); at (N, 1) the sampled id's slot in U; kept (B, T)
    the loss
    tokens that count; excluded (B, T) the loss tokens dropped because the old policy gives their sampled id zero
    probability (sampler and old policy disagree: a data error, counted in old_excluded_frac; docs/numerics.md).
    """

    ids: torch.Tensor
    support: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    at: torch.Tensor
    kept: torch.Tensor
    excluded: torch.Tensor


def loss_support(new, old: SparseLogProbs, tokens, mask, *, top_k, delta, tail=TAIL, fill=TAIL_FILL) -> LossSupport:
    """The support rule of the TROLL losses, the one place it is written (the loss, the KL metrics of TRL's own
    loss types and ``troll.lm.batch_check`` use it): U = old kept | new kept (top_k, delta) | sampled token, with
    ``tail`` as in :func:`troll.troll_loss`; ``new`` a :class:`troll.categorical.policy.CurrentPolicy` over the B*T
    rows, ``old``
    flat (B*T, K), tokens and mask (B, T)."""
    bsz, seq = tokens.shape
    extra = tokens.reshape(-1, 1).long()
    ids, support, a, b = coarse_support(new, old, top_k=top_k, delta=delta, extra=extra, tail=tail, fill=fill)
    with one_thread():
        at = (ids == extra).long().argmax(-1, keepdim=True)
        with torch.no_grad():
            old_zero = torch.isneginf(b.gather(-1, at).reshape(bsz, seq))
            old_zero |= torch.isneginf(old.token_logp(tokens.reshape(-1)).reshape(bsz, seq))
        excluded = mask & old_zero
    return LossSupport(ids, support, a, b, at, mask & ~excluded, excluded)


@torch.no_grad()
def sparse_kl_metrics(
    new, old: SparseLogProbs, tokens: torch.Tensor, mask: torch.Tensor, *, kl_bound, top_k, delta, tail, fill
) -> dict[str, torch.Tensor]:
    """KL(pi || pi_old) before projection on the TROLL losses' support (:func:`loss_support`), without a loss.

    new: a :class:`troll.categorical.policy.CurrentPolicy` over the B*T rows (ChunkedLMHead or DenseLogits); old: (B,
    T, K);
    tokens, mask: (B, T). Returns ``kl_before/mean``, ``kl_before/max`` over the loss tokens, equal to the TROLL
    loss's metrics of those names, and ``kl_share/*`` (:func:`kl_shares`) over the tokens whose KL exceeds
    ``kl_bound``: the ones a TROLL bound of ``kl_bound`` would project.
    """
    bsz, seq = tokens.shape
    flat = old.flatten()
    s = loss_support(new, flat, tokens, mask.bool(), top_k=top_k, delta=delta, tail=tail, fill=fill)
    kl = torch.where(s.kept, kl_divergence(s.a, s.b).reshape(bsz, seq), 0.0)
    over = s.kept & (kl > kl_bound)
    shares = kl_shares(s.a, s.b, s.ids, flat)
    return {
        **masked_stats("kl_before", kl, s.kept, ("mean", "max")),
        **{f"kl_share/{key}": masked_mean(value.reshape(bsz, seq), over) for key, value in shares.items()},
    }


def _metrics(proj, a, b, ids, old, mask, excluded, support, kl_bound, shape) -> dict[str, torch.Tensor]:
    """The loss's metrics over the loss tokens ``mask`` (B, T): KL before / after, projected and infeasible shares,
    eta, the support's size, and where the KL of a projected token comes from (:func:`kl_shares`)."""
    view = {k: t.reshape(shape) for k, t in zip(("eta", "kl_before", "kl_after"), proj[1:])}
    bad = infeasible(view["kl_after"], kl_bound)
    projected = mask & (view["eta"] > 0)
    shares = kl_shares(a, b, ids, old)
    return {
        **masked_stats("kl_before", view["kl_before"], mask, ("mean", "max")),
        **masked_stats("kl_after", view["kl_after"], mask, ("mean", "max")),
        "projected_frac": masked_mean(projected.double(), mask),
        "infeasible_frac": masked_mean(bad.double(), mask),
        "old_excluded_frac": masked_mean(excluded.double(), excluded | mask),
        # eta of an infeasible row is the end of the path (~1e26), not a step size: left out of its statistics
        **masked_stats("eta", view["eta"], mask & ~bad, ("mean", "max")),
        "support/mean": masked_mean(support[:, :-1].sum(-1).reshape(shape).double(), mask),
        **{f"kl_share/{k}": masked_mean(v.reshape(shape), projected) for k, v in shares.items()},
    }


def kl_shares(a: torch.Tensor, b: torch.Tensor, ids: torch.Tensor, old: SparseLogProbs, *, top: int = KL_SHARE_TOP):
    """Where KL(pi~ || pi_old) comes from, per row: shares of the old policy's ``top`` most probable kept ids
    ("old_top8"), of the other support ids ("support") and of the rest category ("rest"); they sum to one.

    a, b: (N, U + 1) new and old log-probs on the support and the rest; ids: (N, U); old: flat (N, K). A term
    pi~_j log(pi~_j / pi_old_j) can be negative, so a share can be too. On a flat-tailed model the bound may be
    spent on the many small tokens rather than on the few that hold the mass (docs/results.md).
    """
    p = a.exp()
    terms = torch.where(p > 0, p * (a - b), 0.0)  # (N, U + 1)
    k = min(top, old.ids.shape[-1])
    top_ids = (
        old.ids.long().masked_fill(~old.mask, -1).gather(-1, old.logp.masked_fill(~old.mask, NEG_INF).topk(k).indices)
    )
    in_top = (ids.unsqueeze(-1) == top_ids.unsqueeze(-2)).any(-1)  # (N, U)
    total = terms.sum(-1).clamp_min(1e-300)
    head = torch.where(in_top, terms[:, :-1], 0.0).sum(-1)
    rest = terms[:, -1]
    return {f"old_top{top}": head / total, "support": (total - head - rest) / total, "rest": rest / total}


def troll_loss_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    old: SparseLogProbs,
    tokens: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    kl_bound: float = KL_BOUND,
    alpha: float = ALPHA,
    top_k: int = TOP_K,
    delta: float = DELTA,
    level: str = "token",
    agg: str = "token-mean",
    max_len: int | None = None,
    chunk_size: int | None = None,
    entropy: bool = False,
    tail: str = TAIL,
    fill: float = TAIL_FILL,
) -> LossOutput:
    """:func:`troll.troll_loss` of ``logits = (hidden @ weight.T + bias) / temperature``, without the logits.

    Args:
        hidden:  (B, T, H) the LM head's input at the response positions (gradient flows to it).
        weight:  (V, H) the LM head's weight (``lm_head.weight``); bias: (V,) or None.
        old, tokens, advantages, mask, and the keywords: as in :func:`troll.troll_loss`.
        chunk_size: vocabulary columns per pass (default about 2**24 / (B T)); a speed / memory trade-off only.
        entropy: also report metrics["entropy/mean"], the current policy's entropy (nats, at the temperature)
            averaged over the mask, from the scan's vocabulary pass (no extra matmul).

    Memory: O(B T x chunk_size) + O(B T x U) plus weight's gradient, instead of O(B T x V). Same value, gradients
    (to hidden, weight, bias) and metrics as the dense path up to float rounding.
    """
    params = dict(kl_bound=kl_bound, alpha=alpha, top_k=top_k, delta=delta, level=level, agg=agg)
    check_troll_settings(**params)
    check_tail(tail, fill)
    params.update(tail=tail, fill=fill)
    check_chunk_size(chunk_size)
    vocab = check_head(hidden, weight, bias, temperature, lead_dims=2)
    bsz, seq, _ = hidden.shape
    tokens, adv, mask = check_batch(tokens, advantages, mask, bsz, seq, vocab, source="hidden")
    check_old(old, bsz, seq, vocab)

    new = ChunkedLMHead(hidden.reshape(bsz * seq, -1), weight, bias, temperature, chunk_size, entropy)
    out = troll_loss_from_policy(new, old.flatten(), tokens, adv, mask, **params, max_len=max_len)
    if entropy:
        ent = torch.where(mask, new.entropy.double().reshape(bsz, seq), 0.0)
        out.metrics["entropy/mean"] = ent.sum() / mask.double().sum().clamp_min(1)
    fp64 = head_dtype(hidden, weight) == torch.float64
    return LossOutput(out.loss if fp64 else out.loss.float(), out.metrics)
