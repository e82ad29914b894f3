"""Where a study's cells run: ``--executor local`` (here, ``--jobs`` at a time), ``ray`` or ``slurm``.

- ``local`` (the default) is the engine's own loop (:func:`troll.study.runner.run_cells`): subprocesses of the study.
- ``ray`` (:mod:`troll.study.on_ray`): one Ray task per cell on a cluster (``--ray-address``; without it
  ``ray.init()`` starts one on this machine), each asking for the cell's cores; a task whose node is lost is rerun
  elsewhere (:data:`troll.study.on_ray.RETRIES` times), a cell that fails by itself is not.
- ``slurm`` (:mod:`troll.study.on_slurm`): one job array per study through submitit, ``--slurm-cells-per-task``
  cells per array task; the job ids are recorded in the study folder so that ``--resume`` reattaches to the live
  ones instead of submitting their cells again.

Every remote task calls the same entry point, :func:`troll.study.cell.run_cell`, which owns the cell through its
lease and resumes it from its newest checkpoint: a retried, requeued or resubmitted cell gives the numbers an
uninterrupted one gives. What a cluster needs and this module checks before anything is written: the study folder on
one file system shared by every node under the same absolute path (a relative ``--out`` is resolved here; any other
relative path a cell would read is refused, since a node starts in another directory), the cluster's tools
(``sbatch``; a Ray cluster that answers as Ray, :func:`troll.study.on_ray.probe`, with a node that has a cell's cores),
the Python packages (``pip install 'troll[cluster]'``), and options that would be ignored or overridden (``--jobs``
beside a cluster executor, an ``--slurm-sbatch`` option one of the study's own flags or submitit sets).
:func:`flags` gives back the flags of an executor, for the command that continues a study.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from troll.runs.files import UsageError

EXECUTORS = ("local", "ray", "slurm")
SLURM_TIME_MIN = 60
# the fewest minutes --slurm-time takes: a cell's stop notice comes troll.study.on_slurm.NOTICE_S (90 s) before the
# time limit, and a shorter task would get it before it started
SLURM_TIME_LOW = 2


@dataclass(frozen=True)
class SlurmOptions:
    """What a SLURM user sets for the job array (``--slurm-*``); None: the cluster's default."""

    partition: str | None = None
    time_min: int = SLURM_TIME_MIN
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    array_parallelism: int | None = None
    sbatch: tuple[tuple[str, str], ...] = ()
    setup: tuple[str, ...] = ()
    cells_per_task: int = 1
    local: bool = False
    script: bool = False


@dataclass(frozen=True)
class Executor:
    """The executor of a study: its name, its options, and the study folder it submits for."""

    name: str = "local"
    ray_address: str | None = None
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    out: Path | None = None

    @property
    def files(self) -> tuple[str, ...]:
        """What it writes in the study folder (the study's manifest lists them)."""
        if self.name != "slurm":
            return ()
        from troll.study.on_slurm import JOBS_FILE, SLURM_FOLDER

        return (f"{SLURM_FOLDER}/", JOBS_FILE)

    def run(self, frontend, cells, status: dict, *, report, on_finish=None) -> dict[str, str]:
        """Run the unfinished ``cells`` (none kept) remotely; fills and returns ``status`` (label -> status)."""
        if self.name == "ray":
            from troll.study import on_ray

            return on_ray.run(self, frontend, cells, status, report=report, on_finish=on_finish)
        from troll.study import on_slurm

        return on_slurm.run(self, frontend, cells, status, report=report, on_finish=on_finish)


# ---------------------------------------------------------------------------------------------- flags

