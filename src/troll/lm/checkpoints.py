"""Which checkpoint a resumed ``troll train`` run continues from: only complete ones count.

transformers' Trainer (5.x) writes ``checkpoint-N/`` in place, file by file (weights, optimiser, scheduler, RNG
state, ``trainer_state.json`` last), so a run killed during the write leaves a folder that looks like a checkpoint
and is not one. Once the Trainer has written all of it, the run's :class:`~troll.lm.callbacks.Checkpoints`
callback (``on_save``, called after the whole save) marks it complete with the run protocol's
:func:`troll.runs.protocol.mark_checkpoint` (the mark holds the step and the number of metrics.jsonl lines logged up
to that point); only then are older checkpoints removed (the run keeps one). So at any moment the newest *marked*
checkpoint is complete, and a resumed run

- continues from it and cuts metrics.jsonl back to exactly the lines it had logged (not "every line up to step
  N": the end of a run logs the final held-out accuracy at step N *after* the last checkpoint, and a resumed run
  logs it again);
- removes every unmarked checkpoint folder, the remains of an interrupted write;
- starts over when there is none.

Imports nothing heavy: the command line checks a folder with :func:`last_checkpoint` before loading anything.
"""

from __future__ import annotations

from pathlib import Path

from troll.runs import protocol
from troll.runs.protocol import MARK

__all__ = ["MARK", "PREFIX", "TEMPLATE", "last_checkpoint", "mark_complete", "prepare_resume", "remove_all", "step_of"]

PREFIX = "checkpoint-"
TEMPLATE = PREFIX + "{}"  # the Trainer's checkpoint-N/ folders


def step_of(folder: Path) -> int:
    """N of ``checkpoint-N``."""
    return int(folder.name[len(PREFIX) :])


def last_checkpoint(out: Path) -> Path | None:
    """The complete checkpoint with the largest step, or None."""
    return protocol.last_marked(out, TEMPLATE)


def mark_complete(folder: Path, *, step: int, metrics_lines: int) -> None:
    """Mark ``folder`` complete, then remove the run's older checkpoints (:func:`troll.runs.protocol.mark_checkpoint`:
    one is kept, as TRL's ``save_total_limit=1`` would, but never before its successor is whole)."""
    protocol.mark_checkpoint(folder, step=step, metrics_lines=metrics_lines)


def prepare_resume(out: Path) -> tuple[Path | None, list[dict]]:
    """(the newest complete checkpoint, the metrics rows it covers); (None, []): start over
    (:func:`troll.runs.protocol.resume_from_marked`)."""
    return protocol.resume_from_marked(out, TEMPLATE)


def remove_all(out: Path) -> None:
    """Delete every checkpoint of a finished run (its final model/ stays)."""
    protocol.remove_checkpoints(out, TEMPLATE)
