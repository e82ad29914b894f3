"""A cell's entry point on any machine: safe to run again, whoever ran it before and however that ended.

:func:`run_cell` is what a Ray task or a SLURM array task calls for each of its cells (:mod:`troll.study.executors`).
It owns the cell through a lease (:mod:`troll.study.lease`), then, from what the shared folder holds:

- a cell whose summary.json exists is done: it exits 0 at once (a retried task, a requeued job);
- a cell whose folder holds a checkpoint resumes from it (the command's own ``--resume``, which continues from the
  newest checkpoint bit for bit);
- any other started cell holds only its command's files (checked, never guessed): they are removed and it starts
  over; a cell never started starts.

The command runs as a subprocess of the entry point (so that it is exactly the command a user would type, as with
``--executor local``), killed with it (``PR_SET_PDEATHSIG``): when the entry point dies, so does its cell, and its
heartbeat stops. The result is a small dict ({"label", "code", "status"}), never an exception for a failed cell:
executors do not retry a cell that failed by itself, only one whose machine was lost.

Stopping. A command that a stop signal ended (exit 143 or 138: ``troll tce train`` saved a checkpoint of its
iteration; :func:`troll.runs.protocol.stop_signal_of`) leaves its cell "stopped (SIGTERM)", not failed, and
:func:`run_cells` then starts none of its task's remaining cells: the signal was meant for the whole task (a
cluster's notice before it ends or preempts a job). :func:`stop_running` is how a task's own handler passes such a
notice on: SIGTERM to the running command, then a wait for its checkpoint (``troll.study.on_slurm.CellTask``).
A study stops its cells from afar through the shared folder instead (``--executor ray``): it writes each cell's
:attr:`~troll.study.grid.Cell.stop_request` file, and the entry point, which looks for it while the command runs,
stops the command the same way; one that finds it before starting leaves its cell "stopped (not started)".
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from troll import runs
from troll.runs import protocol
from troll.runs.files import SUMMARY_FILE, UsageError
from troll.study import lease as lease_lib
from troll.study.grid import Cell

STATUS_LINE = "# troll cell: "  # each attempt's last log line: "# troll cell: <status> (attempt <id> on <host>)"


@dataclass(frozen=True)
class CellJob:
    """Everything an entry point needs, computed by the study process: picklable, no study state.

    ``argv`` starts the cell, ``resume_argv`` continues it from its checkpoint (``can_resume(cell)`` says whether
    it has one); ``run_command`` names the command whose manifest says what in the folder may be removed (None: the
    folder is left to the command); ``env`` is added to the environment; ``cores`` is what the cell uses.
    """

    cell: Cell
    argv: tuple[str, ...]
    resume_argv: tuple[str, ...]
    can_resume: Callable[[Cell], bool]
    run_command: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cores: int = 1
    beat_s: float = lease_lib.BEAT_S
    stale_s: float = lease_lib.STALE_S

    @property
    def label(self) -> str:
        return self.cell.label


def job_for(frontend, cell: Cell, *, beat_s: float | None = None, stale_s: float | None = None) -> CellJob:
    """The :class:`CellJob` of a planned cell of ``frontend`` (a :class:`troll.study.Frontend`)."""
    return CellJob(
        cell=cell,
        argv=tuple(frontend.cell_argv(cell, False)),
        resume_argv=tuple(frontend.cell_argv(cell, True)),
        can_resume=frontend.can_resume,
        run_command=frontend.run_command,
        env=dict(frontend.env),
        cores=int(frontend.cores(cell)),
        beat_s=lease_lib.BEAT_S if beat_s is None else beat_s,
        stale_s=lease_lib.STALE_S if stale_s is None else stale_s,
    )


def _result(job: CellJob, code: int, status: str) -> dict:
    return {"label": job.label, "code": code, "status": status}


def run_cell(job: CellJob) -> dict:
    """Run one cell to its end, or find it done (module docstring); returns {"label", "code", "status"}, which its
    log also ends with (a :data:`STATUS_LINE`, read by a study that reattached to the task)."""
    if (job.cell.folder / SUMMARY_FILE).is_file():
        return _result(job, 0, "done")
    if stop_requested(job.cell):  # its study stopped before this task started
        _log_status(job.cell, NOT_STARTED, "-")
        return _result(job, 1, NOT_STARTED)
    lease = lease_lib.Lease(job.cell.folder, beat_s=job.beat_s, stale_s=job.stale_s)
    result = _owned(job, lease)
    _log_status(job.cell, result["status"], lease.attempt)
    return result


def _owned(job: CellJob, lease: lease_lib.Lease) -> dict:
    try:
        lease.acquire()
    except lease_lib.Busy as err:
        return _result(job, 1, f"failed (in use: {err})")
    try:
        if (job.cell.folder / SUMMARY_FILE).is_file():  # finished by the attempt whose lease this one took over
            return _result(job, 0, "done")
        if stop_requested(job.cell):  # while it waited for a stale lease
            return _result(job, 1, NOT_STARTED)
        try:
            again = _prepare(job)
        except runs.Busy as err:  # a writer on this host holds the folder's own lock (a run resumed by hand)
            return _result(job, 1, f"failed (in use: {err})")
        except UsageError as err:
            return _result(job, 1, f"failed (foreign files: {err})")
        code = _run(job, lease, job.resume_argv if again else job.argv)
        return _result(job, code, _status_of(code))
    finally:
        lease.release()


LOST = -1000  # the code of an attempt that lost its lease (its command was killed)
KILLED = -1001  # the code of a command stopped but killed after STOP_GRACE_S without its checkpoint
NOT_STARTED = "stopped (not started)"


def _status_of(code: int) -> str:
    """A cell's status from its command's exit code (or :data:`LOST`, :data:`KILLED`)."""
    if code == 0:
        return "done"
    if code == LOST:
        return "failed (lease lost)"
    if code == KILLED:
        return f"stopped (killed: no checkpoint within {STOP_GRACE_S:g} s)"
    name = protocol.stop_signal_of(code)
    return f"stopped ({name})" if name is not None else f"failed (exit {code})"


def stop_requested(cell: Cell) -> bool:
    """Whether the cell's stop request exists (False when the shared file system cannot say, e.g. ESTALE on NFS:
    the next look, a quarter of a second later, will)."""
    try:
        return cell.stop_request.exists()
    except OSError:
        return False


def request_stop(cell: Cell, signal_name: str) -> str | None:
    """Write the cell's stop request (its arm's folder too, for a cell not started yet); None, or why it could not."""
    try:
        cell.stop_request.parent.mkdir(parents=True, exist_ok=True)
        cell.stop_request.write_text(f"{signal_name}\n")
    except OSError as err:
        return f"could not write {cell.stop_request}: {err}"
    return None


def progress_line(cell: Cell, status: str, failed_hint: str = "") -> str:
    """What a study reports when ``cell`` has ended with ``status`` (``failed_hint`` follows a failure's)."""
    if status == "done":
        return f"finished {cell.label}"
    if status.startswith("stopped"):
        return f"{status.replace('stopped', 'stopped ' + cell.label, 1)}; --resume continues it"
    return f"FAILED {cell.label}: {status}{failed_hint}"


def _prepare(job: CellJob) -> bool:
    """True when the cell resumes from a checkpoint; otherwise its leftovers (its command's files only) go."""
    cell = job.cell
    runs.check_free(cell.folder)  # a writer on this host that holds the folder's own lock (e.g. a run by hand)
    again = bool(job.can_resume(cell))
    if job.run_command is not None and cell.folder.exists() and not again:
        if runs.check_folder(cell.folder, job.run_command, resume=False, overwrite=True, what="cell") == "replace":
            runs.clear(cell.folder, job.run_command)
    cell.folder.parent.mkdir(parents=True, exist_ok=True)
    return again


def last_status(cell: Cell) -> str | None:
    """The status the cell's last attempt wrote at its end (its log's last :data:`STATUS_LINE`), None when none did:
    also when a command was started after the last status line (an attempt that ended without writing one, e.g.
    killed with its machine)."""
    try:
        text = cell.log.read_bytes().decode(errors="replace")
    except OSError:
        return None
    status = None
    for line in text.splitlines():
        if line.startswith(STATUS_LINE):
            status = line[len(STATUS_LINE) :].split(" (attempt ")[0]
        elif line.startswith("$ "):  # an attempt started after it: its status, if it wrote one, follows
            status = None
    return status


def _log(cell: Cell, text: str) -> None:
    with cell.log.open("a") as log:
        log.write(text)


def _log_status(cell: Cell, status: str, attempt: int | str) -> None:
    """End the cell's log with its :data:`STATUS_LINE` (the one format :func:`last_status` reads); ``attempt`` is the
    lease's attempt id, "-" for a cell that never ran. Creates the arm folder of a cell that never started."""
    cell.log.parent.mkdir(parents=True, exist_ok=True)
    _log(cell, f"{STATUS_LINE}{status} (attempt {attempt} on {socket.gethostname()})\n")


def _run(job: CellJob, lease: lease_lib.Lease, argv: tuple[str, ...]) -> int:
    """The cell's command as a subprocess, beating the lease while it runs; :data:`LOST` when the lease was lost.
    When the cell's stop request appears, the command gets SIGTERM and :data:`STOP_GRACE_S` to end (:data:`KILLED`
    after that).

    The command ignores SIGUSR2: SLURM sends submitit's notice before a time limit to every process of the job step,
    and the task's handler passes it on as SIGTERM (:func:`stop_running`), which the command would not live to see.
    """
    from troll.study.runner import die_with_parent

    proc, arm = None, die_with_parent((signal.SIGUSR2,))
    with job.cell.log.open("a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        try:
            proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **job.env}, preexec_fn=arm)  # fmt: skip
            _RUNNING.append((job, lease, proc))
            while proc.poll() is None:
                if not lease.beat():
                    proc.kill()
                    proc.wait()
                    return LOST
                if stop_requested(job.cell):  # its study is stopping (from another machine, maybe)
                    proc.send_signal(signal.SIGTERM)
                    code = _end_of(proc, lease, time.monotonic() + STOP_GRACE_S)
                    return KILLED if code is None else code  # killed, if it still runs, below
                time.sleep(min(0.25, job.beat_s / 4))
        finally:
            if (job, lease, proc) in _RUNNING:
                _RUNNING.remove((job, lease, proc))
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode


_RUNNING: list[tuple] = []  # (job, lease, process) of the command this process runs now, for stop_running
# how long a stopped task waits for its cell's checkpoint (a box-pushing iteration: 10-40 s, longer under load);
# SLURM's notice comes troll.study.on_slurm.NOTICE_S before the time limit, 30 s more than this
STOP_GRACE_S = 60.0


def stop_running(grace_s: float) -> None:
    """Send SIGTERM to the cell command this process runs (if any) and wait up to ``grace_s`` seconds for it to end
    (``troll tce train`` ends its iteration and saves a checkpoint), beating its lease; then kill it if it still
    runs. Its log ends with the cell's status either way.

    Safe in a signal handler of the main thread, which may have interrupted :func:`_run` anywhere, even inside the
    command's ``Popen.poll``: the end is watched without reaping the process (``waitid`` with ``WNOWAIT``), which is
    left to its Popen."""
    for _, _, proc in list(_RUNNING):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for job, lease, proc in list(_RUNNING):
        code = _end_of(proc, lease, deadline)
        if code is None:
            proc.kill()  # reaped by its Popen later
            status = f"stopped (killed: no checkpoint within {grace_s:g} s)"
        else:
            status = _status_of(code)
        _log_status(job.cell, status, lease.attempt)


def _end_of(proc: subprocess.Popen, lease: lease_lib.Lease, deadline: float) -> int | None:
    """The exit code of ``proc`` once it ends (:data:`LOST`, after killing it, when another attempt takes the cell
    over), beating the lease meanwhile; None if it still runs at ``deadline``. The process is left unreaped."""
    code = proc.returncode
    while code is None and time.monotonic() < deadline:
        if not lease.beat():  # another attempt took the cell over: it is theirs now
            proc.kill()
            return LOST
        try:
            ended = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped by its Popen this instant
            return proc.returncode
        if ended is not None:
            code = ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status
        else:
            time.sleep(0.05)
    return code


def run_cells(jobs: list[CellJob]) -> list[dict]:
    """The cells of one array task, one after the other (each alone: a failed one does not stop the next, a stopped
    one does: the rest are left for the task's requeue or the study's ``--resume``, their logs saying so)."""
    results = []
    for k, job in enumerate(jobs):
        results.append(run_cell(job))
        if results[-1]["status"].startswith("stopped"):
            for later in jobs[k + 1 :]:
                _log_status(later.cell, "stopped (not started: its task was stopped)", "-")
            break
    return results
