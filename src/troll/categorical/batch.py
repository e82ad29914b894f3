"""A policy-gradient batch as every loss sees it: its checks, its aggregation over tokens, masked statistics and the
GSPO sequence weight (what a loss returns, :class:`~troll.output.LossOutput`, is shared by both wings).

Shapes: B sequences, T positions, V vocabulary, K stored old ids.
    tokens     (B, T)     sampled ids
    advantages (B,) or (B, T)
    mask       (B, T)     True on response tokens
"""

from __future__ import annotations

import torch

from troll._checks import (
    check_choice,
    check_ids,
    check_int,
    check_logits,
    check_mask,
    check_shape,
    check_sparse,
    check_tensor,
)
from troll.categorical.defaults import AGGREGATIONS, MAX_LOG_RATIO
from troll.categorical.sparse import SparseLogProbs


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


def check_logits_batch(logits, tokens, advantages, mask):
    """:func:`check_batch` with (B, T) taken from ``logits`` (B, T, V), whose type and shape are checked too."""
    check_logits("logits", logits, scan=False)  # values: check_lse on the logsumexp the loss computes anyway
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}.")
    return check_batch(tokens, advantages, mask, *logits.shape, source="logits")


def check_batch(tokens, advantages, mask, b: int, t: int, vocab: int, *, source: str = "logits"):
    """Validate the (B, T) side of a batch; returns long tokens (0 off the mask), (B, T) advantages, bool mask."""
    for name, value in (("tokens", tokens), ("advantages", advantages), ("mask", mask)):
        check_tensor(name, value)
    check_shape("tokens", tokens, (b, t), f" (B, T) from {source}")
    check_shape("mask", mask, (b, t), f" (B, T) from {source}")
    if not advantages.is_floating_point():
        advantages = advantages.double()
    if advantages.shape not in ((b,), (b, t)):
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}; expected ({b},) or ({b}, {t}).")
    mask = check_mask(mask)
    check_ids("tokens (at mask == True)", tokens[mask], vocab)
    tokens = torch.where(mask, tokens, 0).long()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    if not torch.isfinite(adv).all():
        raise ValueError("advantages contain NaN or inf; check the reward function and its normalisation.")
    return tokens, adv.expand(b, t), mask


def check_old(old: SparseLogProbs, b: int, t: int, v: int) -> None:
    if not isinstance(old, SparseLogProbs):
        raise ValueError(f"old must be a SparseLogProbs (from troll.sparsify), got {type(old).__name__}.")
    if old.ids.dim() != 3:
        raise ValueError(f"old.ids must be (B, T, K), got shape {tuple(old.ids.shape)}.")
    if tuple(old.ids.shape[:-1]) != (b, t):
        raise ValueError(f"old.ids has shape {tuple(old.ids.shape)} but ({b}, {t}, K) is expected (B, T from logits).")
    if old.vocab_size != v:
        raise ValueError(f"old.vocab_size is {old.vocab_size} but logits have V = {v}; use one vocabulary.")
    check_sparse(old, v)


def sequence_weight(logp_tok: torch.Tensor, old_tok: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token weight exp(log pi_t - sg(log pi_t) + sg(log s_i)), log s_i = masked mean log-ratio (<= 10)."""
    count = mask.to(logp_tok.dtype).sum(-1, keepdim=True)
    log_s = torch.where(mask, logp_tok - old_tok, 0.0).sum(-1, keepdim=True) / count.clamp_min(1)
    log_s = log_s.clamp(max=MAX_LOG_RATIO).detach()
    # A token the current policy bans (log pi = -inf) makes log_s = -inf and the weight 0; select first so that
    # -inf - (-inf) never happens.
    lp = torch.where(torch.isfinite(logp_tok), logp_tok, 0.0)
    return torch.exp(lp - lp.detach() + log_s)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, values, 0.0).sum() / mask.to(values.dtype).sum().clamp_min(1)


def masked_stats(name: str, values: torch.Tensor, mask: torch.Tensor, which) -> dict[str, torch.Tensor]:
    """Masked mean / min / max of a (B, T) tensor; 0 for an empty mask."""
    out = {}
    v = values.double()
    empty = not bool(mask.any())
    for w in which:
        if w == "mean":
            out[f"{name}/mean"] = masked_mean(v, mask)
        elif empty:
            out[f"{name}/{w}"] = v.new_zeros(())
        else:
            out[f"{name}/{w}"] = getattr(v[mask], w)()
    return out
