"""``--executor slurm``: one SLURM job array per study through submitit (:mod:`troll.study.executors`).

Each array task runs ``--slurm-cells-per-task`` cells in turn through the cell entry point
(:func:`troll.study.cell.run_cells`), as a submitit ``Checkpointable``: a task stopped by its time limit or a
preemption is requeued by submitit with the same cells, which continue from their checkpoints. submitit's notice
(SIGUSR2, :data:`NOTICE_S` = 90 s before the time limit, here and with ``--slurm-local``) is passed on to the
running cell first: it gets SIGTERM and up to :data:`troll.study.cell.STOP_GRACE_S` seconds to save a checkpoint of
its iteration. A cell whose command SLURM itself ends with SIGTERM (exit 143 after its checkpoint) is "stopped", and
its task starts no further cell.

The study folder holds submitit's files (``slurm/``: the pickled tasks, the sbatch script, each task's stdout and
stderr) and the record of the job ids (``slurm-jobs.json``), written right after the submission. The study process
only waits for the array: killed, it leaves the jobs running, and ``--resume`` reattaches to those still alive
(their cells are not submitted again) and submits only the unfinished cells no live job holds.

``--slurm-local`` runs the tasks on this machine through submitit's ``LocalExecutor`` (each task a process that
outlives the study, as a SLURM job does; its id is its process id), and ``--slurm-script`` prints the sbatch script
the array would be submitted with.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import submitit
from submitit.slurm.slurm import _make_sbatch_string

from troll.runs.files import write_json
from troll.study import cell as cell_lib
from troll.study import lease as lease_lib
from troll.study import runner

JOBS_FILE = "slurm-jobs.json"  # the record of submitted job ids, in the study folder
SLURM_FOLDER = "slurm"  # submitit's pickles and logs, in the study folder
POLL_LOCAL_S = 0.5
POLL_SLURM_S = 30.0  # sacct is the cluster's: ask it rarely
NOTICE_S = 90  # submitit's notice (SIGUSR2) comes this long before a time limit: the cell's grace, and 30 s to spare


class CellTask(submitit.helpers.Checkpointable):
    """An array task: its cells in turn. Requeued as it is (its cells resume from their checkpoints)."""

    def __call__(self, jobs: list) -> list[dict]:
        return cell_lib.run_cells(jobs)

    def checkpoint(self, *args, **kwargs):
        """submitit's handler of a time limit's or a preemption's notice, before it requeues the task: the running
        cell is stopped with a checkpoint of its iteration first."""
        cell_lib.stop_running(cell_lib.STOP_GRACE_S)  # of the NOTICE_S before the time limit
        return super().checkpoint(*args, **kwargs)


def parameters(executor, cores: int) -> dict:
    """submitit's SlurmExecutor parameters (sbatch's names) from the ``--slurm-*`` options."""
    s = executor.slurm
    params = {"job_name": "troll-study", "time": s.time_min, "cpus_per_task": s.cpus_per_task or cores,
              "signal_delay_s": NOTICE_S}  # fmt: skip
    if s.partition:
        params["partition"] = s.partition
    if s.mem_gb is not None:
        params["mem"] = f"{int(s.mem_gb)}GB" if s.mem_gb == int(s.mem_gb) else f"{int(s.mem_gb * 1024)}MB"
    if s.array_parallelism is not None:
        params["array_parallelism"] = s.array_parallelism
    if s.sbatch:
        params["additional_parameters"] = dict(s.sbatch)
    if s.setup:
        params["setup"] = list(s.setup)
    return params


def sbatch_script(executor, tasks: int, cores: int, *, python: str | None = None) -> str:
    """The sbatch script submitit submits for ``tasks`` array tasks (one task: a plain job, no array), as
    ``SlurmExecutor`` writes it (``python``: the interpreter the nodes run, by default this one)."""
    folder = executor.out / SLURM_FOLDER
    python = python or shlex.quote(sys.executable)
    command = " ".join([python, "-u -m submitit.core._submit", shlex.quote(str(folder))])
    count = tasks if tasks > 1 else None
    return _make_sbatch_string(command=command, folder=folder, map_count=count, **parameters(executor, cores))


def submit(executor, groups: list[list], cores: int) -> list:
    """Submit one array task per group of cell jobs; returns the submitit jobs (their ids are the record's)."""
    folder = executor.out / SLURM_FOLDER
    if executor.slurm.local:
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=executor.slurm.time_min, signal_delay_s=NOTICE_S)
    else:
        ex = submitit.SlurmExecutor(folder=folder)
        ex.update_parameters(**parameters(executor, cores))
    with ex.batch():
        futures = [ex.submit(CellTask(), group) for group in groups]
    return futures


