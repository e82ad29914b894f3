"""TROLL for verl 0.9 (https://github.com/volcengine/verl): the loss, the old-policy capture and the engine hook.

The pieces (docs/verl.md has the recipe and what is tested): the loss (:func:`troll_ppo_loss`, a drop-in for
verl's ``ppo_loss``), the old-policy capture in the engine (:class:`TrollFSDPEngine`, remove-padding path, no
sequence parallelism; by default the LM head in vocabulary chunks from the final hidden states, never the
(tokens, V) logits: ``troll.lm_head`` in the actor config), :func:`register`, which makes verl's workers use
both, and the trainer mixin (:class:`TrollTrainerMixin`), which sets the TROLL batch flags and keeps the
captured old policy that verl's ``_compute_old_log_prob`` would drop. The entry point is
``python -m troll.integrations.verl_main``. Tested on CPU through verl's real TrainingWorker, FSDP2 engine and
RayPPOTrainer methods (1 and 2 processes); not run in Ray, with a rollout engine, or on a GPU.

Importing this module checks the installed verl against :data:`SUPPORTED_VERL` and fails with a clear message
outside it.
"""

from __future__ import annotations

import types
import warnings
from dataclasses import dataclass, field

import torch

from troll.integrations._verl_config import (
    OLD_PREFIX,
    SUPPORTED_VERL,
    TROLL_KEYS,
    TROLL_LOSS_MODES,
    _get,
    check_verl_version,
    troll_lm_head,
    troll_settings,
)

check_verl_version()

from verl.trainer.ppo.core_algos import agg_loss, kl_penalty  # noqa: E402  (after the version guard)
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.metric import AggregationType, Metric  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402
from verl.workers.engine.base import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402
from verl.workers.utils.padding import no_padding_2_padding  # noqa: E402

from troll.distributed import gather_lm_head  # noqa: E402
from troll.integrations import hf  # noqa: E402
from troll.integrations._verl_glue import capture_rows, pad_capture, troll_loss_verl  # noqa: E402
from troll.lm_head import ChunkedLMHead, sparsify_from_hidden  # noqa: E402
from troll.sparse import (
    SparseLogProbs,  # noqa: E402
    old_token_logp,  # noqa: E402
)

__all__ = [
    "OLD_PREFIX",
    "SUPPORTED_VERL",
    "TROLL_KEYS",
    "TROLL_HEAD",
    "TROLL_HIDDEN",
    "TROLL_LOGITS",
    "TROLL_LOSS_MODES",
    "TrollActorGroup",
    "TrollFSDPActorConfig",
    "TrollFSDPEngine",
    "TrollTrainerMixin",
    "check_verl_version",
    "old_policy_from_batch",
    "old_policy_to_padded",
    "register",
    "troll_lm_head",
    "troll_ppo_loss",
    "troll_settings",
]

# model_output keys for the loss (each popped by it, so none stays in the outputs verl keeps per micro-batch):
# the dense LM-head path's current logits at every position, divided by the temperature,
TROLL_LOGITS = "troll_logits"
# the chunked path's final hidden states at every position (the LM head's input; divided by the per-row temperature
# when the rows' temperatures differ), and the head to apply to them (_HeadRef: module and temperature).
TROLL_HIDDEN = "troll_hidden"
TROLL_HEAD = "troll_head"
_FIELDS = ("ids", "logp", "mask", "log_rest", "vocab")


