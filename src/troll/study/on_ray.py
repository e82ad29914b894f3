"""``--executor ray``: one Ray task per cell, each asking for the cell's cores (:mod:`troll.study.executors`).

The task is :func:`troll.study.cell.run_cell`, imported by the worker (every node needs troll installed, the same
version as the study's). A task whose node dies is rerun by Ray on another node, :data:`RETRIES` times at most; the
rerun owns the cell once the dead attempt's lease is stale and continues from its newest checkpoint. A cell that
fails by itself returns its status and is not retried. SIGTERM, SIGUSR1 or Ctrl-C to the study cancels its tasks
gracefully: their cells save a checkpoint of their iteration first (:func:`run`). A kill of the study ends its tasks
at once, as Ray ends a driver's tasks. Either way ``--resume`` then submits the unfinished cells again.
"""

from __future__ import annotations

import logging
import os

from troll.runs import protocol
from troll.study import cell as cell_lib
from troll.study import runner

RETRIES = 3  # reruns of a task whose node was lost (Ray's default for tasks)


def _connect(address: str | None) -> None:
    import ray

    quiet = {"log_to_driver": False, "logging_level": logging.WARNING, "configure_logging": False}
    if address is None:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, **quiet)
    else:
        ray.init(address=address, **quiet)


def run(executor, frontend, cells, status: dict, *, report, on_finish=None) -> dict[str, str]:
    """Run the cells as Ray tasks. SIGTERM, SIGUSR1 or Ctrl-C cancels them gracefully: each task's entry point
    passes SIGTERM to its cell and waits for its checkpoint (:func:`troll.study.cell.stop_running`), and once they
    have ended :class:`troll.study.runner.StudyStopped` is raised; a second Ctrl-C ends them at once."""
    import ray

    cells = runner.runnable_cells(frontend, cells, status, report, probe_leases=True)
    if not cells:
        return status
    _connect(executor.ray_address)
    refs: dict = {}
    logged: dict[str, int] = {}  # each cell's log size at its submission: what this study's attempt wrote follows
    with protocol.stop_requests(runner.STUDY_STOP_SIGNALS) as stop:
        try:
            task = ray.remote(cell_lib.run_cell)
            for cell in cells:
                job = cell_lib.job_for(frontend, cell)
                logged[job.label] = job.cell.log.stat().st_size if job.cell.log.is_file() else 0
                ref = task.options(num_cpus=job.cores, max_retries=RETRIES, retry_exceptions=False).remote(job)
                refs[ref] = job
                report(f"submitted {job.label} to Ray ({job.cores} core{'s' if job.cores > 1 else ''})")
            stopping = False
            while refs:
                if stop.signal is not None and not stopping:
                    stopping = True
                    report(f"{stop.signal}: stopping; {len(refs)} task(s) stop their cells, which save a checkpoint")
                    for ref in refs:
                        ray.cancel(ref, force=False)  # a KeyboardInterrupt in the task: troll.study.cell._run
                done, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
                for ref in done:
                    job = refs.pop(ref)
                    status[job.label] = _status(ray, ref, job, logged[job.label])
                    report(cell_lib.progress_line(job.cell, status[job.label], f"; see {job.cell.log}"))
                    if on_finish is not None:
                        on_finish(status)
        finally:
            for ref in refs:
                ray.cancel(ref, force=True)
            ray.shutdown()
    if stop.signal is not None and any(s not in ("done", "kept") for s in status.values()):
        raise runner.StudyStopped(stop.signal, status)
    return status


def _status(ray, ref, job, logged: int) -> str:
    """A finished task's cell status: its result, or for a cancelled task what its cell's log says since the
    ``logged`` bytes it held at the submission."""
    try:
        return ray.get(ref)["status"]
    except ray.exceptions.TaskCancelledError:
        return cell_lib.last_status(job.cell, after=logged) or "stopped (not started)"
    except ray.exceptions.RayError as err:  # its node lost more often than RETRIES, or Ray failed
        return f"failed (ray: {type(err).__name__})"
