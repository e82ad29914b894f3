"""``TrollGRPOConfig``: TRL's GRPOConfig with TROLL's hyper-parameters, and the TRL version this integration supports.

The TROLL values are checked by :func:`troll.categorical.settings.check_troll_settings`, the one check the library's
losses, verl's
config and ``troll train`` share; what TRL's own options allow with the TROLL loss types is checked here.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

try:
    import trl
    from trl import GRPOConfig
except ImportError as err:  # pragma: no cover - only without TRL
    raise ImportError(
        "troll.integrations.trl needs TRL >=1.16,<1.17 (with transformers, accelerate and datasets): "
        "install them with `pip install troll[trl]`."
    ) from err

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from troll.categorical.defaults import (
    AGGREGATIONS,
    ALPHA,
    DELTA,
    KL_BOUND,
    LM_HEAD,
    LM_HEADS,
    TAIL,
    TAIL_FILL,
    TAILS,
    TOP_K,
    TROLL_LOSSES,
)
from troll.categorical.settings import check_tail, check_troll_settings
from troll.integrations.sampler import OLD_POLICIES
from troll.runs.numbers import is_real

SUPPORTED_TRL = ">=1.16,<1.17"
# The loss types TRL 1.16's GRPOTrainer implements (it checks them only when the loss runs, so a typo in a config
# would otherwise surface after model loading and generation).
# vLLM's default cap on the log-probs returned per token (its max_logprobs); TRL's colocate engine keeps it.
VLLM_MAX_LOGPROBS = 20
TRL_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


_finite_number = is_real  # the one check of a number (troll.runs.numbers)


def check_trl_version(version: str | None = None) -> None:
    """Raise if ``version`` (default: the installed TRL) is outside :data:`SUPPORTED_TRL`."""
    version = trl.__version__ if version is None else version
    if not SpecifierSet(SUPPORTED_TRL).contains(Version(version), prereleases=True):
        raise RuntimeError(
            f"TrollGRPOTrainer supports TRL {SUPPORTED_TRL}, but TRL {version} is installed. It overrides "
            "GRPOTrainer internals that change between TRL minor releases. Install a supported TRL: "
            f"pip install 'trl{SUPPORTED_TRL}' (or pip install troll[trl]); docs/trl.md, \"Upgrading TRL\", says how "
            "a new TRL release is checked."
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
        troll_tail: how the mass outside the kept tokens enters the projection: "bucket" (default: one rest category
            holding each policy's true tail mass) or "renormalize" (the paper's code: each policy's kept tokens
            rescaled to one, ``troll_fill`` for the support ids it did not keep); docs/method.md, "The sparse support".
        troll_fill: the probability ``troll_tail="renormalize"`` gives a support id a policy did not keep (1e-12).
        troll_measure_kl: for TRL's own loss types: when a rollout batch feeds several optimiser steps, capture the
            old sparse policy as for TROLL and log, at every optimiser step, KL(pi || pi_old) over TROLL's sparse
            support (troll_top_k, troll_delta, troll_tail, the sampled token) under the keys TROLL uses for the KL
            before projection (``troll/kl_before/mean|max``, ``troll/kl_share/*``). TRL's loss is not touched. The
            TROLL loss types always log these.
        troll_old_policy: where the old policy comes from: "recompute" (a no-grad forward of the trainer's
            pre-update weights on the rollout batch) or "sampler" (the top log-probs the generation recorded: HF
            generate, vLLM's logprob_token_ids or a rollout_func's; the trust region is then around the policy that
            drew the tokens, and the forward is skipped). docs/trl.md, "The old policy from the sampler".

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
        metadata={"help": "TROLL: per-token KL bound of the trust-region projection (paper 0.05)."},
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
        default=LM_HEAD,
        metadata={
            "help": "TROLL: 'chunked' (LM head in vocabulary chunks from the final hidden states, never the (B, T, V) "
            "logits) or 'dense' (the model's full logits). Falls back to 'dense' with a warning where 'chunked' "
            "cannot be exact (FSDP1, soft-capped or scaled logits; FSDP2 and ZeRO-3 keep it)."
        },
    )

    troll_tail: str = field(
        default=TAIL,
        metadata={
            "help": "TROLL: the mass outside the kept tokens, " + " or ".join(map(repr, TAILS)) + ": 'bucket' keeps "
            "it as one rest category, 'renormalize' (the paper's code) rescales the kept tokens and fills the others "
            "with troll_fill."
        },
    )
    troll_fill: float = field(
        default=TAIL_FILL,
        metadata={"help": "TROLL: probability of a support id a policy did not keep, with troll_tail='renormalize'."},
    )
    troll_measure_kl: bool = field(
        default=False,
        metadata={
            "help": "TRL's loss types: log KL(pi || pi_old) over TROLL's sparse support at every optimiser step "
            "(troll/kl_before/*, troll/kl_share/*) when a rollout batch feeds several steps; TRL's loss is unchanged."
        },
    )

    troll_old_policy: str = field(
        default="recompute",
        metadata={
            "help": "TROLL: 'recompute' (the old policy from a no-grad forward of the pre-update weights) or 'sampler' "
            "(the top log-probs recorded at generation: HF generate, vLLM, or a rollout_func's logprob_token_ids)."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        self._check_troll_values()
        if self.loss_type in TROLL_LOSSES:
            self._check_troll_compatible()
        if self.troll_old_policy == "sampler":
            self._check_sampler()

    def _check_troll_values(self) -> None:
        if self.loss_type not in TROLL_LOSSES + TRL_LOSS_TYPES:
            close = difflib.get_close_matches(str(self.loss_type), TROLL_LOSSES + TRL_LOSS_TYPES, n=1)
            hint = f"did you mean loss_type={close[0]!r}? " if close else ""
            raise ValueError(
                f"loss_type={self.loss_type!r} is not a known loss type; {hint}Choose one of "
                f"{', '.join(map(repr, TROLL_LOSSES + TRL_LOSS_TYPES))}."
            )
        if not _finite_number(self.temperature) or not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0 and finite, got {self.temperature!r}: the logits are divided by it, for "
                "sampling and in every loss. Set the sampling temperature, e.g. temperature=1.0."
            )
        check_troll_settings(
            kl_bound=self.troll_kl_bound,
            alpha=self.troll_alpha,
            top_k=self.troll_top_k,
            delta=self.troll_delta,
            agg=self.troll_agg,
            names={k: f"troll_{k}" for k in ("kl_bound", "alpha", "top_k", "delta", "agg")},
        )
        check_tail(self.troll_tail, self.troll_fill, names={"tail": "troll_tail", "fill": "troll_fill"})
        if not isinstance(self.troll_measure_kl, bool):
            raise ValueError(
                f"troll_measure_kl must be True or False, got {self.troll_measure_kl!r}: True logs the KL a TRL loss "
                "type reaches on the off-policy steps."
            )
        if self.troll_old_policy not in OLD_POLICIES:
            raise ValueError(
                f"troll_old_policy={self.troll_old_policy!r} is not supported; set troll_old_policy='recompute' (a "
                "no-grad forward of the pre-update weights) or 'sampler' (the log-probs recorded at generation)."
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

    def _check_sampler(self) -> None:
        """What troll_old_policy='sampler' cannot make right, refused with the reason (docs/trl.md)."""
        sampling = dict(top_p=self.top_p, top_k=self.top_k, min_p=self.min_p)
        sampling["repetition_penalty"] = self.repetition_penalty
        if isinstance(self.generation_kwargs, dict):  # they override the fields above
            sampling.update({k: v for k, v in self.generation_kwargs.items() if k in sampling})
        fixes = []
        if sampling["repetition_penalty"] not in (None, 1.0):
            fixes.append(
                f"repetition_penalty={sampling['repetition_penalty']} (the sampler's distribution would carry the "
                "penalty, which the trained policy does not: set repetition_penalty=1.0)"
            )
        if self.use_transformers_continuous_batching:
            fixes.append("use_transformers_continuous_batching=True (generate_batch runs no logits processor)")
        neutral = dict(top_p=(None, 1.0), top_k=(None, 0, -1), min_p=(None, 0, 0.0))
        truncated = [f"{k}={sampling[k]}" for k in neutral if sampling[k] not in neutral[k]]
        if self.use_vllm and truncated:
            fixes.append(
                f"{', '.join(truncated)} with use_vllm=True: vLLM's processed log-probs are renormalised over the "
                "tokens the truncation keeps (trl#6789), so the full temperature-scaled distribution the trust region "
                "is around cannot be recovered from them (set top_p=1.0, top_k=0, min_p=None, or generate with "
                "transformers, whose recorder reads the scores before truncation)"
            )
        if self.use_vllm and self.troll_top_k > VLLM_MAX_LOGPROBS:
            fixes.append(
                f"troll_top_k={self.troll_top_k} with use_vllm=True: vLLM returns at most max_logprobs="
                f"{VLLM_MAX_LOGPROBS} log-probs per token by default (TRL's colocate engine does not raise it; a "
                f"server needs --max-logprobs): set troll_top_k <= {VLLM_MAX_LOGPROBS}"
            )
        if fixes:
            raise ValueError(
                "troll_old_policy='sampler' does not support " + "; ".join(fixes) + ". Or set "
                "troll_old_policy='recompute'."
            )
