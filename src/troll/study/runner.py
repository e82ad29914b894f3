"""Running a study: its folder, its config.json, and every cell as a subprocess, ``jobs`` at a time.

Layout of the study folder ``<out>``::

    config.json                      {"command": ..., "spec": ..., "argv": ...}: the grid (written first)
    <key>=<value>/<arm>/seed<k>/     one run folder per cell (no ``<key>=<value>/`` level unswept)
    <key>=<value>/<arm>/seed<k>.log  that run's console output, one ``$ command`` line per start
    <key>=<value>/<arm>/seed<k>.stop while it exists, the cell's entry point stops it (a study on Ray stopping)
    study.json, study.md, study.png  the report (:mod:`troll.study.report`), rewritten as cells finish

Why subprocesses: a cell is then exactly the command a user would type, a crash of one leaves the others running,
and ``--jobs N`` runs N side by side. A cell is finished when its summary.json exists (its command writes it last,
atomically); a finished cell is never rerun. An unfinished one, found when a study is resumed, continues from its
checkpoint when the frontend says it can (:attr:`Frontend.can_resume`), and starts over otherwise.

Where the cells run: here, ``jobs`` at a time (``--executor local``, the default), or through an executor of
:mod:`troll.study.executors` (a Ray cluster, a SLURM job array), whose tasks call the cell entry point
:func:`troll.study.cell.run_cell`. Either way a cell is owned by one attempt at a time through its lease
(:mod:`troll.study.lease`: ``<cell>.lease`` beside its log, removed when the attempt ends).

Faults. The study's own files are written atomically. On Linux each cell is started with ``PR_SET_PDEATHSIG``:
when the study process dies, even by SIGKILL, its cells are killed with it, so that a resumed study never races a
cell left running by the one before it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from troll import runs
from troll.runs import protocol
from troll.runs.files import (
    CONFIG_FILE,
    SUMMARY_FILE,
    UsageError,
    load_config,
    write_json,
)
from troll.study import lease as lease_lib
from troll.study import options as cell_options
from troll.study import report as report_lib
from troll.study.frontend import Frontend, Study
from troll.study.grid import Cell

STUDY_FILES = (CONFIG_FILE, report_lib.JSON_FILE, report_lib.TABLE_FILE, report_lib.PLOT_FILE)
POLL_S = 0.25  # how often running cells are checked; a study's cells run for seconds to hours


def check_folder(out: Path, *, command: str, overwrite: bool, resume: bool) -> bool:
    """Check a study folder before anything is written; True when ``overwrite`` may delete it.

    The rules of every run folder (:func:`troll.runs.check_folder`): a folder of another command is refused, one of
    ``command`` is continued with ``resume`` or replaced with ``overwrite`` when it holds nothing the study did not
    write (its cells checked by their own manifests), never silently reused; and the folder can be written
    (:func:`check_writable`). Leaves nothing behind.
    """
    action = runs.check_folder(out, command, resume=resume, overwrite=overwrite, what="study")
    if resume and action == "new":
        raise UsageError(f"--resume: {out} holds no study; start it without --resume.")
    check_writable(out)
    return action == "replace"


def check_writable(out: Path) -> None:
    """:class:`UsageError` naming ``--out`` when the study folder could not be made or written: an existing one must
    be a writable folder; for a new one the first missing folder of its path is made and removed again (permissions
    alone do not tell: root may write anywhere, yet not make a folder in /proc or on a read-only file system)."""
    path = Path(os.path.abspath(out))
    first = path
    while not os.path.lexists(first.parent) and first.parent != first:
        first = first.parent
    fix = "give --out a folder on a file system you can write"
    if os.path.lexists(path):
        if not path.is_dir():
            raise UsageError(f"--out {out} is a file, not a folder; {fix}.")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"--out {out}: this user may not write in that folder; {fix}.")
        return
    if not first.parent.is_dir():
        raise UsageError(f"--out {out}: {first.parent} is a file, not a folder; {fix}.")
    try:
        first.mkdir()
    except FileExistsError:  # made by another process meanwhile: it can be made
        return
    except OSError as err:
        raise UsageError(f"--out {out}: a folder cannot be made in {first.parent} ({err.strerror or err}); "
                         f"{fix}.") from None  # fmt: skip
    first.rmdir()


def load_spec(out: Path) -> dict:
    """The ``spec`` object saved in a study folder's config.json (:class:`UsageError` when missing or damaged)."""
    if not (out / CONFIG_FILE).is_file():
        raise UsageError(f"--resume: {out / CONFIG_FILE} not found; start the study without --resume.")
    return load_config(out, key="spec")["spec"]


