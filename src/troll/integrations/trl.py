"""TROLL in TRL's GRPOTrainer: ``loss_type="troll"`` and ``"troll_seq"`` next to TRL's own loss types.

Generation, rewards, advantages, buffering, checkpointing and logging are TRL's; every TRL loss type ("dapo", "grpo",
"dr_grpo", "bnpo", "cispo", ..., with either importance-sampling level) runs through TRL's own ``_compute_loss``, so
TROLL and clipping share one code path. How the TROLL loss types depart from TRL's clipped objective:

- Old policy (docs/method.md, "Where the old policy comes from"). When a rollout batch feeds more than one optimiser
  step (steps_per_generation > gradient_accumulation_steps, or num_iterations > 1; TRL's own criterion for computing old
  log-probs), the batch's old policy is captured while TRL scores it: the pre-update weights at the sampling
  temperature, sparsified to the top tokens of each completion position plus the sampled one, stored in the batch as
  ``troll_old_*`` tensors with the batch dim first, so that TRL's shuffling and splitting slice them along with the
  rest. With the chunked head the capture reads the final hidden states of TRL's own no-grad forward for its old
  log-probs (a forward hook on the backbone), so a rollout batch costs one no-grad forward, as with TRL's losses; the
  dense head runs a second one. Otherwise old = current, and the loss sparsifies its own (detached) logits: the
  projection is then the identity, as it should be.
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
- Normalisation. "troll" aggregates token-mean, the normalisation of TRL's default "dapo" (token sum over the number
  of loss tokens in the global accumulated batch); "troll_seq" seq-mean-token-mean, as TRL's "grpo" (the GSPO setup).
  Each is scaled for gradient accumulation and processes exactly as TRL scales that loss type, so at ratio 1 "troll"
  equals "dapo" and "troll_seq" equals "grpo" with importance_sampling_level="sequence", in value and gradient.
  ``troll_agg`` picks another aggregation (seq-mean-token-sum-norm uses max_completion_length, as "dr_grpo").
- Metrics go to TRL's ``_metrics`` (hence to any ``report_to``) under ``troll/``, e.g. ``troll/kl_after/max``,
  reduced over processes (max/min as such, the rest weighted by loss tokens) and over the logging window; TRL's
  ``entropy`` is logged too.

Not supported with the TROLL loss types (rejected by the config): beta != 0, the entropy bonus, top-entropy and
off-policy masking, the vLLM importance-sampling correction; at construction: MoE auxiliary losses.
Multimodal inputs are rejected at the first forward.
"""

from __future__ import annotations

import difflib
import math
import warnings
from dataclasses import dataclass, field
from numbers import Real

import torch

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
except ImportError as err:  # pragma: no cover - only without TRL
    raise ImportError(
        "troll.integrations.trl needs TRL >=1.16,<1.17 (with transformers, accelerate and datasets): "
        "install them with `pip install troll[trl]`."
    ) from err

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from troll.batch import LossOutput
from troll.defaults import AGGREGATIONS, ALPHA, DELTA, KL_BOUND, TOP_K
from troll.distributed import full_shape, is_dtensor, is_fsdp2_model, with_lm_head
from troll.integrations import hf
from troll.lm_head import sparsify_from_hidden
from troll.losses import troll_loss, troll_loss_from_hidden
from troll.sparse import SparseLogProbs, sparsify

__all__ = [
    "LM_HEADS",
    "SUPPORTED_TRL",
    "TROLL_LOSS_TYPES",
    "TrollGRPOConfig",
    "TrollGRPOTrainer",
    "check_trl_version",
]

SUPPORTED_TRL = ">=1.16,<1.17"
TROLL_LOSS_TYPES = ("troll", "troll_seq")
# The loss types TRL 1.16's GRPOTrainer implements (it checks them only when the loss runs, so a typo in a config
# would otherwise surface after model loading and generation).
TRL_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


def _finite_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


