"""``--executor ray``: one Ray task per cell, each asking for the cell's cores (:mod:`troll.study.executors`).

The task is :func:`troll.study.cell.run_cell`, imported by the worker (every node needs troll installed, the same
version as the study's). A task whose node dies is rerun by Ray on another node, :data:`RETRIES` times at most; the
rerun owns the cell once the dead attempt's lease is stale and continues from its newest checkpoint. A cell that
fails by itself returns its status and is not retried. Ending the study (or a kill of it) ends its tasks, as Ray
ends a driver's tasks; ``--resume`` then submits the unfinished cells again.
"""

from __future__ import annotations

import logging
import os

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
    import ray

    cells = runner.runnable_cells(frontend, cells, status, report, probe_leases=True)
    if not cells:
        return status
    _connect(executor.ray_address)
    refs: dict = {}
    try:
        task = ray.remote(cell_lib.run_cell)
        for cell in cells:
            job = cell_lib.job_for(frontend, cell)
            ref = task.options(num_cpus=job.cores, max_retries=RETRIES, retry_exceptions=False).remote(job)
            refs[ref] = job
            report(f"submitted {job.label} to Ray ({job.cores} core{'s' if job.cores > 1 else ''})")
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
            for ref in done:
                job = refs.pop(ref)
                try:
                    result = ray.get(ref)
                    status[job.label] = result["status"]
                except ray.exceptions.RayError as err:  # its node lost more often than RETRIES, or Ray failed
                    status[job.label] = f"failed (ray: {type(err).__name__})"
                _report(job, status[job.label], report)
                if on_finish is not None:
                    on_finish(status)
    finally:
        for ref in refs:
            ray.cancel(ref, force=True)
        ray.shutdown()
    return status


def _report(job, status: str, report) -> None:
    if status == "done":
        report(f"finished {job.label}")
    else:
        report(f"FAILED {job.label}: {status}; see {job.cell.log}")
