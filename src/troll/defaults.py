"""The paper's hyper-parameters (arXiv 2510.03817; docs/method.md), in one place for every entry point."""

from __future__ import annotations

KL_BOUND = 0.05  # eps: the per-token bound KL(pi || pi_old) <= eps
ALPHA = 1.0  # weight of the regression KL(pi~ || sg(pi)) to the projected policy
TOP_K = 64  # most tokens kept per position when sparsifying a policy
DELTA = 1e-5  # keep tokens until their mass reaches 1 - DELTA
CLIP_EPS = 0.2  # PPO/GRPO clip range of the baselines
CISPO_EPS_HIGH = 5.0  # CISPO's cap on the importance weight (as TRL's loss_type="cispo")
MAX_LOG_RATIO = 10.0  # sequence-level (GSPO) log importance ratios are clamped here
