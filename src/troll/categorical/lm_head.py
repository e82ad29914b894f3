"""TROLL from the LM head's input: hidden states and the output weight, never the (N, V) logits.

The dense path builds logits = hidden @ W.T / temperature, (N, V): 2.5 GB in fp32 for N = 4096 tokens of a
152k vocabulary, and as much again for their gradient. TROLL needs far less of them (docs/method.md): per row the
logsumexp, the few most probable ids, and the logits at the support U (old kept | new kept | sampled). Here they
come from passes over vocabulary chunks of C columns, so memory is O(N x C) + O(N x U) besides the weight's own
gradient:

    scan    (no grad)  one pass: the row maximum, the log-normaliser and the running top-k        -> kept(), lse
    forward            logits at U by dot products with the gathered weight rows (no vocabulary pass)
    backward           one pass that recomputes each chunk's logits: d lse / d logits = softmax, d at / d logits =
                       a scatter onto U; then grad_hidden += dz @ W_c and grad_W_c = dz.T @ hidden

That is the same matmul count as a fused log-prob kernel (TRL's ChunkedLogProbFunction): one forward pass, one
recomputation and two gradient products. :class:`ChunkedLMHead` is a drop-in for
:class:`troll.categorical.policy.DenseLogits`, so the support, the projection and the loss are the dense path's code
(:func:`troll.troll_loss_from_hidden` in :mod:`troll.categorical.losses`). :func:`sparsify_from_hidden` captures the
old policy
the same way, matching :func:`troll.sparsify`.

Shapes: B sequences, T positions, N = B*T rows, H hidden size, V vocabulary, C chunk columns, U support ids.
"""

from __future__ import annotations

import torch

from troll._checks import check_lse, check_number, check_shape, check_tensor
from troll.categorical.defaults import DELTA, TOP_K
from troll.categorical.settings import check_delta, check_top_k
from troll.categorical.sparse import SparseLogProbs, include_ids, mass_rule, merge_ids, trim_kept

# A chunk's logits take about this many elements (64 MB in fp32): C = CHUNK_ELEMENTS // N, at least MIN_CHUNK.
CHUNK_ELEMENTS = 2**24
MIN_CHUNK = 256
# The weight rows gathered for the logits at U are processed in row blocks of about this many elements.
GATHER_ELEMENTS = 2**24
NEG_INF = float("-inf")
# Values are checked through the scan's logsumexp (NaN / inf in hidden, weight or bias reach it): no extra pass.
LOGITS = "logits (hidden @ weight.T + bias) / temperature"


