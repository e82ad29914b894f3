"""``--executor ray``: one Ray task per cell, each asking for the cell's cores (:mod:`troll.study.executors`).

The task is :func:`troll.study.cell.run_cell`, imported by the worker (every node needs troll installed, the same
version as the study's). A task whose node dies is rerun by Ray on another node, :data:`RETRIES` times at most; the
rerun owns the cell once the dead attempt's lease is stale and continues from its newest checkpoint. A cell that
fails by itself returns its status and is not retried. SIGTERM, SIGUSR1 or Ctrl-C to the study stops its tasks
gracefully: their cells save a checkpoint of their iteration first (:func:`run`). A kill of the study ends its tasks
at once, as Ray ends a driver's tasks. Either way ``--resume`` then submits the unfinished cells again.
"""

from __future__ import annotations

import logging
import os
import time

from troll.runs import protocol
from troll.study import cell as cell_lib
from troll.study import runner

RETRIES = 3  # reruns of a task whose node was lost (Ray's default for tasks)
# how long a stopping study waits for its tasks: a running cell's grace, or a stale lease's wait, and 30 s more;
# tasks Ray has not started by then (a busy cluster) are left to end with the study
STOP_WAIT_S = max(cell_lib.STOP_GRACE_S, cell_lib.lease_lib.STALE_S) + 30.0


def _connect(address: str | None) -> None:
    import ray

    quiet = {"log_to_driver": False, "logging_level": logging.WARNING, "configure_logging": False}
    if address is None:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, **quiet)
    else:
        ray.init(address=address, **quiet)


def run(executor, frontend, cells, status: dict, *, report, on_finish=None) -> dict[str, str]:
    """Run the cells as Ray tasks. SIGTERM, SIGUSR1 or Ctrl-C stops them through the shared folder, not through Ray:
    the study writes each cell's stop request (:attr:`troll.study.grid.Cell.stop_request`), the task's entry point
    passes SIGTERM to its cell and waits for its checkpoint, and a task that had not started yet ends at once. Once
    every task has returned (or :data:`STOP_WAIT_S` has passed: a task Ray has not even started by then, on a busy
    cluster, ends with the study), :class:`troll.study.runner.StudyStopped` is raised. A second Ctrl-C ends the
    study, and with it, as Ray ends a driver's tasks, the tasks and their cells. (Ray's own cancel is not used: in
    Ray 2.60 a cancel that meets a task just ending can abort the driver on an internal check.)"""
    import ray

    cells = runner.runnable_cells(frontend, cells, status, report, probe_leases=True)
    if not cells:
        return status
    _connect(executor.ray_address)
    refs: dict = {}
    with protocol.stop_requests(runner.STUDY_STOP_SIGNALS) as stop:
        try:
            task = ray.remote(cell_lib.run_cell)
            for cell in cells:
                job = cell_lib.job_for(frontend, cell)
                ref = task.options(num_cpus=job.cores, max_retries=RETRIES, retry_exceptions=False).remote(job)
                refs[ref] = job
                report(f"submitted {job.label} to Ray ({job.cores} core{'s' if job.cores > 1 else ''})")
            deadline = None
            while refs:
                if stop.signal is not None and deadline is None:
                    deadline = time.monotonic() + STOP_WAIT_S
                    report(f"{stop.signal}: stopping; {len(refs)} task(s) stop their cells, which save a checkpoint "
                           "(Ctrl-C again: at once, losing their iteration)")  # fmt: skip
                    for job in refs.values():
                        problem = cell_lib.request_stop(job.cell, stop.signal)
                        if problem is not None:
                            report(f"{job.label}: {problem}; it ends with the study")
                if deadline is not None and time.monotonic() > deadline:
                    for job in refs.values():  # most likely never started by Ray; it ends with the study
                        status[job.label] = f"stopped (its task had not ended {STOP_WAIT_S:g} s after the stop)"
                        report(cell_lib.progress_line(job.cell, status[job.label]))
                    break
                done, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
                for ref in done:
                    job = refs.pop(ref)
                    status[job.label] = _status(ray, ref)
                    if not status[job.label].startswith("failed (in use"):  # else the request may be another study's
                        job.cell.stop_request.unlink(missing_ok=True)
                    report(cell_lib.progress_line(job.cell, status[job.label], f"; see {job.cell.log}"))
                    if on_finish is not None:
                        on_finish(status)
        finally:
            ray.shutdown()  # tasks still running (an error, a second Ctrl-C) end with the driver
            for job in refs.values():
                job.cell.stop_request.unlink(missing_ok=True)
    if stop.signal is not None and any(s not in ("done", "kept") for s in status.values()):
        raise runner.StudyStopped(stop.signal, status)
    return status


def _status(ray, ref) -> str:
    """A finished task's cell status: its result, or why Ray could not give it."""
    try:
        return ray.get(ref)["status"]
    except ray.exceptions.RayError as err:  # its node lost more often than RETRIES, or Ray failed
        return f"failed (ray: {type(err).__name__})"