def _load(out: Path) -> list[dict]:
    try:
        return list(json.loads((out / JOBS_FILE).read_text())["jobs"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


class _Watch:
    """Whether recorded jobs still run: a local task by its process (pid and start time), a SLURM job by submitit."""

    def __init__(self, executor):
        self.executor = executor
        self.mine: dict[str, object] = {}  # id -> submitit job submitted by this process

    def alive(self, entry: dict) -> bool:
        job = self.mine.get(entry["id"])
        if entry.get("local"):
            if job is not None and getattr(job, "_process", None) is not None:
                return job._process.poll() is None  # also reaps it
            start = lease_lib._start_time(int(entry["id"]))
            return start is not None and start == entry.get("start")
        if job is None:
            job = submitit.SlurmJob(folder=self.executor.out / SLURM_FOLDER, job_id=entry["id"])
            self.mine[entry["id"]] = job
        return not job.done()


def _ended(cell, entry: dict) -> str:
    """A cell's status once the task that held it has ended: its entry point's last word in its log."""
    if (cell.folder / "summary.json").is_file():
        return "done"
    return cell_lib.last_status(cell) or f"failed (job {entry['id']} ended before the cell did)"


def run(executor, frontend, cells, status: dict, *, report, on_finish=None) -> dict[str, str]:
    out = executor.out
    rel = {c.folder.relative_to(out).as_posix(): c for c in cells}
    record = _load(out)
    watch = _Watch(executor)
    pending = [e for e in record if any(r in rel for r in e["cells"]) and watch.alive(e)]
    held = {r for e in pending for r in e["cells"]}
    for entry in pending:
        report(f"reattached to job {entry['id']} ({', '.join(entry['cells'])})")
    todo = runner.runnable_cells(frontend, [c for r, c in rel.items() if r not in held], status, report)
    jobs = [cell_lib.job_for(frontend, c) for c in todo]
    size = executor.slurm.cells_per_task
    groups = [jobs[i : i + size] for i in range(0, len(jobs), size)]
    if groups:
        cores = max(j.cores for j in jobs)
        futures = submit(executor, groups, cores)
        for future, group in zip(futures, groups):
            entry = {"id": str(future.job_id), "cells": [j.cell.folder.relative_to(out).as_posix() for j in group],
                     "local": executor.slurm.local}  # fmt: skip
            if executor.slurm.local:
                entry["start"] = lease_lib._start_time(int(future.job_id))
            watch.mine[entry["id"]] = future
            record.append(entry)
            pending.append(entry)
        write_json(out / JOBS_FILE, {"jobs": record})
        where = "here (--slurm-local)" if executor.slurm.local else "to SLURM"
        report(f"submitted {len(groups)} task(s) of {len(jobs)} cell(s) {where}: job(s) "
               f"{', '.join(str(f.job_id) for f in futures)}")  # fmt: skip
    poll = POLL_LOCAL_S if executor.slurm.local else POLL_SLURM_S
    try:
        while pending:
            for entry in [e for e in pending if not watch.alive(e)]:
                pending.remove(entry)
                for name in entry["cells"]:
                    if name in rel:
                        cell = rel[name]
                        status[cell.label] = _ended(cell, entry)
                        report(cell_lib.progress_line(cell, status[cell.label]))
                        if on_finish is not None:
                            on_finish(status)
            if pending:
                time.sleep(poll)
    except KeyboardInterrupt:
        report(f"the jobs keep running; --resume reattaches to them ({out / JOBS_FILE})")
        raise
    return status
