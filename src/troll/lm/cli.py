"""``troll train``, ``troll compare`` and ``troll study``: GRPO runs of a language model with TROLL or clipping;
``troll status``, where studies stand.

The provider of these subcommands (see :mod:`troll.cli`): their parsers and handlers; the flags themselves,
their help and their translation into a run's options are in :mod:`troll.lm.flags`. Every input is checked before
a model is loaded or a file is written; a bad one exits with status 2 and a message saying how to fix it. Heavy
imports (transformers, TRL, reasoning_gym's tasks, matplotlib) happen in the handlers, once a run starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from troll import runs
from troll.lm.api import cache_note as _cache_note
from troll.lm.api import quiet as _quiet
from troll.lm.api import train, validate
from troll.lm.flags import (
    BOUND_FLAGS,
    CMP_DOC,
    KL_BOUND_HELP,
    LOSS_HELP,
    RUN_ARGS,
    STATUS_DOC,
    STUDY_DOC,
    TRAIN_DOC,
    add_run_args,
    options_from_args,
)
from troll.lm.options import CODE_DEFAULTS, DEFAULT_LOSSES, LOSSES, RESUMABLE_FIELDS, RunOptions
from troll.runs.files import CONFIG_FILE, UsageError
from troll.study import executors


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
    study.add_argument("--kl-bound", type=float, default=argparse.SUPPRESS, help=KL_BOUND_HELP)
    study.add_argument(
        "--clip-eps",
        type=float,
        default=argparse.SUPPRESS,
        help="the clip losses' clip range (default: each loss's own)",
    )
    study.add_argument("--jobs", type=int, default=1, help="cells run at once, as subprocesses (default: 1)")
    study.add_argument("--keep-checkpoints", action="store_true", help="keep each cell's checkpoint-N/ (~1.1 GB)")
    study.add_argument("--keep-model", action="store_true", help="keep each cell's final model/ (~0.5 GB)")
    add_run_args(study, "study folder (default: runs/study-<task>)", skip=("--seed",))
    executors.add_flags(study)
    study.set_defaults(run=_listing(cmd_study), name="study")


def add_commands(sub) -> None:
    """Register train, compare, study, status and eval-code (the provider hook of :mod:`troll.cli`)."""
    train = sub.add_parser("train", help="one GRPO run with TROLL or a clipped loss", description=TRAIN_DOC)
    train.add_argument("--loss", default=argparse.SUPPRESS, help=LOSS_HELP)
    for flag, users, meaning in BOUND_FLAGS.values():
        shown = ", ".join(f"{k} {LOSSES[k].bound:g}" for k in users)
        train.add_argument(flag, type=float, default=argparse.SUPPRESS, help=f"{meaning} (default: {shown})")
    add_run_args(train, "run folder (default: runs/<loss>-<task>-seed<seed>)")
    train.add_argument("--options", default=argparse.SUPPRESS, metavar="FILE", help="the run's options as a JSON "
                       "object of their fields instead of flags (a study writes one for each cell)")  # fmt: skip
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
    compare.add_argument("--kl-bound", type=float, default=argparse.SUPPRESS, help=KL_BOUND_HELP)
    compare.add_argument(
        "--clip-eps",
        type=float,
        default=None,
        help=f"the clip losses' clip range (default: each loss's own, grpo {LOSSES['grpo'].bound:g})",
    )
    add_run_args(compare, "comparison folder (default: runs/compare-<task>-seed<seed>)")
    compare.set_defaults(run=_listing(cmd_compare), name="compare")
    _add_study_parser(sub)
    status = sub.add_parser("status", help="where the studies below a folder stand", description=STATUS_DOC)
    status.add_argument("folder", metavar="FOLDER", help="a study's --out, or a folder holding studies")
    status.set_defaults(run=cmd_status, name="status")
    _add_eval_code_parser(sub)


def cmd_status(args: argparse.Namespace) -> int:
    """Print where the studies stand; exit status 1 when one of them could not be read."""
    from troll.lm.status import status_text
    from troll.study.status import show

    return show(*status_text(Path(args.folder)))


def _listing(handler):
    """``--list-tasks`` on any of the three subcommands lists the tasks instead of running."""

    def run(args: argparse.Namespace) -> int:
        return list_tasks() if args.list_tasks else handler(args)

    return run


def resume_options(args: argparse.Namespace) -> RunOptions:
    """The saved options of the run in --out, with the few that may change on resume taken from the command line."""
    from troll.lm import options
    from troll.lm.options import saved_options

    if not hasattr(args, "out"):
        raise UsageError("--resume needs --out, the run folder to continue.")
    if hasattr(args, "options"):
        raise UsageError("--resume continues with the options in the folder's config.json; drop --options.")
    # each flag's value checked; how they fit together is the saved run's (its loss, batch shape, ...)
    options_from_args(args, shared=True)
    path = Path(args.out) / CONFIG_FILE
    if runs.check_folder(Path(args.out), options.COMMAND, resume=True, overwrite=False) == "new":
        if not path.is_file() and any(Path(args.out).iterdir()):
            # killed while its first config.json was written: nothing ran, so the run starts over from the flags
            print(f"troll train: {args.out} holds no complete config.json; the run starts over", file=sys.stderr)
            return options_from_args(args)
        raise UsageError(f"--resume: {path} not found; start the run without --resume.")
    saved = saved_options(Path(args.out))
    changed = [
        f.name
        for f in dataclasses.fields(RunOptions)
        if hasattr(args, f.name)
        and f.name not in (*RESUMABLE_FIELDS, "out")
        and getattr(args, f.name) != getattr(saved, f.name)
    ]
    if changed:
        names = ", ".join("--" + c.replace("_", "-") for c in changed)
        raise UsageError(f"--resume continues the saved run; {names} differ from its config.json. Drop them.")
    given = {k: getattr(args, k) for k in RESUMABLE_FIELDS if hasattr(args, k)}
    return dataclasses.replace(saved, **given, out=args.out)


def given_options(args: argparse.Namespace) -> RunOptions:
    """The options of a new run: from the flags, or all from ``--options FILE`` (:mod:`troll.study.options`), which
    no run flag may join and ``--resume`` does not read (the folder's config.json holds the run's options)."""
    if not hasattr(args, "options"):
        return options_from_args(args)
    from troll.study import options as cell_options

    flags = [
        "--" + f.name.replace("_", "-")
        for f in dataclasses.fields(RunOptions)
        if f.name != "out" and hasattr(args, f.name)
    ]
    if flags:
        raise UsageError(f"--options {args.options} gives every option of the run; drop {', '.join(flags)} (or drop "
                         "--options and give them all as flags).")  # fmt: skip
    values = cell_options.read(Path(args.options), RunOptions)
    return RunOptions(**values, **({"out": args.out} if hasattr(args, "out") else {}))


def cmd_train(args: argparse.Namespace) -> int:
    runs.exclusive(resume=args.resume, overwrite=args.overwrite)
    # --out from the first look on (the default folder once it is known), so that no other process changes it
    # between the checks and the run
    with runs.holding(args.out) if hasattr(args, "out") else contextlib.nullcontext():
        opts = (resume_options(args) if args.resume else given_options(args)).resolved()
        with runs.holding(opts.out):
            return _train_command(args, opts)


def _train_command(args: argparse.Namespace, opts) -> int:
    """The run through the public :func:`troll.lm.api.train`, which checks the folder, task and model first."""
    summary = train(opts, resume=args.resume, overwrite=args.overwrite, keep_checkpoints=args.keep_checkpoints,
                    save_model=not args.no_model)  # fmt: skip
    _report(opts.out, summary)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from troll.lm import compare

    losses = compare.parse_losses(args.losses)
    base = options_from_args(args, shared=True)
    runs = compare.plan(base, losses)
    for opts in runs:
        validate(opts)
    out = Path(runs[0].out).parent
    clear = compare.check_compare_folder(out, overwrite=args.overwrite, resume=args.resume, runs=runs)
    _quiet()
    _cache_note(runs[0].model)
    result = compare.run(out, runs, clear=clear, resume=args.resume)
    print(f"wrote {out / compare.PLOT_FILE} and {out / compare.TABLE_FILE}")
    print(result)
    return 0


def study_spec(args: argparse.Namespace):
    """(StudySpec, study folder) from the command line; with --resume, the saved grid, which flags may not change
    (except --losses and --seeds, which may add to it: troll.study.grid.grows)."""
    from troll.lm import study
    from troll.study import parse_seeds

    losses = study.parse_arms(args.losses) if hasattr(args, "losses") else None
    saved = None
    if args.resume:
        if not hasattr(args, "out"):
            raise UsageError("--resume needs --out, the study folder to continue.")
        saved = study.load_spec(Path(args.out))
    given = options_from_args(args, shared=True)
    if saved:
        names = [f.name for f in dataclasses.fields(RunOptions) if hasattr(args, f.name)]
        base = dataclasses.replace(saved.base, **{k: getattr(given, k) for k in names})
    else:
        base = given
    types = {flag[2:].replace("-", "_"): kind for flag, kind, _ in RUN_ARGS} | study.SWEEP_BOUNDS
    key, values = (saved.sweep_key, saved.sweep_values) if saved else (None, [])
    if hasattr(args, "sweep"):
        key, values = study.parse_sweep(args.sweep, types)
    spec = study.StudySpec(
        dataclasses.replace(base, out="", seed=0),
        losses or (saved.losses if saved else list(DEFAULT_LOSSES)),
        parse_seeds(args.seeds) if hasattr(args, "seeds") else (saved.seeds if saved else [0, 1, 2]),
        key,
        values,
    )
    if saved:
        _check_same_grid(spec, saved)
    from troll.lm.options import task_label

    return spec, Path(getattr(args, "out", "") or f"runs/study-{task_label(base.task)}")


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
        ]
        if a != b and not (name in ("losses", "seeds") and grows(b, a))
    ]
    if changed:
        raise UsageError(
            f"--resume continues the saved study; {', '.join(changed)} differ from its config.json. Drop them "
            "(more --losses or --seeds may be added, none dropped), or start a new study with another --out."
        )


def cmd_study(args: argparse.Namespace) -> int:
    from troll.lm import model, study, tasks
    from troll.study import check_folder
    from troll.study.command import check_jobs, cmd_study

    runs.exclusive(resume=args.resume, overwrite=args.overwrite)
    jobs = check_jobs(args.jobs)
    executor = executors.from_args(args)
    spec, out = study_spec(args)
    out = executors.resolve_out(executor, out)
    cells = study.plan(spec, out)
    swept = f"--sweep {spec.sweep_key}: " if spec.sweep_key in ("model", "task") else ""
    for model_name, task in sorted({(c.options.model, c.options.task) for c in cells}):
        try:
            tasks.check_task(task)
            model.resolve_model(model_name)
        except UsageError as err:
            raise UsageError(f"{swept}{err}") from err
    clear = check_folder(out, command=study.COMMAND, overwrite=args.overwrite, resume=args.resume)
    engine = study.frontend(keep_checkpoints=args.keep_checkpoints, keep_model=args.keep_model,
                            threads=spec.base.threads)  # fmt: skip
    executor = executors.prepare(executor, out, engine, cells)
    script = executors.script(executor, engine, cells)
    if script is not None:
        print(script)
        return 0
    _prepare_default_model({c.options.model for c in cells})

    def run(report):
        return study.run(
            out, spec, cells, clear=clear, jobs=jobs, keep_checkpoints=args.keep_checkpoints,
            keep_model=args.keep_model, report=report, executor=executor,
        )  # fmt: skip

    return cmd_study("study", out, len(cells), jobs, run, executor=executor)


def _prepare_default_model(names: set[str]) -> None:
    """Convert the packaged GGUF once here, so that parallel cells do not all convert it at the same time."""
    from troll.lm import model

    if model.DEFAULT_MODEL in names and not model.is_cached():
        _cache_note(model.DEFAULT_MODEL)
        _quiet()
        model.ensure_cached(model.resolve_model(model.DEFAULT_MODEL))


def _report(out: str, summary: dict) -> None:
    keys = ("heldout_accuracy_before", "heldout_accuracy_after", "train_time_s", "wall_time_s")
    sampled = {k: v for k, v in summary.items() if k.startswith("heldout_sampled_")}  # code tasks: pass@1, pass@4
    print(json.dumps({k: summary.get(k) for k in keys} | sampled))
    print(f"run folder: {out}")


def list_tasks() -> int:
    from troll.lm.code_tasks import TASKS
    from troll.lm.tasks import DEFAULT_TASK, PRESETS, task_names

    for name in task_names():
        preset = f"  (preset: {PRESETS[name]})" if name in PRESETS else ""
        print(f"{name}{' [default]' if name == DEFAULT_TASK else ''}{preset}")
    for name, families in TASKS.items():
        print(f"{name}  (code: generated Python functions; {', '.join(families)})")
    print("jsonl:PATH  (code: your prompts and tests, docs/code.md)")
    return 0


EVAL_CODE_DOC = (
    "pass@k of a model on a code task: HumanEval (--task humaneval: the problems whose tests convert to "
    "call-style cases), the held-out items of a generated task (code, code_<family>), or a JSONL file "
    "(jsonl:PATH). Prints one JSON object: pass_at_1 (greedy), sampled (the unbiased pass@1 and pass@4 of --samples "
    "completions an item at --temperature), reward (mean fraction of tests passed, greedy), greedy pass@1 per family "
    "and per function asked for (generated tasks), and the HumanEval problems left out by reason. A bar on stderr "
    "shows the items done, the pass rate so far and the time left."
)


def _add_eval_code_parser(sub) -> None:
    p = sub.add_parser(
        "eval-code", help="pass@1 and pass@4 of a model on HumanEval or a code task", description=EVAL_CODE_DOC
    )
    p.add_argument("--task", default="humaneval", help="humaneval, code, code_<family> or jsonl:PATH "
                   "(default: humaneval)")  # fmt: skip
    p.add_argument("--model", default="smollm2", help="as troll train's --model (default: smollm2)")
    p.add_argument("--n", type=int, default=None, help="items evaluated (default: all of HumanEval or the file; "
                   "128 held-out items of a generated task)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="a generated task's seed, as troll train's (default: 0)")
    p.add_argument("--max-completion-length", type=int, default=None,
                   help="new tokens a completion (default: 384 for HumanEval, 160 otherwise)")  # fmt: skip
    p.add_argument("--samples", type=int, default=CODE_DEFAULTS.heldout_samples,
                   help="completions an item sampled at --temperature for pass@1 and pass@4; 0: greedy only "
                   f"(default: {CODE_DEFAULTS.heldout_samples})")  # fmt: skip
    p.add_argument(
        "--temperature",
        type=float,
        default=CODE_DEFAULTS.temperature,
        help=f"temperature of the samples, as troll train's (default: {CODE_DEFAULTS.temperature:g})",
    )
    p.add_argument("--system", default=None, help="system message (default: the chat template's own)")
    p.add_argument("--slots", type=int, default=2, help="sandboxed processes at once (default: 2)")
    p.add_argument("--output", type=int, default=1 << 20, help="bytes a stdio test may print or one return value "
                   "may take (default: 1 MiB, at most 16 MiB)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--out", default=None, help="also write the result as JSON to this new file")
    p.set_defaults(run=cmd_eval_code, name="eval-code")


def _check_eval_code(args: argparse.Namespace) -> int:
    from troll.lm import code_data, code_eval, model
    from troll.runs.numbers import check_int, check_real

    if not code_data.is_code_task(args.task):
        raise UsageError(f"--task must be humaneval, code, code_<family> or jsonl:PATH, got {args.task!r}.")
    code_data.check_code_task(args.task, training=False)
    for flag, value in (("--n", args.n), ("--max-completion-length", args.max_completion_length)):
        if value is not None:
            check_int(flag, value, low=1, high=10**6, error=UsageError)
    check_int("--samples", args.samples, low=0, high=1024, error=UsageError)
    check_real("--temperature", args.temperature, low=0, high=1e6, error=UsageError)
    check_int("--slots", args.slots, low=1, high=256, error=UsageError)
    check_int("--output", args.output, low=1, high=16 << 20, error=UsageError)
    check_int("--threads", args.threads, low=1, high=1024, error=UsageError)
    if args.out is not None and Path(args.out).exists():
        raise UsageError(f"--out {args.out} exists; troll never overwrites a result: give a new file name.")
    model.resolve_model(args.model)
    if args.max_completion_length:
        return args.max_completion_length
    return (
        code_eval.HUMANEVAL_COMPLETION_LENGTH if args.task == code_data.HUMANEVAL else code_data.CODE_COMPLETION_LENGTH
    )


def cmd_eval_code(args: argparse.Namespace) -> int:
    length = _check_eval_code(args)
    import torch

    from troll.lm import code_eval, model
    from troll.sandbox.scoring import default_sandbox

    mode = default_sandbox().mode  # built (and self-tested) before the model: no sandbox, no generation
    print(f"troll eval-code: sandbox mode {mode} (docs/sandbox.md)", file=sys.stderr)
    torch.set_num_threads(args.threads)
    net, tokenizer = model.load_model(model.resolve_model(args.model))
    result = code_eval.evaluate(net, tokenizer, args.task, n=args.n, seed=args.seed, max_new_tokens=length,
                                system=args.system, slots=args.slots, samples=args.samples,
                                temperature=args.temperature, output=args.output)  # fmt: skip
    data = {**result.to_json(), "model": args.model, "max_completion_length": length, "sandbox_mode": mode}
    text = json.dumps(data, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    if result.unscored:
        print(f"troll eval-code: the sandbox could not run {result.unscored} item(s); counted as failures",
              file=sys.stderr)  # fmt: skip
    return 0
