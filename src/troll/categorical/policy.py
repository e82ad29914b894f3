"""The current policy as the loss sees it (docs/method.md): its logsumexp, its most probable ids, its logits at ids.

Any object with the four members of :class:`CurrentPolicy` can be the current policy: :class:`DenseLogits` over
(N, V) logits here, :class:`troll.categorical.lm_head.ChunkedLMHead` from the LM head's input.
:func:`troll.categorical.sparse_projection.coarse_support` turns one and the old policy into the (|U| + 1)-category
distributions the projection works on, so the support, the projection and the loss are written once.

The dense path costs what a clip loss costs (docs/numerics.md, "The dense path"): the logsumexp is taken in row
blocks (no (N, V) temporary), and its gradient and the gradient of the logits at the support ids are written into
one (N, V) buffer, in place: ``softmax * g_lse`` and then a scatter-add of ``g_at``.

Shapes: N rows, V vocabulary, U ids.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch.autograd.function import once_differentiable

from troll._threads import one_thread
from troll.categorical.projection import compute_dtype
from troll.categorical.sparse import kept_ids

# Row blocks of the dense logsumexp and backward hold about this many elements (1 MB in fp32): cache-sized.
BLOCK_ELEMENTS = 2**18


@runtime_checkable
class CurrentPolicy(Protocol):
    """The current policy over N rows, as :func:`coarse_support` and the loss use it.

    vocab_size: V.
    lse:        (N, 1) the rows' logsumexp, with gradient.
    kept(top_k, delta) -> (ids, mask), (N, k) long and bool: the most probable tokens until mass 1 - delta
                (at most ``top_k``), as :func:`troll.sparsify` keeps them; no gradient.
    at(ids)     -> (N, U) the logits at ``ids`` (N, U), with gradient.
    """

    vocab_size: int

    @property
    def lse(self) -> torch.Tensor: ...

    def kept(self, top_k: int, delta: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    def at(self, ids: torch.Tensor) -> torch.Tensor: ...


def _row_block(vocab: int) -> int:
    return max(1, BLOCK_ELEMENTS // max(vocab, 1))


@torch.no_grad()
def blocked_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """(N, 1) logsumexp of (N, V) ``logits`` in the compute dtype, in row blocks: no (N, V) temporary.

    One thread: a block's operations are too small to split (docs/numerics.md, "Threads")."""
    n, vocab = logits.shape
    dtype = compute_dtype(logits.dtype)
    out = torch.empty((n, 1), dtype=dtype, device=logits.device)
    rows = _row_block(vocab)
    with one_thread():
        for r in range(0, n, rows):
            torch.logsumexp(logits[r : r + rows].to(dtype), dim=-1, keepdim=True, out=out[r : r + rows])
    return out


class _Pending:
    """The gradients of the logits at support ids, held until the logsumexp's backward writes them."""

    def __init__(self):
        self.items: list[tuple[torch.Tensor, torch.Tensor]] = []


class _LseFn(torch.autograd.Function):
    """lse (N, 1) of the logits; its backward writes ``softmax * g_lse`` and every pending ``g_at`` in one buffer.

    Inputs: logits (N, V) any float dtype, lse (N, 1) no grad (already computed), pending :class:`_Pending`.
    """

    @staticmethod
    def forward(ctx, logits, lse, pending):
        ctx.save_for_backward(logits, lse)
        ctx.pending = pending
        ctx.set_materialize_grads(False)
        return lse.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, g_lse):
        with one_thread():  # cache-sized blocks: too small to split across threads (docs/numerics.md, "Threads")
            return _lse_backward(ctx, g_lse)


def _lse_backward(ctx, g_lse):
    """:class:`_LseFn`'s backward: ``softmax * g_lse`` plus every pending ``g_at``, written block by block."""
    logits, lse = ctx.saved_tensors
    items, ctx.pending.items = ctx.pending.items, []
    if not ctx.needs_input_grad[0]:
        return None, None, None
    grad = torch.empty_like(logits)
    n, vocab = logits.shape
    rows = _row_block(vocab)  # each block's sub, exp, mul and scatter run while it sits in cache
    for r in range(0, n, rows):
        blk = slice(r, r + rows)
        out = grad[blk] if logits.dtype == lse.dtype else None
        if g_lse is None:
            z = torch.zeros_like(logits[blk], dtype=lse.dtype) if out is None else out.zero_()
        else:  # d lse / d logits = softmax = exp(logits - lse); exp(-inf) = 0 on masked entries
            z = torch.sub(logits[blk].to(lse.dtype), lse[blk], out=out).exp_().mul_(g_lse[blk])
        for ids, g_at in items:  # d at / d logits: scatter-add, so an id listed twice gets both terms
            z.scatter_add_(-1, ids[blk], g_at[blk])
        if out is None:
            grad[blk] = z
    return grad, None, None


class _AtFn(torch.autograd.Function):
    """Logits at ``ids`` (N, U). Its backward only hands ``g_at`` to the logsumexp's backward, which runs after it
    (``lse`` is an input here, so autograd waits for this node before that one) and writes the one (N, V) gradient.
    """

    @staticmethod
    def forward(ctx, logits, ids, lse, pending):
        ctx.save_for_backward(ids)
        ctx.pending = pending
        ctx.set_materialize_grads(False)
        return logits.gather(-1, ids).to(lse.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_at):
        if g_at is not None:
            (ids,) = ctx.saved_tensors
            ctx.pending.items.append((ids, g_at))
        return None, None, None, None


class DenseLogits:
    """The current policy as dense (N, V) logits: a :class:`CurrentPolicy`.

    logits: (N, V) in any float dtype (bf16 / fp16 are computed in fp32, fp64 stays fp64; never copied whole);
    lse: (N, 1) their logsumexp if the caller has it already (it is then used as given, gradient and all).
    ``lse`` and every ``at(ids)`` share one backward that writes a single (N, V) gradient in place.
    """

    def __init__(self, logits: torch.Tensor, lse: torch.Tensor | None = None):
        self.logits = logits
        self.vocab_size = logits.shape[-1]
        self.dtype = compute_dtype(logits.dtype)
        self._given = lse
        self._lse0 = blocked_logsumexp(logits.detach()) if lse is None else lse.detach()
        self._pending = _Pending()
        self._lse = None

    @property
    def lse(self) -> torch.Tensor:
        if self._given is not None:
            return self._given
        if self._lse is None or (self._lse.grad_fn is None and torch.is_grad_enabled() and self.logits.requires_grad):
            self._lse = _LseFn.apply(self.logits, self._lse0, self._pending)  # (again if first read under no_grad)
        return self._lse

    def kept(self, top_k: int, delta: float):
        with one_thread():  # docs/numerics.md, "Threads"
            return kept_ids(self.logits.detach(), self._lse0, top_k, delta)

    def at(self, ids: torch.Tensor) -> torch.Tensor:
        if self._given is not None or not torch.is_grad_enabled() or not self.logits.requires_grad:
            return self.logits.gather(-1, ids).to(self.dtype)
        return _AtFn.apply(self.logits, ids, self.lse, self._pending)
