"""The old policy from the sampler: the top-K log-probs a generation engine returns, as a :class:`SparseLogProbs`.

TROLL's trust region is around the old policy pi_old = softmax(logits_old / temperature) over the whole vocabulary
(docs/method.md). "recompute" builds it with a no-grad forward of the trainer's pre-update weights on the rollout
batch; "sampler" takes it from the generation that drew the tokens, so the bound holds around the policy that
actually sampled them (which matters when rollouts are stale) and the forward is saved. Three sources:

- HF ``generate``: :class:`troll.integrations.hf.GenerationRecorder` runs :func:`troll.sparsify` on every step's
  logits (exactly the recompute rule, on the generation's own forward).
- vLLM and a ``rollout_func``: per completion position a list of top log-probs with their token ids (vLLM's
  ``logprobs=K``: the K most probable plus the sampled token when it ranks lower). :func:`sparse_from_topk` checks
  them and applies the same kept rule (the most probable until mass 1 - delta, at most top_k, plus the sampled
  token); the rest of the mass is the tail, 1 - sum of the kept probabilities in float64.

docs/trl.md, "The old policy from the sampler", says which sampling settings each source supports and why.
"""

from __future__ import annotations

import math

import torch

from troll.categorical.sparse import SparseLogProbs, mass_rule

OLD_POLICIES = ("recompute", "sampler")
# Log-probs a little above 0 are float rounding of a token at probability 1; more is not a log-prob.
POSITIVE_TOL = 1e-4
# The returned entries' probabilities may add up to 1 plus rounding, not more.
MASS_TOL = 1e-3


