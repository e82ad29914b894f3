"""Which checkpoint a resumed run continues from: only complete ones count.

transformers' Trainer (5.x) writes ``checkpoint-N/`` in place, file by file (weights, optimiser, scheduler, RNG
state, ``trainer_state.json`` last), so a run killed during the write leaves a folder that looks like a checkpoint
and is not one. Once the Trainer has written all of it, the run's :class:`~troll.lm.callbacks.Checkpoints`
callback (``on_save``, called after the whole save) adds :data:`MARK`, written atomically, holding the step and the
number of metrics.jsonl lines logged up to that point; only then are older checkpoints removed (the run keeps one).
So at any moment the newest *marked* checkpoint is complete, and a resumed run

- continues from it and cuts metrics.jsonl back to exactly the lines it had logged (not "every line up to step
  N": the end of a run logs the final held-out accuracy at step N *after* the last checkpoint, and a resumed run
  logs it again);
- removes every unmarked checkpoint folder, the remains of an interrupted write;
- starts over when there is none.

Imports nothing heavy: the command line checks a folder with :func:`last_checkpoint` before loading anything.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from troll.runs import protocol
from troll.runs.checkpoints import numbered_files
from troll.runs.files import METRICS_FILE, write_json

PREFIX = "checkpoint-"
MARK = "troll_complete.json"  # {"step": N, "metrics_lines": K}, written after the Trainer's last file


def checkpoint_dirs(out: Path) -> list[Path]:
    """Every ``checkpoint-N`` folder of ``out``, complete or not, by increasing N."""
    return [path for _, path in numbered_files(out, PREFIX + "{}", folders=True)]


def step_of(folder: Path) -> int:
    """N of ``checkpoint-N``."""
    return int(folder.name[len(PREFIX) :])


def read_mark(folder: Path) -> dict | None:
    """The mark of a complete checkpoint folder, or None (missing, damaged, or for another step)."""
    try:
        mark = json.loads((folder / MARK).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(mark, dict) and mark.get("step") == step_of(folder) and isinstance(mark.get("metrics_lines"), int)
    return mark if ok else None


def last_checkpoint(out: Path) -> Path | None:
    """The complete checkpoint with the largest step, or None."""
    complete = [p for p in checkpoint_dirs(out) if read_mark(p) is not None]
    return complete[-1] if complete else None


def mark_complete(folder: Path, *, step: int, metrics_lines: int) -> None:
    """Mark ``folder`` complete (atomically), then remove the run's other checkpoints: one is kept, as TRL's
    ``save_total_limit=1`` would, but never before its successor is whole."""
    write_json(folder / MARK, {"step": step, "metrics_lines": metrics_lines})
    for other in checkpoint_dirs(folder.parent):
        if other != folder:
            shutil.rmtree(other, ignore_errors=True)


def prepare_resume(out: Path) -> tuple[Path | None, list[dict]]:
    """Get ``out`` ready to continue: (the newest complete checkpoint, the metrics rows it covers).

    Unmarked checkpoint folders are removed and metrics.jsonl is cut to the lines the checkpoint had logged (which
    also drops a torn last line). Without a complete checkpoint the metrics go too and (None, []) says: start over.
    """
    checkpoint = last_checkpoint(out)
    for folder in checkpoint_dirs(out):
        if folder != checkpoint:
            shutil.rmtree(folder, ignore_errors=True)
    if checkpoint is None:
        (Path(out) / METRICS_FILE).unlink(missing_ok=True)
        return None, []
    return checkpoint, protocol.resume_metrics(out, read_mark(checkpoint)["metrics_lines"])


def remove_all(out: Path) -> None:
    """Delete every checkpoint of a finished run (its final model/ stays)."""
    for folder in checkpoint_dirs(out):
        shutil.rmtree(folder, ignore_errors=True)