def _padded(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """A per-response-token field as a (B, length, ...) padded tensor (zeros after each response)."""
    if getattr(tensor, "is_nested", False):
        tensor = tensor.to_padded_tensor(0)
    if tensor.shape[1] < length:
        tensor = torch.nn.functional.pad(tensor, (0, 0) * (tensor.ndim - 2) + (0, length - tensor.shape[1]))
    return tensor[:, :length]


def old_policy_from_batch(data, response_mask: torch.Tensor, prefix: str = OLD_PREFIX) -> SparseLogProbs:
    """The stored old policy (B, T, K) from a verl micro-batch whose ``{prefix}*`` fields are padded or nested.

    Nested fields are padded with zeros by tensordict; the padding is re-filled here (logp -inf, mask False) so that
    it is inert, and the vocabulary size is read from the response positions only.
    """
    missing = [prefix + name for name in _FIELDS if prefix + name not in data.keys()]
    if missing:
        raise KeyError(
            f"TROLL loss: the batch has no {missing}; the old policy must be captured in compute_log_prob "
            "(TrollFSDPEngine with the troll_capture flag) and kept in the batch (docs/verl.md)."
        )
    t = {name: _padded(data[prefix + name], response_mask.shape[1]) for name in _FIELDS}
    mask = t["mask"].bool() & response_mask.unsqueeze(-1)
    vocab = t["vocab"][response_mask].unique()
    if vocab.numel() != 1:
        raise ValueError(f"TROLL loss: {prefix}vocab must hold one vocabulary size, got {vocab.tolist()}.")
    logp = torch.where(mask, t["logp"], float("-inf"))
    log_rest = torch.where(response_mask, t["log_rest"], 0.0)
    return SparseLogProbs(t["ids"].long(), logp, mask, int(vocab), log_rest)


def troll_ppo_loss(config, model_output, data, dp_group=None):
    """verl's ``ppo_loss`` for loss_mode "troll"/"troll_seq"; every other loss_mode goes to stock ``ppo_loss``.

    Install with ``partial(troll_ppo_loss, config=actor_config)`` where verl installs ``ppo_loss``. Needs
    ``model_output[TROLL_LOGITS]`` (from :class:`TrollFSDPEngine`) and the captured old policy in ``data``.
    Normalised over the global mini-batch exactly as verl's ``agg_loss`` (see ``_verl_glue.verl_scale``).
    """
    settings = troll_settings(config)
    if settings is None:
        return ppo_loss(config, model_output, data, dp_group)
    logits, hidden = model_output.pop(TROLL_LOGITS, None), model_output.pop(TROLL_HIDDEN, None)
    head = model_output.pop(TROLL_HEAD, None)
    if logits is None and (hidden is None or head is None):
        raise KeyError(
            f"TROLL loss: model_output has no {TROLL_LOGITS!r} (nor both {TROLL_HIDDEN!r} and {TROLL_HEAD!r}); the "
            "actor must run on TrollFSDPEngine (VERL_USE_EXTERNAL_MODULES=troll.integrations.verl_plugin) with the "
            "troll_logits flag set (docs/verl.md)."
        )
    if hidden is not None and config.entropy_coeff != 0:
        raise ValueError(
            "TROLL loss: an entropy bonus (entropy_coeff != 0) needs the entropy's gradient, which the chunked LM "
            "head does not give; set actor_rollout_ref.actor.troll.lm_head=dense (TrollTrainerMixin does)."
        )
    current = no_padding_2_padding(logits if hidden is None else hidden, data)  # (B, T, V) or (B, T, H)
    info = {
        "dp_size": data["dp_size"],
        "batch_num_tokens": data["batch_num_tokens"],
        "global_batch_size": data["global_batch_size"],
        "loss_scale_factor": config.loss_scale_factor,
    }
    config.global_batch_info.update(info)
    length = current.shape[1]
    mask, adv, tokens = (_padded(data[k], length) for k in ("response_mask", "advantages", "responses"))
    mask = mask.bool()
    old = old_policy_from_batch(data, mask)
    if hidden is None:
        out = troll_loss_verl(current, old, tokens, adv, mask, settings, info)
    else:
        with torch.autocast(current.device.type, enabled=False):  # the chunked head computes in fp32
            weight, bias = gather_lm_head(head.module.weight, getattr(head.module, "bias", None))
            head = (current, weight, bias, head.temperature)
            out = troll_loss_verl(None, old, tokens, adv, mask, settings, info, head=head)
    summed = data["dp_size"] > 1 or any(info[k] is not None for k in ("batch_num_tokens", "global_batch_size"))
    summed = summed or config.loss_scale_factor is not None
    metrics = {f"troll/{k}": Metric(value=v.item(), aggregation=AggregationType.MEAN) for k, v in out.metrics.items()}
    loss_agg = AggregationType.SUM if summed else AggregationType.MEAN
    metrics["actor/pg_loss"] = Metric(value=out.loss.detach().item(), aggregation=loss_agg)
    loss = out.loss
    # verl's entropy bonus and KL-to-reference loss, added exactly as ppo_loss adds them (same helpers, same mask)
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
    return loss, metrics


class _HeadRef(types.SimpleNamespace):
    """The LM head module and the temperature its logits are divided by (1.0 where the hidden states already are)."""


class TrollFSDPEngine(FSDPEngineWithLMHead):
    """FSDPEngineWithLMHead that also returns TROLL's per-token outputs; only the model's inputs and outputs change.

    Non-tensor flags on the micro-batch select what is added (nothing without them, so stock runs are unchanged):
    ``troll_capture={"top_k": k, "delta": d}`` in compute_log_prob adds the packed old policy
    (``SparseLogProbs.to_dict(OLD_PREFIX)``, K = top_k + 1 per token), and ``troll_logits=True`` in the update adds
    what the loss needs. ``troll_lm_head`` picks how: "chunked" takes the model's final hidden states (with
    ``output_hidden_states`` in the update, from a hook on the backbone in compute_log_prob), asks for the logits of
    one position only (``logits_to_keep=1``) and computes everything from the hidden states and the LM head's weight
    in vocabulary chunks, never the (tokens, V) logits: the old policy, verl's
    log-probs (and entropy, when asked), and for the loss :data:`TROLL_HIDDEN` and :data:`TROLL_HEAD`; with
    ``troll_logprob_grad`` (verl's KL loss) the log-probs carry a gradient. "dense" (also when the flag is absent;
    the mixin sets it from ``troll.lm_head``, whose default is "chunked") takes the model's logits, and the loss gets
    :data:`TROLL_LOGITS`. Remove-padding path only, without Ulysses sequence
    parallelism and fused kernels.
    """

    _troll_last_path = None  # "chunked" or "dense": the LM-head path of the last micro-batch with TROLL flags
    _troll_hidden = None  # the final hidden states of the running no-grad micro-batch (chunked), from the hook
    _troll_keep_hidden = False  # whether the backbone hook keeps them
    _troll_hook = None  # (backbone, hook handle)

    def _troll_flags(self, micro_batch):
        capture = tu.get_non_tensor_data(data=micro_batch, key="troll_capture", default=None)
        want_loss = tu.get_non_tensor_data(data=micro_batch, key="troll_logits", default=False)
        chunked = (capture is not None or want_loss) and (
            tu.get_non_tensor_data(data=micro_batch, key="troll_lm_head", default="dense") == "chunked"
            and not tu.get_non_tensor_data(data=micro_batch, key="calculate_sum_pi_squared", default=False)
        )
        return capture, want_loss, chunked

    def prepare_model_inputs(self, micro_batch):
        model_inputs, output_args = super().prepare_model_inputs(micro_batch)
        chunked = self._troll_flags(micro_batch)[2]
        self._troll_hidden, self._troll_keep_hidden = None, False
        if chunked:
            self._troll_check_layout(micro_batch)
            model_inputs.update(logits_to_keep=1)
            if torch.is_grad_enabled():
                # The update: the hidden states must be an output of the model's forward, so that FSDP2 unshards the
                # root unit's parameters (the final norm) for the backward through them; autograd saves every
                # layer's output for the backward anyway (with verl's activation offload, the tuple keeps them on
                # the device until the loss has run).
                model_inputs.update(output_hidden_states=True)
            else:
                # compute_log_prob: every layer's output would outlive the forward, and the transformers versions
                # verl 0.9 allows cannot select the last one alone; a hook keeps just the last.
                self._troll_hook_backbone()
                self._troll_keep_hidden = True
        return model_inputs, output_args

    def _troll_hook_backbone(self) -> None:
        """A forward hook on the backbone that keeps its ``last_hidden_state`` (the LM head's input) when asked."""
        getter = getattr(self.module, "get_decoder", None)
        backbone = getter() if getter is not None else getattr(self.module, "base_model", None)
        if backbone is None or (self._troll_hook is not None and self._troll_hook[0] is backbone):
            return

        def keep(module, args, output):
            if self._troll_keep_hidden:
                self._troll_hidden = getattr(output, "last_hidden_state", None)
                self._troll_keep_hidden = False

        self._troll_hook = (backbone, backbone.register_forward_hook(keep))

    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        capture, want_loss, chunked = self._troll_flags(micro_batch)
        if chunked:
            return self._troll_outputs_from_hidden(output, output_args, micro_batch, capture, want_loss)
        extra = {}
        if capture is not None or want_loss:
            self._troll_last_path = "dense"
            logits, tokens = self._troll_logits(output, output_args, micro_batch)
            if capture is not None:
                extra.update(capture_rows(logits.detach(), tokens, top_k=capture["top_k"], delta=capture["delta"]))
            if want_loss:
                extra[TROLL_LOGITS] = logits
            cu_seqlens = micro_batch["input_ids"].offsets()
            extra = {k: torch.nested.nested_tensor_from_jagged(v, cu_seqlens) for k, v in extra.items()}
        model_output = super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
        model_output.update(extra)
        return model_output

    def _troll_check_layout(self, micro_batch) -> None:
        use_rmpad = tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True)
        fused = tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False)
        if not use_rmpad or fused or self.use_ulysses_sp:
            raise NotImplementedError(
                "TrollFSDPEngine supports use_remove_padding=True without fused kernels and without Ulysses "
                "sequence parallelism only."
            )

    def _troll_logits(self, output, output_args, micro_batch):
        """(total_nnz, V) logits / temperature and the (total_nnz,) next tokens, packing padding removed."""
        self._troll_check_layout(micro_batch)
        if getattr(output, "logits", None) is None:
            raise ValueError("TrollFSDPEngine: the model returned no logits; TROLL needs a linear LM head.")
        logits = output.logits.squeeze(0)  # (total_nnz + pad, V)
        logits = logits / output_args["temperature_rmpad"].reshape(-1, 1).to(logits.dtype)
        pad = output_args["pad_size"]
        tokens = output_args["input_ids_rmpad_rolled"].reshape(-1)
        if pad:
            logits, tokens = logits[:-pad], tokens[:-pad]
        return logits, tokens

    def _troll_head(self, output, hidden):
        """(head module, weight, bias): the model's linear LM head, checked against the one logit row it returned."""
        head = hf.output_embeddings(self.module)
        weight = getattr(head, "weight", None)
        if weight is None:
            reason = "the model has no linear LM head (get_output_embeddings() with a weight)"
        elif hidden is None:
            reason = (
                "the model returned no hidden_states (update)"
                if torch.is_grad_enabled()
                else "the backbone (get_decoder()) gave no last_hidden_state to the forward hook (compute_log_prob)"
            )
        elif getattr(output, "logits", None) is None:
            reason = "the model returned no logits"
        else:
            reason = hf.logit_transform(getattr(self.module, "config", None))
        if reason is None:
            weight, bias = gather_lm_head(weight, getattr(head, "bias", None))
            if weight.dim() != 2 or tuple(weight.shape) != (output.logits.shape[-1], hidden.shape[-1]):
                reason = f"the LM head's weight here has shape {tuple(weight.shape)}, not (V, H) (a sharded weight?)"
        if reason is not None:
            raise ValueError(
                f"TrollFSDPEngine: troll.lm_head=chunked: {reason}; set actor_rollout_ref.actor.troll.lm_head=dense "
                "for this model."
            )
        # The model also returned the logits of its last position: they must be hidden @ weight.T + bias, or the
        # chunked path would not reproduce the model (a logit scale, a soft-cap, a norm after the hidden states).
        last = hidden.reshape(-1, hidden.shape[-1])[-1:]
        with torch.no_grad():  # under the forward's autocast, as the model's own head
            expected = torch.nn.functional.linear(last, weight, bias).float()
        got = output.logits.detach().reshape(-1, output.logits.shape[-1])[-1:].float()
        error = float((got - expected).abs().max())
        if not error <= hf.PROBE_TOL * (float(expected.abs().max()) + 1):
            raise ValueError(
                f"TrollFSDPEngine: the model's logits are not last_hidden_state @ lm_head.weight.T + bias (max "
                f"deviation {error:.3g}); set actor_rollout_ref.actor.troll.lm_head=dense for this model."
            )
        return head, weight, bias

    def _troll_outputs_from_hidden(self, output, output_args, micro_batch, capture, want_loss):
        """verl's model outputs plus TROLL's, from the final hidden states and the LM head in vocabulary chunks."""
        self._troll_last_path = "chunked"
        hidden, self._troll_hidden = self._troll_hidden, None
        if hidden is None and getattr(output, "hidden_states", None) is not None:
            hidden = output.hidden_states[-1]
        head, weight, bias = self._troll_head(output, hidden)
        hidden, temperature = _scaled_hidden(hidden.squeeze(0), output_args, bias)  # (total_nnz + pad, H)
        tokens = output_args["input_ids_rmpad_rolled"].reshape(-1)
        entropy = tu.get_non_tensor_data(data=micro_batch, key="calculate_entropy", default=False)
        grad = torch.is_grad_enabled() and tu.get_non_tensor_data(micro_batch, "troll_logprob_grad", False)
        if capture is not None and grad:
            raise NotImplementedError(
                "TrollFSDPEngine: the old policy is captured without gradient (compute_log_prob)."
            )
        with torch.autocast(hidden.device.type, enabled=False):
            if capture is not None:
                old, log_probs, ent = _capture_from_hidden(hidden, weight, bias, temperature, tokens, capture, entropy)
            else:
                with torch.set_grad_enabled(grad):
                    rows = ChunkedLMHead(
                        hidden if grad else hidden.detach(), weight, bias, temperature, entropy=entropy
                    )
                    log_probs = (rows.at(tokens.unsqueeze(-1)) - rows.lse).squeeze(-1)
                old, ent = None, rows.entropy
        # verl's fused-kernel layout: (1, tokens) log-probs and entropy instead of logits, so verl's own code unpads
        # and nests them exactly as it does for its fused kernels.
        fused = types.SimpleNamespace(log_probs=log_probs.unsqueeze(0), entropy=ent.unsqueeze(0) if entropy else None)
        tu.assign_non_tensor(micro_batch, use_fused_kernels=True)
        try:
            model_output = super().prepare_model_outputs(fused, output_args, micro_batch, None)
        finally:
            tu.assign_non_tensor(micro_batch, use_fused_kernels=False)
        pad = output_args["pad_size"]
        keep = slice(0, hidden.shape[0] - pad)  # without the packing's pad rows
        extra = {}
        if capture is not None:
            extra.update(pad_capture(old[keep], capture["top_k"]))
        if want_loss:
            extra[TROLL_HIDDEN] = hidden[keep]
        cu_seqlens = micro_batch["input_ids"].offsets()
        model_output.update({k: torch.nested.nested_tensor_from_jagged(v, cu_seqlens) for k, v in extra.items()})
        if want_loss:
            model_output[TROLL_HEAD] = _HeadRef(module=head, temperature=temperature)
        return model_output