def sparse_from_topk(
    logprobs,
    token_ids,
    completion_ids,
    *,
    vocab_size: int,
    top_k: int,
    delta: float,
    source: str = "rollout_func",
    device=None,
) -> SparseLogProbs:
    """The old policy (B, T, K) from per-position top log-probs, T the longest completion.

    Args:
        logprobs:  B sequences x T_i positions x n entries (nested lists or tensors): log-probs of the
            temperature-scaled full-vocabulary distribution (vLLM: ``logprobs_mode="processed_logprobs"`` without
            top-p/top-k/min-p truncation). Entries at -inf are padding.
        token_ids: the same nesting, the entries' token ids (``logprob_token_ids``).
        completion_ids: B lists of T_i sampled ids; each position's entries must include its sampled token.
        vocab_size: V of the trained model; top_k, delta: the kept rule (:func:`troll.sparsify`).
        source: how errors name the fields (e.g. "rollout_func" or "vLLM").

    Positions past a sequence's end have no kept id and all their mass in the tail (they are outside the loss).
    Raises ValueError naming the field and the fix on mismatched shapes, NaN or positive log-probs, ids outside
    the vocabulary, repeated ids, a missing sampled token, fewer than top_k entries (unless their mass already
    reaches 1 - delta) or entries whose probabilities add up to more than one.
    """
    lp, ids, tokens, lengths = _padded(logprobs, token_ids, completion_ids, source)
    real = ~torch.isneginf(lp)
    _check_values(lp, ids, real, vocab_size, source)
    sampled = (ids == tokens.unsqueeze(-1)) & real
    valid = torch.arange(lp.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
    _check_sampled(sampled, valid, source)
    _check_count(lp, real, valid, vocab_size, top_k, delta, source)
    # Sort by probability, keep by the mass rule over the first top_k, and always the sampled token.
    order = lp.argsort(-1, descending=True)
    lp, ids, real, sampled = (t.gather(-1, order) for t in (lp, ids, real, sampled))
    k = min(top_k, lp.shape[-1])
    keep = torch.zeros_like(real)
    keep[..., :k] = mass_rule(lp[..., :k], delta) & real[..., :k]
    keep = (keep | sampled) & valid.unsqueeze(-1)
    width = max(int(keep.sum(-1).max()) if keep.numel() else 0, 1)
    # Kept entries first (stable: still by probability), then trim to the widest row.
    slot = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[..., :width]
    keep, lp, ids = keep.gather(-1, slot), lp.gather(-1, slot), ids.gather(-1, slot)
    kept_mass = torch.where(keep, lp.double().exp(), 0.0).sum(-1)
    log_rest = (1 - kept_mass).clamp_min(0).log()  # -inf when the kept ids hold all the mass
    old = SparseLogProbs(
        torch.where(keep, ids, 0), torch.where(keep, lp, float("-inf")).float(), keep, vocab_size, log_rest.float()
    )
    return old if device is None else old.to(device)


def _padded(logprobs, token_ids, completion_ids, source):
    """(B, T, n) float64 log-probs (-inf padding), (B, T, n) long ids, (B, T) sampled ids, (B,) lengths."""
    names = (f"{source} logprobs", f"{source} logprob_token_ids", "completion_ids")
    if logprobs is None or token_ids is None:
        missing = names[0] if logprobs is None else names[1]
        raise ValueError(
            f"troll_old_policy='sampler' needs {missing} (per completion position the top log-probs and their token "
            "ids), but it is None. Return both from the generation (vLLM: logprobs=K), or set "
            "troll_old_policy='recompute'."
        )
    if not (len(logprobs) == len(token_ids) == len(completion_ids)):
        raise ValueError(
            f"{names[0]}, {names[1]} and completion_ids must hold one entry per sequence, got {len(logprobs)}, "
            f"{len(token_ids)} and {len(completion_ids)} sequences."
        )
    lengths = [len(c) for c in completion_ids]
    for i, (seq_lp, seq_ids, n) in enumerate(zip(logprobs, token_ids, lengths)):
        if len(seq_lp) != n or len(seq_ids) != n:
            raise ValueError(
                f"{names[0]}[{i}] has {len(seq_lp)} positions and {names[1]}[{i}] {len(seq_ids)}, but completion "
                f"{i} has {n} tokens: they must cover the same completion positions (one list of top log-probs per "
                "generated token)."
            )
        for t, (a, b) in enumerate(zip(seq_lp, seq_ids)):
            if len(a) != len(b):
                raise ValueError(
                    f"{names[0]}[{i}][{t}] has {len(a)} entries but {names[1]}[{i}][{t}] has {len(b)}: every "
                    "log-prob needs its token id."
                )
    n = max([len(a) for seq in logprobs for a in seq] + [1])
    b, t = len(lengths), max(lengths + [1])
    lp = torch.full((b, t, n), float("-inf"), dtype=torch.float64)
    ids = torch.zeros((b, t, n), dtype=torch.long)
    tokens = torch.zeros((b, t), dtype=torch.long)
    for i, (seq_lp, seq_ids, seq_tok) in enumerate(zip(logprobs, token_ids, completion_ids)):
        for j, (a, c) in enumerate(zip(seq_lp, seq_ids)):
            if len(a):
                lp[i, j, : len(a)] = torch.tensor([math.nan if x is None else float(x) for x in a], dtype=lp.dtype)
                ids[i, j, : len(c)] = torch.tensor([int(x) for x in c], dtype=torch.long)
        if len(seq_tok):
            tokens[i, : len(seq_tok)] = torch.as_tensor(seq_tok, dtype=torch.long).reshape(-1)
    return lp, ids, tokens, torch.tensor(lengths, dtype=torch.long)


def _where(mask: torch.Tensor) -> str:
    index = tuple(int(x) for x in mask.nonzero()[0])
    return "[" + "][".join(map(str, index)) + "]"


def _check_values(lp, ids, real, vocab_size, source):
    bad = torch.isnan(lp) | torch.isposinf(lp) | (lp > POSITIVE_TOL)
    if bool(bad.any()):
        raise ValueError(
            f"{source} logprobs{_where(bad)} is {float(lp[bad][0])!r}: log-probs must be finite and <= 0 (-inf marks "
            "padding). Return log-probabilities (log_softmax of logits / temperature), not logits, probabilities or "
            "NaN; or set troll_old_policy='recompute'."
        )
    outside = real & ((ids < 0) | (ids >= vocab_size))
    if bool(outside.any()):
        raise ValueError(
            f"{source} logprob_token_ids{_where(outside)} is {int(ids[outside][0])}, outside the model's vocabulary "
            f"[0, {vocab_size}): the generation must use the trained model's tokenizer and vocabulary."
        )
    n = lp.shape[-1]
    if n > 1:
        filler = -torch.arange(1, n + 1).expand_as(ids)
        ranked = torch.where(real, ids, filler).sort(-1).values
        repeated = ((ranked[..., 1:] == ranked[..., :-1]) & (ranked[..., 1:] >= 0)).any(-1)
        if bool(repeated.any()):
            raise ValueError(
                f"{source} logprob_token_ids{_where(repeated)} repeats a token id; each id may appear once per "
                "position (its log-prob would count twice)."
            )
    mass = torch.where(real, lp.exp(), 0.0).sum(-1)
    over = mass > 1 + MASS_TOL
    if bool(over.any()):
        raise ValueError(
            f"{source} logprobs{_where(over)}: the probabilities add up to {float(mass[over][0]):.4g} > 1, so they are "
            "not log-probs of one distribution. Return log_softmax(logits / temperature) at the listed ids."
        )


def _check_sampled(sampled, valid, source):
    missing = valid & ~sampled.any(-1)
    if bool(missing.any()):
        raise ValueError(
            f"{source} logprob_token_ids{_where(missing)} does not contain the sampled token (completion_ids"
            f"{_where(missing)}), so its old log-prob is unknown. Include the sampled token's log-prob at every "
            "position (vLLM does: logprobs=K returns the top K plus the sampled token), or set "
            "troll_old_policy='recompute'."
        )


def _check_count(lp, real, valid, vocab_size, top_k, delta, source):
    """Each position needs min(top_k, V) entries, unless the ones returned already hold mass 1 - delta."""
    count = real.sum(-1)
    mass = torch.where(real, lp.exp(), 0.0).sum(-1)
    short = valid & (count < min(top_k, vocab_size)) & (mass < 1 - delta)
    if bool(short.any()):
        n = int(count[short][0])
        raise ValueError(
            f"{source} returned {n} log-probs at logprobs{_where(short)}, fewer than troll_top_k={top_k}, and "
            f"they hold mass {float(mass[short][0]):.4g} < 1 - troll_delta: the kept rule needs the top troll_top_k. "
            f"Ask the engine for troll_top_k log-probs per token (vLLM: logprobs={top_k} with max_logprobs >= "
            f"{top_k}), or set troll_top_k <= {n}."
        )


def fit_length(old: SparseLogProbs, length: int) -> SparseLogProbs:
    """``old`` (B, T, K) cut or padded along T to ``length`` (padding: no kept id, all mass in the tail).

    TRL pads the completions to the longest one (and to pad_to_multiple_of), a generation records every step.
    """
    b, t, k = old.ids.shape
    rest = old.log_rest_mass().to(old.logp.dtype) if old.log_rest is None else old.log_rest
    if length <= t:
        return SparseLogProbs(old.ids[:, :length], old.logp[:, :length], old.mask[:, :length], old.vocab_size,
                              rest[:, :length])  # fmt: skip
    extra = length - t

    def pad(x, value):
        return torch.cat([x, x.new_full((b, extra, *x.shape[2:]), value)], 1)

    return SparseLogProbs(
        pad(old.ids, 0), pad(old.logp, float("-inf")), pad(old.mask, False), old.vocab_size, pad(rest, 0.0)
    )


def sampled_token_logps(old: SparseLogProbs, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) fp32 log-probs of ``tokens`` under ``old`` where ``mask``, 0 elsewhere: TRL's old_per_token_logps
    without a forward (padding positions are 0, as no loss reads them)."""
    logp = old.token_logp(tokens).float()
    return torch.where(mask.bool(), logp, 0.0)


def sampled_lists(old: SparseLogProbs, completion_ids) -> list[list[float]]:
    """Per sequence, the sampled tokens' log-probs under ``old`` (B, T, K), as the lists TRL's generation returns."""
    tokens = torch.zeros(len(completion_ids), old.ids.shape[1], dtype=torch.long, device=old.ids.device)
    for i, ids in enumerate(completion_ids):
        if len(ids):
            tokens[i, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
    logp = old.token_logp(tokens).tolist()
    return [row[: len(ids)] for row, ids in zip(logp, completion_ids)]
