"""``troll study``: one task, a grid of losses x seeds (optionally swept over one run option), and the statistics.

Layout of the study folder ``<out>``::

    config.json                      the grid (written first; --resume reads it)
    <key>=<value>/<loss>/seed<k>/    one ``troll train`` run folder per cell (no ``<key>=<value>/`` level unswept)
    <key>=<value>/<loss>/seed<k>.log that run's output
    study.json, study.md, study.png  every cell's summary, the aggregates, the table and the curves

Each cell runs as a subprocess ``python -m troll.cli train ...`` with every option spelled out, so a cell is
exactly a ``troll train`` run, a crash of one cell leaves the others running, and ``--jobs N`` runs N cells side
by side (one torch thread each by default). A finished cell (summary.json present) is never rerun; with
``--resume`` an interrupted cell continues from its checkpoint, or starts over if it had none. Cells drop their
checkpoints and final model when they finish unless ``--keep-checkpoints`` / ``--keep-model``: a cell then holds
config.json, metrics.jsonl, summary.json and plots.png (a few hundred kB).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from troll.train import options
from troll.train.options import LOSSES, TROLL_LOSSES, RunOptions, UsageError

MAX_SEEDS = 1000  # a count beyond this is a typo, not a study
JSON_FILE = "study.json"
TABLE_FILE = "study.md"
PLOT_FILE = "study.png"
# Run options a sweep may not name: the grid already varies loss and seed, and out is the study's.
NOT_SWEPT = {"loss", "seed", "out"}
# ``eps`` is TROLL's KL bound in a study (as --eps); ``clip_eps`` is the clip losses' (as --clip-eps).
SWEEP_EXTRA = {"clip_eps": float}


@dataclass
class StudySpec:
    """The grid of a study: ``base`` options (eps = TROLL's bound), losses, seeds, one optional swept option."""

    base: RunOptions
    losses: list[str]
    seeds: list[int]
    sweep_key: str | None = None  # a RunOptions field name, or "clip_eps"
    sweep_values: list = field(default_factory=list)
    clip_eps: float | None = None

    def to_json(self) -> dict:
        return {
            "base": self.base.to_json(),
            "losses": self.losses,
            "seeds": self.seeds,
            "sweep_key": self.sweep_key,
            "sweep_values": self.sweep_values,
            "clip_eps": self.clip_eps,
        }

    @classmethod
    def from_json(cls, data: dict) -> StudySpec:
        base = RunOptions.from_json(data["base"])
        return cls(base, list(data["losses"]), [int(s) for s in data["seeds"]], data.get("sweep_key"),
                   list(data.get("sweep_values") or []), data.get("clip_eps"))  # fmt: skip


@dataclass
class Cell:
    """One run of the grid: its sweep value (None if unswept), loss, seed, resolved options and folder."""

    value: object
    loss: str
    seed: int
    opts: RunOptions

    @property
    def folder(self) -> Path:
        return Path(self.opts.out)

    @property
    def log(self) -> Path:
        return self.folder.with_name(self.folder.name + ".log")

    @property
    def label(self) -> str:
        return self.folder.as_posix()


# ---------------------------------------------------------------- parsing and planning (nothing written)


def parse_losses(text: str) -> list[str]:
    losses = [s.strip() for s in text.split(",")]
    if not text.strip() or not all(losses):
        raise UsageError(f"--losses {text!r} is empty or has an empty entry; give e.g. --losses troll,grpo.")
    unknown = [loss for loss in losses if loss not in LOSSES]
    if unknown:
        raise UsageError(f"unknown loss {unknown[0]!r} in --losses; choose from: {', '.join(LOSSES)}.")
    if len(set(losses)) != len(losses):
        raise UsageError(f"--losses names a loss twice: {text}; list each once.")
    return losses


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


def parse_sweep(text: str, types: dict[str, type]) -> tuple[str, list]:
    """``"steps-per-rollout=2,4,8"`` -> ("steps_per_rollout", [2, 4, 8]); ``types`` maps field -> int/float/str."""
    key, sep, raw = text.partition("=")
    name = key.strip().removeprefix("--").replace("-", "_")
    allowed = sorted(k.replace("_", "-") for k in types if k not in NOT_SWEPT)
    if not sep or not key.strip():
        raise UsageError(f"--sweep {text!r}: write KEY=V1,V2,..., e.g. --sweep steps-per-rollout=2,4,8.")
    if name not in types or name in NOT_SWEPT:
        raise UsageError(f"--sweep: unknown key {key.strip()!r}; sweep one of: {', '.join(allowed)}.")
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


def plan(spec: StudySpec, out: Path) -> list[Cell]:
    """Every cell of the grid, resolved and value-checked (UsageError naming the flag otherwise)."""
    cells = []
    for value in spec.sweep_values if spec.sweep_key else [None]:
        top = out / f"{spec.sweep_key.replace('_', '-')}={_slug(value)}" if spec.sweep_key else out
        for seed in spec.seeds:
            for loss in spec.losses:
                troll = loss in TROLL_LOSSES
                eps = spec.base.eps if troll else spec.clip_eps
                opts = dataclasses.replace(
                    spec.base, loss=loss, seed=seed, eps=eps, out=str(top / loss / f"seed{seed}")
                )
                if spec.sweep_key == "clip_eps":
                    opts = opts if troll else dataclasses.replace(opts, eps=value)
                elif spec.sweep_key == "eps":
                    opts = dataclasses.replace(opts, eps=value) if troll else opts
                elif spec.sweep_key:
                    opts = dataclasses.replace(opts, **{spec.sweep_key: value})
                try:
                    options.check_values(opts)
                except UsageError as err:
                    if not spec.sweep_key:
                        raise
                    flag = spec.sweep_key.replace("_", "-")
                    raise UsageError(f"--sweep {flag}={value} ({loss}): {err}") from None
                cells.append(Cell(value, loss, seed, opts.resolved()))
    return cells


def _slug(value) -> str:
    return str(value).replace("/", "_").replace(os.sep, "_")


def check_folder(out: Path, *, overwrite: bool, resume: bool) -> bool:
    """As :func:`troll.train.options.check_folder` for a study folder; True when ``overwrite`` may delete it."""
    if overwrite and resume:
        raise UsageError("--overwrite and --resume exclude each other: one discards the study, the other continues it.")
    options.check_out_path(out, "study folder")
    if not (out.is_dir() and any(out.iterdir())):
        if resume:
            raise UsageError(f"--resume: {out} holds no study; start it without --resume.")
        return False
    if not _is_study(out):
        raise UsageError(
            f"--out {out} is not empty and holds no study's {options.CONFIG_FILE}: it holds something else; "
            "choose another --out."
        )
    if resume:
        return False
    if not overwrite:
        raise UsageError(f"study folder {out} is not empty; pass --resume to continue it, --overwrite to replace it.")
    return True


def _is_study(out: Path) -> bool:
    try:
        return json.loads((out / options.CONFIG_FILE).read_text()).get("command") == "study"
    except (OSError, ValueError, AttributeError):
        return False


def load_spec(out: Path) -> StudySpec:
    """The grid saved in a study folder's config.json (UsageError when it is damaged)."""
    data = options.load_config(out, key="spec")
    try:
        return StudySpec.from_json(data["spec"])
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"--resume: {out / options.CONFIG_FILE} holds a damaged study spec ({err}).") from err


