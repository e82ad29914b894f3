"""The projection over a sparse support plus one 'rest' category (docs/method.md, "The sparse support and the rest
bucket").

Support U = old kept ids | new kept ids | sampled token. On U the new policy has its exact log-probs (gradient
flows to every logit through the full-vocabulary logsumexp) and the old policy its stored log-probs, or, for ids
it did not keep, an equal share of its unkept mass. Everything outside U is one 'rest' category on each side.
The geometric interpolation and the KL see only a category's total mass when both policies share its shape, so
this is exactly the dense projection against the old policy completed as follows: its unkept mass spread evenly
over its unkept ids (which sets the rest's old mass), and, inside the rest, the new policy's shape. The old
policy's shape inside the rest was never stored; this is the one completion under which one category is exact.
It equals the dense projection when U is the whole vocabulary (the rest category is then dropped).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from troll._checks import (
    check_ids,
    check_logits,
    check_lse,
    check_positive,
    check_shape,
    check_sparse,
)
from troll._threads import one_thread
from troll.categorical.defaults import DELTA, TAIL, TAIL_FILL, TOP_K
from troll.categorical.policy import CurrentPolicy, DenseLogits
from troll.categorical.projection import project_log_probs
from troll.categorical.settings import check_delta, check_tail, check_top_k
from troll.categorical.sparse import SparseLogProbs, merge_ids

# Masses below this are rounding noise of fp32 log-probs; the floor keeps every log finite (docs/numerics.md).
MASS_FLOOR = 1e-30
NEG_INF = float("-inf")


def coarse_support(new: CurrentPolicy, old: SparseLogProbs, *, top_k, delta, extra=None, tail=TAIL, fill=TAIL_FILL):
    """Build the (|U| + 1)-category new and old log-probs over flat rows.

    new: a :class:`CurrentPolicy` over N rows; old: flat (N, K); extra: (N, m) ids to add (kept by both policies).
    Returns ``ids`` (N, U), ``mask`` (N, U + 1), ``a`` and ``b`` (N, U + 1) fp64 normalised log-probs with
    -inf on padding (and on the rest when U is the whole vocabulary, or with ``tail="renormalize"``).

    ``tail="bucket"``: exact log-probs on U and one rest category (module docstring). ``tail="renormalize"`` (the
    paper's code): each policy's kept ids carry their probabilities rescaled to sum to one over its kept set, the ids
    of U it did not keep carry ``fill``, and there is no rest; then both are renormalised over U (the fill moves the
    kept values by at most |U| * fill). At full support both modes are the dense projection.
    """
    vocab = new.vocab_size
    with torch.no_grad():
        new_ids, new_mask = new.kept(top_k, delta)  # a pass over the vocabulary: the policy picks its threads
    with torch.no_grad(), one_thread():
        cand = [old.ids.long(), new_ids] + ([] if extra is None else [extra])
        cand_mask = [old.mask, new_mask] + ([] if extra is None else [torch.ones_like(extra, dtype=torch.bool)])
        ids, mask, src = merge_ids(torch.cat(cand, -1), torch.cat(cand_mask, -1))
        n_out = vocab - mask.sum(-1, keepdim=True)  # ids outside U
        has_rest = n_out > 0
        b, b_rest = _old_on_support(old, src, mask, n_out)
    if tail == "renormalize":
        return _renormalized(new, old, ids, mask, src, new_ids, new_mask, extra, fill)
    at, lse = new.at(ids), new.lse  # the chunked head's gather is a large product: the caller's threads
    with one_thread():
        a = torch.where(mask, (at - lse).double(), NEG_INF)
        # The new rest is 1 - sum over U in fp64; rounding may push it to <= 0, hence the floor.
        a_rest = (1 - a.exp().sum(-1, keepdim=True)).clamp_min(MASS_FLOOR).log()
        a = torch.log_softmax(torch.cat([a, torch.where(has_rest, a_rest, NEG_INF)], -1), dim=-1)
        b = torch.log_softmax(torch.cat([b, torch.where(has_rest, b_rest, NEG_INF)], -1), dim=-1)
    return ids, torch.cat([mask, has_rest], -1), a, b


def _old_on_support(old: SparseLogProbs, src: torch.Tensor, mask: torch.Tensor, n_out: torch.Tensor):
    """Old log-probs on U and on the rest (N, 1).

    Stored values where the old policy kept the id; elsewhere its unkept mass shared uniformly by the
    ``n_tail`` ids it did not keep, of which ``n_out`` lie outside U and make up the rest category.
    """
    k_old = old.ids.shape[-1]
    stored = old.logp.double().gather(-1, src.clamp_max(k_old - 1))
    n_tail = (old.vocab_size - old.mask.sum(-1, keepdim=True)).double().clamp_min(1)
    log_unkept = old.log_rest_mass().unsqueeze(-1).clamp_min(math.log(MASS_FLOOR))
    b = torch.where(mask, torch.where(src < k_old, stored, log_unkept - n_tail.log()), NEG_INF)
    b_rest = log_unkept + n_out.double().clamp_min(1).log() - n_tail.log()
    return b, b_rest


def _renormalized(new: CurrentPolicy, old: SparseLogProbs, ids, mask, src, new_ids, new_mask, extra, fill: float):
    """:func:`coarse_support` with ``tail="renormalize"``: the kept sets rescaled to one, ``fill`` elsewhere on U."""
    with torch.no_grad(), one_thread():
        k_old = old.ids.shape[-1]
        old_kept = mask & (src < k_old)
        kept_by_new = new_ids.masked_fill(~new_mask, -1)
        if extra is not None:
            kept_by_new = torch.cat([kept_by_new, extra.long()], -1)
        new_kept = mask & (ids.unsqueeze(-1) == kept_by_new.unsqueeze(-2)).any(-1)
        stored = torch.where(old_kept, old.logp.double().gather(-1, src.clamp_max(k_old - 1)), NEG_INF)
    at = new.at(ids)  # the chunked head's gather is a large product: the caller's threads
    with one_thread():
        log_fill = math.log(fill)

        def rescaled(values, kept):
            values = torch.where(kept, values, NEG_INF)
            values = values - torch.logsumexp(values, -1, keepdim=True)
            values = torch.where(kept, values, torch.where(mask, log_fill, NEG_INF))
            no_rest = torch.full_like(values[:, :1], NEG_INF)
            return torch.log_softmax(torch.cat([values, no_rest], -1), dim=-1)

        a = rescaled(at.double(), new_kept)
        b = rescaled(stored, old_kept)
    return ids, torch.cat([mask, torch.zeros_like(mask[:, :1])], -1), a, b


class SparseProjection(NamedTuple):
    """Result of :func:`project_sparse` over N rows (leading dims flattened back to ``...``).

    ids:       (..., U) long support ids (padding holds 0).
    mask:      (..., U + 1) True for real categories; the last column is the rest bucket.
    logp:      (..., U + 1) fp64 projected log-probs ``log pi`` on the support and the rest.
    new_logp:  (..., U + 1) fp64 current log-probs ``log pi~`` (with gradient).
    old_logp:  (..., U + 1) fp64 old log-probs (stored, tail-filled, rest).
    eta, kl_before, kl_after: (...) as in :class:`troll.categorical.projection.Projection`.
    """

    ids: torch.Tensor
    mask: torch.Tensor
    logp: torch.Tensor
    new_logp: torch.Tensor
    old_logp: torch.Tensor
    eta: torch.Tensor
    kl_before: torch.Tensor
    kl_after: torch.Tensor


def project_sparse(
    logits: torch.Tensor,
    old: SparseLogProbs,
    kl_bound: float,
    *,
    top_k: int = TOP_K,
    delta: float = DELTA,
    include: torch.Tensor | None = None,
    tail: str = TAIL,
    fill: float = TAIL_FILL,
) -> SparseProjection:
    """Project the current policy onto KL(pi || pi_old) <= kl_bound over the sparse support.

    Args:
        logits:   (..., V) current logits, divided by the temperature; gradient flows through.
        old:      the old policy's :class:`SparseLogProbs` for the same rows, fields (..., K).
        kl_bound: eps > 0.
        top_k, delta: the kept-token rule applied to the current logits (see :func:`troll.sparsify`).
        include:  (...) ids added to the support (the sampled tokens).
        tail, fill: how the mass outside the kept tokens enters (:func:`coarse_support`; docs/method.md).
    """
    check_positive("kl_bound", kl_bound)
    check_tail(tail, fill)
    check_top_k(top_k)
    check_delta(delta)
    check_logits("logits", logits, scan=False)
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    check_shape("old.ids", old.ids[..., 0], tuple(lead), " (old must cover the same rows as logits)")
    if old.vocab_size != vocab:
        raise ValueError(f"old.vocab_size is {old.vocab_size} but logits have V = {vocab}; use one vocabulary.")
    check_sparse(old, vocab)
    extra = None
    if include is not None:
        check_shape("include", include, tuple(lead), " (one sampled id per row)")
        check_ids("include", include, vocab)
        extra = include.reshape(-1, 1).long()
    new = DenseLogits(logits.reshape(-1, vocab))
    check_lse("logits", new.lse)
    ids, mask, a, b = coarse_support(new, old.flatten(), top_k=top_k, delta=delta, extra=extra, tail=tail, fill=fill)
    out = project_log_probs(a, b, kl_bound)
    width = ids.shape[-1]
    return SparseProjection(
        ids.reshape(*lead, width),
        mask.reshape(*lead, width + 1),
        out.logp.reshape(*lead, width + 1),
        a.reshape(*lead, width + 1),
        b.reshape(*lead, width + 1),
        *(t.reshape(lead) for t in out[1:]),
    )
