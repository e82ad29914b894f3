"""The TROLL loss in verl 0.9: a drop-in for verl's ``ppo_loss``, verl's normalisation of it, the stored old policy.

verl's worker installs ``partial(ppo_loss, config=actor_config)`` and calls it on every micro-batch with the
engine's per-token outputs (remove-padding layout, nested per sequence) and the micro-batch. :func:`troll_ppo_loss`
hands every stock loss_mode to verl's ``ppo_loss``. For "troll" / "troll_seq" it reads the current policy the engine
added (the logits, or the final hidden states and the LM head), the old policy the trainer stored
(:func:`old_policy_from_batch`), computes :func:`troll.troll_loss` (:func:`troll.troll_loss_from_hidden`) and scales
it to verl's normalisation over the global mini-batch (:func:`verl_scale`); verl's entropy bonus and KL loss are
added with verl's own helpers, as ``ppo_loss`` adds them. Shapes: B sequences, T response positions, V vocabulary,
H hidden size, K kept ids.
"""

# ruff: noqa: E402  (verl is imported after the version guard)
from __future__ import annotations

from dataclasses import dataclass

import torch

from troll.integrations.verl.config import check_verl_version

check_verl_version()

from verl.trainer.ppo.core_algos import agg_loss, kl_penalty
from verl.utils.metric import AggregationType, Metric
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from troll.categorical.defaults import OLD_PREFIX
from troll.categorical.distributed import gather_lm_head
from troll.categorical.losses import troll_loss, troll_loss_from_hidden
from troll.categorical.sparse import SparseLogProbs
from troll.integrations.verl.config import ROLLOUT_CORRECTION, troll_settings
from troll.output import LossOutput

# The old policy's fields in verl's batch: the keys of SparseLogProbs.to_dict(OLD_PREFIX).
OLD_KEYS = tuple(OLD_PREFIX + name for name in ("ids", "logp", "mask", "log_rest", "vocab"))
# model_output keys the engine adds for the loss (each popped by it, so none stays in the outputs verl keeps per
# micro-batch): the dense LM-head path's current logits at every position, divided by the temperature,
TROLL_LOGITS = "troll_logits"
# the chunked path's final hidden states at every position (the LM head's input; divided by the per-row temperature
# when the rows' temperatures differ), and the head to apply to them (an LMHeadRef).
TROLL_HIDDEN = "troll_hidden"
TROLL_HEAD = "troll_head"


@dataclass(frozen=True)
class LMHeadRef:
    """The LM head module and the temperature its logits are divided by (1.0 where the hidden states already are)."""

    module: torch.nn.Module
    temperature: float


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


def scaled_troll_loss(current, old, tokens, advantages, mask, settings: dict, global_info: dict, head=None):
    """:func:`troll.troll_loss` on a padded verl micro-batch, normalised as verl's ``agg_loss`` normalises.

    current: (B, T, V) logits at the response positions, already divided by the temperature; or, with ``head`` =
    (weight (V, H), bias (V,) or None, temperature), the (B, T, H) hidden states for
    :func:`troll.troll_loss_from_hidden` (the same loss without the logits). old: SparseLogProbs (B, T, K);
    tokens, advantages, mask: (B, T). ``settings`` from :func:`troll_settings`; ``global_info`` is verl's
    ``config.global_batch_info`` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor).
    Note: verl counts every response token; troll drops a token the old policy excludes (a data error counted in
    ``old_excluded_frac``), so with such tokens the two token counts differ by those tokens.
    """
    mask = mask.bool()
    factor, max_len = verl_scale(settings["agg"], mask, **global_info)
    if head is None:
        out = troll_loss(current, old, tokens, advantages, mask, **settings, max_len=max_len)
    else:
        weight, bias, temperature = head
        kwargs = dict(bias=bias, temperature=temperature, max_len=max_len, **settings)
        out = troll_loss_from_hidden(current, weight, old, tokens, advantages, mask, **kwargs)
    return LossOutput(out.loss * factor.to(out.loss), out.metrics)