def run_study(study: Study, *, clear: bool, jobs: int, report: Callable[[str], None], executor=None) -> dict[str, str]:
    """Write config.json, run the unfinished cells, then the report; returns each cell's status.

    ``clear``: delete the folder first (what :func:`check_folder` allowed). ``executor``: where the cells run
    (:class:`troll.study.executors.Executor`; None: here, ``jobs`` at a time). ``report(text)`` receives the progress
    lines. The report is also rewritten (without its plot) each time a cell ends, to read while the study runs.
    """
    command = study.frontend.command
    if clear:
        runs.clear(study.out, command)
    cells = tuple(c.folder.relative_to(study.out).as_posix() for c in study.cells)
    beside = tuple(p.relative_to(study.out).as_posix() for c in study.cells
                   for p in (c.log, c.stop_request, c.options_file))  # fmt: skip
    files = (*runs.LAYOUTS.get(command, STUDY_FILES), *beside)
    files += tuple(e for c in cells for e in lease_lib.manifest_entries(c))
    files += tuple(executor.files) if executor is not None else ()
    if study.frontend.run_command is None:  # cells that keep no manifest of their own are the study's whole
        files, cells = files + tuple(f"{c}/" for c in cells), ()
    with runs.holding(study.out):
        runs.begin(study.out, command, files=files, runs=cells)
        return _run(study, jobs=jobs, report=report, executor=executor)


def _run(study: Study, *, jobs: int, report: Callable[[str], None], executor=None) -> dict[str, str]:
    write_json(study.out / CONFIG_FILE, {"command": study.frontend.command, "spec": study.spec, "argv": sys.argv})
    if study.frontend.cell_options is not None:  # before any cell starts, here or on a cluster's nodes
        for cell in study.cells:
            if not (cell.folder / SUMMARY_FILE).is_file():
                cell_options.write(cell.options_file, study.frontend.cell_options(cell))

    def partial(status: dict[str, str]) -> None:
        try:
            report_lib.write(study, status, plot=False)
        except Exception as err:  # noqa: BLE001 -- a report must never stop the cells
            report(f"could not update {report_lib.JSON_FILE}: {err!r}")

    try:
        status = run_cells(study.frontend, study.cells, jobs=jobs, report=report, on_finish=partial, executor=executor)
    except StudyStopped as stopped:
        report_lib.write(study, stopped.status)
        raise
    report_lib.write(study, status)
    return status


@dataclass
class _Running:
    cell: Cell
    proc: subprocess.Popen
    log: object
    start: float
    lease: lease_lib.Lease


class StudyStopped(Exception):
    """A local study stopped on ``signal`` (SIGTERM, SIGUSR1, or Ctrl-C's SIGINT) once its running cells had stopped;
    ``status`` is every cell's status then (a stopped cell's "stopped (SIGTERM)")."""

    def __init__(self, signal_name: str, status: dict[str, str]):
        super().__init__(f"stopped by {signal_name}")
        self.signal, self.status = signal_name, status

    @property
    def exit_code(self) -> int:
        return protocol.exit_code(self.signal)


STUDY_STOP_SIGNALS = (*protocol.STOP_SIGNALS, "SIGINT")


