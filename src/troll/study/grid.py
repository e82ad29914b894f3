"""The grid of a study: arms x seeds x the values of one optional swept option, parsed and planned into cells.

An *arm* is what a study compares (a loss for ``troll study``, an algorithm for ``troll tce study``). A cell is one
run: a (swept value, arm, seed) with its folder ``<out>/[<key>=<value>/]<arm>/seed<k>/`` and the frontend's own
options for it. Planning writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from troll.runs.files import UsageError

MAX_SEEDS = 1000  # a count beyond this is a typo, not a study


@dataclass
class Grid:
    """Arms x seeds, optionally x the values of one swept option (``sweep_key`` in field form, e.g. ``lr``)."""

    arms: list[str]
    seeds: list[int]
    sweep_key: str | None = None
    sweep_values: list = field(default_factory=list)

    @property
    def values(self) -> list:
        """The swept values, or ``[None]`` for an unswept study (one block of cells)."""
        return list(self.sweep_values) if self.sweep_key else [None]

    @property
    def sweep_flag(self) -> str | None:
        """The swept option in flag form (``steps-per-rollout``), as folders and tables name it."""
        return self.sweep_key.replace("_", "-") if self.sweep_key else None


@dataclass
class Cell:
    """One run of the grid: its swept value (None if unswept), arm, seed, folder and the frontend's options."""

    value: Any
    arm: str
    seed: int
    folder: Path
    options: Any = None

    @property
    def log(self) -> Path:
        """The run's console output, beside its folder (so that deleting the folder keeps the log)."""
        return self.folder.with_name(self.folder.name + ".log")

    @property
    def options_file(self) -> Path:
        """Beside its folder: the cell's options as data, which its command reads (:mod:`troll.study.options`)."""
        return self.folder.with_name(self.folder.name + ".options.json")

    @property
    def stop_request(self) -> Path:
        """Beside its folder: while this file exists, the cell's entry point stops it (:mod:`troll.study.cell`)."""
        return self.folder.with_name(self.folder.name + ".stop")

    @property
    def label(self) -> str:
        return self.folder.as_posix()


def parse_arms(text: str, known, *, flag: str, noun: str, example: str) -> list[str]:
    """``"troll,grpo"`` -> ["troll", "grpo"]: each one of ``known``, each once, none empty."""
    arms = [s.strip() for s in text.split(",")]
    if not text.strip() or not all(arms):
        raise UsageError(f"{flag} {text!r} is empty or has an empty entry; give e.g. {flag} {example}.")
    unknown = [arm for arm in arms if arm not in known]
    if unknown:
        raise UsageError(f"unknown {noun} {unknown[0]!r} in {flag}; choose from: {', '.join(known)}.")
    if len(set(arms)) != len(arms):
        raise UsageError(f"{flag} names a {noun} twice: {text}; list each once.")
    return arms


def grows(saved: list, given: list) -> bool:
    """True when ``given`` keeps every entry of ``saved``: a resumed study may add seeds or arms to its grid (the
    cells it has keep their folders, the new ones run), never drop one."""
    return set(saved) <= set(given)


def parse_seeds(text: str) -> list[int]:
    """``"3"``: three seeds 0, 1, 2; ``"0,4,7"`` (any comma): exactly those seeds."""
    parts = [s.strip() for s in text.split(",")]
    if "," in text:
        parts = [p for p in parts if p]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not values:
        raise UsageError(f"--seeds {text!r}: give a count (--seeds 3: seeds 0,1,2) or a list (--seeds 0,1,2).")
    if "," not in text:
        if not 1 <= values[0] <= MAX_SEEDS:
            raise UsageError(f"--seeds {text}: a count of seeds must lie in [1, {MAX_SEEDS}] (or list: --seeds 0,1).")
        return list(range(values[0]))
    if len(set(values)) != len(values):
        raise UsageError(f"--seeds {text} names a seed twice; list each once.")
    for seed in values:
        if not 0 <= seed < 2**32:
            raise UsageError(f"--seeds {text}: each seed must lie in [0, 2**32), got {seed}.")
    return values


def parse_sweep(text: str, types: dict[str, type], not_swept=frozenset(), hint: str = "") -> tuple[str, list]:
    """``"steps-per-rollout=2,4,8"`` -> ("steps_per_rollout", [2, 4, 8]).

    ``types`` maps each sweepable option (field form) to int, float or str; ``not_swept`` names options the grid
    itself varies (the arm, the seed) or that belong to the study (its folder); ``hint`` ends the message of an
    unknown key.
    """
    key, sep, raw = text.partition("=")
    name = key.strip().removeprefix("--").replace("-", "_")
    allowed = sorted(k.replace("_", "-") for k in types if k not in not_swept)
    if not sep or not key.strip():
        raise UsageError(f"--sweep {text!r}: write KEY=V1,V2,..., e.g. --sweep steps-per-rollout=2,4,8.")
    if name not in types or name in not_swept:
        raise UsageError(f"--sweep: unknown key {key.strip()!r}; sweep one of: {', '.join(allowed)}.{hint}")
    parts = [p.strip() for p in raw.split(",")]
    if not raw.strip() or not all(parts):
        raise UsageError(f"--sweep {text!r}: the value list is empty or has an empty entry.")
    try:
        values = [types[name](p) for p in parts]
    except ValueError:
        raise UsageError(f"--sweep {text!r}: each value of {key.strip()} must be a {types[name].__name__}.") from None
    if len(set(values)) != len(values):
        raise UsageError(f"--sweep {text!r} names a value twice; list each once.")
    return name, values


def plan(grid: Grid, out: Path, build: Callable[[Any, str, int, Path], Any]) -> list[Cell]:
    """Every cell of the grid, in the order value, seed, arm (so that the first cells done cover every arm).

    ``build(value, arm, seed, folder)`` returns the frontend's options of a cell, or raises :class:`UsageError`;
    in a swept study the message is prefixed with the value and the arm that caused it.
    """
    cells = []
    for value in grid.values:
        top = out / f"{grid.sweep_flag}={_slug(value)}" if grid.sweep_key else out
        for seed in grid.seeds:
            for arm in grid.arms:
                folder = top / arm / f"seed{seed}"
                try:
                    options = build(value, arm, seed, folder)
                except UsageError as err:
                    if not grid.sweep_key:
                        raise
                    raise UsageError(f"--sweep {grid.sweep_flag}={value} ({arm}): {err}") from None
                cells.append(Cell(value, arm, seed, folder, options))
    return cells


def _slug(value) -> str:
    return str(value).replace("/", "_").replace(os.sep, "_")