def _scaled_hidden(hidden, output_args, bias):
    """(hidden, temperature) such that the logits / verl's per-row temperatures are (hidden @ W.T + b) / temperature.

    One temperature over the real rows (verl pads the packing rows' temperatures with 1): the hidden states as they
    are. Per-sample temperatures: each row divided by its own, and 1.0 (exact only without a bias).
    """
    temps = output_args["temperature_rmpad"].reshape(-1)
    real = temps[: temps.shape[0] - output_args["pad_size"]]
    if real.numel() == 0 or bool((real == real[0]).all()):
        return hidden, float(real[0]) if real.numel() else 1.0
    if bias is None:  # logits / t = (hidden / t) @ weight.T
        return hidden / temps.unsqueeze(-1).to(hidden.dtype), 1.0
    raise NotImplementedError(
        "TrollFSDPEngine: per-sample temperatures with a biased LM head; set "
        "actor_rollout_ref.actor.troll.lm_head=dense."
    )


@torch.no_grad()
def _capture_from_hidden(hidden, weight, bias, temperature, tokens, capture, entropy):
    """(old policy, log-probs of ``tokens``, entropy or None) of every row, from one chunked sparsification.

    The old policy keeps the sampled token with its exact log-prob, and the first of the two vocabulary passes also
    gives the entropy, so verl's own compute_log_prob outputs cost no third pass.
    """
    out = sparsify_from_hidden(
        hidden,
        weight,
        bias=bias,
        temperature=temperature,
        top_k=capture["top_k"],
        delta=capture["delta"],
        include=tokens,
        return_entropy=bool(entropy),
    )
    old, ent = out if entropy else (out, None)
    return old, old_token_logp(old, tokens).to(old.logp.dtype), ent  # the sampled token is kept: its stored value