def run_cells(
    frontend: Frontend, cells: list[Cell], *, jobs: int, report: Callable[[str], None], on_finish=None, executor=None
) -> dict[str, str]:
    """Run the unfinished cells, ``jobs`` at a time; returns label -> "done" | "kept" | "failed (exit N)" | "stopped
    (SIGTERM)" (a cell whose command a stop signal ended: :func:`troll.runs.protocol.stop_signal_of`).

    A finished cell is kept (and tidied); a failed one is reported and the others go on. ``on_finish(status)`` is
    called after each cell ends. With an ``executor`` other than local, the cells to run are handed to it
    (:mod:`troll.study.executors`).

    Stopping (local): SIGTERM, SIGUSR1 or Ctrl-C (SIGINT) starts no more cells and sends SIGTERM to every running
    one at once; a ``troll tce train`` cell then ends its iteration and saves a checkpoint of it. Once they have all
    ended, :class:`StudyStopped` is raised (the report is written first, by :func:`run_study`). A second Ctrl-C kills
    the cells at once. The cells run in sessions of their own, so that a terminal's Ctrl-C reaches only the study;
    Ctrl-Z (SIGTSTP) pauses the study and its running cells together, and ``fg`` or ``bg`` resumes them.
    """
    status, unfinished = _keep_finished(frontend, cells)
    if executor is not None and executor.name != "local":
        return executor.run(frontend, unfinished, status, report=report, on_finish=on_finish)
    todo = runnable_cells(frontend, unfinished, status, report)
    env = {**os.environ, **frontend.env}
    running: list[_Running] = []
    stopping = False
    with protocol.stop_requests(STUDY_STOP_SIGNALS) as stop, _pausing_with(running):
        try:
            while todo or running:
                while todo and len(running) < jobs and stop.signal is None:
                    started = _start_or_fail(frontend, todo.pop(0), env, report, status)
                    if started is not None:
                        running.append(started)
                if stop.signal is not None and not stopping:
                    stopping, todo = True, []
                    again = " (Ctrl-C again: at once, losing their iteration)" if running else ""
                    report(f"{stop.signal}: stopping; {len(running)} running cell(s) end their iteration and save a "
                           f"checkpoint{again}")  # fmt: skip
                    for item in running:
                        item.proc.send_signal(signal.SIGTERM)
                    continue
                time.sleep(POLL_S)
                for item in [r for r in running if r.proc.poll() is None and not r.lease.beat()]:
                    item.proc.kill()  # another attempt took the cell over (its heartbeat here stopped for too long)
                    item.proc.wait()
                for item in [r for r in running if r.proc.poll() is not None]:
                    status[item.cell.label] = _finish(item, report)
                    running.remove(item)
                    if on_finish is not None:
                        on_finish(status)
        finally:
            for item in running:  # an error, or a second Ctrl-C: the cells end now
                item.proc.kill()
            for item in running:
                item.proc.wait()
                item.log.close()
                item.lease.release()
    if stop.signal is not None and any(c.label not in status or status[c.label] not in ("done", "kept") for c in cells):
        raise StudyStopped(stop.signal, status)
    return status


def _keep_finished(frontend: Frontend, cells: list[Cell]) -> tuple[dict[str, str], list[Cell]]:
    """({label: "kept"} of the cells that wrote their summary, each tidied; the other cells, to run)."""
    status, unfinished = {}, []
    for cell in cells:
        if (cell.folder / SUMMARY_FILE).is_file():
            status[cell.label] = "kept"
            frontend.tidy(cell)
        else:
            unfinished.append(cell)
    return status, unfinished


def _start_or_fail(frontend: Frontend, cell: Cell, env: dict, report, status: dict[str, str]) -> _Running | None:
    """The started cell; None, with its status "failed (in use)" or "failed (foreign files)", when another process
    took the cell's folder, or wrote in it, since the cells were planned."""
    try:
        return _start(frontend, cell, env, report)
    except UsageError as err:
        report(f"FAILED {cell.label}: {err}")
        status[cell.label] = "failed (in use)" if isinstance(err, runs.Busy) else "failed (foreign files)"
        return None


