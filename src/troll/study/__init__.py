"""The study engine: a grid of arms x seeds (x one swept option) run as subprocesses, with its statistics.

It knows nothing of language models or agents: ``troll study`` (:mod:`troll.lm.study`, arms are losses) and an
episodic agent's ``troll tce study`` (arms are algorithms) are *frontends*, each a :class:`Frontend` saying how a
cell is run and what its numbers and curves are. The engine plans the cells and their folders, checks the study
folder (never overwriting results: ``--resume`` or ``--overwrite``), runs the cells ``jobs`` at a time (a failed
cell is reported without stopping the others; a resumed study reruns only unfinished cells), and writes study.json,
study.md (mean ± standard error over seeds, paired differences with 95% t-intervals) and study.png.

Modules, lowest first: ``stats``, ``grid`` (parsing and planning), ``frontend`` (the interface), ``report`` and
``plot``, ``lease`` and ``cell`` (a cell's owner across machines and its entry point), ``runner``, ``executors``
(``--executor local|ray|slurm``, with ``on_ray`` and ``on_slurm``, docs/cluster.md), ``command`` (the study command
both applications share); the folders' files and rules (atomic JSON, whole-line JSONL, manifests,
:class:`UsageError`) are the shared run layer's, :mod:`troll.runs`. This package imports nothing above the core
(never :mod:`troll.lm`, :mod:`troll.cli` or :mod:`troll.episodic`), nor torch, matplotlib, ray or submitit at import
time.

A frontend in a few lines (see :mod:`troll.study.frontend` for every field)::

    grid = Grid(arms=parse_arms(args.algos, ALGOS, flag="--algos", noun="algorithm", example="tce,bbrl"),
                seeds=parse_seeds(args.seeds))
    cells = plan(grid, out, lambda value, arm, seed, folder: {"algo": arm, "seed": seed})
    clear = check_folder(out, command=FRONTEND.command, overwrite=args.overwrite, resume=args.resume)
    status = run_study(Study(out, FRONTEND, grid, {"algos": grid.arms, "seeds": grid.seeds}, cells),
                       clear=clear, jobs=args.jobs, report=print)
"""

from troll.runs.files import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, UsageError
from troll.study.frontend import Curve, Frontend, Number, Pairing, Study, against
from troll.study.grid import Cell, Grid, grows, parse_arms, parse_seeds, parse_sweep, plan
from troll.study.report import JSON_FILE, PLOT_FILE, TABLE_FILE
from troll.study.runner import check_folder, load_spec, run_study

__all__ = [
    "CONFIG_FILE",
    "JSON_FILE",
    "METRICS_FILE",
    "PLOT_FILE",
    "SUMMARY_FILE",
    "TABLE_FILE",
    "Cell",
    "Curve",
    "Frontend",
    "Grid",
    "Number",
    "Pairing",
    "Study",
    "UsageError",
    "against",
    "check_folder",
    "grows",
    "load_spec",
    "parse_arms",
    "parse_seeds",
    "parse_sweep",
    "plan",
    "run_study",
]
