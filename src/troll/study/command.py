"""The study command of every application (``troll study``, ``troll tce study``): once a frontend has planned its
cells and checked its folder, :func:`cmd_study` runs them and reports, the same way for both.

It prints timestamped progress to stderr (``[HH:MM:SS +M.m min] ...``), names the files it wrote, and exits with 1
when a cell failed (why is above and in the cell's .log file) or was stopped before its end, else 0. Stopped by
SIGTERM, SIGUSR1 or Ctrl-C (:func:`troll.study.runner.run_cells`), it prints the command that continues the study
(:func:`resume_command`: with its executor's flags, so that pasted on a cluster's login node it does not run the
cells there) and exits with 128 + the signal's number (143, 138, 130). :func:`check_jobs` is the one rule of ``--jobs``
(and :func:`troll.study.executors.from_args` refuses it beside a cluster executor).
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from troll.runs.files import UsageError
from troll.runs.numbers import is_int
from troll.study import executors
from troll.study.report import JSON_FILE, PLOT_FILE, TABLE_FILE
from troll.study.runner import StudyStopped


def check_jobs(jobs) -> int:
    """``--jobs``: how many cells run at once, a whole number >= 1."""
    if not (is_int(jobs) and jobs >= 1):
        raise UsageError(f"--jobs must be >= 1 (cells run at once), got {jobs}.")
    return jobs


def resume_command(name: str, out: Path, jobs: int, executor: executors.Executor) -> str:
    """The command that continues the study in ``out`` where it ran: ``--resume`` with the executor's flags (and
    ``--jobs`` of a local one); the grid and the cells' options are in its config.json."""
    jobs_flags = ["--jobs", str(jobs)] if executor.name == "local" and jobs != 1 else []
    return shlex.join(["troll", *name.split(), "--out", str(out), "--resume", *jobs_flags, *executors.flags(executor)])


def cmd_study(name: str, out: Path, cells: int, jobs: int, run: Callable[[Callable[[str], None]], dict], *,
              executor: executors.Executor) -> int:  # fmt: skip
    """Run a planned study: ``run(report)`` runs its ``cells`` cells on ``executor`` (:mod:`troll.study.executors`;
    locally ``jobs`` at a time) into ``out`` and returns each cell's status ("failed: ..." for a failed one);
    ``name`` is the command (``study``, ``tce study``)."""
    start = time.time()

    def report(text: str) -> None:
        stamp = f"[{time.strftime('%H:%M:%S')} +{(time.time() - start) / 60:.1f} min]"
        print(f"{stamp} {text}", file=sys.stderr, flush=True)

    report(f"study of {cells} cells in {out}, {executors.describe(executor, jobs)}")
    again = resume_command(name, out, jobs, executor)
    try:
        status = run(report)
    except KeyboardInterrupt:
        report(f"interrupted; continue with: {again}")
        return 130
    except StudyStopped as stopped:
        cells = [label for label, s in stopped.status.items() if s.startswith("stopped")]
        failed = [label for label, s in stopped.status.items() if s.startswith("failed")]
        if failed:
            report(f"{len(failed)} cell(s) failed: {', '.join(failed)}; why is above and in their .log files")
        report(f"stopped by {stopped.signal} ({len(cells)} cell(s) stopped); continue with: {again}")
        return stopped.exit_code
    print(f"wrote {out / JSON_FILE}, {out / TABLE_FILE} and {out / PLOT_FILE}")
    failed = [label for label, s in status.items() if s.startswith("failed")]
    stopped = [label for label, s in status.items() if s.startswith("stopped")]
    if failed:
        print(f"troll {name}: {len(failed)} cell(s) failed: {', '.join(failed)}; why is above and in their .log files",
              file=sys.stderr)  # fmt: skip
    if stopped:
        print(f"troll {name}: {len(stopped)} cell(s) were stopped before their end: {', '.join(stopped)}; continue "
              f"with: {again}", file=sys.stderr)  # fmt: skip
    return 1 if failed or stopped else 0
