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
    check_logits,
    check_lse,
    check_positive,
    check_shape,
    check_top_k,
)
from troll.policy import DenseLogits, coarse_support
from troll.projection import kl_divergence, project_log_probs
from troll.sparse import SparseLogProbs

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LEVELS = ("token", "sequence")
MAX_LOG_RATIO = 10.0  # sequence-level log importance ratios are clamped here (SPEC section 4)


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
    m = mask.to(values.dtype)
    per_seq = (values * m).sum(-1)
    count = m.sum(-1)
    if agg == "token-mean":
        return per_seq.sum() / count.sum().clamp_min(1)
    if agg == "seq-mean-token-sum-norm":
        length = values.shape[-1] if max_len is None else max_len
        if length < 1:
            raise ValueError(f"max_len must be >= 1 for seq-mean-token-sum-norm, got {max_len}.")
        return per_seq.sum() / (values.shape[0] * length)
    nonempty = count > 0
    if agg == "seq-mean-token-mean":
        per_seq = per_seq / count.clamp_min(1)
    return per_seq.sum() / nonempty.sum().clamp_min(1)


def check_troll_args(*, kl_bound, alpha, top_k, delta, level, agg) -> None:
    """The hyper-parameter checks shared by every TROLL loss entry point."""
    check_positive("kl_bound", kl_bound)
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}; the paper uses alpha=1.0.")
    check_top_k(top_k)
    check_delta(delta)
    check_choice("level", level, LEVELS)
    check_choice("agg", agg, AGGREGATIONS)


def _check_batch(logits, tokens, advantages, mask):
    check_logits("logits", logits, scan=False)  # values: check_lse on the logsumexp the loss computes anyway
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}.")
    return check_batch(tokens, advantages, mask, *logits.shape, source="logits")


def check_batch(tokens, advantages, mask, b: int, t: int, vocab: int, *, source: str = "logits"):
    """Validate the (B, T) side of a batch; returns long tokens (0 off the mask), (B, T) advantages, bool mask."""
    check_shape("tokens", tokens, (b, t), f" (B, T) from {source}")
    check_shape("mask", mask, (b, t), f" (B, T) from {source}")
    if advantages.shape not in ((b,), (b, t)):
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}; expected ({b},) or ({b}, {t}).")
    mask = mask.bool()
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
    check_shape("old.ids", old.ids[..., 0], (b, t), " (B, T) from logits")
    if old.vocab_size != v:
        raise ValueError(f"old.vocab_size is {old.vocab_size} but logits have V = {v}; use one vocabulary.")