@contextlib.contextmanager
def _pausing_with(running: list[_Running]):
    """While inside (in the main thread), SIGTSTP (a terminal's Ctrl-Z) stops the ``running`` cells (each with the
    processes of its group: its env workers), then the study; once the study is continued (SIGCONT: ``fg``, ``bg``),
    so are they."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTSTP) == signal.SIG_IGN:
        yield  # Python handles signals in the main thread only; an ignored Ctrl-Z stays ignored
        return

    def each_cell(signum: int) -> None:  # a cell leads its session: its process group holds its env workers too
        for item in running:
            if item.proc.returncode is None:  # not yet reaped: its pid is still its own
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(item.proc.pid, signum)

    def pause(signum, frame) -> None:
        each_cell(signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once the study is continued
        each_cell(signal.SIGCONT)

    before = signal.signal(signal.SIGTSTP, pause)
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, before)


def runnable_cells(frontend: Frontend, cells: list[Cell], status: dict, report, probe_leases: bool = True) -> list:
    """The unfinished ``cells`` that may be started; the others get their status ("failed (in use)": another
    process writes there; "failed (foreign files)": its folder holds files its command did not write) and a report.
    ``probe_leases``: a lease that looks alive counts as in use too."""
    todo = []
    for cell in cells:
        try:
            _check_free(frontend, cell, probe_leases)
        except runs.Busy as err:
            report(f"FAILED {cell.label}: {err}")
            status[cell.label] = "failed (in use)"
            continue
        problem = _restartable(frontend, cell)
        if problem:
            report(f"FAILED {cell.label}: {problem}")
            status[cell.label] = "failed (foreign files)"
        else:
            cell.stop_request.unlink(missing_ok=True)  # a stopped study's, if it ended before it could remove it
            todo.append(cell)
    return todo


def _restartable(frontend: Frontend, cell: Cell) -> str | None:
    """None when an unfinished cell can be (re)started; else why not: its folder holds files its command did not
    write (they are never deleted)."""
    if frontend.run_command is None or not cell.folder.exists() or frontend.can_resume(cell):
        return None
    try:
        runs.check_folder(cell.folder, frontend.run_command, resume=False, overwrite=True, what="cell")
    except UsageError as err:
        return str(err)
    return None


def _check_free(frontend: Frontend, cell: Cell, probe_leases: bool = True) -> None:
    """:class:`UsageError` when another process is writing the cell's folder (e.g. its run resumed by hand), or
    another attempt owns its lease and looks alive (a cell of the same study running elsewhere)."""
    if frontend.run_command is not None:
        runs.check_free(cell.folder)
    holder = lease_lib.probably_live(cell.folder) if probe_leases else None
    if holder is not None:
        raise lease_lib.Busy(f"{cell.folder} is in use: attempt {holder.attempt} on {holder.host} (pid {holder.pid}) "
                             "owns it and keeps its heartbeat; nothing was changed.")  # fmt: skip


def _start(frontend: Frontend, cell: Cell, env: dict, report) -> _Running:
    _check_free(frontend, cell)  # again: it may have been taken since the study looked
    lease = lease_lib.Lease(cell.folder)
    lease.acquire()
    try:
        return _start_owned(frontend, cell, env, report, lease)
    except BaseException:
        lease.release()
        raise


def _start_owned(frontend: Frontend, cell: Cell, env: dict, report, lease: lease_lib.Lease) -> _Running:
    again = frontend.can_resume(cell)
    if frontend.run_command is not None and cell.folder.exists() and not again:
        # interrupted before anything it could continue from: its command's files go (checked by _restartable)
        if runs.check_folder(cell.folder, frontend.run_command, resume=False, overwrite=True) == "replace":
            runs.clear(cell.folder, frontend.run_command)
    cell.folder.parent.mkdir(parents=True, exist_ok=True)
    argv = frontend.cell_argv(cell, again)
    log = cell.log.open("a")
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            preexec_fn=die_with_parent(), start_new_session=True)  # fmt: skip
    report(f"started {cell.label}{' (resuming)' if again else ''}")
    return _Running(cell, proc, log, time.time(), lease)


def _finish(item: _Running, report) -> str:
    item.log.close()
    item.lease.release()
    minutes = (time.time() - item.start) / 60
    code = item.proc.returncode
    if code == 0:
        report(f"finished {item.cell.label} in {minutes:.1f} min")
        return "done"
    stopped = protocol.stop_signal_of(code)
    if stopped is not None:
        report(f"stopped {item.cell.label} ({stopped}) after {minutes:.1f} min; --resume continues it from its "
               "newest checkpoint")  # fmt: skip
        return f"stopped ({stopped})"
    tail = item.cell.log.read_text(errors="replace").splitlines()[-5:]
    lines = "\n  ".join(tail)
    report(f"FAILED {item.cell.label} (exit {code}) after {minutes:.1f} min; see {item.cell.log}:\n  {lines}")
    return f"failed (exit {code})"


def die_with_parent(ignore: tuple[int, ...] = ()):
    """A ``preexec_fn`` asking Linux to SIGKILL the child when its parent dies, and to ignore the signals ``ignore``
    (kept through exec and by the child's own children); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.signal.argtypes, libc.signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
    parent = os.getpid()
    pr_set_pdeathsig, sigkill, sig_ign = 1, 9, ctypes.c_void_p(1)

    def arm() -> None:  # runs in the child between fork and exec: async-signal-safe calls only
        libc.prctl(pr_set_pdeathsig, sigkill)
        for signum in ignore:
            libc.signal(int(signum), sig_ign)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return arm