def default_chunk_size(rows: int, vocab: int) -> int:
    """Vocabulary columns per chunk so that one chunk's (N, C) logits hold about CHUNK_ELEMENTS values."""
    return max(1, min(vocab, max(MIN_CHUNK, CHUNK_ELEMENTS // max(rows, 1))))


def head_dtype(*tensors) -> torch.dtype:
    """fp64 if any input is fp64, else fp32 (bf16 / fp16 inputs are computed in fp32, as in the dense path)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _chunk_logits(hidden, weight, bias, temperature, start, end):
    """(N, C) logits of vocabulary columns [start, end): (hidden @ W_c.T + b_c) / temperature, in hidden's dtype."""
    w = weight[start:end].to(hidden.dtype)
    z = hidden @ w.T if bias is None else torch.addmm(bias[start:end].to(hidden.dtype), hidden, w.T)
    return z.div_(temperature)


def _chunks(vocab: int, chunk_size: int):
    return ((s, min(s + chunk_size, vocab)) for s in range(0, vocab, chunk_size))


@torch.no_grad()
def _scan(hidden, weight, bias, temperature, chunk_size, top_k, entropy=False):
    """One pass: row maximum m (N, 1), log_norm = logsumexp - m (N, 1), the top-k logits and ids (N, k), and the
    entropy (N, 1) if asked (else None).

    The sum of exp(z - m) is kept *without* the maximum's own 1, so log_norm = log1p(S) stays exact for a row at
    1 - 1e-12 (as in :func:`troll.sparsify`): when a chunk raises the maximum, the old maximum joins S as one more
    term. The top-k is sorted by logit, merged chunk by chunk. The entropy is log_norm - W / (1 + S) with
    W = sum exp(z - m) (z - m), carried like S (a new maximum m' turns W into exp(m - m') (W + (m - m') (1 + S))).
    """
    n = hidden.shape[0]
    m = hidden.new_full((n, 1), NEG_INF)
    s = hidden.new_zeros((n, 1))
    w = hidden.new_zeros((n, 1)) if entropy else None
    top = hidden.new_empty((n, 0))
    top_ids = torch.zeros((n, 0), dtype=torch.long, device=hidden.device)
    for start, end in _chunks(weight.shape[0], chunk_size):
        z = _chunk_logits(hidden, weight, bias, temperature, start, end)
        cm, ca = z.max(-1, keepdim=True)
        finite = cm > NEG_INF
        e = (z - torch.where(finite, cm, 0.0)).exp_()
        ez = _row_dot(e, z) if entropy else None
        cs = e.scatter_(-1, ca, 0.0).sum(-1, keepdim=True)  # the chunk's terms other than its maximum
        del e
        if entropy:  # sum e (z - cm) = sum e z - cm (1 + cs)
            w = _merge_entropy_sum(w, s, m, ez - torch.where(finite, cm, 0.0) * (1 + cs), cs, cm, finite)
        up = cm > m
        s_up = (s + 1) * (m - cm).exp() + cs
        s_keep = torch.where(finite, s + (cm - torch.where(finite, m, 0.0)).exp() * (1 + cs), s)
        s = torch.where(up, s_up, s_keep)
        m = torch.maximum(m, cm)
        if top_k > 0:
            ct, ci = z.topk(min(top_k, end - start), dim=-1)
            top, order = torch.cat([top, ct], -1).topk(min(top_k, top.shape[-1] + ct.shape[-1]), dim=-1)
            top_ids = torch.cat([top_ids, ci + start], -1).gather(-1, order)
    log_norm = s.log1p()
    return m, log_norm, top, top_ids, None if w is None else log_norm - w / (1 + s)


def _row_dot(e, z):
    """(N, 1) sum over the row of e * z, as a batched dot (no (N, C) temporary); 0 * -inf counts as 0."""
    out = torch.bmm(e.unsqueeze(1), z.unsqueeze(-1)).view(-1, 1)
    bad = out.isnan().view(-1)
    if bad.any():  # rows with -inf logits (masked ids): there e = 0
        out[bad] = (e[bad] * z[bad].nan_to_num(neginf=0.0)).sum(-1, keepdim=True)
    return out


def _merge_entropy_sum(w, s, m, cw, cs, cm, finite):
    """W of the rows so far (maximum m, S) merged with a chunk's (cw, cs, maximum cm), in the larger maximum's frame."""
    seen = m > NEG_INF
    d_up = torch.where(seen, m - cm, 0.0)  # used where the chunk raises the maximum (cm > m)
    w_up = cw + torch.where(seen, d_up.exp() * (w + d_up * (1 + s)), 0.0)
    d_keep = torch.where(finite & seen, cm - m, 0.0)  # used where it does not (cm <= m)
    w_keep = torch.where(finite, w + d_keep.exp() * (cw + d_keep * (1 + cs)), w)
    return torch.where(cm > m, w_up, w_keep)


def _gather_logits(hidden, weight, bias, ids, temperature):
    """(N, U) logits at ``ids`` (N, U) from the gathered weight rows, in row blocks: O(N U H) work, no V pass."""
    n, u = ids.shape
    out = hidden.new_empty((n, u))
    rows = max(1, GATHER_ELEMENTS // max(u * hidden.shape[1], 1))
    for r in range(0, n, rows):
        blk = ids[r : r + rows]
        w = weight[blk].to(hidden.dtype)  # (r, U, H)
        z = torch.bmm(w, hidden[r : r + rows].unsqueeze(-1)).squeeze(-1)
        if bias is not None:
            z += bias[blk].to(hidden.dtype)
        out[r : r + rows] = z / temperature
    return out


class _LMHeadFn(torch.autograd.Function):
    """(lse (N, 1), logits at ids (N, U)) of hidden @ W.T / temperature, with a chunked, recomputing backward.

    Inputs: hidden (N, H), weight (V, H), bias (V,) or None, ids (N, U) long, temperature, chunk_size, and
    optionally the lse (N, 1) of the same inputs already computed by :func:`_scan` (then it is reused, not redone).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, temperature, chunk_size, lse=None):
        h = hidden.to(head_dtype(hidden, weight))
        if lse is None:
            m, log_norm, _, _, _ = _scan(h, weight, bias, temperature, chunk_size, 0)
            lse = m + log_norm
        lse = lse.to(h.dtype)
        at = _gather_logits(h, weight, bias, ids, temperature)
        ctx.save_for_backward(hidden, weight, bias, ids, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None: its work is skipped
        return lse.clone(), at

    @staticmethod
    def backward(ctx, g_lse, g_at):
        hidden, weight, bias, ids, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if g_lse is None and g_at is None:
            return (None,) * 7
        t = ctx.temperature
        h = hidden.to(lse.dtype)
        grad_h = torch.zeros_like(h) if need_h else None
        grad_w = weight.new_empty(weight.shape, dtype=h.dtype) if need_w else None  # every chunk writes its rows
        grad_b = bias.new_empty(bias.shape, dtype=h.dtype) if need_b else None
        for start, end in _chunks(weight.shape[0], ctx.chunk_size):
            if g_lse is not None:  # d lse / d z = softmax(z)
                dz = _chunk_logits(h, weight, bias, t, start, end).sub_(lse).exp_().mul_(g_lse)
            else:
                dz = h.new_zeros((h.shape[0], end - start))
            if g_at is not None:  # d at / d z: a scatter onto the ids that fall in this chunk (others add 0)
                local = ids - start
                inside = (local >= 0) & (local < end - start)
                dz.scatter_add_(-1, local.clamp(0, end - start - 1), torch.where(inside, g_at, 0.0))
            dz.div_(t)
            w = weight[start:end].to(h.dtype)
            if need_h:
                grad_h.addmm_(dz, w)
            if need_w:
                torch.mm(dz.T, h, out=grad_w[start:end])
            if need_b:
                grad_b[start:end] = dz.sum(0)
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
        )


class ChunkedLMHead:
    """The current policy as ``hidden @ weight.T (+ bias) / temperature`` without the (N, V) logits.

    A :class:`troll.categorical.policy.CurrentPolicy` like :class:`troll.categorical.policy.DenseLogits`:

        hidden: (N, H); weight: (V, H); bias: (V,) or None; chunk_size: C vocabulary columns a pass
        (default: about 2**24 / N).

    ``kept`` runs the no-grad scan once; the first ``at(ids)`` makes the one autograd call that returns both the
    logits at ``ids`` and ``lse`` (reusing the scan's logsumexp), so its backward is a single chunked pass.
    """

    def __init__(self, hidden, weight, bias=None, temperature=1.0, chunk_size=None, entropy=False):
        self.hidden, self.weight, self.bias, self.temperature = hidden, weight, bias, float(temperature)
        self.vocab_size = weight.shape[0]
        self.chunk_size = chunk_size or default_chunk_size(hidden.shape[0], self.vocab_size)
        self._scanned = None  # (lse, top logits, top ids) of the no-grad scan, and its k
        self._lse = None
        self._want_entropy = entropy
        self.entropy = None  # (N,) no grad, set by the scan when asked for: the metric costs no extra pass

    def _stats(self, top_k: int):
        if self._scanned is None or self._scanned[-1] < top_k:
            h = self.hidden.detach().to(head_dtype(self.hidden, self.weight))
            bias = None if self.bias is None else self.bias.detach()
            w = self.weight.detach()
            m, log_norm, top, ids, ent = _scan(h, w, bias, self.temperature, self.chunk_size, top_k, self._want_entropy)
            check_lse(LOGITS, m + log_norm)
            if ent is not None:
                self.entropy = ent.squeeze(-1)
            self._scanned = (m + log_norm, top, ids, top_k)
        return self._scanned

    @property
    def lse(self) -> torch.Tensor:
        """(N, 1) logsumexp with gradient (from the same autograd call as the first :meth:`at`)."""
        if self._lse is None:
            self.at(torch.zeros((self.hidden.shape[0], 0), dtype=torch.long, device=self.hidden.device))
        return self._lse

    def kept(self, top_k: int, delta: float):
        """(ids, mask) (N, k) of the most probable tokens until mass 1 - delta, the rule of
        ``troll.categorical.sparse``."""
        k = min(top_k, self.vocab_size)
        lse, top, ids, _ = self._stats(k)
        return trim_kept(ids[:, :k], mass_rule(top[:, :k] - lse, delta))

    def at(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, U) logits at ``ids`` with gradient to hidden, weight and bias."""
        lse0 = self._stats(0)[0]
        lse, vals = _LMHeadFn.apply(
            self.hidden, self.weight, self.bias, ids.long(), self.temperature, self.chunk_size, lse0
        )
        if self._lse is None:
            self._lse = lse
        return vals


def check_head(hidden, weight, bias, temperature, lead_dims=None):
    """Validate hidden (..., H), weight (V, H), bias (V,) and the temperature (shapes; values: ``check_lse``)."""
    for name, t in (("hidden", hidden), ("weight", weight)):
        check_tensor(name, t)
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {type(t).__name__}.")
    if lead_dims is not None and hidden.dim() != lead_dims + 1:
        raise ValueError(f"hidden must be (B, T, H), got shape {tuple(hidden.shape)}.")
    if weight.dim() != 2 or weight.shape[0] < 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight must be (V, H) with V >= 2 and H = {hidden.shape[-1]} (hidden's last dim), got shape "
            f"{tuple(weight.shape)}; pass lm_head.weight, not its transpose."
        )
    vocab = weight.shape[0]
    if bias is not None:
        check_shape("bias", bias, (vocab,), " (V,) from weight")
    check_number("temperature", temperature, hint="; use the sampling temperature (1.0 if none)")
    return vocab


def check_chunk_size(chunk_size) -> None:
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive integer or None (automatic), got {chunk_size!r}.")


@torch.no_grad()
def sparsify_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    top_k: int = TOP_K,
    delta: float = DELTA,
    include: torch.Tensor | None = None,
    chunk_size: int | None = None,
    return_entropy: bool = False,
) -> SparseLogProbs | tuple[SparseLogProbs, torch.Tensor]:
    """:func:`troll.sparsify` of ``(hidden @ weight.T + bias) / temperature`` in two chunked no-grad passes.

    Args:
        hidden: (..., H); weight: (V, H); bias: (V,) or None. ``top_k``, ``delta``, ``include``: as in sparsify.
        return_entropy: also return each row's entropy (...,), from the first pass at no extra pass.

    Pass 1 (:func:`_scan`) finds each row's maximum, log-normaliser and top-k, hence the kept ids; pass 2 gathers
    the logits at the kept ids and sums exp(z - max) over the *unkept* ids directly, so ``log_rest`` is exact for a
    row at 1 - 1e-12 instead of 1 minus the kept mass. Returns (..., K) fields in fp32 (fp64 for fp64 inputs).
    """
    check_top_k(top_k)
    check_delta(delta)
    check_chunk_size(chunk_size)
    vocab = check_head(hidden, weight, bias, temperature)
    lead = hidden.shape[:-1]
    extra = None if include is None else include_ids(include, lead, vocab)
    h = hidden.detach().reshape(-1, hidden.shape[-1]).to(head_dtype(hidden, weight))
    chunk = chunk_size or default_chunk_size(h.shape[0], vocab)
    w, b = weight.detach(), None if bias is None else bias.detach()

    m, log_norm, top, ids, ent = _scan(h, w, b, temperature, chunk, min(top_k, vocab), return_entropy)
    check_lse(LOGITS, m + log_norm)
    ids, mask = trim_kept(ids, mass_rule(top - m - log_norm, delta))
    if extra is not None:
        ids, mask = torch.cat([ids, extra], -1), torch.cat([mask, torch.ones_like(extra, dtype=torch.bool)], -1)
        ids, mask, _ = merge_ids(ids, mask)
    x, rest = _kept_and_rest(h, w, b, temperature, chunk, ids, mask, m)
    logp = (x - m - log_norm).masked_fill(~mask, NEG_INF)
    log_rest = rest.log() - log_norm.squeeze(-1)
    k = ids.shape[-1]
    sparse = SparseLogProbs(
        ids.reshape(*lead, k), logp.reshape(*lead, k), mask.reshape(*lead, k), vocab, log_rest.reshape(lead)
    )
    return (sparse, ent.reshape(lead)) if return_entropy else sparse


def _kept_and_rest(h, w, b, temperature, chunk, ids, mask, m):
    """Pass 2: logits at the kept ``ids`` (N, K) and sum over the other ids of exp(z - m) (N,)."""
    n = h.shape[0]
    x = h.new_zeros(ids.shape)
    rest = h.new_zeros(n)
    for start, end in _chunks(w.shape[0], chunk):
        c = end - start
        z = _chunk_logits(h, w, b, temperature, start, end)
        local = ids - start
        inside = (local >= 0) & (local < c)
        x = torch.where(inside, z.gather(-1, local.clamp(0, c - 1)), x)
        # exp(z - m) with a spare zero column: kept ids outside this chunk (or padding) are zeroed there.
        e = h.new_empty((n, c + 1))
        torch.sub(z, m, out=e[:, :c]).exp_()
        e[:, c] = 0.0
        e.scatter_(-1, torch.where(inside & mask, local, c), 0.0)
        rest += e.sum(-1)
    return x, rest