def register(backends=("fsdp", "fsdp2"), devices=("cuda", "npu")) -> None:
    """Make verl build :class:`TrollFSDPEngine` for language models and install :func:`troll_ppo_loss`.

    ``EngineRegistry.register`` asserts on a second registration of a key, so verl's own entry cannot be replaced
    through it; this writes the registry's table directly (verl 0.9.x layout, checked by the version guard). The
    worker (``verl.workers.engine_workers``) installs ``partial(ppo_loss, config=actor_config)`` by the module-level
    name ``ppo_loss``; rebinding that name makes it install :func:`troll_ppo_loss`, which hands every stock
    loss_mode to verl's ``ppo_loss`` unchanged. The engine adds outputs only when the batch carries the TROLL flags.
    """
    import verl.workers.engine_workers as engine_workers

    table = EngineRegistry._engines.setdefault("language_model", {})
    for backend in backends:
        for device in devices:
            table.setdefault(backend, {})[device] = TrollFSDPEngine
    engine_workers.ppo_loss = troll_ppo_loss


def old_policy_to_padded(output, batch_td, prefix: str = OLD_PREFIX) -> dict[str, torch.Tensor]:
    """The captured old policy of a ``compute_log_prob`` output as padded (B, T_resp, K) / (B, T_resp) tensors.

    ``output``: the worker's returned TensorDict (nested (B, j, ...) per-token entries over prompt + response, as
    the engine returns them); ``batch_td``: the no-padding batch it was computed on. This is the step a trainer
    must add next to verl's conversion of ``log_probs`` into ``old_log_probs`` (docs/verl.md: verl's
    ``_compute_old_log_prob`` keeps only the outputs it names).
    """
    keys = [prefix + name for name in _FIELDS]
    missing = [k for k in keys if k not in output.keys()]
    if missing:
        raise KeyError(f"compute_log_prob returned no {missing}: was the troll_capture flag set on the batch?")
    return {k: no_padding_2_padding(output[k], batch_td) for k in keys}


