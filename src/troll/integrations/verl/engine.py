"""verl's FSDP language-model engine with TROLL's outputs, and :func:`register`, which makes verl's workers use it.

:class:`TrollFSDPEngine` overrides two methods of verl 0.9's ``FSDPEngineWithLMHead``: ``prepare_model_inputs``
(what the model is asked for) and ``prepare_model_outputs`` (what is returned per micro-batch). Without the TROLL
flags on a micro-batch (:data:`FLAG_CAPTURE`, :data:`FLAG_LOSS`, set by the trainer) nothing changes. The LM head is
handled by :mod:`troll.integrations.hf`, as in the TRL trainer: :func:`~troll.integrations.hf.head_blocker` and
:func:`~troll.integrations.hf.logits_mismatch` (the probe) decide whether the chunked path reproduces the model, and
:func:`~troll.integrations.hf.sparsify_head` (chunked) or :func:`troll.sparsify` (dense) captures the old policy.
verl concatenates the micro-batches' outputs, so the capture is padded to a fixed K (:func:`capture_width`).
"""

# ruff: noqa: E402  (verl is imported after the version guard)
from __future__ import annotations

import types

import torch

from troll.integrations.verl.config import TROLL, check_verl_version

check_verl_version()

from verl.utils import tensordict_utils as tu
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from troll.categorical.defaults import OLD_PREFIX
from troll.categorical.distributed import gather_lm_head
from troll.categorical.lm_head import ChunkedLMHead
from troll.categorical.sparse import SparseLogProbs, old_token_logp, sparsify
from troll.integrations import hf
from troll.integrations.verl.loss import TROLL_HEAD, TROLL_HIDDEN, TROLL_LOGITS, LMHeadRef, troll_ppo_loss

# Non-tensor flags the trainer sets on a batch and the engine reads on each micro-batch:
FLAG_CAPTURE = "troll_capture"  # {"top_k": k, "delta": d}: compute_log_prob captures the old policy
FLAG_LOSS = "troll_logits"  # True: the update adds what troll_ppo_loss needs
FLAG_LM_HEAD = "troll_lm_head"  # "chunked" or "dense" (absent: dense)
FLAG_LOGPROB_GRAD = "troll_logprob_grad"  # True: the chunked log-probs carry a gradient (verl's KL loss)


def capture_width(top_k: int) -> int:
    """The fixed K of the captured rows: ``top_k`` by the mass rule plus the sampled token.

    verl concatenates the per-micro-batch outputs of ``compute_log_prob``, so every micro-batch must give the same
    K; sparsify's K varies with the batch, so the rows are padded to this width.
    """
    return top_k + 1


def pad_capture(old: SparseLogProbs, top_k: int) -> dict[str, torch.Tensor]:
    """``old`` (N rows) padded to K = :func:`capture_width` kept ids and packed as ``old.to_dict(OLD_PREFIX)``
    (padding: id 0, logp -inf, mask False)."""
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
    return padded.to_dict(OLD_PREFIX)


def capture_rows(logits: torch.Tensor, tokens: torch.Tensor, *, top_k: int, delta: float) -> dict[str, torch.Tensor]:
    """The old sparse policy of (N, V) ``logits`` as per-token tensors with N rows, the sampled ``tokens`` kept.

    logits: (N, V) already divided by the rollout temperature (as in verl's ``prepare_model_outputs``);
    tokens: (N,) the next token of each row (verl's ``input_ids_rmpad_rolled``). Returns :func:`pad_capture`'s dict.
    """
    return pad_capture(sparsify(logits, top_k=top_k, delta=delta, include=tokens), top_k)


def _flag(micro_batch, key: str, default=None):
    return tu.get_non_tensor_data(data=micro_batch, key=key, default=default)