SLURM_FLAGS = ("slurm_partition", "slurm_time", "slurm_cpus_per_task", "slurm_mem_gb", "slurm_array_parallelism",
               "slurm_sbatch", "slurm_setup", "slurm_cells_per_task", "slurm_local", "slurm_script")  # fmt: skip


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The executor flags of a study command (``troll study``, ``troll tce study``); defaults SUPPRESSed."""
    s = argparse.SUPPRESS
    group = parser.add_argument_group("where the cells run (docs/cluster.md)")
    group.add_argument("--executor", default="local", help="local (here, --jobs at a time; the default), ray (one "
                       "task per cell on a Ray cluster) or slurm (a SLURM job array through submitit)")  # fmt: skip
    group.add_argument("--ray-address", default=s, help="the Ray cluster's address, e.g. 10.0.0.1:6379 or auto "
                       "(default: start one on this machine)")  # fmt: skip
    group.add_argument("--slurm-partition", default=s, help="partition of the job array (default: the cluster's)")
    time_help = f"minutes per array task, at least {SLURM_TIME_LOW} (default: {SLURM_TIME_MIN})"
    group.add_argument("--slurm-time", default=s, help=time_help)
    group.add_argument("--slurm-cpus-per-task", default=s, help="cores per array task (default: a cell's cores)")
    group.add_argument("--slurm-mem-gb", default=s, help="memory per array task in GB (default: the cluster's)")
    group.add_argument("--slurm-array-parallelism", default=s, help="array tasks running at once (default: all)")
    group.add_argument("--slurm-sbatch", action="append", default=s, metavar="KEY=VALUE",
                       help="an extra #SBATCH option, e.g. account=myproject or qos=short (repeatable)")  # fmt: skip
    group.add_argument("--slurm-setup", action="append", default=s, metavar="LINE",
                       help="a shell line run before the cells, e.g. 'module load python' (repeatable)")  # fmt: skip
    group.add_argument("--slurm-cells-per-task", default=s, help="cells one array task runs in turn (default: 1)")
    group.add_argument(
        "--slurm-local",
        action="store_true",
        default=s,
        help="run the array's tasks on this machine (submitit's local executor; no SLURM needed)",
    )
    group.add_argument(
        "--slurm-script",
        action="store_true",
        default=s,
        help="print the job array's sbatch script and exit, submitting and writing nothing",
    )


def _int(args, name: str, low: int):
    text = getattr(args, name)
    flag = "--" + name.replace("_", "-")
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} must be an integer >= {low}, got {text!r}.") from None
    if value < low:
        raise UsageError(f"{flag} must be an integer >= {low}, got {value}.")
    return value


def _slurm_time(text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise UsageError(f"--slurm-time must be a whole number of minutes, got {text!r}.") from None
    if value < SLURM_TIME_LOW:
        raise UsageError(f"--slurm-time must be at least {SLURM_TIME_LOW} minutes, got {value}: each array task gets "
                         "its stop notice 90 s before its time limit, for its cell to save a checkpoint.")  # fmt: skip
    return value


# sbatch options a --slurm-sbatch may not set: one of the study's flags sets it (sbatch's long name and short letter)
OWN_SBATCH = {"time": ("t", "--slurm-time"), "partition": ("p", "--slurm-partition"),
              "cpus-per-task": ("c", "--slurm-cpus-per-task"), "mem": (None, "--slurm-mem-gb")}  # fmt: skip
# ... or submitit and the study need it as they set it
SET_SBATCH = {"array": ("a", "the array of the study's cells; --slurm-array-parallelism sets how many run at once"),
              "signal": (None, "the stop notice the cells save their checkpoint on, 90 s before the time limit"),
              "output": ("o", "submitit reads each task's result and log there"),
              "error": ("e", "submitit reads each task's log there"),
              "open-mode": (None, "a requeued task appends to its logs")}  # fmt: skip


def _sbatch_option(text: str) -> tuple[str, str]:
    key, sep, value = text.removeprefix("#SBATCH").strip().removeprefix("--").partition("=")
    if not sep or not key.strip() or not value.strip() or " " in key.strip():
        raise UsageError(f"--slurm-sbatch {text!r}: write KEY=VALUE, an sbatch option without its dashes, e.g. "
                         "--slurm-sbatch account=myproject.")  # fmt: skip
    key = key.strip().lstrip("-")
    name = _sbatch_name(key)
    if name in OWN_SBATCH:
        flag = OWN_SBATCH[name][1]
        raise UsageError(f"--slurm-sbatch {text}: sbatch's --{name} is what {flag} sets, and the two would overrule "
                         f"each other; give {flag} instead.")  # fmt: skip
    if name in SET_SBATCH:
        raise UsageError(f"--slurm-sbatch {text}: the study sets sbatch's --{name} itself ({SET_SBATCH[name][1]}); "
                         "drop this --slurm-sbatch.")  # fmt: skip
    return key, value.strip()


def _sbatch_name(key: str) -> str | None:
    """The option of :data:`OWN_SBATCH` or :data:`SET_SBATCH` that the --slurm-sbatch ``key`` names: its long name
    (or a prefix of it of three letters or more, as sbatch takes one; ``_`` for ``-``, as submitit writes keys) or
    its short letter. None for any other option."""
    key = key.replace("_", "-")
    for name, (letter, _) in (*OWN_SBATCH.items(), *SET_SBATCH.items()):
        if key == letter or key == name or (len(key) >= 3 and name.startswith(key)):
            return name
    return None


def _check_jobs(args, name: str) -> None:
    """``--jobs`` counts the cells that run at once *here*; a cluster executor decides that itself."""
    text = str(getattr(args, "jobs", 1)).strip()
    try:
        given = int(text) != 1
    except ValueError:  # not a number: the application's own check of --jobs names it
        return
    if given and name != "local":
        how = ("Ray starts each cell as soon as a node has its cores free" if name == "ray" else
               "--slurm-array-parallelism sets how many array tasks run at once")  # fmt: skip
        raise UsageError(f"--jobs {text} applies to --executor local (cells run at once on this machine); with "
                         f"--executor {name}, {how}. Drop --jobs.")  # fmt: skip


def from_args(args) -> Executor:
    """The executor the flags ask for; :class:`UsageError` naming the flag for a typo or an option of another
    executor. Nothing is checked on the machine yet (:func:`prepare` does)."""
    name = str(getattr(args, "executor", "local")).strip()
    if name not in EXECUTORS:
        near = difflib.get_close_matches(name, EXECUTORS, n=1)
        hint = f" Did you mean --executor {near[0]}?" if near else ""
        raise UsageError(f"--executor {name!r} is not one of {', '.join(EXECUTORS)}.{hint}")
    given = [f for f in SLURM_FLAGS if hasattr(args, f)]
    if given and name != "slurm":
        raise UsageError(f"--{given[0].replace('_', '-')} applies to --executor slurm; add it or drop the flag.")
    if hasattr(args, "ray_address") and name != "ray":
        raise UsageError("--ray-address applies to --executor ray; add it or drop the flag.")
    _check_jobs(args, name)
    if name != "slurm":
        return Executor(name, ray_address=getattr(args, "ray_address", None))
    has = lambda f: hasattr(args, f)  # noqa: E731
    mem = None
    if has("slurm_mem_gb"):
        try:
            mem = float(args.slurm_mem_gb)
        except ValueError:
            mem = -1.0
        if not (math.isfinite(mem) and mem > 0):
            raise UsageError(f"--slurm-mem-gb must be a number of GB > 0, got {args.slurm_mem_gb!r}.")
    partition = args.slurm_partition.strip() if has("slurm_partition") else None
    if partition == "":
        raise UsageError("--slurm-partition is empty; give a partition name or leave the flag out.")
    slurm = SlurmOptions(
        partition=partition,
        time_min=_slurm_time(args.slurm_time) if has("slurm_time") else SLURM_TIME_MIN,
        cpus_per_task=_int(args, "slurm_cpus_per_task", 1) if has("slurm_cpus_per_task") else None,
        mem_gb=mem,
        array_parallelism=_int(args, "slurm_array_parallelism", 1) if has("slurm_array_parallelism") else None,
        sbatch=tuple(_sbatch_option(t) for t in getattr(args, "slurm_sbatch", ())),
        setup=tuple(getattr(args, "slurm_setup", ())),
        cells_per_task=_int(args, "slurm_cells_per_task", 1) if has("slurm_cells_per_task") else 1,
        local=has("slurm_local"),
        script=has("slurm_script"),
    )
    if slurm.local and slurm.script:
        raise UsageError("--slurm-local runs the array here and --slurm-script only prints it; give one of them.")
    per = [k for k, _ in slurm.sbatch if k.replace("_", "-") in ("mem-per-cpu", "mem-per-gpu")]
    if per and slurm.mem_gb is not None:
        raise UsageError(f"--slurm-sbatch {per[0]}=... and --slurm-mem-gb both set the memory (sbatch takes one of "
                         "--mem, --mem-per-cpu, --mem-per-gpu); give one of them.")  # fmt: skip
    return Executor("slurm", slurm=slurm)


def flags(executor: Executor) -> list[str]:
    """The command-line flags that choose ``executor`` again (:func:`from_args` of them gives it back), for the
    command that continues a study; none for ``local``."""
    if executor.name == "local":
        return []
    if executor.name == "ray":
        return ["--executor", "ray", *(["--ray-address", executor.ray_address] if executor.ray_address else [])]
    s = executor.slurm
    mem = None if s.mem_gb is None else (str(int(s.mem_gb)) if s.mem_gb == int(s.mem_gb) else repr(s.mem_gb))
    values = {"--slurm-partition": s.partition, "--slurm-time": s.time_min if s.time_min != SLURM_TIME_MIN else None,
              "--slurm-cpus-per-task": s.cpus_per_task, "--slurm-mem-gb": mem,
              "--slurm-array-parallelism": s.array_parallelism,
              "--slurm-cells-per-task": s.cells_per_task if s.cells_per_task != 1 else None}  # fmt: skip
    argv = ["--executor", "slurm"]
    for flag, value in values.items():
        argv += [flag, str(value)] if value is not None else []
    for key, value in s.sbatch:
        argv += ["--slurm-sbatch", f"{key}={value}"]
    for line in s.setup:
        argv += ["--slurm-setup", line]
    return argv + ["--slurm-local"] * s.local + ["--slurm-script"] * s.script


# ---------------------------------------------------------------------------------------------- checks


def resolve_out(executor: Executor, out: Path) -> Path:
    """The study folder the cells write to: as given for ``local``; absolute for the others (a node starts in
    another directory, and the path must be the same on every node of the shared file system)."""
    return Path(out) if executor.name == "local" else Path(os.path.abspath(out))


def _relative_paths(argv, env: dict, options: dict | None = None) -> list[str]:
    """Tokens of a cell's command line, and text values of its options (:mod:`troll.study.options`, named in flag
    form), that name an existing file or folder by a relative path, and relative entries of the PYTHONPATH the
    cell inherits."""
    found = []
    given = list(zip(("", *argv), argv))
    given += [("--" + str(name).replace("_", "-"), value) for name, value in (options or {}).items()]
    for before, token in given:  # option values only: a command's words are not paths
        value = before.startswith("-") and isinstance(token, str) and token and not token.startswith("-")
        if value and not os.path.isabs(token) and os.path.exists(token):
            found.append(f"{before} {token}".strip())
    for entry in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
        if not os.path.isabs(entry):
            found.append(f"PYTHONPATH entry {entry!r}")
    return found


def prepare(executor: Executor, out: Path, frontend, cells) -> Executor:
    """Check, before anything is written, that the cells can run where ``executor`` sends them (:class:`UsageError`
    naming the flag and the fix otherwise); returns the executor bound to the study folder ``out``."""
    if executor.name == "local":
        return executor
    if not Path(out).is_absolute():
        raise UsageError(f"--out {out}: --executor {executor.name} needs the study folder as an absolute path on a "
                         "file system every node shares.")  # fmt: skip
    env = {**os.environ, **frontend.env}
    for cell in cells:
        data = frontend.cell_options(cell) if frontend.cell_options is not None else None
        bad = _relative_paths(frontend.cell_argv(cell, False), env, data)
        if bad:
            raise UsageError(f"--executor {executor.name}: the cells would read {bad[0]}, a relative path, and a "
                             "node starts in another directory; give it as an absolute path on the file system "
                             "every node shares.")  # fmt: skip
    if executor.name == "ray":
        _require("ray", "--executor ray")
        _check_ray(executor.ray_address, frontend, cells)
    else:
        _require("submitit", "--executor slurm")
        if not (executor.slurm.local or executor.slurm.script) and shutil.which("sbatch") is None:
            raise UsageError("--executor slurm: there is no sbatch on this machine; run the study on a SLURM login "
                             "node, or print the job script with --slurm-script, or run the array's tasks here with "
                             "--slurm-local. Nothing was written.")  # fmt: skip
    return Executor(executor.name, executor.ray_address, executor.slurm, Path(out))


def _require(module: str, flag: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{flag} needs the Python package {module}: pip install 'troll[cluster]'.")


def _check_ray(address: str | None, frontend, cells) -> None:
    """The Ray cluster answers as Ray (:func:`troll.study.on_ray.probe`; without ``--ray-address``: the cluster the
    study starts here, of this machine's cores), and one of its nodes has the cores a cell asks for: Ray would
    otherwise hold the cell, silently, until such a node joins."""
    from troll.study import on_ray

    if address is None:
        cpus, where = [float(os.cpu_count() or 1)], "the cluster the study starts on this machine"
    else:
        try:
            cpus, where = on_ray.probe(address), f"the Ray cluster at {address}"
        except on_ray.NotRay as err:
            raise UsageError(f"--ray-address {address}: {err}. Nothing was written.") from None
    need = max((int(frontend.cores(c)) for c in cells), default=1)
    most = max(cpus, default=0.0)
    if need > most:
        has = f"its largest node has {most:g}" if most else "none of its nodes has any (start worker nodes)"
        raise UsageError(f"--executor ray: a cell asks for {need} cores ({frontend.cores_from}) but {where} has no "
                         f"node that large: {has}; Ray would hold the cell until such a node joins. Lower "
                         f"{frontend.cores_from} or give the cluster larger nodes. Nothing was written.")  # fmt: skip


def array_tasks(executor: Executor, cells) -> int:
    return math.ceil(len(cells) / executor.slurm.cells_per_task)


def describe(executor: Executor, jobs: int) -> str:
    """How the cells run, for the study's first progress line."""
    if executor.name == "local":
        return f"{jobs} at a time"
    if executor.name == "ray":
        return f"on Ray ({executor.ray_address or 'a cluster started here'})"
    where = "here through submitit's local executor" if executor.slurm.local else "as a SLURM job array"
    return f"{where}, {executor.slurm.cells_per_task} cell(s) per task"


def script(executor: Executor, frontend, cells) -> str | None:
    """The sbatch script of the job array when ``--slurm-script`` asks for it (the unfinished cells'), else None."""
    if executor.name != "slurm" or not executor.slurm.script:
        return None
    from troll.study import on_slurm

    todo = [c for c in cells if not (c.folder / "summary.json").is_file()] or list(cells)
    cores = max(int(frontend.cores(c)) for c in todo)
    return on_slurm.sbatch_script(executor, array_tasks(executor, todo), cores)
