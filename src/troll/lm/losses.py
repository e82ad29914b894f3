"""The losses of ``troll train --loss`` and their bounds: how each maps onto TRL, its default bound, and the one
name of each loss family's bound (``kl_bound``, ``clip_eps``, ``cispo_cap``) from the flag to config.json."""

from __future__ import annotations

from typing import NamedTuple

from troll.categorical import defaults
from troll.categorical.defaults import TROLL_LOSSES
from troll.runs.files import UsageError

__all__ = ["BOUNDS", "CLIP_LOSSES", "DEFAULT_LOSSES", "LOSSES", "TROLL_LOSSES", "LossSpec", "bound_name",
           "check_bound_name"]  # fmt: skip


class LossSpec(NamedTuple):
    """How ``--loss NAME`` maps onto TRL (its loss_type and importance_sampling_level), its default bound (the
    RunOptions field :func:`bound_name` names: ``kl_bound``, ``clip_eps`` or ``cispo_cap``), what that bound is for
    it, what the loss does (for the model card), and its default dual clip (TRL's ``delta``; None: none)."""

    loss_type: str
    level: str
    bound: float
    bound_meaning: str
    what: str
    dual_clip: float | None = None


_KL = "per-token KL bound of the trust region"
_CLIP = "clip range of the ratio"
_TROLL_WHAT = {
    "troll": "TROLL's per-token trust region",
    "troll_seq": "TROLL's per-token trust region with a GSPO-style sequence-level weight",
}
LOSSES: dict[str, LossSpec] = {
    **{name: LossSpec(name, "token", defaults.KL_BOUND, _KL, _TROLL_WHAT[name]) for name in TROLL_LOSSES},
    **{
        name: LossSpec(name, "token", defaults.CLIP_EPS, _CLIP, f"TRL's `{name}` clipped loss")
        for name in ("grpo", "dapo", "dr_grpo", "bnpo")
    },
    "cispo": LossSpec(
        "cispo", "token", defaults.CISPO_EPS_HIGH, "upper cap of the detached ratio", "TRL's `cispo` loss"
    ),
    # GSPO: sequence-level ratio with TRL's "grpo" normalisation; the GSPO paper clips at 3e-4 / 4e-4.
    "gspo": LossSpec(
        "grpo",
        "sequence",
        3e-4,
        "clip range of the sequence-level ratio",
        "TRL's `grpo` loss with GSPO's sequence-level importance ratio",
    ),
    # The TROLL paper's baselines. Its "GRPO (clip)": token-mean aggregation (TRL's "dapo" normalisation), a clip of
    # 0.2 and a dual clip at 10 (TRL's delta caps the ratio of negative-advantage tokens there).
    "clip": LossSpec(
        "dapo",
        "token",
        defaults.CLIP_EPS,
        _CLIP,
        "the TROLL paper's GRPO clip baseline: TRL's `dapo` loss (token-mean) with a dual clip",
        defaults.DUAL_CLIP,
    ),
    # Its GSPO runs aggregate token-mean as well: GSPO's sequence-level ratio with TRL's "dapo" normalisation.
    "gspo_tm": LossSpec(
        "dapo",
        "sequence",
        3e-4,
        "clip range of the sequence-level ratio",
        "TRL's `dapo` loss (token-mean) with GSPO's sequence-level importance ratio",
    ),
}
# Losses whose ratio TRL clips to [1 - clip_eps, 1 + clip_eps_high] (--clip-eps-high, --dual-clip apply to them).
CLIP_LOSSES = tuple(name for name, spec in LOSSES.items() if spec.loss_type in ("grpo", "dapo", "dr_grpo", "bnpo"))
# One name per quantity, from the flag to the projection: the bound of each loss family under the name its users know
# (TRL's epsilon is the clip range; CISPO caps the detached ratio), as a flag (--kl-bound), an arm's option
# (troll:kl-bound=0.2), a RunOptions field, and a key of config.json and summary.json.
BOUNDS: dict[str, tuple[tuple[str, ...], str]] = {
    "kl_bound": (TROLL_LOSSES, "TROLL losses: the per-token KL bound of the trust region"),
    "clip_eps": (CLIP_LOSSES, "clip losses: the clip range of the ratio (TRL's epsilon)"),
    "cispo_cap": (("cispo",), "cispo: the cap of the detached ratio (TRL's epsilon_high)"),
}
# compare and study: the first TROLL loss against the first clip loss unless --losses says otherwise
DEFAULT_LOSSES = ("troll", "grpo")


def bound_name(loss: str) -> str | None:
    """The name of ``loss``'s bound in :data:`BOUNDS` (``kl_bound``, ``clip_eps`` or ``cispo_cap``); None for an
    unknown loss."""
    return next((name for name, (users, _) in BOUNDS.items() if loss in users), None)


def check_bound_name(loss: str, name: str, *, form: str = "--{}", subject: str = "--loss") -> None:
    """Raise :class:`UsageError` when ``name``, a bound of :data:`BOUNDS`, is not ``loss``'s own: a bound means one
    thing. ``form`` spells a name as the user wrote it (``--{}``: a flag; ``{}=``: an arm's option)."""
    own = bound_name(loss)
    if own is None or own == name:  # an unknown loss: check_values names it
        return
    users, meaning = BOUNDS[name]
    flag, own_flag = (form.format(n.replace("_", "-")) for n in (name, own))
    raise UsageError(f"{flag} sets {meaning.split(': ')[1]} of {', '.join(users)}; {subject} {loss} takes {own_flag}.")
