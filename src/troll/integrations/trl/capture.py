"""Where :class:`~troll.integrations.trl.trainer.TrollGRPOTrainer` gets a rollout batch's old policy from
(docs/method.md, "Where the old policy comes from"; docs/trl.md): a mixin of the trainer, apart from its loss.

- Recompute (``troll_old_policy="recompute"``, the default): the pre-update weights at the sampling temperature,
  sparsified to the top tokens of each completion position plus the sampled one. With the chunked head the capture
  rides on TRL's own no-grad scoring forward (:meth:`~OldPolicyCapture._troll_capture_hooks`: a backbone hook keeps
  the final hidden states, a model hook sparsifies them through the LM head); otherwise
  :meth:`~OldPolicyCapture._troll_capture_old` runs its own forward in chunks.
- Sampler (``troll_old_policy="sampler"``): what the generation recorded, through HF generate's logits processor
  (:class:`troll.integrations.hf.GenerationRecorder`), or vLLM's and a ``rollout_func``'s top log-probs
  (:func:`troll.integrations.sampler.sparse_from_topk`); TRL's old-log-prob forward is then skipped for the TROLL
  loss types.

The mixin reads the trainer's ``args`` (the ``troll_*`` fields of a TrollGRPOConfig), ``accelerator``, ``model``,
``model_wrapped``, ``temperature``, ``use_vllm``, ``vllm_generation``, ``rollout_func``, ``tools`` and
``environment_factories`` (TRL's GRPOTrainer attributes, pinned by tests/integrations/trl/test_trl_contract.py), and
the trainer's :meth:`_troll_with_head`, :attr:`troll_lm_head` and ``_troll_enabled``. Its names all start with
``_troll_``, so it overrides nothing of TRL's.
"""

from __future__ import annotations

import contextlib

import torch

from troll.categorical.defaults import OLD_PREFIX
from troll.categorical.distributed import full_shape
from troll.categorical.sparse import SparseLogProbs
from troll.integrations import hf
from troll.integrations.sampler import fit_length, sampled_lists, sparse_from_topk

_MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes", "token_type_ids")


