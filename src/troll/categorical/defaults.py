"""The paper's hyper-parameters (arXiv 2510.03817; docs/method.md) and the names every entry point shares.

One place for each: the library's keyword defaults, ``TrollGRPOConfig``, verl's ``troll`` section and ``troll
train`` read them from here, so a name or a default is never written twice.
"""

from __future__ import annotations

KL_BOUND = 0.05  # eps: the per-token bound KL(pi || pi_old) <= eps
ALPHA = 1.0  # weight of the regression KL(pi~ || sg(pi)) to the projected policy
TOP_K = 64  # most tokens kept per position when sparsifying a policy
DELTA = 1e-5  # keep tokens until their mass reaches 1 - DELTA
CLIP_EPS = 0.2  # PPO/GRPO clip range of the baselines
DUAL_CLIP = 10.0  # the paper's clip baseline caps the loss of negative-advantage tokens at -c A with c = 10
CISPO_EPS_HIGH = 5.0  # CISPO's cap on the importance weight (as TRL's loss_type="cispo")
MAX_LOG_RATIO = 10.0  # sequence-level (GSPO) log importance ratios are clamped here

# The TROLL loss types: "troll" (token-level ratio) and "troll_seq" (GSPO-style sequence-level weight). The same
# names are TRL's loss_type, verl's policy_loss.loss_mode and ``troll train --loss``.
TROLL_LOSSES = ("troll", "troll_seq")
LEVELS = ("token", "sequence")
# Token aggregations (docs/method.md, "The loss"); verl's loss_agg_mode uses the same names.
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def troll_level(loss: str) -> str:
    """The level a TROLL loss projects at: "sequence" for "troll_seq" (GSPO-style weights), else "token"."""
    return "sequence" if loss == "troll_seq" else "token"


def troll_agg(loss: str, agg: str | None = None) -> str:
    """The aggregation a TROLL loss uses: ``agg`` if given, else token-mean for "troll" (as TRL's "dapo") and
    seq-mean-token-mean for "troll_seq" (as TRL's "grpo", the GSPO setup)."""
    if agg is not None:
        return agg
    return "seq-mean-token-mean" if loss == "troll_seq" else "token-mean"


# How an integration reads the policy off a language model: "chunked" (final hidden states and the LM head's weight
# in vocabulary chunks, never the (tokens, V) logits) or "dense" (the model's logits).
LM_HEADS = ("chunked", "dense")
LM_HEAD = "chunked"
# How the mass outside the kept tokens enters the projection (docs/method.md, "The sparse support"): "bucket" keeps it
# as one rest category on each side (this library's default); "renormalize" rescales each policy's kept tokens to sum
# to one and gives every id of the support it did not keep the probability TAIL_FILL (the paper's code).
TAILS = ("bucket", "renormalize")
TAIL = "bucket"
TAIL_FILL = 1e-12
# Key prefix of the old sparse policy's tensors in a batch container (SparseLogProbs.to_dict / from_dict).
OLD_PREFIX = "troll_old_"
