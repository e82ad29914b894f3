"""The flags of ``troll train``, ``troll compare`` and ``troll study``: their table, their help, and how their values
become a :class:`~troll.lm.options.RunOptions` (the run's settings, checked there).

Torch-free: the parser of :mod:`troll.lm.cli` is built from this table without loading a model. Each run flag is a
``RunOptions`` field in flag form (``--max-completion-length`` sets ``max_completion_length``), its help text in the
field's metadata (:func:`troll.lm.options.run_flags`), so a new option needs no edit here; each loss family's
bound has its own flag (:data:`BOUND_FLAGS`: ``--kl-bound``, ``--clip-eps``, ``--cispo-cap``).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from troll.lm.options import (
    BOUNDS,
    LOSSES,
    TROLL_LOSSES,
    RunOptions,
    run_flags,
)
from troll.runs.files import UsageError, check_out_path

KL_BOUND_HELP = f"TROLL's per-token KL bound (default: {LOSSES[TROLL_LOSSES[0]].bound:g})"
# The flag of each loss family's bound (troll.lm.options.BOUNDS): --kl-bound, --clip-eps, --cispo-cap.
BOUND_FLAGS = {dest: ("--" + dest.replace("_", "-"), users, meaning) for dest, (users, meaning) in BOUNDS.items()}


# (flag, type, help) of the options shared by train, compare and study: each RunOptions field with a flag, its help
# text from the field's metadata (troll.lm.options._flag), in the order of the fields.
RUN_ARGS: list[tuple[str, type, str]] = run_flags()


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
