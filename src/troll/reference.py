"""Float64 dense reference implementations, written for clarity rather than speed.

They follow the equations of docs/method.md literally (eta, not s = 1/(1 + eta); plain bisection, not Newton) so
that the tests and the benchmarks compare the fast paths against something computed a different way.
"""

from __future__ import annotations

import torch


def _interp(a: torch.Tensor, b: torch.Tensor, eta: float) -> torch.Tensor:
    """log softmax((a + eta b) / (1 + eta)) for one row of log-probs."""
    return torch.log_softmax((a + eta * b) / (1 + eta), dim=-1)


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> float:
    p = p_log.exp()
    return float(torch.where(p > 0, p * (p_log - q_log), torch.zeros_like(p)).sum())


def project_row(new_logits: torch.Tensor, old_logits: torch.Tensor, kl_bound: float):
    """Project one row (V,) of finite logits; returns (log pi, eta, kl_before, kl_after) in float64."""
    a = torch.log_softmax(new_logits.double(), -1)
    b = torch.log_softmax(old_logits.double(), -1)
    kl0 = _kl(a, b)
    if kl0 <= kl_bound:
        return a, 0.0, kl0, kl0
    lo, hi = 0.0, 1.0
    while _kl(_interp(a, b, hi), b) > kl_bound:  # grow the bracket until the bound holds at its upper end
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if _kl(_interp(a, b, mid), b) > kl_bound:
            lo = mid
        else:
            hi = mid
    logp = _interp(a, b, hi)
    return logp, hi, kl0, _kl(logp, b)


def project(new_logits: torch.Tensor, old_logits: torch.Tensor, kl_bound: float):
    """Row by row over (..., V); returns (logp (..., V), eta, kl_before, kl_after (...)) in float64."""
    vocab = new_logits.shape[-1]
    rows = [project_row(n, o, kl_bound) for n, o in zip(new_logits.reshape(-1, vocab), old_logits.reshape(-1, vocab))]
    lead = new_logits.shape[:-1]
    logp = torch.stack([r[0] for r in rows]).reshape(*lead, vocab)
    scalars = [torch.tensor([r[i] for r in rows], dtype=torch.float64).reshape(lead) for i in (1, 2, 3)]
    return (logp, *scalars)


def aggregate(values, mask, agg, max_len=None):
    """The four aggregations, written out per sequence with Python loops."""
    bsz, seq = values.shape
    per_seq, counts = [], []
    for i in range(bsz):
        sel = values[i][mask[i].bool()]
        per_seq.append(sel.sum())
        counts.append(sel.numel())
    total = sum(counts)
    if agg == "token-mean":
        return sum(per_seq) / total if total else values.sum() * 0
    if agg == "seq-mean-token-sum-norm":
        return sum(per_seq) / (bsz * (max_len or seq))
    kept = [(s / c if agg == "seq-mean-token-mean" else s) for s, c in zip(per_seq, counts) if c > 0]
    return sum(kept) / len(kept) if kept else values.sum() * 0


def troll_loss(
    logits,
    old_logits,
    tokens,
    advantages,
    mask,
    *,
    kl_bound=0.05,
    alpha=1.0,
    level="token",
    agg="token-mean",
    max_len=None,
):
    """Dense TROLL loss in float64 over the full vocabulary (no sparsity), for values and finite differences.

    logits, old_logits: (B, T, V); tokens, mask: (B, T); advantages (B,) or (B, T). Returns a 0-dim tensor.
    """
    bsz, seq, _ = logits.shape
    adv = advantages.double()
    adv = adv.unsqueeze(-1).expand(bsz, seq) if adv.dim() == 1 else adv
    logp, _, _, _ = project(logits, old_logits, kl_bound)
    new = torch.log_softmax(logits.double(), -1)
    old = torch.log_softmax(old_logits.double(), -1)
    pg = torch.zeros(bsz, seq, dtype=torch.float64)
    reg = torch.zeros(bsz, seq, dtype=torch.float64)
    for i in range(bsz):
        log_ratio = [float(logp[i, t, tokens[i, t]] - old[i, t, tokens[i, t]]) for t in range(seq)]
        valid = [t for t in range(seq) if mask[i, t]]
        log_s = min(sum(log_ratio[t] for t in valid) / max(len(valid), 1), 10.0)
        for t in range(seq):
            weight = torch.tensor(log_ratio[t] if level == "token" else log_s, dtype=torch.float64).exp()
            pg[i, t] = -adv[i, t] * weight
            p = new[i, t].exp()
            reg[i, t] = (p * (new[i, t] - logp[i, t])).sum()
    return aggregate(pg, mask, agg, max_len) + alpha * aggregate(reg, mask, agg, max_len)
