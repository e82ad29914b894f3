"""Sparse next-token distributions: the few most probable tokens of a large vocabulary (docs/method.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from troll._checks import (
    check_ids,
    check_logits,
    check_lse,
    check_shape,
    check_sparse,
    check_tensor,
)
from troll.categorical.defaults import DELTA, OLD_PREFIX, TOP_K
from troll.categorical.settings import check_delta, check_top_k


@dataclass
class SparseLogProbs:
    """Exact full-vocabulary log-probs at a few ids per row; padded entries have ``mask`` False.

    ids:        (..., K) long token ids (padding holds id 0).
    logp:       (..., K) fp32 log-probs under the full vocabulary (padding holds -inf).
    mask:       (..., K) bool, True for real entries.
    vocab_size: V, needed to spread the unkept mass over the V - |kept| other tokens.
    log_rest:   (...) log of the mass outside the kept ids, or None (then 1 - sum(exp(logp)), computed in fp64).
    """

    ids: torch.Tensor
    logp: torch.Tensor
    mask: torch.Tensor
    vocab_size: int
    log_rest: torch.Tensor | None = None

    def __post_init__(self):
        if not (self.ids.shape == self.logp.shape == self.mask.shape):
            raise ValueError(
                f"SparseLogProbs fields must share one shape, got ids {tuple(self.ids.shape)}, "
                f"logp {tuple(self.logp.shape)}, mask {tuple(self.mask.shape)}."
            )

    def to(self, device) -> SparseLogProbs:
        rest = None if self.log_rest is None else self.log_rest.to(device)
        return SparseLogProbs(self.ids.to(device), self.logp.to(device), self.mask.to(device), self.vocab_size, rest)

    def __getitem__(self, index) -> SparseLogProbs:
        """Index the leading dims only (e.g. a mini-batch of sequences); the K dim is kept whole."""
        index = index if isinstance(index, tuple) else (index,)
        rest = None if self.log_rest is None else self.log_rest[index]
        return SparseLogProbs(self.ids[index], self.logp[index], self.mask[index], self.vocab_size, rest)

    def flatten(self) -> SparseLogProbs:
        """The same distributions as (N, K) rows, N the product of the leading dims."""
        k = self.ids.shape[-1]
        rest = None if self.log_rest is None else self.log_rest.reshape(-1)
        return SparseLogProbs(
            self.ids.reshape(-1, k), self.logp.reshape(-1, k), self.mask.reshape(-1, k), self.vocab_size, rest
        )

    def log_rest_mass(self) -> torch.Tensor:
        """(...) fp64 log of the mass outside the kept ids, from ``log_rest`` or from the kept mass."""
        if self.log_rest is not None:
            return self.log_rest.double()
        kept = self.logp.double().exp().sum(-1)
        return (1 - kept).clamp_min(0).log()

    def token_logp(self, tokens: torch.Tensor) -> torch.Tensor:
        """(...) fp64 log-probs of ``tokens`` (...): the stored value where kept, else an equal share of the unkept
        mass (docs/method.md, the uniform tail). Unchecked: :func:`old_token_logp` is the checked public form."""
        hit = (self.ids == tokens.unsqueeze(-1)) & self.mask
        stored = torch.where(hit, self.logp.double(), 0.0).sum(-1)
        n_tail = (self.vocab_size - self.mask.sum(-1)).double().clamp_min(1)
        return torch.where(hit.any(-1), stored, self.log_rest_mass() - n_tail.log())

    def to_dict(self, prefix: str = OLD_PREFIX) -> dict[str, torch.Tensor]:
        """Plain tensors for a batch container that slices every entry along the leading dims (e.g. verl's DataProto).

        Keys ``{prefix}ids`` (..., K) long, ``{prefix}logp`` (..., K), ``{prefix}mask`` (..., K) bool,
        ``{prefix}log_rest`` (...) (computed from the kept mass when None) and ``{prefix}vocab`` (...) long, V
        repeated on every row so that it survives any slicing. :meth:`from_dict` inverts it.
        """
        lead = self.ids.shape[:-1]
        return {
            f"{prefix}ids": self.ids,
            f"{prefix}logp": self.logp,
            f"{prefix}mask": self.mask,
            f"{prefix}log_rest": self.log_rest_mass().to(self.logp.dtype) if self.log_rest is None else self.log_rest,
            f"{prefix}vocab": torch.full(lead, self.vocab_size, dtype=torch.long, device=self.ids.device),
        }

    @classmethod
    def from_dict(cls, tensors, prefix: str = OLD_PREFIX) -> SparseLogProbs:
        """The :class:`SparseLogProbs` packed by :meth:`to_dict` (any mapping holding its five keys)."""
        names = ("ids", "logp", "mask", "log_rest", "vocab")
        missing = [f"{prefix}{n}" for n in names if f"{prefix}{n}" not in tensors]
        if missing:
            raise KeyError(
                f"from_dict: missing {missing}; the batch must carry what SparseLogProbs.to_dict(prefix={prefix!r}) "
                "wrote (was the old policy captured before the update?)."
            )
        vocab = tensors[f"{prefix}vocab"]
        sizes = vocab.unique().tolist() if vocab.numel() else []
        if len(sizes) != 1:
            raise ValueError(f"from_dict: {prefix}vocab must hold one vocabulary size, got {sizes}.")
        ids, logp, mask = (tensors[f"{prefix}{n}"] for n in names[:3])
        return cls(ids.long(), logp, mask.bool(), int(sizes[0]), tensors[f"{prefix}log_rest"])


def merge_ids(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row union of candidate ids, keeping the first occurrence and the candidates' order.

    ids, mask: (N, M). Returns ``(unique_ids, unique_mask, source)`` of shape (N, M') with M' the largest union
    in the batch; ``source`` is each unique id's position among the M candidates, so callers gather values
    with it (an earlier candidate wins a tie, e.g. the old policy's exact value over a filled-in one).
    """
    n, m = ids.shape
    pos = torch.arange(m, device=ids.device).expand(n, m)
    big = torch.iinfo(torch.int64).max
    key = torch.where(mask, ids.long() * m + pos, big)
    key, order = key.sort(dim=-1)
    sid = key // m
    first = key != big
    first[:, 1:] &= sid[:, 1:] != sid[:, :-1]
    # Compact: first occurrences, in candidate order, to the front; then trim the shared padding.
    src = torch.where(first, order, m + pos)
    src, _ = src.sort(dim=-1)
    width = max(int(first.sum(-1).max()) if n else 0, 1)
    src = src[:, :width]
    keep = src < m
    src = torch.where(keep, src, 0)
    return torch.where(keep, ids.gather(1, src), 0), keep, src


def sparsify(
    logits: torch.Tensor,
    *,
    top_k: int = TOP_K,
    delta: float = DELTA,
    include: torch.Tensor | None = None,
) -> SparseLogProbs:
    """Keep per row the most probable tokens until their mass reaches ``1 - delta`` (at most ``top_k``).

    Args:
        logits:  (..., V) logits, already divided by the sampling temperature. Not differentiated.
        top_k:   the largest number of tokens kept per row by the mass rule.
        delta:   the mass left out, in [0, 1); 0 keeps exactly ``min(top_k, V)`` tokens.
        include: (...) or (..., m) ids always kept (the sampled tokens), on top of the ``top_k``.

    Returns:
        :class:`SparseLogProbs` with (..., K) fields, K the largest kept count in the batch, and ``log_rest`` (...)
        the log of the mass outside the kept ids. Values are exact full-vocabulary log-probs in fp32 (fp64 for fp64
        logits), normalised against the row maximum so that a token at 1 - 1e-12 keeps its 1e-12 of tail.
    """
    check_top_k(top_k)
    check_delta(delta)
    check_logits("logits", logits, scan=False)  # values are checked through the logsumexp below
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.detach().reshape(-1, vocab)
    extra = None if include is None else include_ids(include, lead, vocab)
    with torch.no_grad():
        ids, mask, logp, log_rest = _sparsify_rows(flat, top_k, delta, extra)
    k = ids.shape[-1]
    return SparseLogProbs(
        ids.reshape(*lead, k), logp.reshape(*lead, k), mask.reshape(*lead, k), vocab, log_rest.reshape(lead)
    )


def kept_ids(logits: torch.Tensor, lse: torch.Tensor, top_k: int, delta: float, *, first_k: int = 16, probe: int = 64):
    """Ids (N, k) of the most probable tokens until mass 1 - delta (at most ``top_k``) and their mask.

    logits: (N, V); lse: (N, 1) their logsumexp. Trimmed to the largest kept count in the batch.
    ``topk``'s cost grows with k, so the pass is chosen from the batch: ``probe`` rows spread over it take a
    top-``first_k``; if more than a quarter of them fall short of 1 - delta (flat rows: sampled text at
    temperature 1), every row takes one top-``top_k`` pass. Otherwise (peaked rows) all take the top-``first_k``
    and only the rows that fall short take a second, top-``top_k`` pass (always so with ``probe=0``). Both give
    the same kept sets.
    """
    n = logits.shape[0]
    k = min(top_k, logits.shape[-1])
    k0 = k if delta == 0 else min(k, first_k)
    if k0 < k and n > 0 and probe > 0:
        rows = torch.linspace(0, n - 1, min(n, probe), device=logits.device).long()
        if float(_short(logits[rows].topk(k0, dim=-1).values, lse[rows], delta).double().mean()) > 0.25:
            k0 = k
    top, ids = logits.topk(k0, dim=-1)
    mask = mass_rule(top - lse, delta)
    if k0 < k:
        short = _short(top, lse, delta)
        if bool(short.any()):
            rows = short.nonzero().squeeze(-1)
            top_r, ids_r = logits[rows].topk(k, dim=-1)
            ids = torch.cat([ids, ids.new_zeros(ids.shape[0], k - k0)], -1).index_copy(0, rows, ids_r)
            mask = torch.cat([mask, mask.new_zeros(mask.shape[0], k - k0)], -1)
            mask = mask.index_copy(0, rows, mass_rule(top_r - lse[rows], delta))
    return trim_kept(ids, mask)


def _short(top: torch.Tensor, lse: torch.Tensor, delta: float) -> torch.Tensor:
    """(N,) True where the top tokens' mass (summed in fp64) is short of 1 - delta."""
    return (top.double() - lse.double()).exp().sum(-1) < 1 - delta


def mass_rule(top_logp: torch.Tensor, delta: float) -> torch.Tensor:
    """Keep a token (sorted by probability) while the mass before it is short of 1 - delta; summed in fp64."""
    p = top_logp.double().exp()
    mask = (p.cumsum(-1) - p < 1 - delta) if delta > 0 else torch.ones_like(p, dtype=torch.bool)
    return mask & (top_logp > float("-inf"))


def trim_kept(ids, mask):
    """Trim to the largest kept count; padding holds id 0."""
    width = max(int(mask.sum(-1).max()) if mask.numel() else 0, 1)
    ids, mask = ids[:, :width], mask[:, :width]
    return torch.where(mask, ids, 0), mask


def _sparsify_rows(flat, top_k, delta, extra):
    x = flat.to(torch.float64 if flat.dtype == torch.float64 else torch.float32)
    first, first_id = x.max(dim=-1, keepdim=True)
    # exp(x - max) is 1 at the maximum; summing the others apart keeps log1p exact for peaked rows.
    e = (x - first).exp()
    e.scatter_(-1, first_id, 0.0)
    log_norm = e.sum(-1, keepdim=True).log1p()  # logsumexp(x) - max
    check_lse("logits", first + log_norm)
    ids, mask = kept_ids(x, first + log_norm, top_k, delta)
    if extra is not None:
        ids, mask = torch.cat([ids, extra], -1), torch.cat([mask, torch.ones_like(extra, dtype=torch.bool)], -1)
        ids, mask, _ = merge_ids(ids, mask)
    logp = (x.gather(-1, ids) - first - log_norm).masked_fill(~mask, float("-inf"))
    # What is left in e after removing the kept ids (unique; padding removes nothing) is the rest's mass;
    # the maximum's 1 comes back if a tie left it out of the kept ids.
    e.scatter_add_(-1, ids, torch.where(mask, -e.gather(-1, ids), 0.0))
    max_kept = ((ids == first_id) & mask).any(-1, keepdim=True)
    e.scatter_add_(-1, first_id, (~max_kept).to(e.dtype))
    log_rest = e.sum(-1).log() - log_norm.squeeze(-1)
    return ids, mask, logp, log_rest


def include_ids(include: torch.Tensor, lead: torch.Size, vocab: int) -> torch.Tensor:
    if include.dim() == len(lead):
        include = include.unsqueeze(-1)
    check_shape("include", include[..., 0], tuple(lead), " (the logits' leading dims, optionally plus one more)")
    check_ids("include", include, vocab)
    return include.reshape(-1, include.shape[-1]).long()


def cat_sparse(parts: list[SparseLogProbs], dim: int = 0) -> SparseLogProbs:
    """Concatenate along leading dim ``dim``, padding each part's K to the largest (id 0, logp -inf, mask False).

    All parts must share the vocabulary size and the other leading dims. ``log_rest`` is filled from the kept mass
    for a part that has none, so the result always carries it.
    """
    if not parts:
        raise ValueError("cat_sparse: parts is empty; pass at least one SparseLogProbs.")
    vocab = {p.vocab_size for p in parts}
    if len(vocab) != 1:
        raise ValueError(f"cat_sparse: the parts have different vocab_size {sorted(vocab)}; they must share one.")
    lead = parts[0].ids.dim() - 1
    if not -lead <= dim < lead:
        raise ValueError(f"cat_sparse: dim {dim} is not a leading dim of (..., K) fields with {lead} leading dims.")
    dim = dim % lead
    width = max(p.ids.shape[-1] for p in parts)

    def pad(t, value):
        extra = width - t.shape[-1]
        return t if extra == 0 else torch.cat([t, t.new_full((*t.shape[:-1], extra), value)], -1)

    ids = torch.cat([pad(p.ids, 0) for p in parts], dim)
    logp = torch.cat([pad(p.logp, float("-inf")) for p in parts], dim)
    mask = torch.cat([pad(p.mask, False) for p in parts], dim)
    rest = torch.cat([p.log_rest_mass().to(p.logp.dtype) if p.log_rest is None else p.log_rest for p in parts], dim)
    return SparseLogProbs(ids, logp, mask, vocab.pop(), rest)


def old_token_logp(old: SparseLogProbs | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Old per-token log-probs (B, T) in fp64: the stored value at the sampled id, else its share of the unkept mass.

    ``old`` is a :class:`SparseLogProbs` (B, T, K), or already the per-token log-probs (B, T) (returned detached).
    """
    check_tensor("tokens", tokens)
    if torch.is_tensor(old):
        check_shape("old", old, tuple(tokens.shape), " (one old log-prob per token)")
        return old.detach().double()
    if not isinstance(old, SparseLogProbs):
        raise ValueError(f"old must be a SparseLogProbs (from troll.sparsify) or a tensor, got {type(old).__name__}.")
    check_shape("old.ids", old.ids[..., 0], tuple(tokens.shape), " (old must cover the same positions as tokens)")
    check_sparse(old, old.vocab_size)
    check_ids("tokens", tokens, old.vocab_size)
    return old.token_logp(tokens)