# ---------------------------------------------------------------- running the cells


def cell_argv(cell: Cell, *, resume: bool, keep_checkpoints: bool, keep_model: bool) -> list[str]:
    """The ``troll train`` command line of a cell: every option spelled out (or --resume from its folder)."""
    argv = [sys.executable, "-m", "troll.cli", "train", "--out", cell.opts.out]
    if resume:
        argv.append("--resume")
    else:
        for f in dataclasses.fields(RunOptions):
            if f.name != "out":
                argv += ["--" + f.name.replace("_", "-"), str(getattr(cell.opts, f.name))]
    if keep_checkpoints:
        argv.append("--keep-checkpoints")
    if not keep_model:
        argv.append("--no-model")
    return argv


def run_cells(
    cells: list[Cell], *, jobs: int, keep_checkpoints: bool, keep_model: bool, report, on_finish=None
) -> dict[str, str]:
    """Run the unfinished cells, ``jobs`` at a time; returns label -> "done" | "kept" | "failed (exit N)".

    ``report(text)`` receives one line per started and finished cell; ``on_finish(status)`` is called after each
    cell ends. A finished cell (summary.json) is kept; one with a checkpoint resumes from it; any other leftover
    folder of an interrupted cell is started over.
    """
    from troll.train.run import SUMMARY_FILE

    status, todo = {}, []
    for cell in cells:
        if (cell.folder / SUMMARY_FILE).is_file():
            status[cell.label] = "kept"
            if not keep_checkpoints:
                _drop_checkpoints(cell.folder)
        else:
            todo.append(cell)
    running: list[tuple[Cell, subprocess.Popen, object, float]] = []
    env = {**os.environ, "OMP_NUM_THREADS": str(cells[0].opts.threads) if cells else "1"}
    try:
        while todo or running:
            while todo and len(running) < jobs:
                cell = todo.pop(0)
                again = options.last_checkpoint(cell.folder) is not None
                if cell.folder.exists() and not again:
                    shutil.rmtree(cell.folder)  # ours (inside the study), interrupted before its first checkpoint
                cell.folder.parent.mkdir(parents=True, exist_ok=True)
                argv = cell_argv(cell, resume=again, keep_checkpoints=keep_checkpoints, keep_model=keep_model)
                log = cell.log.open("a")
                log.write(f"$ {' '.join(argv)}\n")
                log.flush()
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
                running.append((cell, proc, log, time.time()))
                report(f"started {cell.label}{' (resuming)' if again else ''}")
            time.sleep(0.5)
            for item in [r for r in running if r[1].poll() is not None]:
                running.remove(item)
                status[item[0].label] = _finish(item, report)
                if on_finish is not None:
                    on_finish(status)
    finally:
        for _cell, proc, log, _ in running:  # interrupted: stop the cells we started, they resume later
            proc.terminate()
            proc.wait()
            log.close()
    return status


