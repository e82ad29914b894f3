"""Float64 dense reference implementations, written for clarity rather than speed.

They follow the equations of docs/method.md literally (eta, not s = 1/(1 + eta); plain bisection, not Newton) so
that the tests and the benchmarks compare the fast paths against something computed a different way.
"""

from __future__ import annotations

import math

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


def kept_set(logp_row: torch.Tensor, top_k: int, delta: float) -> list[int]:
    """The kept ids of one row of log-probs: by probability while the mass before is short of 1 - delta, <= top_k."""
    order = sorted(range(logp_row.numel()), key=lambda j: -float(logp_row[j]))
    kept, before = [], 0.0
    for j in order[:top_k]:
        if delta > 0 and before >= 1 - delta:
            break
        kept.append(j)
        before += float(logp_row[j].exp())
    return kept


def renormalized_row(new_logits, old_logits, token: int, *, top_k: int, delta: float, fill: float):
    """The paper's sparse representation of one position (tail="renormalize"), written out: (ids, a, b) in float64.

    Each policy keeps its own set (the rule of :func:`kept_set`, plus the sampled ``token``); the support is their
    union; a policy's kept ids carry its probabilities divided by their sum, the other support ids ``fill``; both
    are then renormalised over the support.
    """
    a_full = torch.log_softmax(new_logits.double(), -1)
    b_full = torch.log_softmax(old_logits.double(), -1)
    new_kept = set(kept_set(a_full, top_k, delta)) | {token}
    old_kept = set(kept_set(b_full, top_k, delta)) | {token}
    ids = sorted(new_kept | old_kept)

    def side(full, kept):
        norm = torch.logsumexp(full[sorted(kept)], -1)
        values = torch.stack([full[j] - norm if j in kept else full.new_tensor(math.log(fill)) for j in ids])
        return torch.log_softmax(values, -1)

    return ids, side(a_full, new_kept), side(b_full, old_kept)


def troll_loss_renormalized(
    logits, old_logits, tokens, advantages, mask, *, kl_bound=0.05, alpha=1.0, top_k=64, delta=1e-5, fill=1e-12
):
    """Token-level, token-mean TROLL loss with the paper's sparse representation, position by position (float64)."""
    bsz, seq, _ = logits.shape
    adv = advantages.double()
    adv = adv.unsqueeze(-1).expand(bsz, seq) if adv.dim() == 1 else adv
    total, count = logits.new_zeros((), dtype=torch.float64), 0
    for i in range(bsz):
        for t in range(seq):
            if not mask[i, t]:
                continue
            tok = int(tokens[i, t])
            ids, a, b = renormalized_row(logits[i, t], old_logits[i, t], tok, top_k=top_k, delta=delta, fill=fill)
            logp, _, _, _ = project_row(a, b, kl_bound)
            at = ids.index(tok)
            pg = -adv[i, t] * (logp[at] - b[at]).exp()
            reg = (a.exp() * (a - logp)).sum()
            total, count = total + pg + alpha * reg, count + 1
    return total / max(count, 1)