def _sequence_weight(logp_tok: torch.Tensor, old_tok: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token weight exp(log pi_t - sg(log pi_t) + sg(log s_i)), log s_i = masked mean log-ratio (<= 10)."""
    m = mask.to(logp_tok.dtype)
    log_s = ((logp_tok - old_tok) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1)
    log_s = log_s.clamp(max=MAX_LOG_RATIO).detach()
    return torch.exp(logp_tok - logp_tok.detach() + log_s)


def troll_loss(
    logits: torch.Tensor,
    old: SparseLogProbs,
    tokens: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_bound: float = 0.05,
    alpha: float = 1.0,
    top_k: int = 64,
    delta: float = 1e-5,
    level: str = "token",
    agg: str = "token-mean",
    max_len: int | None = None,
) -> LossOutput:
    """The TROLL loss (SPEC section 4) on the sparse support with a rest bucket (SPEC section 5).

    Per token t, with pi the projection of pi~ = softmax(logits) onto KL(pi || pi_old) <= kl_bound::

        pg_t  = -A_t * pi(o_t) / pi_old(o_t)        (level="sequence": the GSPO-token weight instead)
        reg_t = KL(pi~_t || sg(pi_t))               (0 where the projection is inactive)
        loss  = agg(pg) + alpha * agg(reg)

    Metrics: kl_before/kl_after (mean, max), projected_frac, eta (mean, max), support (mean), ratio (mean, min,
    max), loss/pg and loss/reg, all over response tokens.
    """
    params = dict(kl_bound=kl_bound, alpha=alpha, top_k=top_k, delta=delta, level=level, agg=agg)
    check_troll_args(**params)
    tokens, adv, mask = _check_batch(logits, tokens, advantages, mask)
    bsz, seq, vocab = logits.shape
    check_old(old, bsz, seq, vocab)

    new = DenseLogits(logits.reshape(-1, vocab))
    check_lse("logits", new.lse)
    out = troll_loss_on_policy(new, old.flatten(), tokens, adv, mask, **params, max_len=max_len)
    return LossOutput(out.loss if logits.dtype == torch.float64 else out.loss.float(), out.metrics)


def troll_loss_on_policy(new, old, tokens, adv, mask, *, kl_bound, alpha, top_k, delta, level, agg, max_len):
    """The TROLL loss for a validated batch; ``new`` is a :class:`DenseLogits` or a stand-in over B*T rows.

    old: flat SparseLogProbs (B*T, K); tokens, adv, mask: (B, T). Returns a fp64 :class:`LossOutput`.
    """
    bsz, seq = tokens.shape
    ids, support, a, b = coarse_support(new, old, top_k=top_k, delta=delta, extra=tokens.reshape(-1, 1))
    # Positions outside the response get old = new: inactive, finite, and no solver work.
    rows = mask.reshape(-1, 1)
    b = torch.where(rows, b, a.detach())
    proj = project_log_probs(a, b, kl_bound)

    at = (ids == tokens.reshape(-1, 1)).long().argmax(-1, keepdim=True)  # the sampled id's slot in U

    def tok(t):
        return t.gather(-1, at).reshape(bsz, seq)

    logp_tok, old_tok = tok(proj.logp), tok(b)
    if level == "token":
        weight = torch.exp(logp_tok - old_tok)
    else:
        weight = _sequence_weight(logp_tok, old_tok, mask)
    pg = -adv.to(weight.dtype) * weight
    reg = kl_divergence(a, proj.logp.detach()).reshape(bsz, seq)
    pg_loss = aggregate(pg, mask, agg, max_len=max_len)
    reg_loss = aggregate(reg, mask, agg, max_len=max_len)
    loss = pg_loss + alpha * reg_loss

    with torch.no_grad():
        view = {k: t.reshape(bsz, seq) for k, t in zip(("eta", "kl_before", "kl_after"), proj[1:])}
        metrics = {
            **_stats("kl_before", view["kl_before"], mask, ("mean", "max")),
            **_stats("kl_after", view["kl_after"], mask, ("mean", "max")),
            "projected_frac": _masked_mean((view["eta"] > 0).double(), mask),
            **_stats("eta", view["eta"], mask, ("mean", "max")),
            "support/mean": _masked_mean(support[:, :-1].sum(-1).reshape(bsz, seq).double(), mask),
            **_stats("ratio", torch.exp(logp_tok - old_tok), mask, ("mean", "min", "max")),
            "loss/pg": pg_loss.detach(),
            "loss/reg": reg_loss.detach(),
        }
    return LossOutput(loss, metrics)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp_min(1)


def _stats(name: str, values: torch.Tensor, mask: torch.Tensor, which) -> dict[str, torch.Tensor]:
    """Masked mean / min / max of a (B, T) tensor; 0 for an empty mask."""
    out = {}
    v = values.double()
    empty = not bool(mask.any())
    for w in which:
        if w == "mean":
            out[f"{name}/mean"] = _masked_mean(v, mask)
        elif empty:
            out[f"{name}/{w}"] = v.new_zeros(())
        else:
            out[f"{name}/{w}"] = getattr(v[mask], w)()
    return out


def old_token_logp(old: SparseLogProbs | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Old per-token log-probs (B, T): the stored value at the sampled id, else its share of the unkept mass."""
    if torch.is_tensor(old):
        return old.double()
    hit = (old.ids == tokens.unsqueeze(-1)) & old.mask
    stored = torch.where(hit, old.logp.double(), 0.0).sum(-1)
    n_tail = (old.vocab_size - old.mask.sum(-1)).double().clamp_min(1)
    return torch.where(hit.any(-1), stored, old.log_rest_mass() - n_tail.log())
