"""The check of TROLL's hyper-parameters, shared by the losses, ``TrollGRPOConfig``, verl's ``troll`` section and
``troll train``; torch-free, so that the command line validates its input without importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from troll.categorical.defaults import AGGREGATIONS, ALPHA, DELTA, KL_BOUND, LEVELS, TAILS, TOP_K
from troll.runs.numbers import FieldError, check_choice, is_int, is_real


def check_troll_settings(
    *,
    kl_bound,
    alpha,
    top_k,
    delta,
    level: str | None = None,
    agg: str | None = None,
    names: Mapping[str, str] | None = None,
) -> None:
    """The one check of TROLL's hyper-parameters, shared by the losses, ``TrollGRPOConfig``, verl's ``troll`` section
    and ``troll train``. ``names`` maps a setting to what the caller calls it (e.g. ``{"kl_bound":
    "troll_kl_bound"}`` or ``{"kl_bound": "--kl-bound"}``), so that the message names the argument the user wrote.
    ``level`` / ``agg`` are checked when given."""
    names = names or {}

    def fail(key: str, value, rule: str, meaning: str, paper) -> None:
        _fail(names.get(key, key), value, rule, meaning, paper)

    if not _finite(kl_bound) or not kl_bound > 0:
        fail("kl_bound", kl_bound, "> 0 and finite", "the per-token KL bound of the trust region", KL_BOUND)
    if not _finite(alpha) or not alpha >= 0:
        fail("alpha", alpha, ">= 0 and finite", "the weight of the regression to the projected policy", ALPHA)
    check_top_k(top_k, names.get("top_k", "top_k"))
    check_delta(delta, names.get("delta", "delta"))
    if level is not None:
        check_choice(names.get("level", "level"), level, LEVELS)
    if agg is not None:
        check_choice(names.get("agg", "agg"), agg, AGGREGATIONS)


_finite = is_real  # the one check of a number (troll.runs.numbers)


def _fail(name: str, value, rule: str, meaning: str, paper) -> None:
    """The message of a bad TROLL setting, naming it as the caller does (``top_k``, ``--top-k``, a config key)."""
    fix = f"{name} {paper!r}" if name.startswith("-") else f"{name}={paper!r}"  # a flag, or a key (Hydra's too)
    raise FieldError(
        f"{name} must be {rule}, got {value!r}: it is {meaning}. Set e.g. {fix} (the paper's value).", name
    )


def check_top_k(top_k, name: str = "top_k") -> None:
    """top_k, the most tokens kept per position: an integer >= 1 (the one rule, for the losses and every config)."""
    if not is_int(top_k) or top_k < 1:
        _fail(name, top_k, "an integer >= 1", "the most tokens kept per position", TOP_K)


def check_delta(delta, name: str = "delta") -> None:
    """delta, the probability mass left out when sparsifying: a number in [0, 1) (0 keeps exactly top_k tokens)."""
    if not _finite(delta) or not 0 <= delta < 1:
        meaning = "the probability mass left out when sparsifying (0 keeps exactly top_k tokens)"
        _fail(name, delta, "in [0, 1)", meaning, DELTA)


def check_tail(tail: str, fill: float, *, names: Mapping[str, str] | None = None) -> None:
    """``tail`` one of :data:`troll.categorical.defaults.TAILS`; ``fill`` (the renormalize mode's probability) in (0,
    1e-3]."""
    names = names or {}
    check_choice(names.get("tail", "tail"), tail, TAILS)
    if not _finite(fill) or not 0 < fill <= 1e-3:
        name = names.get("fill", "fill")
        raise ValueError(
            f"{name} must lie in (0, 1e-3], got {fill!r}: it is the probability tail='renormalize' gives a support id "
            "a policy did not keep (the paper's code uses 1e-12)."
        )
