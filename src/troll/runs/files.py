"""The files of run and study folders, written so that a process killed at any moment leaves them readable.

A run or a study may be stopped by SIGKILL (an out-of-memory killer, a batch scheduler, a closed laptop) between
any two instructions, and ``--resume`` must then find every file either as it was or as it will be, never half
written:

- JSON files (config.json, summary.json, study.json) are written to a temporary name in the same folder and moved
  into place with :func:`os.replace`, which is atomic on POSIX and Windows: a reader sees the old file or the new;
- JSONL files (metrics.jsonl) grow by whole lines, each appended with one ``write`` call on a file opened with
  ``O_APPEND``; a process killed inside that call can still leave a torn last line (no final newline), which
  :func:`read_jsonl` drops;
- folders are checked (:func:`check_out_path`) before anything is written, so a bad ``--out`` fails with a message
  instead of half-way through.

Nothing here imports torch or a training library; :class:`UsageError` is the one error type the command line turns
into a message and exit status 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CONFIG_FILE = "config.json"  # what a folder holds: a run's options, a study's grid
SUMMARY_FILE = "summary.json"  # written last by a run that finished: a study's cell is finished when it exists
METRICS_FILE = "metrics.jsonl"  # one JSON object a line, each with the x-axis key of the curves (e.g. "step")
PLOTS_FILE = "plots.png"  # a run's curves, drawn at its end
VIDEO_FILE = "video.mp4"  # a TCE run's evaluation episodes (troll tce render)
CHECKPOINT_FILE = "checkpoint-{}.pt"  # a TCE, BBRL or PPO run's checkpoint after iteration {} (one file)
# the commands that write folders, as config.json's "command" and the manifest name them
TRAIN, COMPARE, STUDY = "train", "compare", "study"
TCE_TRAIN, TCE_STUDY = "tce train", "tce study"


class UsageError(ValueError):
    """Bad command-line input; the message says how to fix it. Raised before anything is written."""


def write_json(path: Path, data) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically: a temporary file in the same folder, then a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        f.write(json.dumps(data, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())  # the rename must not reach the disk before the content (power loss, not only kill)
    os.replace(tmp, path)


def append_jsonl(path: Path, row: dict) -> None:
    """Append ``row`` as one line with a single ``write`` on an ``O_APPEND`` descriptor: lines are never interleaved
    or split by a buffer, so a kill leaves at most the last line torn."""
    data = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:  # a regular file takes the whole buffer in one call; the loop covers a short write all the same
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def _complete_lines(path: Path) -> list[str]:
    """The newline-terminated lines of ``path`` (a torn last line, without its newline, is left out)."""
    if not path.is_file():
        return []
    return path.read_bytes().decode("utf-8", errors="replace").split("\n")[:-1]


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file, without blank lines and without a torn last line; [] when the file is missing.

    A complete line that is not JSON means the file was edited or damaged, not interrupted: ValueError naming it.
    """
    rows = []
    for number, line in enumerate(_complete_lines(Path(path)), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not a JSON line ({err}); the file is damaged.") from None
    return rows


def truncate_jsonl(path: Path, keep: int) -> list[dict]:
    """Keep the first ``keep`` complete lines of ``path`` (written atomically) and return them parsed."""
    path = Path(path)
    lines = _complete_lines(path)[:keep]
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)
    return [json.loads(line) for line in lines if line.strip()]


def check_out_path(out: Path, what: str) -> None:
    """``out`` must be a folder or creatable as one: not "", not a file, not below a file, and writable (the nearest
    existing folder of its path). Touches nothing."""
    if not str(out).strip():
        raise UsageError("--out is empty; give a folder path, or leave --out out for the default folder.")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {what} {out} exists and is not a folder; choose another --out.")
    nearest = out.absolute() if out.exists() else None
    for parent in out.absolute().parents:
        if nearest is None and parent.exists():
            if not parent.is_dir():
                raise UsageError(f"--out {out}: {parent} is a file, so no folder can be made below it.")
            nearest = parent
    if nearest is not None and not os.access(nearest, os.W_OK | os.X_OK):
        raise UsageError(
            f"--out {out}: {nearest} is not writable by this user (permissions or a read-only file system); "
            "choose another --out or change its permissions."
        )


def read_config(out: Path):
    """The folder's config.json as parsed JSON; :class:`UsageError` when it cannot be read."""
    path = out / CONFIG_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"--resume: {path} cannot be read as JSON ({err}); it is damaged, start a new --out.") from err


def load_config(out: Path, key: str) -> dict:
    """The folder's config.json, a JSON object that must hold the object ``key``; :class:`UsageError` otherwise."""
    data = read_config(out)
    if not isinstance(data, dict) or not isinstance(data.get(key), dict):
        raise UsageError(
            f"--resume: {out / CONFIG_FILE} has no {key!r} object; it was not written by this tool, start a new --out."
        )
    return data