LM_HEADS = ("chunked", "dense")
OLD_KEYS = ("troll_old_ids", "troll_old_logp", "troll_old_mask", "troll_old_log_rest")
_FORWARD_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
_MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes", "token_type_ids")


def check_trl_version(version: str | None = None) -> None:
    """Raise if ``version`` (default: the installed TRL) is outside :data:`SUPPORTED_TRL`."""
    version = trl.__version__ if version is None else version
    if not SpecifierSet(SUPPORTED_TRL).contains(Version(version), prereleases=True):
        raise RuntimeError(
            f"TrollGRPOTrainer supports TRL {SUPPORTED_TRL}, but TRL {version} is installed. It overrides "
            "GRPOTrainer internals that change between TRL minor releases. Install a supported TRL: "
            f"pip install 'trl{SUPPORTED_TRL}' (or pip install troll[trl])."
        )


@dataclass
class TrollGRPOConfig(GRPOConfig):
    """:class:`trl.GRPOConfig` plus TROLL's hyper-parameters (docs/method.md lists the paper's values).

    Args:
        loss_type: TRL's loss types plus "troll" (token level, the default here) and "troll_seq" (sequence level,
            GSPO-style importance weight from the projected policy).
        troll_kl_bound: eps, the per-token bound KL(pi || pi_old) <= eps of the projection (paper: 0.05).
        troll_alpha: weight of the regression KL(pi~ || sg(pi)) of the current policy to its projection (paper: 1.0).
        troll_top_k: most tokens kept per position of the old and new policies (paper: 64).
        troll_delta: mass left out when sparsifying: keep tokens until mass 1 - delta (paper: 1e-5).
        troll_agg: aggregation over tokens, one of ``troll.AGGREGATIONS``; None picks "token-mean" (as TRL's "dapo")
            for "troll" and "seq-mean-token-mean" (as TRL's "grpo") for "troll_seq".
        troll_lm_head: how the current and old policies are read off the LM head: "chunked" (default: from the final
            hidden states in vocabulary chunks, no (B, T, V) logits) or "dense" (the model's full logits). Where
            "chunked" cannot be exact (see the module docstring) the trainer warns and uses "dense".

    TRL 1.16 checks ``loss_type`` only inside ``GRPOTrainer._compute_loss``, which the trainer overrides for the
    TROLL types, so the new values pass GRPOConfig unchanged. The TROLL values are checked here, with the options
    TROLL does not support; TRL's clip options (epsilon, epsilon_high, delta) are unused by the TROLL types.
    """

    loss_type: str = field(
        default="troll",
        metadata={
            "help": "Loss: 'troll' (KL trust-region projection, token level), 'troll_seq' (sequence level, "
            "GSPO-style), or any TRL loss type ('dapo', 'grpo', 'dr_grpo', 'bnpo', 'cispo', 'sapo', ...)."
        },
    )
    troll_kl_bound: float = field(
        default=KL_BOUND,
        metadata={"help": "TROLL: per-token KL bound eps of the trust-region projection (paper 0.05)."},
    )
    troll_alpha: float = field(
        default=ALPHA, metadata={"help": "TROLL: weight of the regression to the projected policy (paper 1.0)."}
    )
    troll_top_k: int = field(
        default=TOP_K,
        metadata={"help": "TROLL: at most this many tokens kept per position when sparsifying (paper 64)."},
    )
    troll_delta: float = field(
        default=DELTA, metadata={"help": "TROLL: keep tokens until their mass reaches 1 - delta (paper 1e-5)."}
    )
    troll_agg: str | None = field(
        default=None,
        metadata={
            "help": "TROLL: token aggregation, one of " + ", ".join(AGGREGATIONS) + "; default token-mean for "
            "'troll' (as 'dapo'), seq-mean-token-mean for 'troll_seq' (as 'grpo')."
        },
    )
    troll_lm_head: str = field(
        default="chunked",
        metadata={
            "help": "TROLL: 'chunked' (LM head in vocabulary chunks from the final hidden states, never the (B, T, V) "
            "logits) or 'dense' (the model's full logits). Falls back to 'dense' with a warning where 'chunked' "
            "cannot be exact (FSDP1, soft-capped or scaled logits; FSDP2 and ZeRO-3 keep it)."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        self._check_troll_values()
        if self.loss_type in TROLL_LOSS_TYPES:
            self._check_troll_compatible()

    def _check_troll_values(self) -> None:
        if self.loss_type not in TROLL_LOSS_TYPES + TRL_LOSS_TYPES:
            close = difflib.get_close_matches(str(self.loss_type), TROLL_LOSS_TYPES + TRL_LOSS_TYPES, n=1)
            hint = f"did you mean loss_type={close[0]!r}? " if close else ""
            raise ValueError(
                f"loss_type={self.loss_type!r} is not a known loss type; {hint}Choose one of "
                f"{', '.join(map(repr, TROLL_LOSS_TYPES + TRL_LOSS_TYPES))}."
            )
        if not _finite_number(self.temperature) or not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0 and finite, got {self.temperature!r}: the logits are divided by it, for "
                "sampling and in every loss. Set the sampling temperature, e.g. temperature=1.0."
            )
        if not _finite_number(self.troll_kl_bound) or not self.troll_kl_bound > 0:
            raise ValueError(
                f"troll_kl_bound must be > 0 and finite, got {self.troll_kl_bound!r}: it is the per-token KL bound "
                "eps of the trust region. Set a positive value, e.g. troll_kl_bound=0.05 (the paper's)."
            )
        if not _finite_number(self.troll_alpha) or not self.troll_alpha >= 0:
            raise ValueError(
                f"troll_alpha must be >= 0 and finite, got {self.troll_alpha!r}: it weights the regression to the "
                "projected policy. Set e.g. troll_alpha=1.0 (the paper's)."
            )
        if isinstance(self.troll_top_k, bool) or not isinstance(self.troll_top_k, int) or self.troll_top_k < 1:
            raise ValueError(
                f"troll_top_k must be an integer >= 1, got {self.troll_top_k!r}. Set e.g. troll_top_k=64 (the paper's)."
            )
        if not _finite_number(self.troll_delta) or not 0 <= self.troll_delta < 1:
            raise ValueError(
                f"troll_delta must lie in [0, 1), got {self.troll_delta!r}: it is the probability mass left out when "
                "sparsifying. Set e.g. troll_delta=1e-5 (the paper's), or 0 to keep exactly troll_top_k tokens."
            )
        if self.troll_agg is not None and self.troll_agg not in AGGREGATIONS:
            raise ValueError(
                f"troll_agg={self.troll_agg!r} is not supported; choose one of {', '.join(map(repr, AGGREGATIONS))}, "
                "or None for the loss type's default."
            )
        if self.troll_lm_head not in LM_HEADS:
            raise ValueError(
                f"troll_lm_head={self.troll_lm_head!r} is not supported; set troll_lm_head='chunked' (the default: "
                "the LM head in vocabulary chunks, far less memory) or troll_lm_head='dense' (the model's full logits)."
            )

    def _check_troll_compatible(self) -> None:
        fixes = []
        if self.loss_type == "troll" and self.importance_sampling_level != "token":
            fixes.append(
                "importance_sampling_level='sequence' (use loss_type='troll_seq' for sequence-level TROLL and leave "
                "importance_sampling_level='token')"
            )
        if self.beta != 0.0:
            fixes.append(f"beta={self.beta} (KL to a reference model: set beta=0.0; the trust region bounds the step)")
        if self.entropy_coef != 0.0 or self.use_adaptive_entropy:
            fixes.append("an entropy bonus (set entropy_coef=0.0 and use_adaptive_entropy=False)")
        if self.top_entropy_quantile < 1.0:
            fixes.append(f"top_entropy_quantile={self.top_entropy_quantile} (set top_entropy_quantile=1.0)")
        if self.off_policy_mask_threshold is not None:
            fixes.append("off-policy sequence masking (set off_policy_mask_threshold=None)")
        if self.use_vllm and self.vllm_importance_sampling_correction:
            fixes.append("the vLLM importance-sampling correction (set vllm_importance_sampling_correction=False)")
        if fixes:
            raise ValueError(f"loss_type={self.loss_type!r} does not support " + "; ".join(fixes) + ".")


class TrollGRPOTrainer(GRPOTrainer):
    """:class:`trl.GRPOTrainer` with the TROLL loss types; a drop-in replacement taking the same arguments.

    Overrides: ``_generate_and_score_completions`` (captures the old policy with the batch), ``_compute_loss``
    (TROLL loss types; anything else goes to TRL) and ``log`` (window max/min of TROLL's max/min metrics).
    Extension points: :meth:`_troll_capture_old` (where the old policy comes from), :meth:`_troll_compute_loss`
    (how the current policy's loss is computed), :meth:`_troll_head_hidden` with :meth:`_troll_with_head` (chunked)
    and :meth:`_troll_logits` (dense). :attr:`troll_lm_head` says which LM-head path is in use.
    """

    _tag_names = ["trl", "grpo", "troll"]

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, *pargs, **kwargs):
        check_trl_version()
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "") or "model"
            args = TrollGRPOConfig(output_dir=f"{name.split('/')[-1]}-TROLL")
        if args.loss_type in TROLL_LOSS_TYPES and not isinstance(args, TrollGRPOConfig):
            raise TypeError(
                f"loss_type={args.loss_type!r} needs a TrollGRPOConfig (it carries TROLL's hyper-parameters), got "
                f"{type(args).__name__}. Build the config with troll.integrations.trl.TrollGRPOConfig(...)."
            )
        self._troll_head_mode = None  # resolved on first use by troll_lm_head
        self._troll_pending = None  # old-policy chunks collected during TRL's scoring forward (a list while armed)
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        if self._troll_enabled and self.aux_loss_enabled:
            raise ValueError(
                f"loss_type={self.loss_type!r} does not support the MoE load-balancing auxiliary loss yet; set "
                "router_aux_loss_coef=0.0 in the config."
            )

    @property
    def _troll_enabled(self) -> bool:
        return self.loss_type in TROLL_LOSS_TYPES

    def _troll_agg(self) -> str:
        """The token aggregation: troll_agg, else token-mean for "troll" (as "dapo"), seq-mean-token-mean for
        "troll_seq" (as "grpo", the GSPO setup)."""
        if self.args.troll_agg is not None:
            return self.args.troll_agg
        return "seq-mean-token-mean" if self.loss_type == "troll_seq" else "token-mean"

    def _troll_needs_old(self) -> bool:
        """Whether a rollout batch feeds more than one optimiser step (TRL's criterion for old log-probs)."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self.args.gradient_accumulation_steps % generate_every != 0

    def _generate_and_score_completions(self, inputs):
        capture = self._troll_enabled and self.model.training and self._troll_needs_old()
        # Chunked head: the capture rides on TRL's own no-grad forward for old log-probs (one forward, not two).
        self._troll_pending = [] if capture and self.troll_lm_head == "chunked" else None
        try:
            batch = super()._generate_and_score_completions(inputs)
        finally:
            pending, self._troll_pending = self._troll_pending, None
        if capture:
            old = _pack_old(pending) if pending else None
            if old is None or old["troll_old_ids"].shape[:2] != batch["completion_ids"].shape:
                old = self._troll_capture_old(batch)  # dense head, or TRL ran no old-log-prob forward
            batch.update(old)
        return batch

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's per-token log-probs; during a rollout batch's no-grad scoring forward, also TROLL's old policy.

        A forward hook on the backbone keeps each chunk's final hidden states at the completion positions (the LM
        head's input, the same tensor TRL's fused head reads); a hook on the model sparsifies them with the head's
        weight once the model's forward has returned (where FSDP2 or ZeRO-3 may gather the head without disturbing
        the forward). TRL's computation is not touched, so its old log-probs stay exactly what they were.
        """
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

    def _troll_capture_hooks(self, t: int):
        """(backbone hook, model hook): the first keeps a chunk's hidden states and tokens at its last ``t``
        positions, the second appends their sparse old policy to ``_troll_pending``."""
        kept = []

        def keep(module, args, kwargs, output):
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            kept.append((output.last_hidden_state[:, -(t + 1) : -1], input_ids[:, -t:]))

        def capture(module, args, output):
            hidden, tokens = kept.pop()
            # Mixed precision may have turned autocast on around the forward: the capture computes in fp32 (as it
            # does outside), whatever the backbone ran in.
            with torch.autocast(hidden.device.type, enabled=False):
                self._troll_pending.append(self._troll_sparsify_with_head(self.model, hidden, tokens))

        return keep, capture

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
        call); FSDP1 (flattened parameters, sharded outside the forward of the model's root unit) is not.
        """
        fsdp2 = bool(getattr(self.accelerator, "is_fsdp2", False)) or is_fsdp2_model(self.model)
        if getattr(self, "is_fsdp_enabled", False) and not fsdp2:
            return "FSDP1 flattens and shards the LM head's weight outside the model's forward (FSDP2 is supported)"
        head = self._troll_output_embeddings(self.model)
        weight = getattr(head, "weight", None)
        if not isinstance(weight, torch.Tensor) or len(full_shape(weight)) != 2:
            return "the model has no linear output embeddings (get_output_embeddings() with a (V, H) weight)"
        if is_dtensor(weight) and not fsdp2:
            return "the LM head's weight is a DTensor outside FSDP2 (tensor parallelism)"
        reason = hf.logit_transform(self.model.config)
        if reason is not None:
            return reason
        try:
            return hf.probe_linear_head(
                self.model,
                head,
                self.accelerator.device,
                autocast=self.accelerator.autocast(),
                with_head=lambda fn: self._troll_with_head(self.model, fn),  # gathered for the one probe row
            )
        except ValueError as err:
            return str(err)

    def _troll_with_head(self, model, fn, *tensors):
        """``fn(weight (V, H), bias (V,) or None, *tensors)`` with the full LM head of ``model``, gradients flowing
        back to its parameters: FSDP2 shards are all-gathered (:func:`troll.distributed.gather_lm_head`), a
        DeepSpeed ZeRO-3 partition is used inside the head's own forward call, where ZeRO-3 gathers it
        (:func:`troll.distributed.call_in_forward`; pass the hidden states as ``tensors``). docs/trl.md, "Sharded
        models", has the memory."""
        return with_lm_head(self._troll_output_embeddings(model), fn, *tensors)

    def _troll_output_embeddings(self, model):
        """The LM head module of ``model`` (unwrapped from DDP and the like), or None."""
        return hf.output_embeddings(self.accelerator.unwrap_model(model))

    def _troll_final_hidden(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S, H) final hidden states of prompt + completion (the LM head's input) and (B, 1, V) last logits.

        The model's own forward, so that DDP (or any wrapper) sees the call and arms its gradient hooks; transformers
        ties hidden_states[-1] to the output after the final norm, and -1 keeps only that one (transformers >= 5.x
        with index selection; earlier versions return all layers, the same last one). ``logits_to_keep=1``: the
        head runs on one position instead of B x S.
        """
        return hf.final_hidden(model, *_sequence(inputs), autocast=self.accelerator.autocast())

    def _troll_head_hidden(self, model, inputs: dict) -> torch.Tensor:
        """(B, T, H) final hidden states at the positions that score the completion (the LM head's input)."""
        hidden, _ = self._troll_final_hidden(model, inputs)
        t = inputs["completion_ids"].size(1)
        # Position i predicts token i + 1: the last t + 1 positions minus the final one score the completion.
        return hidden[:, -(t + 1) : -1]

    def _troll_logits(self, model, inputs: dict) -> torch.Tensor:
        """(B, T, V) logits (fp32, or fp64 for a fp64 model) at the completion positions, divided by the sampling
        temperature: the dense path, the model's plain forward (not TRL's fused LM head)."""
        t = inputs["completion_ids"].size(1)
        return hf.completion_logits(
            model, *_sequence(inputs), t, self.temperature, autocast=self.accelerator.autocast()
        )

    # -------------------------------------------------------------------------------------- old and current policy

    @torch.no_grad()
    def _troll_capture_old(self, batch: dict) -> dict[str, torch.Tensor]:
        """The old policy of a scored rollout batch, before any update on it (docs/method.md).

        Runs the current weights at the sampling temperature in chunks of per_device_train_batch_size sequences and
        keeps, per completion position, the top tokens (mass 1 - troll_delta, at most troll_top_k) plus the sampled
        one. Returns the :data:`OLD_KEYS` tensors, batch dim first: ids (B, T, K) int32, logp (B, T, K) fp32,
        mask (B, T, K) bool and log_rest (B, T) fp32, K the largest kept count in the batch.
        """
        size = self.args.per_device_train_batch_size
        parts = []
        for start in range(0, batch["completion_ids"].size(0), size):
            chunk = {key: batch[key][start : start + size] for key in _FORWARD_KEYS}
            tokens = chunk["completion_ids"]
            if self.troll_lm_head == "chunked":
                hidden = self._troll_head_hidden(self.model, chunk)
                parts.append(self._troll_sparsify_with_head(self.model, hidden, tokens))
                del hidden
            else:
                logits = self._troll_logits(self.model, chunk)
                parts.append(sparsify(logits, include=tokens, **self._troll_kept()))
                del logits
        return _pack_old(parts)

    def _troll_kept(self) -> dict:
        """The sparsification rule (docs/method.md, kept rule) as keywords of sparsify / sparsify_from_hidden."""
        return dict(top_k=self.args.troll_top_k, delta=self.args.troll_delta)

    def _troll_sparsify_with_head(self, model, hidden, tokens) -> SparseLogProbs:
        """The sparse policy of ``hidden`` (B, T, H) through ``model``'s LM head (FSDP2 / ZeRO-3: gathered)."""
        return self._troll_with_head(model, lambda w, b, h, t: self._troll_sparsify_hidden(h, w, b, t), hidden, tokens)

    def _troll_sparsify_hidden(self, hidden, weight, bias, tokens) -> SparseLogProbs:
        return sparsify_from_hidden(
            hidden, weight, bias=bias, temperature=self.temperature, include=tokens, **self._troll_kept()
        )

    def _troll_stored_old(self, inputs: dict, vocab_size: int) -> SparseLogProbs | None:
        """The old policy captured with the rollout batch; None when the batch feeds a single optimiser step."""
        if "troll_old_ids" not in inputs:
            return None
        ids, logp, mask, log_rest = (inputs[key] for key in OLD_KEYS)
        return SparseLogProbs(ids, logp, mask, vocab_size, log_rest)

    def _troll_loss_kwargs(self) -> dict:
        args = self.args
        return dict(
            kl_bound=args.troll_kl_bound,
            alpha=args.troll_alpha,
            top_k=args.troll_top_k,
            delta=args.troll_delta,
            level="sequence" if self.loss_type == "troll_seq" else "token",
            agg=self._troll_agg(),
            max_len=self.max_completion_length,
        )

    def _troll_compute_loss(self, model, inputs: dict) -> LossOutput:
        """The TROLL loss of one micro-batch, aggregated over that micro-batch alone.

        :meth:`_compute_loss` scales it as TRL scales the matching loss type and logs the metrics, which are keyed as
        logged: ``troll/...`` plus TRL's ``entropy``. Without a stored old policy (one optimiser step per rollout
        batch) old = current, detached: the projection is the identity. Override this method for another way of
        evaluating the current policy; keep the signature and the metric keys.
        """
        tokens, mask, adv = inputs["completion_ids"], _loss_mask(inputs), inputs["advantages"]
        if self.troll_lm_head == "chunked":

            def chunked_loss(weight, bias, hidden):
                old = self._troll_stored_old(inputs, weight.shape[0])
                if old is None:
                    old = self._troll_sparsify_hidden(hidden, weight, bias, tokens)
                return troll_loss_from_hidden(
                    hidden,
                    weight,
                    old,
                    tokens,
                    adv,
                    mask,
                    bias=bias,
                    temperature=self.temperature,
                    entropy=True,
                    **self._troll_loss_kwargs(),
                )

            out = self._troll_with_head(model, chunked_loss, self._troll_head_hidden(model, inputs))
            entropy = out.metrics.pop("entropy/mean")
        else:
            logits = self._troll_logits(model, inputs)
            old = self._troll_stored_old(inputs, logits.shape[-1])
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
            return super()._compute_loss(model, inputs)
        out = self._troll_compute_loss(model, inputs)
        mask = _loss_mask(inputs)
        self._troll_log(out.metrics, mask)
        return out.loss * self._troll_loss_scale(inputs, mask)

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

        */max and */min are reduced as such; per-token means are weighted by loss tokens; ``troll/loss/*`` are
        weighted like the aggregation (by tokens for token-mean, evenly for the per-sequence ones: every process
        holds the same number of sequences).
        """
        mode = "train" if self.model.training else "eval"
        keys = sorted(metrics)
        local = torch.stack([metrics[key].detach().double() for key in keys] + [mask.sum().double()])
        rows = self.accelerator.gather(local.unsqueeze(0)).reshape(-1, len(keys) + 1)
        tokens = rows[:, -1]
        nonempty = rows[tokens > 0] if bool((tokens > 0).any()) else rows
        even = self._troll_agg() != "token-mean"
        for i, key in enumerate(keys):
            if key.endswith("/max"):
                value = nonempty[:, i].max()
            elif key.endswith("/min"):
                value = nonempty[:, i].min()
            else:
                weight = torch.ones_like(tokens) if even and key.startswith("troll/loss/") else tokens
                value = (rows[:, i] * weight).sum() / weight.sum().clamp_min(1)
            self._metrics[mode][key].append(float(value))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # TRL averages each metric over the logging window; a bound is only checked by the window's max (min).
        mode = "train" if self.model.training else "eval"
        for key, values in self._metrics[mode].items():
            if key.startswith("troll/") and values and key.endswith(("/max", "/min")):
                values[:] = [max(values) if key.endswith("/max") else min(values)]
        super().log(logs, start_time)


def _sequence(inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt + completion ids and attention mask (B, S); multimodal inputs are rejected."""
    if any(inputs.get(key) is not None for key in _MULTIMODAL_KEYS):
        raise NotImplementedError("The TROLL loss types support text-only models and datasets for now.")
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    return ids, torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)


def _loss_mask(inputs: dict) -> torch.Tensor:
    """(B, T) bool: completion tokens that enter the loss (tool-output tokens excluded, as in TRL)."""
    mask = inputs["completion_mask"]
    if inputs.get("tool_mask") is not None:
        mask = mask * inputs["tool_mask"]
    return mask.bool()


def _pack_old(parts: list[SparseLogProbs]) -> dict[str, torch.Tensor]:
    """The :data:`OLD_KEYS` tensors of chunks of sequences, batch dim first, K padded to the largest chunk's."""
    width = max(part.ids.shape[-1] for part in parts)
    return {
        "troll_old_ids": torch.cat([_pad_last(p.ids, width, 0) for p in parts]).to(torch.int32),
        "troll_old_logp": torch.cat([_pad_last(p.logp, width, float("-inf")) for p in parts]),
        "troll_old_mask": torch.cat([_pad_last(p.mask, width, False) for p in parts]),
        "troll_old_log_rest": torch.cat([p.log_rest for p in parts]),
    }


def _pad_last(t: torch.Tensor, width: int, value) -> torch.Tensor:
    """Right-pad the last dim of ``t`` to ``width`` with ``value``."""
    if t.shape[-1] == width:
        return t
    return torch.cat([t, t.new_full((*t.shape[:-1], width - t.shape[-1]), value)], dim=-1)
