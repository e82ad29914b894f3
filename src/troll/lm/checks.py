"""The checks of a run's options (:func:`check_values`, which :class:`~troll.lm.options.RunOptions` runs when made):
every value finite, of its type and in its bounds, only the loss's own options set, and a batch shape that splits.
Each refusal is a :class:`~troll.runs.files.UsageError` naming the flag and how to fix it."""

from __future__ import annotations

from typing import Any

from troll.categorical import defaults
from troll.categorical.settings import check_tail, check_troll_settings
from troll.lm.code_data import REWARD_WORDS
from troll.lm.losses import BOUNDS, CLIP_LOSSES, LOSSES, TROLL_LOSSES, bound_name, check_bound_name
from troll.runs.files import UsageError
from troll.runs.numbers import check_choice, check_int, check_real, check_seed, is_int, is_real

# A troll.lm.options.RunOptions; not imported, not even for type checkers: options.py imports this module, and the
# checks read only the options' fields.
RunOptions = Any

__all__ = ["LIMITS", "MEASURE_KL", "check_batch_shape", "check_run", "check_used", "check_values"]

MEASURE_KL = ("auto", "on", "off")
CODE_REWARDS = tuple(REWARD_WORDS)  # --code-reward: the share of tests passed, or all of them
# How check_troll_settings names TROLL's settings in a message: as the flags of troll train.
TROLL_FLAGS = {"kl_bound": "--kl-bound", "alpha": "--alpha", "top_k": "--top-k", "delta": "--delta"}


def check_run(opts: RunOptions) -> None:
    """:class:`UsageError` for shared options (``loss=None``), which are no run of their own."""
    if opts.loss is None:
        raise UsageError(
            "these options have no loss (loss=None: the options a comparison or study shares), so they are no run; "
            f"give a loss ({', '.join(LOSSES)}), or make each loss's run with for_loss(options, loss)."
        )


def check_values(opts: RunOptions) -> None:
    """Raise :class:`UsageError` for any value TRL or TROLL would reject later (or silently misuse); the one checker
    of :class:`RunOptions`, which calls it when made.

    Every number must be finite and of the field's type (NaN passes ``x < 0``, so each check is written as the
    condition that must hold). TROLL's own settings go through
    :func:`troll.categorical.settings.check_troll_settings`, the
    one rule set the library, the TRL config and verl share. Shared options (``loss=None``) are checked value by
    value; whether an option concerns the loss is checked in each loss's run.
    """
    if opts.loss is not None and opts.loss not in LOSSES:
        raise UsageError(f"unknown loss {opts.loss!r}; choose one of: {', '.join(LOSSES)}.")
    for name in ("model", "task"):
        if not isinstance(getattr(opts, name), str) or not getattr(opts, name).strip():
            raise UsageError(f"--{name} must be a non-empty string, got {getattr(opts, name)!r}.")
    _check_troll(opts)
    _check_loss_options(opts)
    _check_positive(lr=opts.lr)
    _check_positive_int(prompts_per_step=opts.prompts_per_step)
    if opts.steps is not None:
        _check_positive_int(steps=opts.steps)
    if opts.temperature is not None:
        _check_positive(temperature=opts.temperature)
    for name in ("max_completion_length", "heldout"):
        if getattr(opts, name) is not None:
            _check_positive_int(**{name: getattr(opts, name)})
    if opts.heldout_samples is not None:
        check_int("--heldout-samples", opts.heldout_samples, low=0, high=LIMITS["heldout_samples"], error=UsageError)
    _check_positive_int(steps_per_rollout=opts.steps_per_rollout, threads=opts.threads)
    for name in ("eval_every", "save_every"):
        value = getattr(opts, name)
        if value is not None and not (_is_int(value) and value >= 0):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be a whole number >= 0 (0: only at the end), got {value}.")
    check_seed("--seed", opts.seed, error=UsageError)
    if not isinstance(opts.out, str):
        raise UsageError(f"--out must be a folder path, got {opts.out!r}.")
    if opts.system is not None and not (isinstance(opts.system, str) and opts.system.isprintable()):
        raise UsageError(f'--system must be one line of printable text ("" for an empty message), got {opts.system!r}.')
    _check_code_reward(opts)
    check_batch_shape(opts)


