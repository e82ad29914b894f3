"""TROLL in TRL's GRPOTrainer: ``loss_type="troll"`` and ``"troll_seq"`` next to TRL's own loss types.

Generation, rewards, advantages, buffering, checkpointing and logging are TRL's; every TRL loss type ("dapo", "grpo",
"dr_grpo", "bnpo", "cispo", ..., with either importance-sampling level) runs through TRL's own ``_compute_loss``, so
TROLL and clipping share one code path. How the TROLL loss types depart from TRL's clipped objective:

- Old policy (docs/method.md, "Where the old policy comes from"). When a rollout batch feeds more than one optimiser
  step (steps_per_generation > gradient_accumulation_steps, or num_iterations > 1; TRL's own criterion for computing old
  log-probs), the batch's old policy is captured while TRL scores it: the pre-update weights at the sampling
  temperature, sparsified to the top tokens of each completion position plus the sampled one, stored in the batch as
  ``SparseLogProbs.to_dict()`` (``troll_old_*`` tensors with the batch dim first), so that TRL's shuffling and
  splitting slice them along with the rest. With the chunked head the capture reads the final hidden states of TRL's
  own no-grad forward for its old log-probs (a forward hook on the backbone), so a rollout batch costs one no-grad
  forward, as with TRL's losses; the dense head runs a second one. Otherwise old = current, and the loss sparsifies
  its own (detached) logits: the projection is then the identity, as it should be.
- Current policy. By default (``troll_lm_head="chunked"``) from the final hidden states and the LM head's weight in
  vocabulary chunks (:func:`troll.troll_loss_from_hidden`, :func:`troll.sparsify_from_hidden`), never the (B, T, V)
  logits; ``"dense"`` takes the model's full logits of the completion positions. Both divide by the temperature.
  TRL's fused LM head returns only the sampled tokens' log-probs, not enough for a projection.
- Hidden states. The model's own forward (through DDP or any wrapper, so gradient hooks stay armed) with
  ``output_hidden_states=-1, logits_to_keep=1``: the last hidden state, which transformers ties to the output
  after the final norm (the LM head's input), and the logits of one position only. The LM head's parameters are
  then used directly: they are the same Parameters, so their gradients (a tied embedding's too) accumulate and are
  reduced as usual; under FSDP2 a sharded head is all-gathered in the loss call, its gradient reduce-scattered
  back; under DeepSpeed ZeRO-3 the loss runs as the head module's own forward call, where ZeRO-3 gathers it (see
  docs/trl.md). The chunked path falls back to "dense", with a warning, where it cannot be exact: FSDP1 (the head's
  weight is flattened and sharded outside the forward), a DTensor outside FSDP2, no linear output
  embeddings, a config that rescales or soft-caps the logits (Gemma's final_logit_softcapping, logit_scale, ...),
  or a probe forward whose logits are not last-hidden-state @ weight.T + bias (checked once, on 4 tokens).
- No clipping: TRL's ``epsilon``, ``epsilon_high`` and ``delta`` do not apply.
- The KL a TRL loss type reaches (``troll_measure_kl=True``): the old sparse policy is captured as for TROLL, and at
  each optimiser step a backbone hook keeps the final hidden states of TRL's own forward in ``_compute_loss``; from
  them, without gradient, KL(pi || pi_old) over TROLL's sparse support is logged under TROLL's keys for the KL
  before projection. TRL's loss, gradients and sampling are untouched (bit for bit).
- Normalisation. "troll" aggregates token-mean, the normalisation of TRL's default "dapo" (token sum over the number
  of loss tokens in the global accumulated batch); "troll_seq" seq-mean-token-mean, as TRL's "grpo" (the GSPO setup).
  Each is scaled for gradient accumulation and processes exactly as TRL scales that loss type, so at ratio 1 "troll"
  equals "dapo" and "troll_seq" equals "grpo" with importance_sampling_level="sequence", in value and gradient.
  ``troll_agg`` picks another aggregation (seq-mean-token-sum-norm uses max_completion_length, as "dr_grpo").
- Metrics go to TRL's ``_metrics`` (hence to any ``report_to``) under ``troll/``, e.g. ``troll/kl_after/max``,
  reduced over processes (max/min as such, the rest weighted by loss tokens) and over the logging window (a max
  stays a max); TRL's ``entropy`` is logged too.
- The model card names TROLL and cites it beside GRPO.

Where the old policy comes from (recomputed, or recorded by the sampler) is the mixin of
:mod:`troll.integrations.trl.capture`; this module holds the loss, the LM-head path and the metrics.

TRL internals this trainer relies on, and how an upgrade is checked: docs/trl.md, "Upgrading TRL"; the test
tests/integrations/trl/test_trl_contract.py pins each one.

Not supported with the TROLL loss types (rejected by the config): beta != 0, the entropy bonus, top-entropy and
off-policy masking, the vLLM importance-sampling correction; at construction: MoE auxiliary losses.
Multimodal inputs are rejected at the first forward.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from trl import GRPOConfig, GRPOTrainer

from troll.categorical.defaults import TROLL_LOSSES, troll_agg, troll_level
from troll.categorical.distributed import is_fsdp2_model, with_lm_head
from troll.categorical.lm_head import ChunkedLMHead, sparsify_from_hidden
from troll.categorical.losses import sparse_kl_metrics, troll_loss, troll_loss_from_hidden
from troll.categorical.policy import DenseLogits
from troll.categorical.sparse import cat_sparse, sparsify
from troll.citation import TROLL_ARXIV, TROLL_BIBTEX, TROLL_TITLE
from troll.integrations import hf
from troll.integrations.sampler import sampled_token_logps
from troll.integrations.trl.capture import OldPolicyCapture, sequence
from troll.integrations.trl.config import TrollGRPOConfig, check_trl_version
from troll.output import LossOutput

# The model card's method and citation (TRL writes the card from these attributes), TROLL's beside TRL's GRPO.
TROLL_PAPER = {"title": TROLL_TITLE, "id": TROLL_ARXIV, "citation": TROLL_BIBTEX}


class TrollGRPOTrainer(OldPolicyCapture, GRPOTrainer):
    """:class:`trl.GRPOTrainer` with the TROLL loss types; a drop-in replacement taking the same arguments.

    Overrides three private TRL methods, each pinned by tests/integrations/trl/test_trl_contract.py:
    ``_generate_and_score_completions`` (captures the old policy with the batch), ``_get_per_token_logps_and_entropies``
    (the capture rides on TRL's own no-grad scoring forward) and ``_compute_loss`` (TROLL loss types; anything else goes
    to TRL). Extension points: :meth:`_troll_capture_old` (where the old policy comes from), :meth:`_troll_compute_loss`
    (how the current policy's loss is computed), :meth:`_troll_head_hidden` with :meth:`_troll_with_head` (chunked) and
    :meth:`_troll_logits` (dense). :attr:`troll_lm_head` says which LM-head path is in use.
    """

    _tag_names = ["trl", "grpo", "troll"]

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, *pargs, **kwargs):
        check_trl_version()
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "") or "model"
            args = TrollGRPOConfig(output_dir=f"{name.split('/')[-1]}-TROLL")
        if args.loss_type in TROLL_LOSSES and not isinstance(args, TrollGRPOConfig):
            raise TypeError(
                f"loss_type={args.loss_type!r} needs a TrollGRPOConfig (it carries TROLL's hyper-parameters), got "
                f"{type(args).__name__}. Build the config with troll.integrations.trl.TrollGRPOConfig(...)."
            )
        self._troll_head_mode = None  # resolved on first use by troll_lm_head
        self._troll_pending = None  # old-policy chunks collected during TRL's scoring forward (a list while armed)
        self._troll_sampled = None  # while a rollout batch is generated with troll_old_policy="sampler": its source
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        if getattr(self.args, "troll_old_policy", "recompute") == "sampler" and (
            self._troll_enabled or self._troll_measuring
        ):
            self._troll_check_sampler()
        if self._troll_enabled and self.aux_loss_enabled:
            raise ValueError(
                f"loss_type={self.loss_type!r} does not support the MoE load-balancing auxiliary loss yet; set "
                "router_aux_loss_coef=0.0 in the config."
            )
        if self._troll_enabled:  # the model card TRL writes: TROLL, citing it and GRPO
            self._name = f"TROLL ({self.loss_type}, GRPO with a KL trust-region projection)"
            self._paper = {**TROLL_PAPER, "citation": TROLL_PAPER["citation"] + "\n\n" + GRPOTrainer._paper["citation"]}

    @property
    def _troll_enabled(self) -> bool:
        return self.loss_type in TROLL_LOSSES

    @property
    def _troll_measuring(self) -> bool:
        """A TRL loss type whose KL to the captured old policy is logged (``troll_measure_kl``)."""
        return not self._troll_enabled and getattr(self.args, "troll_measure_kl", False) is True

    def _troll_agg(self) -> str:
        """The token aggregation: troll_agg, else the loss type's default
        (:func:`troll.categorical.defaults.troll_agg`)."""
        return troll_agg(self.loss_type, self.args.troll_agg)

    def _troll_needs_old(self) -> bool:
        """Whether a rollout batch feeds more than one optimiser step (TRL's criterion for old log-probs)."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self.args.gradient_accumulation_steps % generate_every != 0

    # ------------------------------------------------------------------------------------------ capture

    def _generate_and_score_completions(self, inputs):
        wanted = (self._troll_enabled or self._troll_measuring) and self.model.training
        sampler = wanted and self._troll_from_sampler
        capture = wanted and (sampler or self._troll_needs_old())
        # Chunked head: the capture rides on TRL's own no-grad forward for old log-probs (one forward, not two).
        self._troll_pending = [] if capture and not sampler and self.troll_lm_head == "chunked" else None
        try:
            with self._troll_sampling() if sampler else contextlib.nullcontext():
                batch = super()._generate_and_score_completions(inputs)
                old = self._troll_sampled_old(batch["completion_ids"].shape[1]) if sampler else None
        finally:
            pending, self._troll_pending = self._troll_pending, None
        if capture and old is None:
            old = cat_sparse(pending) if pending else None
            if old is None or tuple(old.ids.shape[:2]) != tuple(batch["completion_ids"].shape):
                old = self._troll_capture_old(batch)  # dense head, or TRL ran no old-log-prob forward
        if capture:
            batch.update(old.to_dict())
        return batch

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's per-token log-probs; during a rollout batch's no-grad scoring forward, also TROLL's old policy.

        A forward hook on the backbone keeps each chunk's final hidden states at the completion positions (the LM
        head's input, the same tensor TRL's fused head reads); a hook on the model sparsifies them with the head's
        weight once the model's forward has returned (where FSDP2 or ZeRO-3 may gather the head without disturbing
        the forward). TRL's computation is not touched, so its old log-probs stay exactly what they were.
        """
        if self._troll_skips_forward(kwargs):
            # troll_old_policy="sampler": TRL's old log-probs are the sampler's, no forward (docs/trl.md)
            old = self._troll_sampled_old(logits_to_keep)
            tokens, mask = input_ids[:, -logits_to_keep:], attention_mask[:, -logits_to_keep:]
            return sampled_token_logps(old, tokens, mask), None, None
        if self._troll_pending is None or torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        unwrapped = self.accelerator.unwrap_model(model)
        keep, capture = self._troll_capture_hooks(logits_to_keep)
        hooks = [
            unwrapped.base_model.register_forward_hook(keep, with_kwargs=True),
            unwrapped.register_forward_hook(capture),
        ]
        try:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        finally:
            for hook in hooks:
                hook.remove()

    def _troll_tail(self) -> dict:
        """How the mass outside the kept tokens enters the support (docs/method.md, "The sparse support")."""
        return dict(tail=self.args.troll_tail, fill=self.args.troll_fill)

    # ------------------------------------------------------------------------------------------ the LM-head path

    @property
    def troll_lm_head(self) -> str:
        """The LM-head path in use: ``args.troll_lm_head``, except "dense" where "chunked" cannot be exact (decided
        once, on first use, with a warning; see :meth:`_troll_chunked_blocker`)."""
        if self._troll_head_mode is None:
            mode = getattr(self.args, "troll_lm_head", "dense")
            reason = self._troll_chunked_blocker() if mode == "chunked" else None
            if reason is not None:
                warnings.warn(
                    f"troll_lm_head='chunked' falls back to 'dense' (full (B, T, V) logits, more memory): {reason}. "
                    "Set troll_lm_head='dense' to silence this warning.",
                    stacklevel=2,
                )
                mode = "dense"
            self._troll_head_mode = mode
        return self._troll_head_mode

    def _troll_chunked_blocker(self) -> str | None:
        """Why the chunked path would not reproduce this model's logits, or None if it does.

        FSDP2 and DeepSpeed ZeRO-3 are supported (:meth:`_troll_with_head` gathers the sharded head inside the loss
        call); FSDP1 (flattened parameters, sharded outside the forward of the model's root unit) is not. The rest
        is :func:`troll.integrations.hf.head_blocker` and one probe forward.
        """
        fsdp2 = bool(getattr(self.accelerator, "is_fsdp2", False)) or is_fsdp2_model(self.model)
        if getattr(self, "is_fsdp_enabled", False) and not fsdp2:
            return "FSDP1 flattens and shards the LM head's weight outside the model's forward (FSDP2 is supported)"
        unwrapped = self.accelerator.unwrap_model(self.model)
        reason = hf.head_blocker(unwrapped, sharded=fsdp2)
        if reason is not None:
            return reason
        try:
            return hf.probe_linear_head(
                self.model,
                hf.output_embeddings(unwrapped),
                self.accelerator.device,
                autocast=self.accelerator.autocast(),
                with_head=lambda fn: self._troll_with_head(self.model, fn),  # gathered for the one probe row
            )
        except ValueError as err:
            return str(err)

    def _troll_with_head(self, model, fn, *tensors):
        """``fn(weight (V, H), bias (V,) or None, *tensors)`` with the full LM head of ``model``, gradients flowing
        back to its parameters: FSDP2 shards are all-gathered (:func:`troll.categorical.distributed.gather_lm_head`), a
        DeepSpeed ZeRO-3 partition is used inside the head's own forward call, where ZeRO-3 gathers it
        (:func:`troll.categorical.distributed.call_in_forward`; pass the hidden states as ``tensors``). docs/trl.md,
        "Sharded
        models", has the memory."""
        return with_lm_head(hf.output_embeddings(self.accelerator.unwrap_model(model)), fn, *tensors)

    def _troll_head_hidden(self, model, inputs: dict) -> torch.Tensor:
        """(B, T, H) final hidden states at the positions that score the completion (the LM head's input).

        The model's own forward (:func:`troll.integrations.hf.final_hidden`), so that DDP or any wrapper sees the
        call and arms its gradient hooks.
        """
        hidden, _ = hf.final_hidden(model, *sequence(inputs), autocast=self.accelerator.autocast())
        t = inputs["completion_ids"].size(1)
        # Position i predicts token i + 1: the last t + 1 positions minus the final one score the completion.
        return hidden[:, -(t + 1) : -1]

    def _troll_logits(self, model, inputs: dict) -> torch.Tensor:
        """(B, T, V) logits (fp32, or fp64 for a fp64 model) at the completion positions, divided by the sampling
        temperature: the dense path, the model's plain forward (not TRL's fused LM head)."""
        t = inputs["completion_ids"].size(1)
        return hf.completion_logits(model, *sequence(inputs), t, self.temperature, autocast=self.accelerator.autocast())

    # ------------------------------------------------------------------------------------------ the loss

    def _troll_loss_kwargs(self) -> dict:
        args = self.args
        return dict(
            kl_bound=args.troll_kl_bound,
            alpha=args.troll_alpha,
            top_k=args.troll_top_k,
            delta=args.troll_delta,
            level=troll_level(self.loss_type),
            agg=self._troll_agg(),
            max_len=self.max_completion_length,
            **self._troll_tail(),
        )

    def _troll_compute_loss(self, model, inputs: dict) -> LossOutput:
        """The TROLL loss of one micro-batch, aggregated over that micro-batch alone.

        :meth:`_compute_loss` scales it as TRL scales the matching loss type and logs the metrics, which are keyed as
        logged: ``troll/...`` plus TRL's ``entropy``. Without a stored old policy (one optimiser step per rollout
        batch) old = current, detached: the projection is the identity. Override this method for another way of
        evaluating the current policy; keep the signature and the metric keys.
        """
        tokens, mask, adv = inputs["completion_ids"], loss_mask(inputs), inputs["advantages"]
        old = self._troll_stored_old(inputs)
        if self.troll_lm_head == "chunked":

            def chunked_loss(weight, bias, hidden):
                own = old
                if own is None:
                    own = sparsify_from_hidden(
                        hidden, weight, bias=bias, temperature=self.temperature, include=tokens, **self._troll_kept()
                    )
                kwargs = dict(bias=bias, temperature=self.temperature, entropy=True, **self._troll_loss_kwargs())
                return troll_loss_from_hidden(hidden, weight, own, tokens, adv, mask, **kwargs)

            out = self._troll_with_head(model, chunked_loss, self._troll_head_hidden(model, inputs))
            entropy = out.metrics.pop("entropy/mean")
        else:
            logits = self._troll_logits(model, inputs)
            if old is None:
                old = sparsify(logits.detach(), include=tokens, **self._troll_kept())
            out = troll_loss(logits, old, tokens, adv, mask, **self._troll_loss_kwargs())
            with torch.no_grad():
                per_token = torch.special.entr(torch.softmax(logits.detach(), dim=-1)).sum(-1)
                m = mask.to(per_token.dtype)
                entropy = (per_token * m).sum() / m.sum().clamp_min(1)
        metrics = {f"troll/{key}": value for key, value in out.metrics.items()}
        metrics["entropy"] = entropy
        return LossOutput(out.loss, metrics)

    def _compute_loss(self, model, inputs):
        if not self._troll_enabled:
            if self._troll_measuring and self._troll_stored_old(inputs) is not None:
                return self._troll_measured_trl_loss(model, inputs)
            return super()._compute_loss(model, inputs)
        out = self._troll_compute_loss(model, inputs)
        mask = loss_mask(inputs)
        self._troll_log(out.metrics, mask)
        return out.loss * self._troll_loss_scale(inputs, mask)

    # ------------------------------------------------------------------------------------------ TRL's losses, measured

    def _troll_measured_trl_loss(self, model, inputs: dict) -> torch.Tensor:
        """TRL's own loss, and the KL its current policy has reached from the stored old one (troll_measure_kl).

        Chunked head: a hook on the backbone keeps the final hidden states of the one forward TRL's ``_compute_loss``
        runs (detached, at the completion positions); the KL is computed from them once TRL's loss is built, before
        its backward, without gradient. Dense head: a second no-grad forward for the logits. TRL's loss is returned
        as TRL computed it.
        """
        if self.troll_lm_head != "chunked":
            loss = super()._compute_loss(model, inputs)
            with torch.no_grad():
                logits = self._troll_logits(model, inputs)
                new = DenseLogits(logits.reshape(-1, logits.shape[-1]))
                metrics = self._troll_kl_metrics(new, inputs)
        else:
            t = inputs["completion_ids"].size(1)
            kept = []

            def keep(module, args, output):
                kept.append(output.last_hidden_state[:, -(t + 1) : -1].detach())

            hook = self.accelerator.unwrap_model(model).base_model.register_forward_hook(keep)
            try:
                loss = super()._compute_loss(model, inputs)
            finally:
                hook.remove()
            metrics = self._troll_measure_hidden(model, torch.cat(kept), inputs)
        self._troll_log({f"troll/{key}": value for key, value in metrics.items()}, loss_mask(inputs))
        return loss

    @torch.no_grad()
    def _troll_measure_hidden(self, model, hidden: torch.Tensor, inputs: dict) -> dict:
        """:meth:`_troll_kl_metrics` of the policy read off ``hidden`` (B, T, H) through the LM head (gathered
        under FSDP2 / ZeRO-3 for the call), in fp32 whatever autocast is on."""

        def measure(weight, bias, h):
            with torch.autocast(h.device.type, enabled=False):
                new = ChunkedLMHead(h.reshape(-1, h.shape[-1]), weight, bias, self.temperature)
                return self._troll_kl_metrics(new, inputs)

        return self._troll_with_head(model, measure, hidden)

    @torch.no_grad()
    def _troll_kl_metrics(self, new, inputs: dict) -> dict:
        """KL(pi || pi_old) per loss token over the support TROLL would project on (:func:`sparse_kl_metrics`)."""
        old = self._troll_stored_old(inputs)
        rule = dict(kl_bound=self.args.troll_kl_bound, **self._troll_kept(), **self._troll_tail())
        return sparse_kl_metrics(new, old, inputs["completion_ids"], loss_mask(inputs), **rule)

    def _troll_loss_scale(self, inputs: dict, mask: torch.Tensor):
        """Factor turning the micro-batch aggregate into the loss TRL would return for the same normalisation.

        token-mean is TRL's "dapo": the token sum over the loss tokens of one accumulation window of the global batch
        (``num_items_in_batch`` counts the whole generation batch on all processes; DDP averages over processes).
        The per-sequence aggregations are TRL's "grpo" / "dr_grpo": a local mean divided by the accumulation steps.
        """
        train = self.model.training  # eval batches are neither split nor accumulated
        accumulation = self.current_gradient_accumulation_steps if train else 1
        if self._troll_agg() != "token-mean":
            return 1.0 / accumulation
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if train:
            normalizer = normalizer * accumulation / self.args.steps_per_generation
        return mask.sum() / normalizer

    def _troll_log(self, metrics: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
        """Append the metrics to TRL's, reduced over processes so that they equal the one-process values.

        */max and */min are reduced as such, also over TRL's logging window: TRL logs the mean of each metric's list,
        so a max (min) is kept as a one-element list holding the window's max (min). Per-token means are weighted by
        loss tokens; ``troll/loss/*`` like the aggregation (by tokens for token-mean, evenly for the per-sequence
        ones: every process holds the same number of sequences).
        """
        mode = "train" if self.model.training else "eval"
        keys = sorted(metrics)
        local = torch.stack([metrics[key].detach().double() for key in keys] + [mask.sum().double()])
        rows = self.accelerator.gather(local.unsqueeze(0)).reshape(-1, len(keys) + 1)
        tokens = rows[:, -1]
        nonempty = rows[tokens > 0] if bool((tokens > 0).any()) else rows
        even = self._troll_agg() != "token-mean"
        for i, key in enumerate(keys):
            window = self._metrics[mode][key]
            if key.endswith(("/max", "/min")):
                pick = max if key.endswith("/max") else min
                window[:] = [pick([*window, float(getattr(nonempty[:, i], pick.__name__)())])]
                continue
            weight = torch.ones_like(tokens) if even and key.startswith("troll/loss/") else tokens
            window.append(float((rows[:, i] * weight).sum() / weight.sum().clamp_min(1)))


def loss_mask(inputs: dict) -> torch.Tensor:
    """(B, T) bool: completion tokens that enter the loss (tool-output tokens excluded, as in TRL)."""
    mask = inputs["completion_mask"]
    if inputs.get("tool_mask") is not None:
        mask = mask * inputs["tool_mask"]
    return mask.bool()
