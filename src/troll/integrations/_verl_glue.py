"""The verl plug-in's tensor adapters that need no verl: capture rows and verl's loss normalisation.

verl 0.9 keeps per-token engine outputs as (total_nnz, ...) rows (remove-padding layout) and aggregates the
policy loss over the *global* mini-batch (``agg_loss`` with ``dp_size``, ``batch_num_tokens``,
``global_batch_size``, ``loss_scale_factor``). The math stays in :func:`troll.sparsify` and
:func:`troll.troll_loss`; these functions only change the layout and the normalisation.
"""

from __future__ import annotations

import torch

from troll.batch import LossOutput
from troll.integrations._verl_config import OLD_PREFIX
from troll.losses import troll_loss, troll_loss_from_hidden
from troll.sparse import SparseLogProbs, sparsify


def capture_width(top_k: int) -> int:
    """The fixed K of the captured rows: ``top_k`` by the mass rule plus the sampled token.

    verl concatenates the per-micro-batch outputs of ``compute_log_prob``, so every micro-batch must give the same
    K; sparsify's K varies with the batch, so the rows are padded to this width.
    """
    return top_k + 1


def capture_rows(logits: torch.Tensor, tokens: torch.Tensor, *, top_k: int, delta: float, prefix: str = OLD_PREFIX):
    """The old sparse policy of (N, V) ``logits`` as per-token tensors with N rows, the sampled ``tokens`` kept.

    logits: (N, V) already divided by the rollout temperature (as in verl's ``prepare_model_outputs``);
    tokens: (N,) the next token of each row (verl's ``input_ids_rmpad_rolled``). Returns
    ``SparseLogProbs.to_dict(prefix)`` with K = :func:`capture_width` (padding: id 0, logp -inf, mask False).
    """
    return pad_capture(sparsify(logits, top_k=top_k, delta=delta, include=tokens), top_k, prefix)


def pad_capture(old: SparseLogProbs, top_k: int, prefix: str = OLD_PREFIX) -> dict[str, torch.Tensor]:
    """``old`` (N rows) padded to K = :func:`capture_width` kept ids and packed as ``old.to_dict(prefix)``."""
    pad = capture_width(top_k) - old.ids.shape[-1]
    if pad < 0:  # cannot happen: sparsify keeps at most top_k + len(include) ids
        raise RuntimeError(f"pad_capture: sparsify kept {old.ids.shape[-1]} ids, more than top_k + 1.")
    padded = SparseLogProbs(
        torch.nn.functional.pad(old.ids, (0, pad), value=0),
        torch.nn.functional.pad(old.logp, (0, pad), value=float("-inf")),
        torch.nn.functional.pad(old.mask, (0, pad), value=False),
        old.vocab_size,
        old.log_rest,
    )
    return padded.to_dict(prefix)


def verl_scale(
    agg: str, mask: torch.Tensor, *, dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None
) -> tuple[torch.Tensor, int | None]:
    """``(factor, max_len)`` with ``factor * troll.aggregate(v, mask, agg, max_len=max_len)`` equal to verl's
    ``agg_loss(v, mask, agg, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)``.

    troll's aggregate normalises over the micro-batch; verl's over the global mini-batch and times ``dp_size``
    (FSDP averages gradients over ranks). mask: (B, T) bool.
    """
    count = mask.sum(-1)
    nonempty = (count > 0).sum()
    dp = float(dp_size)
    if agg == "token-mean":
        if batch_num_tokens is None and dp_size > 1:
            raise ValueError("verl_scale: token-mean needs the global batch_num_tokens when dp_size > 1.")
        total = count.sum() if batch_num_tokens is None else torch.as_tensor(batch_num_tokens)
        return count.sum().clamp_min(1) / total.clamp_min(1) * dp, None
    if global_batch_size is None and dp_size > 1:
        raise ValueError(f"verl_scale: {agg} needs the global_batch_size when dp_size > 1.")
    seqs = nonempty if global_batch_size is None else torch.as_tensor(global_batch_size)
    if agg == "seq-mean-token-sum-norm":
        max_len = int(mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return torch.as_tensor(float(mask.shape[0])) / seqs.clamp_min(1) * dp, max_len
    return nonempty.clamp_min(1) / seqs.clamp_min(1) * dp, None


def troll_loss_verl(logits, old, tokens, advantages, mask, settings: dict, global_info: dict, head=None) -> LossOutput:
    """:func:`troll.troll_loss` on a padded verl micro-batch, normalised as verl's ``agg_loss`` normalises.

    logits: (B, T, V) at the response positions, already divided by the temperature, or None with ``head`` =
    (hidden (B, T, H), weight (V, H), bias (V,) or None, temperature) for :func:`troll.troll_loss_from_hidden`
    (the same loss without the logits); old: SparseLogProbs (B, T, K);
    tokens, advantages, mask: (B, T). ``settings`` from :func:`troll_settings`; ``global_info`` is verl's
    ``config.global_batch_info`` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor).
    Note: verl counts every response token; troll drops a token the old policy excludes (a data error counted in
    ``old_excluded_frac``), so with such tokens the two token counts differ by those tokens.
    """
    mask = mask.bool()
    factor, max_len = verl_scale(settings["agg"], mask, **global_info)
    if head is None:
        out = troll_loss(logits, old, tokens, advantages, mask, **settings, max_len=max_len)
    else:
        hidden, weight, bias, temperature = head
        kwargs = dict(bias=bias, temperature=temperature, max_len=max_len, **settings)
        out = troll_loss_from_hidden(hidden, weight, old, tokens, advantages, mask, **kwargs)
    return LossOutput(out.loss * factor.to(out.loss), out.metrics)
