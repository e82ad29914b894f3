"""The options whose default depends on the kind of task (reasoning_gym's short answers or code), resolved when a
run starts (:meth:`troll.lm.options.RunOptions.resolved`) and written to its config.json as used."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from troll.lm import code_data

MATH_COMPLETION_LENGTH = 16  # the reasoning_gym presets' answers are a few tokens
HELDOUT = 128


@dataclass(frozen=True)
class TaskDefaults:
    """The options whose default depends on the kind of task (a run's config.json records the values used)."""

    steps: int
    generations: int
    temperature: float
    max_completion_length: int
    heldout: int
    heldout_samples: int
    code_reward: str | None  # code tasks: "fraction" of an item's tests passed, or "all" (1 when all pass, else 0)


# reasoning_gym tasks: short answers, sampled at 1.0, greedy held-out accuracy only.
MATH_DEFAULTS = TaskDefaults(
    steps=16,
    generations=4,
    temperature=1.0,
    max_completion_length=MATH_COMPLETION_LENGTH,
    heldout=HELDOUT,
    heldout_samples=0,
    code_reward=None,
)
# Code tasks: at 1.0 the default model's samples are right far less often than at 0.7 (docs/code.md: a mean reward
# of 0.05 against 0.2 over 16 samples); its function and fence take ~64 tokens; pass@1 and pass@4 sampled beside
# the greedy pass@1.
CODE_DEFAULTS = TaskDefaults(
    steps=24,
    generations=8,
    temperature=0.7,
    max_completion_length=code_data.CODE_COMPLETION_LENGTH,
    heldout=HELDOUT,
    heldout_samples=4,
    code_reward="all",
)


def task_defaults(task: str) -> dict:
    """{option: value} of the options a task decides: :data:`CODE_DEFAULTS` for a code task (a JSONL file holds out
    a quarter of its lines, at most 128), :data:`MATH_DEFAULTS` otherwise. Reads a JSONL file's lines (a missing or
    bad file raises :class:`UsageError`)."""
    out = dataclasses.asdict(kind_defaults(task))
    if task.startswith(code_data.JSONL_PREFIX):
        out["heldout"] = code_data.jsonl_heldout(task, HELDOUT)
    return out


def task_label(task: str) -> str:
    """The task as a default folder name: ``jsonl:PATH`` becomes ``jsonl-<file stem>`` (no separators)."""
    if isinstance(task, str) and task.startswith(code_data.JSONL_PREFIX):
        return "jsonl-" + Path(task[len(code_data.JSONL_PREFIX) :]).stem
    return task


def kind_defaults(task: str) -> TaskDefaults:
    """The defaults of the task's kind: :data:`CODE_DEFAULTS` for a code task, :data:`MATH_DEFAULTS` otherwise
    (without reading a JSONL file's lines, which only the held-out share needs)."""
    return CODE_DEFAULTS if code_data.is_code_task(task) else MATH_DEFAULTS


def default_generations(task: str) -> int:
    """--generations when not given: 4 for reasoning_gym tasks, 8 for a code task."""
    return kind_defaults(task).generations


def default_completion_length(task: str) -> int:
    """--max-completion-length when not given: 16 for reasoning_gym's short answers, more for a code task."""
    return kind_defaults(task).max_completion_length
