"""The run protocol of every command that trains into a folder (``troll train``, ``troll tce train`` with TCE, BBRL
or PPO), on top of the folder rules of :mod:`troll.runs.folder`:

- :func:`run`: the skeleton: the folder held from the check on, a finished run's summary returned, else the run;
- :func:`prepare`: fresh, resume or refuse, before anything is written: a folder of another command, or of this
  command with another kind of run (TCE's folder resumed as PPO), or one whose saved config differs from the
  given one in more than the fields a resumed run may change, is refused with the fix;
- :func:`saved_config`: the config a folder's config.json holds for a command (None when it holds none);
- :func:`start`: config.json (``{"command": ..., key: config}``) and an empty metrics.jsonl, once the manifest is
  begun (:func:`troll.runs.folder.begin`);
- :func:`resume_metrics`: metrics.jsonl cut back to the lines the newest checkpoint belongs to;
- :func:`save_checkpoint`: a numbered checkpoint file written whole (temporary file, fsync, rename), the older ones
  removed only then, so one is kept;
- :func:`stop_requests` and :class:`Stopped`: SIGTERM or SIGUSR1 (a cluster's notice before it preempts or ends a
  job, or a user's ``kill``) asks a run to stop at its next iteration's end with a checkpoint, so that ``--resume``
  loses nothing; the command then exits with 128 + the signal's number, as a process the signal ended;
- checkpoint *folders* written in place by another library (transformers' Trainer writes ``checkpoint-N/`` file by
  file): :func:`mark_checkpoint` marks one whole once its writer is done, then removes the older ones;
  :func:`last_marked` finds the newest marked one; :func:`resume_from_marked` removes the unmarked remains of an
  interrupted write and cuts metrics.jsonl back to it; :func:`remove_checkpoints` ends a run's checkpoints.

Torch-free: what a checkpoint holds is written by the caller (``write(file)``, or the other library).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from troll.runs.checkpoints import numbered_files
from troll.runs.files import (
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    UsageError,
    read_config,
    truncate_jsonl,
    write_json,
)
from troll.runs.folder import check_folder, holding


def run(out: Path, prepare: Callable[[], tuple], train: Callable) -> dict:
    """A run into ``out``: from the check on the folder is held (no other process starts or deletes it while the run
    is built); ``prepare()`` checks it before anything is written and returns (config, finished already); a finished
    run returns its summary.json, any other ``train(config)``, the summary."""
    with holding(out):
        config, finished = prepare()
        if finished:
            return json.loads((Path(out) / SUMMARY_FILE).read_text())
        return train(config)


MISSING = "<not a setting>"  # what differences() shows for a field the saved config lacks


def differences(saved, given, *, resumable: tuple[str, ...] = ()) -> dict:
    """{field: (saved's value, given's)} for every field of ``given`` whose value is not ``saved``'s, but the fields a
    resumed run may change (``resumable``, each config's RESUMABLE_FIELDS). ``saved`` and ``given`` are dataclasses or
    dicts; a dict ``given`` names only the fields it compares (the flags a user gave); a field ``saved`` lacks shows
    as :data:`MISSING`. The one comparison of a resumed run with its folder, for every command."""

    def get(obj, name):
        return obj.get(name, MISSING) if isinstance(obj, dict) else getattr(obj, name, MISSING)

    names = list(given) if isinstance(given, dict) else [f.name for f in dataclasses.fields(given)]
    return {k: (get(saved, k), get(given, k)) for k in names if k not in resumable and get(saved, k) != get(given, k)}


def prepare(config, out: Path, *, command: str, resume: bool, saved: Callable, kind: str, resumable: tuple[str, ...],
            finished: Callable | None = None):  # fmt: skip
    """Returns (the config to run, finished already). ``config``: the given one (None: the folder's, to resume);
    ``saved(out)``: the config of this kind the folder holds, or None; ``resumable``: the fields a resumed run may
    change (:func:`differences`). A config is a dataclass.
    ``finished(config)``: whether the resumed run has nothing left to do (default: its summary.json exists; a run
    that may be extended past its end says otherwise)."""
    action = check_folder(out, command, resume=resume, overwrite=False)
    if action == "new":
        if config is None:
            raise UsageError(f"{out} holds no run to resume; pass a config to start one.")
        return config, False
    found = saved(out)
    if found is None:
        raise UsageError(
            f"{out} holds a run of 'troll {command}' that is not a {kind} run; continue it with its own algorithm, "
            "or choose another folder."
        )
    if config is not None:
        diff = differences(found, config, resumable=resumable)
        if diff:
            listed = "; ".join(f"{k}: folder {a!r}, given {b!r}" for k, (a, b) in diff.items())
            raise UsageError(
                f"--resume: the config differs from the one {out} was started with ({listed}); resume with the same "
                f"settings (only {', '.join(resumable)} may change) or start a new folder."
            )
        found = dataclasses.replace(found, **{k: getattr(config, k) for k in resumable})
    return found, finished(found) if finished else (out / SUMMARY_FILE).is_file()


def saved_config(out: Path, command: str, key: str = "config") -> dict | None:
    """The object ``key`` of the folder's config.json when ``command`` wrote it; None when there is none, or the
    file cannot be read (the folder rules then decide)."""
    if not (Path(out) / CONFIG_FILE).is_file():
        return None
    try:
        data = read_config(Path(out))
    except UsageError:
        return None
    if not isinstance(data, dict) or data.get("command") != command or not isinstance(data.get(key), dict):
        return None
    return data[key]


def write_config(out: Path, command: str, config: dict, key: str = "config", **extra) -> None:
    """config.json, ``{"command": command, key: config, **extra}`` (e.g. the library versions), written whole."""
    write_json(Path(out) / CONFIG_FILE, {"command": command, key: config, **extra})


def start(out: Path, command: str, config: dict, key: str = "config", **extra) -> None:
    """A fresh run's config.json (:func:`write_config`) and empty metrics.jsonl (after
    :func:`troll.runs.folder.begin`)."""
    write_config(out, command, config, key, **extra)
    truncate_jsonl(Path(out) / METRICS_FILE, 0)


def resume_metrics(out: Path, lines: int) -> list[dict]:
    """metrics.jsonl cut back to its first ``lines`` lines (those the checkpoint resumed from belongs to); the rows."""
    return truncate_jsonl(Path(out) / METRICS_FILE, lines)


def save_checkpoint(out: Path, template: str, number: int, write: Callable[[BinaryIO], None]) -> Path:
    """``template.format(number)`` in ``out`` (e.g. ``checkpoint-{}.pt``), written whole by ``write(file)``: into a
    temporary file, fsync, then an atomic rename; only then are the folder's other files of ``template`` removed."""
    path = Path(out) / template.format(number)
    tmp = Path(out) / f".{path.name}.tmp-{os.getpid()}"
    with tmp.open("wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for n, old in numbered_files(out, template, folders=False):
        if n != number:
            old.unlink(missing_ok=True)
    return path


STOP_SIGNALS = ("SIGTERM", "SIGUSR1")


class StopRequest:
    """``signal``: the name of the first stop signal received while :func:`stop_requests` is active, or None."""

    def __init__(self):
        self.signal: str | None = None


class Stopped(Exception):
    """A run stopped on ``signal`` at the end of step ``step`` (an iteration, or env steps for PPO), its state in
    ``checkpoint``: resuming continues as if it had not stopped."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path):
        super().__init__(f"stopped by {signal_name} after step {step}; the checkpoint is {checkpoint}")
        self.signal, self.step, self.checkpoint = signal_name, step, Path(checkpoint)

    @property
    def exit_code(self) -> int:
        return exit_code(self.signal)


def exit_code(signal_name: str) -> int:
    """128 + the signal's number: what a shell reports for a process the signal ended (143 for SIGTERM, 130 for
    SIGINT); the exit status of a command that stopped on it."""
    return 128 + int(getattr(signal, signal_name))


@contextlib.contextmanager
def stop_requests(signals: tuple[str, ...] = STOP_SIGNALS) -> Iterator[StopRequest]:
    """While inside, ``signals`` (SIGTERM and SIGUSR1) only note their name in the yielded :class:`StopRequest` (the
    loop checks it at each iteration's end, saves a checkpoint and raises :class:`Stopped`); the handlers before are
    restored on leaving. When SIGINT is among ``signals``, a second SIGINT after any stop request raises
    KeyboardInterrupt (Ctrl-C twice stops at once). Python runs signal handlers in the main thread only: elsewhere
    (a run in a thread) nothing is installed, and the signals keep their handlers (the default one ends the
    process)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def note(signum, frame) -> None:
        name = signal.Signals(signum).name
        if request.signal is None:
            request.signal = name
        elif name == "SIGINT":
            raise KeyboardInterrupt

    before = {name: signal.signal(getattr(signal, name), note) for name in signals}
    try:
        yield request
    finally:
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)


def stop_signal_of(code: int) -> str | None:
    """The stop signal (:data:`STOP_SIGNALS`) that ended a command with exit status ``code``: 128 + its number (a
    run that saved a checkpoint on it, :attr:`Stopped.exit_code`) or minus its number (a command the signal ended,
    as subprocess reports it); None for any other status."""
    for name in STOP_SIGNALS:
        number = int(getattr(signal, name))
        if code in (128 + number, -number):
            return name
    return None


MARK = "troll_complete.json"  # in a checkpoint folder: {"step": N, "metrics_lines": K}, written after its last file


def mark_checkpoint(folder: Path, *, step: int, metrics_lines: int) -> None:
    """Mark the checkpoint folder ``folder`` (e.g. ``checkpoint-N/``, named by the folder's template) whole, with the
    number of metrics.jsonl lines logged up to it, atomically; only then remove the run's older checkpoint folders
    of that name: one is kept, never before its successor is whole."""
    template = _template_of(Path(folder))
    write_json(Path(folder) / MARK, {"step": step, "metrics_lines": metrics_lines})
    for number, other in numbered_files(Path(folder).parent, template, folders=True):
        if number < step:
            shutil.rmtree(other, ignore_errors=True)


def read_mark(folder: Path) -> dict | None:
    """The mark of a whole checkpoint folder, or None (missing, damaged, or for another step than its name's)."""
    try:
        mark = json.loads((Path(folder) / MARK).read_text())
    except (OSError, ValueError):
        return None
    number = int(Path(folder).name.rsplit("-", 1)[-1])
    ok = isinstance(mark, dict) and mark.get("step") == number and isinstance(mark.get("metrics_lines"), int)
    return mark if ok else None


def last_marked(out: Path, template: str) -> Path | None:
    """The marked checkpoint folder of ``template`` (e.g. ``checkpoint-{}``) with the largest number, or None."""
    marked = [path for _, path in numbered_files(out, template, folders=True) if read_mark(path) is not None]
    return marked[-1] if marked else None


def resume_from_marked(out: Path, template: str) -> tuple[Path | None, list[dict]]:
    """Get ``out`` ready to continue: (the newest marked checkpoint folder, the metrics rows it covers).

    The unmarked folders (an interrupted write) are removed and metrics.jsonl is cut to the lines the checkpoint had
    logged (which also drops a torn last line). Without a marked one the metrics go too, and (None, []) says: start
    over."""
    checkpoint = last_marked(out, template)
    for _, folder in numbered_files(out, template, folders=True):
        if folder != checkpoint:
            shutil.rmtree(folder, ignore_errors=True)
    if checkpoint is None:
        (Path(out) / METRICS_FILE).unlink(missing_ok=True)
        return None, []
    return checkpoint, resume_metrics(out, read_mark(checkpoint)["metrics_lines"])


def remove_checkpoints(out: Path, template: str) -> None:
    """Delete every checkpoint of ``template``, file or folder (a finished run that keeps none)."""
    for _, path in numbered_files(out, template):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _template_of(folder: Path) -> str:
    prefix, sep, number = folder.name.rpartition("-")
    if not (sep and number.isdigit()):
        raise ValueError(f"{folder} is not a numbered checkpoint folder (<name>-<number>)")
    return f"{prefix}-{{}}"