class TrollActorGroup:
    """A proxy for the trainer's ``actor_rollout_wg`` that sets the TROLL flags and keeps the capture's output.

    Every attribute other than ``compute_log_prob`` and ``update_actor`` goes to the wrapped worker group. A
    ``compute_log_prob`` call for the reference policy (verl's ``no_lora_adapter`` flag, where the LoRA actor is its
    own reference) is passed through untouched: nothing is captured there.
    """

    def __init__(self, group, capture: dict, lm_head: str = "dense", logprob_grad: bool = False):
        self._group, self._capture, self.last = group, capture, None
        self._lm_head, self._logprob_grad = lm_head, logprob_grad

    def __getattr__(self, name):
        return getattr(self._group, name)

    def compute_log_prob(self, batch_td):
        if tu.get_non_tensor_data(batch_td, "no_lora_adapter", False):
            return self._group.compute_log_prob(batch_td)
        tu.assign_non_tensor(batch_td, troll_capture=self._capture, troll_lm_head=self._lm_head)
        output = self._group.compute_log_prob(batch_td)
        self.last = (output, batch_td)
        return output

    def update_actor(self, batch_td):
        flags = {"troll_logits": True, "troll_lm_head": self._lm_head, "troll_logprob_grad": self._logprob_grad}
        tu.assign_non_tensor(batch_td, **flags)
        return self._group.update_actor(batch_td)