def _check_code_reward(opts: RunOptions) -> None:
    from troll.lm import code_data

    if opts.code_reward is None:
        return
    if opts.code_reward not in CODE_REWARDS:
        raise UsageError(f"--code-reward must be one of {', '.join(CODE_REWARDS)}, got {opts.code_reward!r}.")
    if not code_data.is_code_task(opts.task):
        raise UsageError(f"--code-reward applies to code tasks only; --task {opts.task} has its own reward: drop it.")


def _check_troll(opts: RunOptions) -> None:
    """The loss's bound: only its own is set (``--clip-eps`` is no option of ``--loss troll``), and for the other
    losses a finite number > 0; TROLL's bound, and alpha, top_k and delta (checked for every loss, so that the shared
    options of a comparison fail before any run starts) through the library's own check."""
    own = None if opts.loss is None else bound_name(opts.loss)
    for name in BOUNDS:
        if own is not None and name != own and getattr(opts, name) is not None:
            check_bound_name(opts.loss, name)
    for name in ("clip_eps", "cispo_cap"):
        value = getattr(opts, name)
        if value is None or (_is_number(value) and value > 0):
            continue
        meaning = BOUNDS[name][1].split(": ")[1] if own is None else LOSSES[opts.loss].bound_meaning
        whom = f"the {BOUNDS[name][1].split(':')[0]}" if own is None else opts.loss
        raise UsageError(f"--{name.replace('_', '-')} must be a finite number > 0 (for {whom} it is the {meaning}), "
                         f"got {value}.")  # fmt: skip
    # A clip loss's bound, valid by now, is no KL bound; passing it keeps the call whole and cannot fail.
    kl_bound = opts.bound if own is not None else opts.kl_bound
    if kl_bound is None:  # shared options without --kl-bound: TROLL's default, to check the others with
        kl_bound = LOSSES[TROLL_LOSSES[0]].bound
    try:
        check_troll_settings(kl_bound=kl_bound, alpha=opts.alpha, top_k=opts.top_k, delta=opts.delta, names=TROLL_FLAGS)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _check_loss_options(opts: RunOptions) -> None:
    """--agg, --tail, --clip-eps-high, --dual-clip and --measure-kl: their values, and that the loss uses them."""
    try:
        if opts.agg is not None:
            check_choice("--agg", opts.agg, defaults.AGGREGATIONS)
        check_tail(opts.tail, defaults.TAIL_FILL, names={"tail": "--tail"})
    except ValueError as err:
        raise UsageError(str(err)) from None
    if opts.measure_kl not in MEASURE_KL:
        raise UsageError(
            f"--measure-kl must be auto, on or off, got {opts.measure_kl!r}: whether a clip loss logs the KL it "
            "reaches (auto: when a rollout batch feeds several optimiser steps)."
        )
    if opts.clip_eps_high is not None and not (_is_number(opts.clip_eps_high) and opts.clip_eps_high > 0):
        raise UsageError(
            f"--clip-eps-high must be a finite number > 0 (the upper clip range, TRL's epsilon_high; DAPO's "
            f"clip-higher uses 0.28), got {opts.clip_eps_high}."
        )
    if opts.dual_clip is not None and not (_is_number(opts.dual_clip) and opts.dual_clip >= 0):
        raise UsageError(
            f"--dual-clip must be 0 (none) or a finite number > 1 + the upper clip range (TRL's delta; the paper: "
            f"10), got {opts.dual_clip}."
        )
    if not (_is_number(opts.beta) and 0 <= opts.beta <= LIMITS["beta"]):
        raise UsageError(
            f"--beta must be a finite number from 0 (no KL penalty, the default) to {LIMITS['beta']:g}, the weight of "
            f"the KL penalty to the starting model (DeepSeek's GRPO used 0.04), got {opts.beta}."
        )
    _check_applies(opts)