def sequence(inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt + completion ids and attention mask (B, S); multimodal inputs are rejected."""
    if any(inputs.get(key) is not None for key in _MULTIMODAL_KEYS):
        raise NotImplementedError("The TROLL loss types support text-only models and datasets for now.")
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    return ids, torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)


class OldPolicyCapture:
    """The old policy of a rollout batch: recomputed with the pre-update weights, or recorded by the sampler."""

    # ------------------------------------------------------------------------------------------ recompute

    def _troll_capture_hooks(self, t: int):
        """(backbone hook, model hook): the first keeps a chunk's hidden states and tokens at its last ``t``
        positions, the second appends their sparse old policy to ``_troll_pending``."""
        kept = []

        def keep(module, args, kwargs, output):
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            kept.append((output.last_hidden_state[:, -(t + 1) : -1], input_ids[:, -t:]))

        def capture(module, args, output):
            hidden, tokens = kept.pop()
            self._troll_pending.append(self._troll_sparsify_head(self.model, hidden, tokens))

        return keep, capture

    @torch.no_grad()
    def _troll_capture_old(self, batch: dict) -> SparseLogProbs:
        """The old policy (B, T, K) of a scored rollout batch, before any update on it (docs/method.md).

        Runs the current weights at the sampling temperature in chunks of per_device_train_batch_size sequences
        (:func:`troll.integrations.hf.capture_old`) and keeps, per completion position, the top tokens (mass
        1 - troll_delta, at most troll_top_k) plus the sampled one.
        """
        unwrapped = self.accelerator.unwrap_model(self.model)
        return hf.capture_old(
            unwrapped,
            *sequence(batch),
            batch["completion_ids"],
            temperature=self.temperature,
            chunked=self.troll_lm_head == "chunked",
            batch_size=self.args.per_device_train_batch_size,
            autocast=self.accelerator.autocast,
            wrapped=self.model,
            with_head=lambda fn, *tensors: self._troll_with_head(self.model, fn, *tensors),
            **self._troll_kept(),
        )

    def _troll_kept(self) -> dict:
        """The sparsification rule (docs/method.md, kept rule) as keywords of sparsify / sparsify_from_hidden."""
        return dict(top_k=self.args.troll_top_k, delta=self.args.troll_delta)

    def _troll_sparsify_head(self, model, hidden, tokens) -> SparseLogProbs:
        """The sparse policy of ``hidden`` (B, T, H) through ``model``'s LM head (FSDP2 / ZeRO-3: gathered)."""

        def with_head(fn, *tensors):
            return self._troll_with_head(model, fn, *tensors)

        return hf.sparsify_head(hidden, tokens, with_head=with_head, temperature=self.temperature, **self._troll_kept())

    def _troll_stored_old(self, inputs: dict) -> SparseLogProbs | None:
        """The old policy captured with the rollout batch; None when the batch feeds a single optimiser step."""
        return SparseLogProbs.from_dict(inputs) if f"{OLD_PREFIX}ids" in inputs else None

    # ------------------------------------------------------------------------------------ the sampler's old policy

    @property
    def _troll_from_sampler(self) -> bool:
        """troll_old_policy="sampler": the old policy is what the generation recorded (docs/trl.md)."""
        return getattr(self.args, "troll_old_policy", "recompute") == "sampler"

    def _troll_check_sampler(self) -> None:
        """Refuse what the sampler cannot serve, before training; ask vLLM for the top-K log-probs."""
        if self.tools or self.environment_factories is not None:
            raise ValueError(
                "troll_old_policy='sampler' does not support tools or environment_factory yet (the tool loop splices "
                "tool tokens into the completions after generation); set troll_old_policy='recompute'."
            )
        if self.use_vllm and self.rollout_func is None:
            # TRL asks vLLM for the sampled token's log-prob only (logprobs=0); the sampler needs the top K.
            self.vllm_generation.logprobs = self.args.troll_top_k

    def _troll_vocab_size(self) -> int:
        unwrapped = self.accelerator.unwrap_model(self.model)
        head = hf.output_embeddings(unwrapped)
        weight = getattr(head, "weight", None)
        return int(full_shape(weight)[0]) if weight is not None else int(unwrapped.config.vocab_size)

    @contextlib.contextmanager
    def _troll_sampling(self):
        """Within the block the generation records the old policy: HF generate through a logits processor
        (:class:`troll.integrations.hf.GenerationRecorder`), vLLM and a rollout_func through their top log-probs
        (:func:`troll.integrations.sampler.sparse_from_topk`). The source is kept in ``_troll_sampled``."""
        kept = dict(top_k=self.args.troll_top_k, delta=self.args.troll_delta)
        if self.rollout_func is not None:
            original, owner, name = self.rollout_func, self, "rollout_func"
            wrapped = self._troll_wrap_rollout(original, kept)
        elif self.use_vllm:
            original, owner, name = self.vllm_generation.generate, self.vllm_generation, "generate"
            wrapped = self._troll_wrap_vllm(original, kept)
        else:
            recorder = hf.GenerationRecorder(temperature=self.temperature, **kept)
            self._troll_sampled = recorder
            try:
                with hf.recording_generate(self.accelerator.unwrap_model(self.model_wrapped), recorder):
                    yield
            finally:
                self._troll_sampled = None
            return
        had_own = name in owner.__dict__
        setattr(owner, name, wrapped)
        try:
            yield
        finally:
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # the class's method again
            self._troll_sampled = None

    def _troll_wrap_rollout(self, rollout_func, kept: dict):
        def rollout(prompts, trainer):
            output = rollout_func(prompts, trainer)
            if "logprob_token_ids" not in output:
                raise ValueError(
                    "troll_old_policy='sampler' needs the rollout_func to return 'logprob_token_ids' beside "
                    "'logprobs': per completion position the top log-probs and their token ids, the sampled token "
                    "among them (as vLLM's logprobs=K gives them). Return them, or set troll_old_policy='recompute'."
                )
            self._troll_sampled = sparse_from_topk(
                output["logprobs"], output["logprob_token_ids"], output["completion_ids"], source="rollout_func",
                vocab_size=self._troll_vocab_size(), device=self.accelerator.device, **kept,
            )  # fmt: skip
            # TRL reads "logprobs" as the sampled tokens' log-probs (B, T)
            return {**output, "logprobs": sampled_lists(self._troll_sampled, output["completion_ids"])}

        return rollout

    def _troll_wrap_vllm(self, generate, kept: dict):
        def vllm_generate(*args, **kwargs):
            prompt_ids, completion_ids, logprobs, token_ids = generate(*args, **kwargs)
            self._troll_sampled = sparse_from_topk(
                logprobs, token_ids, completion_ids, source="vLLM", vocab_size=self._troll_vocab_size(),
                device=self.accelerator.device, **kept,
            )  # fmt: skip
            # TRL keeps entry 0 of each position as the sampled token's log-prob (right for logprobs=0 only)
            sampled = [[[lp] for lp in seq] for seq in sampled_lists(self._troll_sampled, completion_ids)]
            return prompt_ids, completion_ids, sampled, token_ids

        return vllm_generate

    def _troll_sampled_old(self, length: int) -> SparseLogProbs:
        """The sampler's old policy of the batch being scored, (B, length, K) on the trainer's device."""
        source = self._troll_sampled
        if isinstance(source, hf.GenerationRecorder):
            if len(source.records) != 1:
                raise RuntimeError(f"expected one generate call per rollout batch, saw {len(source.records)}.")
            source = source.records[0]
        if source is None:
            raise RuntimeError("troll_old_policy='sampler': the generation recorded no old policy.")
        return fit_length(source, length).to(self.accelerator.device)

    def _troll_skips_forward(self, kwargs: dict) -> bool:
        """Whether TRL's no-grad old-log-prob forward is replaced by the sampler's log-probs: the TROLL loss types
        read only the sparse old policy, so nothing else needs it (TRL's own loss types keep it)."""
        return (
            self._troll_sampled is not None
            and self._troll_enabled
            and not torch.is_grad_enabled()
            and not kwargs.get("compute_entropy")
            and not kwargs.get("compute_aux_loss")
        )
