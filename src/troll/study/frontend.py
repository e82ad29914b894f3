"""What a study engine needs from the command it runs: :class:`Frontend`, a dataclass of callables and labels.

The engine (:mod:`troll.study.runner`, :mod:`troll.study.report`) knows grids, folders, subprocesses and
statistics; a frontend knows its runs. It says

- how a cell is run: :attr:`Frontend.cell_argv` (a command line that writes the cell's folder: ``metrics.jsonl``
  while it runs, ``summary.json`` last, once it has finished), :attr:`Frontend.cell_options` (the cell's options as
  data, written to :attr:`~troll.study.grid.Cell.options_file` before the cells run for the command line to name:
  :mod:`troll.study.options`), :attr:`Frontend.can_resume` (whether an unfinished
  cell's folder holds a checkpoint its command can continue from), :attr:`Frontend.tidy` (what to drop from a cell
  found finished, e.g. checkpoints);
- which numbers a cell gives: :attr:`Frontend.numbers` maps (cell, summary, metrics rows) to a dict; the keys listed
  in :attr:`Frontend.table` are averaged over seeds, those in :attr:`Frontend.paired` compared per seed;
- what is compared with what: :attr:`Frontend.pairing` (pairs of arms a - b, and how study.md and study.json name
  the two sides);
- the curves: :attr:`Frontend.curves` (metrics keys, each optionally restricted to some rows) against the x-axis
  :attr:`Frontend.x_key` (``step``: optimiser steps of a language-model run; environment steps for an agent).

``troll study`` (:mod:`troll.lm.study`) is one frontend; an episodic agent's ``troll tce study`` is another::

    Frontend(
        command="tce study", arm="algo", run_command="tce train",
        cell_argv=lambda cell, resume: [sys.executable, "-m", "troll.cli", "tce", "train", "--algo", cell.arm,
                                        "--seed", str(cell.seed), "--out", str(cell.folder), *(["--resume"] * resume)],
        numbers=lambda cell, summary, rows: {"success": summary["success_rate"], "return": summary["return"]},
        table=(Number("success", "success rate"), Number("return", "episode return")),
        paired=(Number("success", "success rate"),),
        pairing=Pairing(pairs=against("tce"), keys=("algo", "reference"), heading="algorithm minus TCE",
                        column="algorithm - TCE"),
        curves=(Curve("eval/success_rate", "success rate", ylim=(-0.02, 1.02)),),
        x_key="env_steps", x_label="environment steps",
        can_resume=lambda cell: bool(numbered_files(cell.folder, "checkpoint-{}.pt")),
    )
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from troll.study.grid import Cell, Grid


@dataclass(frozen=True)
class Number:
    """A number every cell gives (a key of :attr:`Frontend.numbers`' dict) and its label in study.md."""

    key: str
    label: str


@dataclass(frozen=True)
class Curve:
    """A curve of study.png: the metrics.jsonl ``key``, its panel ``title``, optionally the rows of a cell that count
    (``rows(cell, rows)``; e.g. the off-policy steps only) and the y-range (``ylim``; e.g. (0, 1) for a rate)."""

    key: str
    title: str
    rows: Callable[[Cell, list[dict]], list[dict]] | None = None
    ylim: tuple[float, float] | None = None


def against(reference: str) -> Callable[[list[str]], list[tuple[str, str]]]:
    """Pairs (arm, reference) for every other arm of the grid: each arm minus the reference arm, per seed."""

    def pairs(arms: list[str]) -> list[tuple[str, str]]:
        return [(arm, reference) for arm in arms if arm != reference] if reference in arms else []

    return pairs


@dataclass(frozen=True)
class Pairing:
    """The paired comparisons: ``pairs(arms)`` gives the (a, b) whose per-seed difference a - b is reported.

    ``keys`` name a and b in study.json; ``heading`` titles the section of study.md (``## Paired: <heading>, same
    seed``) and ``column`` its column; ``none`` is printed instead of the table when there is no pair.
    """

    pairs: Callable[[list[str]], list[tuple[str, str]]]
    keys: tuple[str, str] = ("arm", "reference")
    heading: str = "arm minus reference"
    column: str = "arm - reference"
    none: str = "No paired comparison: the study holds no pair of arms to compare.\n"


def _never(cell: Cell) -> bool:
    return False


def _nothing(cell: Cell) -> None:
    return None


def _no_text(grid: Grid, cells: list[Cell]) -> str:
    return ""


def _one_core(cell: Cell) -> int:
    return 1


@dataclass(frozen=True)
class Frontend:
    """Everything the study engine needs to know about the runs of one command (see the module docstring).

    ``command`` is the study's name in its config.json (a folder is resumed only by the command that wrote it) and
    in messages (``troll <command> --out ... --resume``); ``run_command`` the command a cell runs, whose manifest
    (:mod:`troll.runs.folder`) says what in a cell's folder may be deleted; ``arm`` names the grid's first axis
    (``loss``, ``algo``) in study.json, study.md and the plots. ``env`` is added to each cell's environment: one
    thread each by default, so that ``--jobs N`` cells share N cores without oversubscribing them.
    ``cores(cell)``: the cores a cell uses, what a Ray task or a SLURM array task asks for (one by default);
    ``cores_from`` names the flags that set them, in messages (a cell larger than every node of a Ray cluster).
    ``title(grid, cells)`` heads study.png; ``note(grid, cells)`` ends study.md (how the numbers were computed).
    """

    command: str
    arm: str
    cell_argv: Callable[[Cell, bool], list[str]]
    numbers: Callable[[Cell, dict, list[dict]], dict]
    table: tuple[Number, ...]
    paired: tuple[Number, ...]
    pairing: Pairing
    curves: tuple[Curve, ...]
    x_key: str = "step"
    x_label: str = "step"
    can_resume: Callable[[Cell], bool] = _never
    # the fields of a cell's config (a JSON object), written to its options_file; None: the command line says all
    cell_options: Callable[[Cell], dict] | None = None
    # the command of a cell's folder ("train", "tce train"), whose manifest says what in it may be deleted; None:
    # an unfinished cell's folder is left to the cell's command as it is
    run_command: str | None = None
    tidy: Callable[[Cell], None] = _nothing
    title: Callable[[Grid, list[Cell]], str] = _no_text
    note: Callable[[Grid, list[Cell]], str] = _no_text
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({"OMP_NUM_THREADS": "1"}))
    cores: Callable[[Cell], int] = _one_core
    cores_from: str = "--threads"


@dataclass
class Study:
    """A planned study: its folder, frontend, grid, the frontend's own description of the grid (``spec``, saved
    in config.json and study.json, read back on ``--resume``) and the cells."""

    out: Path
    frontend: Frontend
    grid: Grid
    spec: dict
    cells: list[Cell]