def _chunked_blocker(actor) -> str | None:
    """Why the actor config rules out the chunked LM head, or None."""
    if float(_get(actor, "entropy_coeff", 0) or 0) != 0:
        return "an entropy bonus (entropy_coeff != 0) needs the entropy's gradient, which the chunked head lacks"
    if _get(actor, "strategy") == "fsdp":
        return (
            "strategy=fsdp (FSDP1, flattened parameters) is not tested with the chunked LM head (verl's FSDP1 engine "
            "cannot run without a GPU); set actor_rollout_ref.actor.strategy=fsdp2 for the chunked head"
        )
    return None


class TrollTrainerMixin:
    """Put before verl's ``RayPPOTrainer`` (``class T(TrollTrainerMixin, RayPPOTrainer)``) to train with TROLL.

    Three overrides, each calling verl's method first:

    - ``init_workers`` wraps ``actor_rollout_wg`` in :class:`TrollActorGroup` (the TROLL batch flags);
    - ``_compute_old_log_prob`` adds the captured ``troll_old_*`` fields, padded to (B, T_resp, K), to the DataProto
      verl returns (verl keeps only the outputs it names, and would drop them);
    - ``_update_actor`` logs the loss's ``troll/*`` metrics under ``troll/`` (verl prefixes every actor metric
      with ``actor/``).

    :class:`troll.integrations.verl_main.TrollRayPPOTrainer` is this mixin on verl 0.9's ``RayPPOTrainer``.
    """

    def init_workers(self):
        super().init_workers()
        self._troll_wrap_workers()

    def _troll_wrap_workers(self) -> None:
        actor = self.config.actor_rollout_ref.actor
        settings = troll_settings(actor)
        if settings is not None and not isinstance(self.actor_rollout_wg, TrollActorGroup):
            capture = {"top_k": settings["top_k"], "delta": settings["delta"]}
            lm_head = troll_lm_head(actor)
            reason = _chunked_blocker(actor) if lm_head == "chunked" else None
            if reason is not None:
                warnings.warn(f"troll.lm_head=chunked falls back to dense (full logits): {reason}.", stacklevel=2)
                lm_head = "dense"
            logprob_grad = bool(_get(actor, "use_kl_loss", False))  # verl's KL loss differentiates the log-probs
            self.actor_rollout_wg = TrollActorGroup(self.actor_rollout_wg, capture, lm_head, logprob_grad)

    def _compute_old_log_prob(self, batch):
        old, mfu = super()._compute_old_log_prob(batch)
        group = self.actor_rollout_wg
        if isinstance(group, TrollActorGroup):
            if group.last is None:
                raise RuntimeError("TROLL: _compute_old_log_prob ran without compute_log_prob; nothing was captured.")
            output, batch_td = group.last
            group.last = None
            for key, value in old_policy_to_padded(output, batch_td).items():
                old.batch[key] = value
        return old, mfu

    def _update_actor(self, batch):
        output = super()._update_actor(batch)
        metrics = output.meta_info.get("metrics")
        if metrics:
            prefix = "actor/troll/"
            output.meta_info["metrics"] = {
                (k[len("actor/") :] if k.startswith(prefix) else k): v for k, v in metrics.items()
            }
        return output


@dataclass
class TrollFSDPActorConfig(FSDPActorConfig):
    """verl's FSDPActorConfig with a ``troll`` section (kl_bound, alpha, top_k, delta; optional lm_head).

    verl builds the actor config dataclass from Hydra and rejects unknown keys, so
    ``+actor_rollout_ref.actor.troll.*`` alone fails; select this class with
    ``actor_rollout_ref.actor._target_=troll.integrations.verl.TrollFSDPActorConfig``.
    """

    troll: dict = field(default_factory=dict)