def _finish(item, report) -> str:
    cell, proc, log, start = item
    log.close()
    minutes = (time.time() - start) / 60
    if proc.returncode == 0:
        report(f"finished {cell.label} in {minutes:.1f} min")
        return "done"
    tail = cell.log.read_text(errors="replace").splitlines()[-5:]
    report(
        f"FAILED {cell.label} (exit {proc.returncode}) after {minutes:.1f} min; see {cell.log}:\n  " + "\n  ".join(tail)
    )
    return f"failed (exit {proc.returncode})"


def _drop_checkpoints(folder: Path) -> None:
    for path in folder.glob("checkpoint-*"):
        if path.is_dir():
            shutil.rmtree(path)


def run(out: Path, spec: StudySpec, cells: list[Cell], *, clear: bool, jobs: int, keep_checkpoints: bool,
        keep_model: bool, report) -> dict[str, str]:  # fmt: skip
    """Write config.json, run the cells, then study.json / study.md / study.png; returns each cell's status."""
    from troll.train import study_report

    if clear:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {"command": "study", "spec": spec.to_json(), "argv": sys.argv}
    (out / options.CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")

    def partial(status: dict[str, str]) -> None:  # study.json / study.md so far, to read while the study runs
        try:
            study_report.write(out, spec, cells, status, plot=False)
        except Exception as err:  # noqa: BLE001 -- a report must never stop the cells
            report(f"could not update {JSON_FILE}: {err!r}")

    status = run_cells(
        cells, jobs=jobs, keep_checkpoints=keep_checkpoints, keep_model=keep_model, report=report, on_finish=partial
    )
    study_report.write(out, spec, cells, status)
    return status
