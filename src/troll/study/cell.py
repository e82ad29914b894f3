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
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from troll import runs
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
    lease = lease_lib.Lease(job.cell.folder, beat_s=job.beat_s, stale_s=job.stale_s)
    result = _owned(job, lease)
    _log(job.cell, f"{STATUS_LINE}{result['status']} (attempt {lease.attempt} on {socket.gethostname()})\n")
    return result


def _owned(job: CellJob, lease: lease_lib.Lease) -> dict:
    try:
        lease.acquire()
    except lease_lib.Busy as err:
        return _result(job, 1, f"failed (in use: {err})")
    try:
        if (job.cell.folder / SUMMARY_FILE).is_file():  # finished by the attempt whose lease this one took over
            return _result(job, 0, "done")
        try:
            again = _prepare(job)
        except runs.Busy as err:  # a writer on this host holds the folder's own lock (a run resumed by hand)
            return _result(job, 1, f"failed (in use: {err})")
        except UsageError as err:
            return _result(job, 1, f"failed (foreign files: {err})")
        code = _run(job, lease, job.resume_argv if again else job.argv)
        if code == 0:
            return _result(job, 0, "done")
        return _result(job, code, "failed (lease lost)" if code == LOST else f"failed (exit {code})")
    finally:
        lease.release()


LOST = -1000  # the code of an attempt that lost its lease (its command was killed)


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


def _log(cell: Cell, text: str) -> None:
    with cell.log.open("a") as log:
        log.write(text)


def _run(job: CellJob, lease: lease_lib.Lease, argv: tuple[str, ...]) -> int:
    """The cell's command as a subprocess, beating the lease while it runs; :data:`LOST` when the lease was lost."""
    from troll.study.runner import die_with_parent

    with job.cell.log.open("a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **job.env}, preexec_fn=die_with_parent())  # fmt: skip
        try:
            while proc.poll() is None:
                if not lease.beat():
                    proc.kill()
                    proc.wait()
                    return LOST
                time.sleep(min(0.25, job.beat_s / 4))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode


def run_cells(jobs: list[CellJob]) -> list[dict]:
    """The cells of one array task, one after the other (each alone: a failed one does not stop the next)."""
    return [run_cell(job) for job in jobs]