class TrollFSDPEngine(FSDPEngineWithLMHead):
    """FSDPEngineWithLMHead that also returns TROLL's per-token outputs; only the model's inputs and outputs change.

    :data:`FLAG_CAPTURE` in compute_log_prob adds the packed old policy (``SparseLogProbs.to_dict(OLD_PREFIX)``,
    K = top_k + 1 per token); :data:`FLAG_LOSS` in the update adds what the loss needs. :data:`FLAG_LM_HEAD` picks
    how: "chunked" takes the model's final hidden states (with ``output_hidden_states`` in the update, from a hook on
    the backbone in compute_log_prob), asks for the logits of one position only (``logits_to_keep=1``) and computes
    everything from the hidden states and the LM head's weight in vocabulary chunks, never the (tokens, V) logits:
    the old policy, verl's log-probs (and entropy, when asked), and for the loss :data:`TROLL_HIDDEN` and
    :data:`TROLL_HEAD`; with :data:`FLAG_LOGPROB_GRAD` (verl's KL loss) the log-probs carry a gradient. "dense"
    (also when the flag is absent; the trainer sets it from ``troll.lm_head``, whose default is "chunked") takes the
    model's logits, and the loss gets :data:`TROLL_LOGITS`. Remove-padding path only, without Ulysses sequence
    parallelism and fused kernels.
    """

    _troll_last_path = None  # "chunked" or "dense": the LM-head path of the last micro-batch with TROLL flags
    _troll_hidden = None  # the final hidden states of the running no-grad micro-batch (chunked), from the hook
    _troll_keep_hidden = False  # whether the backbone hook keeps them
    _troll_hook = None  # (backbone, hook handle)

    def _troll_flags(self, micro_batch):
        capture, want_loss = _flag(micro_batch, FLAG_CAPTURE), _flag(micro_batch, FLAG_LOSS, False)
        chunked = (capture is not None or want_loss) and (
            _flag(micro_batch, FLAG_LM_HEAD, "dense") == "chunked"
            and not _flag(micro_batch, "calculate_sum_pi_squared", False)
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
        use_rmpad = _flag(micro_batch, "use_remove_padding", True)
        if not use_rmpad or _flag(micro_batch, "use_fused_kernels", False) or self.use_ulysses_sp:
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
        """(head module, weight (V, H), bias or None): the model's LM head, gathered if sharded, and checked.

        :func:`troll.integrations.hf.head_blocker` rules out what the model's structure shows (no linear head, a
        logit transform in its config); the one logit row the model returned must equal the head applied to its
        hidden state (:func:`troll.integrations.hf.logits_mismatch`, on every micro-batch), or the chunked path would
        not reproduce the model (a scale, a soft-cap, a norm after the hidden states).
        """
        head = weight = bias = None
        reason = hf.head_blocker(self.module, sharded=True)  # FSDP2 shards: gathered here
        if reason is None and hidden is None:
            reason = (
                "the model returned no hidden_states (update)"
                if torch.is_grad_enabled()
                else "the backbone (get_decoder()) gave no last_hidden_state to the forward hook (compute_log_prob)"
            )
        if reason is None and getattr(output, "logits", None) is None:
            reason = "the model returned no logits"
        if reason is None:
            head = hf.output_embeddings(self.module)
            weight, bias = gather_lm_head(head.weight, getattr(head, "bias", None))
            vocab, size = output.logits.shape[-1], hidden.shape[-1]
            if tuple(weight.shape) != (vocab, size):
                reason = f"the LM head's weight here has shape {tuple(weight.shape)}, not (V, H) (a sharded weight?)"
            else:
                logits_row = output.logits.reshape(-1, vocab)[-1:]
                reason = hf.logits_mismatch(logits_row, hidden.reshape(-1, size)[-1:], weight, bias)
        if reason is not None:
            raise ValueError(
                f"TrollFSDPEngine: troll.lm_head=chunked: {reason}; set {TROLL}.lm_head=dense for this model."
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
        entropy = _flag(micro_batch, "calculate_entropy", False)
        grad = torch.is_grad_enabled() and _flag(micro_batch, FLAG_LOGPROB_GRAD, False)
        if capture is not None and grad:
            raise NotImplementedError(
                "TrollFSDPEngine: the old policy is captured without gradient (compute_log_prob)."
            )
        with torch.autocast(hidden.device.type, enabled=False):
            if capture is not None:
                old, log_probs, ent = _capture_from_hidden(hidden, tokens, weight, bias, temperature, capture, entropy)
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
        keep = slice(0, hidden.shape[0] - output_args["pad_size"])  # without the packing's pad rows
        extra = {}
        if capture is not None:
            extra.update(pad_capture(old[keep], capture["top_k"]))
        if want_loss:
            extra[TROLL_HIDDEN] = hidden[keep]
        cu_seqlens = micro_batch["input_ids"].offsets()
        model_output.update({k: torch.nested.nested_tensor_from_jagged(v, cu_seqlens) for k, v in extra.items()})
        if want_loss:
            model_output[TROLL_HEAD] = LMHeadRef(module=head, temperature=temperature)
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
        f"TrollFSDPEngine: per-sample temperatures with a biased LM head; set {TROLL}.lm_head=dense."
    )


@torch.no_grad()
def _capture_from_hidden(hidden, tokens, weight, bias, temperature, capture, entropy):
    """(old policy, log-probs of ``tokens``, entropy or None) of every row, from one chunked sparsification.

    :func:`troll.integrations.hf.sparsify_head` with the head already gathered. The old policy keeps the sampled
    token with its exact log-prob, and the first of the two vocabulary passes also gives the entropy, so verl's own
    compute_log_prob outputs cost no third pass.
    """
    out = hf.sparsify_head(
        hidden,
        tokens,
        with_head=lambda fn, *tensors: fn(weight, bias, *tensors),
        temperature=temperature,
        top_k=capture["top_k"],
        delta=capture["delta"],
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
