"""What the command line tells a user beyond a bad value: a run folder that may not be used
(:func:`check_run_folder`)."""

from __future__ import annotations

from pathlib import Path

from troll import runs
from troll.lm.checkpoints import last_checkpoint
from troll.runs.files import SUMMARY_FILE, UsageError

__all__ = ["COMMAND", "check_run_folder"]

COMMAND = "train"  # a run folder's config.json "command" and manifest (troll.runs.folder)


def check_run_folder(out: Path, *, overwrite: bool, resume: bool) -> bool:
    """Check the run folder (:func:`troll.runs.check_folder`: a folder of another command or with files the run
    did not write is never replaced); True when it holds an earlier run that ``overwrite`` allows to delete.

    A run that finished is resumed only to extend it from a kept checkpoint (``--keep-checkpoints``), while an
    interrupted one without a complete checkpoint starts over. Touches nothing.
    """
    action = runs.check_folder(out, COMMAND, resume=resume, overwrite=overwrite)
    if action == "resume" and last_checkpoint(out) is None and (out / SUMMARY_FILE).is_file():
        raise UsageError(
            f"--resume: {out} holds no complete checkpoint-* folder to continue from (a run that finished "
            "deletes its checkpoints unless it was started with --keep-checkpoints)."
        )
    return action == "replace"