def _padded(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """A per-response-token field as a (B, length, ...) padded tensor (zeros after each response)."""
    if getattr(tensor, "is_nested", False):
        tensor = tensor.to_padded_tensor(0)
    if tensor.shape[1] < length:
        tensor = torch.nn.functional.pad(tensor, (0, 0) * (tensor.ndim - 2) + (0, length - tensor.shape[1]))
    return tensor[:, :length]


def old_policy_from_batch(data, response_mask: torch.Tensor) -> SparseLogProbs:
    """The stored old policy (B, T, K) from a verl micro-batch whose :data:`OLD_KEYS` fields are padded or nested.

    Nested fields are padded with zeros by tensordict; the padding is re-filled here (logp -inf, mask False) so that
    it is inert, and the vocabulary size is read from the response positions only.
    """
    missing = [key for key in OLD_KEYS if key not in data.keys()]
    if missing:
        raise KeyError(
            f"TROLL loss: the batch has no {missing}; the old policy must be captured in compute_log_prob "
            "(TrollFSDPEngine with the troll_capture flag) and kept in the batch (docs/verl.md)."
        )
    ids, logp, mask, log_rest, vocab = (_padded(data[key], response_mask.shape[1]) for key in OLD_KEYS)
    mask = mask.bool() & response_mask.unsqueeze(-1)
    vocab = vocab[response_mask].unique()
    if vocab.numel() != 1:
        raise ValueError(f"TROLL loss: {OLD_PREFIX}vocab must hold one vocabulary size, got {vocab.tolist()}.")
    logp = torch.where(mask, logp, float("-inf"))
    log_rest = torch.where(response_mask, log_rest, 0.0)
    return SparseLogProbs(ids.long(), logp, mask, int(vocab), log_rest)


def troll_ppo_loss(config, model_output, data, dp_group=None):
    """verl's ``ppo_loss`` for loss_mode "troll"/"troll_seq"; every other loss_mode goes to stock ``ppo_loss``.

    Installed by :func:`troll.integrations.verl.engine.register` where verl installs ``ppo_loss``. Needs the
    engine's :data:`TROLL_LOGITS` (dense) or :data:`TROLL_HIDDEN` and :data:`TROLL_HEAD` (chunked), which it pops
    from ``model_output``, and the captured old policy in ``data``. A batch with verl's rollout-correction weights
    (``rollout_is_weights``) is refused: the TROLL loss has no per-token weight to apply them with.
    """
    settings = troll_settings(config)
    if settings is None:
        return ppo_loss(config, model_output, data, dp_group)
    if "rollout_is_weights" in data.keys():
        raise ValueError(
            "TROLL loss: the batch carries rollout_is_weights (verl's rollout-correction importance weights), which "
            f"the TROLL loss does not apply; set {ROLLOUT_CORRECTION}.rollout_is=null."
        )
    logits, hidden = model_output.pop(TROLL_LOGITS, None), model_output.pop(TROLL_HIDDEN, None)
    head = model_output.pop(TROLL_HEAD, None)
    if logits is None and (hidden is None or head is None):
        raise KeyError(
            f"TROLL loss: model_output has no {TROLL_LOGITS!r} (nor both {TROLL_HIDDEN!r} and {TROLL_HEAD!r}); the "
            "actor must run on TrollFSDPEngine (VERL_USE_EXTERNAL_MODULES=troll.integrations.verl.plugin) with the "
            "troll_logits flag set (docs/verl.md)."
        )
    if hidden is not None and config.entropy_coeff != 0:
        raise ValueError(
            "TROLL loss: an entropy bonus (entropy_coeff != 0) needs the entropy's gradient, which the chunked LM "
            "head does not give; set actor_rollout_ref.actor.troll.lm_head=dense (TrollTrainerMixin does)."
        )
    current = no_padding_2_padding(logits if hidden is None else hidden, data)  # (B, T, V) or (B, T, H)
    info = {key: data[key] for key in ("dp_size", "batch_num_tokens", "global_batch_size")}
    info["loss_scale_factor"] = config.loss_scale_factor
    config.global_batch_info.update(info)
    length = current.shape[1]
    mask, adv, tokens = (_padded(data[k], length) for k in ("response_mask", "advantages", "responses"))
    mask = mask.bool()
    old = old_policy_from_batch(data, mask)
    if hidden is None:
        out = scaled_troll_loss(current, old, tokens, adv, mask, settings, info)
    else:
        with torch.autocast(current.device.type, enabled=False):  # the chunked head computes in fp32
            weight, bias = gather_lm_head(head.module.weight, getattr(head.module, "bias", None))
            lm_head = (weight, bias, head.temperature)
            out = scaled_troll_loss(current, old, tokens, adv, mask, settings, info, head=lm_head)
    summed = data["dp_size"] > 1 or any(info[k] is not None for k in ("batch_num_tokens", "global_batch_size"))
    loss_agg = AggregationType.SUM if summed or config.loss_scale_factor is not None else AggregationType.MEAN
    metrics = {f"troll/{k}": Metric(value=v.item(), aggregation=AggregationType.MEAN) for k, v in out.metrics.items()}
    metrics["actor/pg_loss"] = Metric(value=out.loss.detach().item(), aggregation=loss_agg)
    loss = _add_verl_terms(out.loss, config, model_output, data, mask, metrics, loss_agg)
    return loss, metrics


def _add_verl_terms(loss, config, model_output, data, mask, metrics: dict, loss_agg):
    """``loss`` plus verl's entropy bonus and KL-to-reference loss, exactly as ``ppo_loss`` adds them (same helpers,
    same mask, same metric names)."""
    if model_output.get("entropy") is not None:
        entropy = no_padding_2_padding(model_output["entropy"], data)
        entropy_loss = agg_loss(entropy, mask, config.loss_agg_mode, **config.global_batch_info)
        loss = loss - config.entropy_coeff * entropy_loss
        metrics["actor/entropy_loss"] = Metric(value=entropy_loss.detach().item(), aggregation=loss_agg)
    if config.use_kl_loss:
        if "ref_log_prob" not in data.keys():
            raise KeyError("TROLL loss: use_kl_loss=True needs ref_log_prob in the batch (a reference policy).")
        log_prob = no_padding_2_padding(model_output["log_probs"], data)
        ref = _padded(data["ref_log_prob"], log_prob.shape[1])
        kld = kl_penalty(logprob=log_prob, ref_logprob=ref, kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(kld, mask, config.loss_agg_mode, **config.global_batch_info)
        loss = loss + kl_loss * config.kl_loss_coef
        metrics["kl_loss"] = Metric(value=kl_loss.detach().item(), aggregation=loss_agg)
        metrics["kl_coef"] = config.kl_loss_coef
    return loss