def _check_applies(opts: RunOptions) -> None:
    """An option the loss ignores is refused (compare and study drop it for the losses it does not concern)."""
    if opts.loss is None:
        return
    given = {flag for flag, value in (("--agg", opts.agg), ("--clip-eps-high", opts.clip_eps_high),
                                      ("--dual-clip", opts.dual_clip)) if value is not None}  # fmt: skip
    if "--agg" in given and opts.loss not in TROLL_LOSSES:
        raise UsageError(
            f"--agg sets the aggregation of the TROLL losses ({', '.join(TROLL_LOSSES)}); {opts.loss} aggregates as "
            "TRL's loss type does (--loss clip and gspo_tm are token-mean). Drop --agg or pick a TROLL loss."
        )
    clip_given = sorted(given - {"--agg"})
    if clip_given and opts.loss not in CLIP_LOSSES:
        raise UsageError(
            f"{' and '.join(clip_given)}: only the clip losses ({', '.join(CLIP_LOSSES)}) clip their ratio that way, "
            f"{opts.loss} does not. Drop {' and '.join(clip_given)} or pick a clip loss."
        )
    if opts.beta and opts.loss in TROLL_LOSSES:
        raise UsageError(
            f"--beta {opts.beta:g}: {opts.loss} takes no KL penalty to the starting model; its trust region bounds "
            "each step instead. Drop --beta or pick another loss (e.g. --loss clip)."
        )
    if opts.loss in CLIP_LOSSES and opts.dual_clip:
        high = opts.bound if opts.clip_eps_high is None else opts.clip_eps_high
        if _is_number(opts.bound) and not opts.dual_clip > 1 + high:
            raise UsageError(
                f"--dual-clip {opts.dual_clip:g} must exceed 1 + the upper clip range ({1 + high:g}): it caps the loss "
                "of negative-advantage tokens at -c A beyond the clip; set e.g. --dual-clip 10 (the paper), or 0 for "
                "none."
            )


def check_used(opts: RunOptions, losses: list[str], swept: str | None = None) -> None:
    """Compare and study: a loss-specific option given on the command line (or ``swept``) must concern one of
    ``losses``; :func:`for_loss` drops it for the others."""
    names = ("agg", "clip_eps", "clip_eps_high", "dual_clip")
    given = {name: getattr(opts, name) for name in names}
    for name, value in given.items():
        if value is None and name != swept:
            continue
        family, users = ("TROLL", TROLL_LOSSES) if name == "agg" else ("clip", CLIP_LOSSES)
        if not set(losses) & set(users):
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag} concerns the {family} losses ({', '.join(users)}), and --losses has none: "
                f"{','.join(losses)}. Drop {flag} or add such a loss."
            )
    if (opts.beta or swept == "beta") and not set(losses) - set(TROLL_LOSSES):
        raise UsageError(
            f"--beta concerns the losses other than TROLL's, and --losses has none: {','.join(losses)}. Drop --beta "
            "or add such a loss (e.g. clip)."
        )


_is_number = is_real
_is_int = is_int
# Upper limits of the numeric flags (beyond them a step overflows, or the sizes cannot be allocated on one machine).
LIMITS = {"lr": 1.0, "steps": 10**9, "heldout": 10**6, "prompts_per_step": 10**5, "max_completion_length": 10**6,
          "steps_per_rollout": 10**5, "threads": 1024, "temperature": 1e6, "heldout_samples": 1024,
          "beta": 1e6}  # fmt: skip


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        check_real("--" + name.replace("_", "-"), value, low=0, high=LIMITS.get(name), error=UsageError)


def _check_positive_int(**values: int) -> None:
    for name, value in values.items():
        check_int("--" + name.replace("_", "-"), value, low=1, high=LIMITS.get(name), error=UsageError)


def check_batch_shape(opts: RunOptions) -> None:
    """The rollout batch must split into whole optimiser batches, and GRPO needs at least two samples a prompt.

    Shared options (``loss=None``) are checked value by value only: a study's sweep or arm may still set
    --prompts-per-step, --generations, --steps-per-rollout or --save-every, and a resumed run keeps its saved
    ones, so how they fit together is checked in each run."""
    if opts.generations is not None and not (_is_int(opts.generations) and opts.generations >= 2):
        raise UsageError(
            f"--generations must be >= 2: GRPO's advantage compares the samples of one prompt, got {opts.generations}."
        )
    if opts.loss is None:
        return
    if opts.rollout_size % opts.steps_per_rollout:
        generations = opts.rollout_size // opts.prompts_per_step
        raise UsageError(
            f"a rollout batch of --prompts-per-step {opts.prompts_per_step} x --generations {generations} = "
            f"{opts.rollout_size} completions cannot be split into --steps-per-rollout {opts.steps_per_rollout} "
            "equal optimiser batches; pick values whose product is a multiple of --steps-per-rollout."
        )
    every = opts.save_every
    if _is_int(every) and every % opts.steps_per_rollout:
        raise UsageError(
            f"--save-every {every} is not a multiple of --steps-per-rollout {opts.steps_per_rollout}: a checkpoint "
            "inside a rollout batch cannot hold the rest of that batch, so a run resumed from it would sample a new "
            f"one; pick a multiple of {opts.steps_per_rollout} (or 0: no checkpoints)."
        )
