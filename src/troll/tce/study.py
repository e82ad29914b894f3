"""``troll tce study``: the episodic frontend of the study engine (:mod:`troll.study`), arms = algorithms.

What the engine needs from it (:class:`troll.study.Frontend`): a cell's command line and options (``troll tce train
--options FILE``, its config as data: :mod:`troll.study.options`; or ``--resume`` from its folder when it holds a
checkpoint), a cell's numbers, the pairs and the
curves against environment steps. Numbers of a cell, from its summary.json and metrics.jsonl (evaluations of the
mean trajectory for TCE / BBRL, of the deterministic policy for PPO, on the same episode seeds; PPO steps the Python
packages, so on EnvPool its episodes are other draws from the same distribution):

- ``success``, ``return``, ``distance``: the last evaluation, at the budget; ``best_success``, ``best_return``,
  ``best_distance``: the best evaluation of the run;
- ``success_auc``: the mean evaluated success rate over the run's evaluations, the area under the learning curve
  over the budget (sample efficiency in one number);
- ``steps_to_success``: the env steps of the first evaluation with success >= 0.8 (seeds that never got there are
  left out of its mean); ``minutes``: wall time of the run.

Pairs: TCE - BBRL and TCE - PPO per seed (same seed: the same evaluation episodes for TCE and BBRL, and the same
initial network), with 95% t-intervals. Curves: evaluated success rate, return and final distance, the rollout return,
the entropy of the Gaussian over the ProDMP parameters (TCE / BBRL) and the share of policy epochs the projection was
active (TCE / BBRL), each mean ± standard error over seeds. One option may be swept (``--sweep KEY=V1,V2``) if it
applies to every algorithm of the study. Cells run with ``OMP_NUM_THREADS`` = ``--threads`` and ``--workers``
environment processes each (default 1: ``--jobs 2`` then steps two simulators on a 2-core machine).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from troll.runs.files import TCE_STUDY, TCE_TRAIN, VIDEO_FILE
from troll.study import Cell, Curve, Frontend, Grid, Number, Pairing, Study, UsageError, runner, stats
from troll.study import grid as grid_lib
from troll.study import options as cell_options_file
from troll.tce import flags as opts

COMMAND, RUN_COMMAND = TCE_STUDY, TCE_TRAIN  # the study's command and each cell's
STUDY_WORKERS = 1  # env processes of a cell: with --jobs 2 two cells step two simulators on two cores
NOT_SWEPT = frozenset({"algo", "env", "seed", "threads", "workers", "env_options", "policy_hidden", "critic_hidden",
                       "ppo_net_arch"})  # fmt: skip


@dataclass
class StudySpec:
    """The grid of a study: env, algorithms, seeds, the budget, the options given (field -> value, TCE fields and
    ``ppo_<field>``), one optional swept option, and the runtime of each cell (workers, threads)."""

    env: str
    algos: list[str]
    seeds: list[int]
    steps: int | None = None
    options: dict = field(default_factory=dict)
    sweep_key: str | None = None
    sweep_values: list = field(default_factory=list)
    workers: int = STUDY_WORKERS
    threads: int = 1
    videos: bool = False  # each cell renders <cell>/video.mp4 when it ends (a runtime choice)

    @property
    def grid(self) -> Grid:
        return Grid(list(self.algos), list(self.seeds), self.sweep_key, list(self.sweep_values))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> StudySpec:
        # JSON gives lists; the options hold tuples (widths), as parsed from the command line
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in data.get("options", {}).items()}
        return cls(**{**data, "options": options})


def load_spec(out: Path) -> StudySpec:
    data = runner.load_spec(out)
    try:
        return StudySpec.from_json(data)
    except (TypeError, ValueError) as err:
        raise UsageError(f"--resume: {out / 'config.json'} holds a damaged study spec ({err}).") from err


def spec_from_args(args, given: dict) -> tuple[StudySpec, Path]:
    """(StudySpec, study folder) from the command line; with --resume, the saved grid, which flags may not change,
    except that --algos and --seeds may add arms and seeds to it (:func:`troll.study.grid.grows`)."""
    if args.resume:
        if not hasattr(args, "out"):
            raise UsageError("--resume needs --out, the study folder to continue.")
        saved = load_spec(Path(args.out))
        if hasattr(args, "env") and args.env != saved.env:
            raise UsageError(f"--resume: the study in {args.out} is on {saved.env}, not {args.env}; drop --env.")
        fresh = _fresh_spec(args, given, saved.env)
        grid_flags = {"--algos": ("algos",), "--seeds": ("seeds",), "--steps": ("steps",),
                      "--sweep": ("sweep_key", "sweep_values")}  # fmt: skip
        given_flags = [option for option in grid_flags if hasattr(args, option[2:])]
        grown = {n: getattr(fresh, n) for n in ("algos", "seeds")
                 if f"--{n}" in given_flags and grid_lib.grows(getattr(saved, n), getattr(fresh, n))}  # fmt: skip
        differ = [o for o in given_flags if any(n not in grown and getattr(fresh, n) != getattr(saved, n)
                                                for n in grid_flags[o])]  # fmt: skip
        differ += [opts.flag(k) for k, v in given.items() if not _same_option(k, v, saved.options)]
        if differ:
            raise UsageError(f"--resume continues the saved study; {', '.join(differ)} differ from its config.json. "
                             "Drop them (only --threads and --workers may change, and --algos and --seeds may add "
                             "to the grid, never drop), or start a new --out.")  # fmt: skip
        runtime = {k: getattr(fresh, k) for k in ("threads", "workers") if hasattr(args, k)}
        runtime["videos"] = bool(getattr(args, "videos", False))
        saved = _with_backend(saved, _started_backend(Path(args.out)))
        return dataclasses.replace(saved, **grown, **runtime), Path(args.out)
    if not hasattr(args, "env"):
        raise UsageError("--env is required to start a study, e.g. --env gym/reacher-sparse.")
    spec = _with_backend(_fresh_spec(args, given, opts.check_env(args.env)))
    return spec, Path(getattr(args, "out", "") or f"runs/tce-study-{spec.env.replace('/', '-')}")


def _same_option(name: str, value, saved: dict) -> bool:
    """Whether a flag given to ``--resume`` says what the saved study says: the same value, or for ``env_options``
    the same value of every key given (the saved ones also hold the backend the study recorded)."""
    if name == "env_options" and isinstance(value, dict) and isinstance(saved.get(name), dict):
        return all(k in saved[name] and saved[name][k] == v for k, v in value.items())
    return saved.get(name) == value


def _with_backend(spec: StudySpec, backend: str | None = None) -> StudySpec:
    """The spec with its simulator recorded (``env_options["backend"]``), so that every cell of the study, including
    those a later resume starts after the default changed, runs on one backend: the one given, else ``backend`` (a
    resumed study from before this rule: its started cells' backend), else the env's default."""
    from troll.episodic.envs.registry import default_backend, has_backends

    env_options = dict(spec.options.get("env_options", {}))
    if not has_backends(spec.env) or "backend" in env_options:
        return spec
    env_options["backend"] = backend or default_backend(spec.env)
    return dataclasses.replace(spec, options={**spec.options, "env_options": env_options})


def written_config(cell: Cell) -> dict:
    """The config.json ``troll tce train`` writes for a planned cell, as read back from JSON."""
    return json.loads(json.dumps({"command": RUN_COMMAND, "config": cell.options["config"].to_dict()}))


def check_started(cells: list[Cell], out: Path) -> None:
    """UsageError, before anything is written, when a started cell of a resumed study (its config.json written)
    would resume with other settings than the study gives it today: a folder made by an older version (for one,
    before metaworld/* cells kept the preset's env options beside a recorded backend), which ``--resume`` would
    otherwise finish or keep beside new cells, mixing two setups in one report."""
    from troll.episodic.config import RESUMABLE_FIELDS
    from troll.study.archive import differs

    stale = []
    for cell in cells:
        path = cell.folder / "config.json"
        try:
            saved = json.loads(path.read_text())
            resumed = {"command": saved.get("command"), "config": opts.resumed_config(saved["config"]).to_dict()}
        except FileNotFoundError:
            continue  # not started
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # damaged or unreadable: the cell's own --resume says so, and the cell fails alone
        why = differs(json.loads(json.dumps(resumed)), written_config(cell), frozenset(RESUMABLE_FIELDS))
        if why:
            stale.append(f"{cell.folder.relative_to(out).as_posix()} ({why.removeprefix('run with ')})")
    if stale:
        shown = "; ".join(stale[:3]) + (f"; and {len(stale) - 3} more" if len(stale) > 3 else "")
        raise UsageError(
            f"--resume: {len(stale)} started cell(s) of {out} ran with other settings than this version gives the "
            f"study: {shown}. They were made by an older version: leave the folder as it is and start the study "
            "again with a new --out (or move this one away). Nothing was changed."
        )


def _started_backend(out: Path) -> str | None:
    """The backend recorded by the first started tce / bbrl cell of a study folder, if any."""
    for config in sorted(out.glob("*/seed*/config.json")) + sorted(out.glob("*/*/seed*/config.json")):
        try:
            backend = json.loads(config.read_text())["config"]["env_options"].get("backend")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if backend:
            return backend
    return None


def _fresh_spec(args, given: dict, env: str) -> StudySpec:
    toy = env in opts.TOY_ENVS  # no PPO there (no step interface): tce and bbrl by default
    algos = ("tce", "bbrl") if toy else opts.ALGOS
    if hasattr(args, "algos"):
        algos = grid_lib.parse_arms(args.algos, opts.ALGOS, flag="--algos", noun="algorithm", example="tce,bbrl,ppo")
    for algo in algos:
        opts.check_env(env, algo)
    seeds = grid_lib.parse_seeds(args.seeds) if hasattr(args, "seeds") else [0, 1, 2]
    workers, threads = opts.int_flag(args, "workers", 0, STUDY_WORKERS), opts.int_flag(args, "threads", 1, 1)
    spec = StudySpec(env, list(algos), seeds, opts.int_flag(args, "steps", 1, None), dict(given), workers=workers,
                     threads=threads, videos=bool(getattr(args, "videos", False)))  # fmt: skip
    for name in given:
        if not any(opts.applies(name, a) for a in spec.algos):
            raise UsageError(f"{opts.flag(name)} applies to none of --algos {','.join(spec.algos)}; drop it.")
    if hasattr(args, "sweep"):
        kinds = {k: v for k, v in opts.kinds().items() if k not in NOT_SWEPT and v in (int, float, bool, str)}
        parsers = {k: _sweep_parser(k, kind) for k, kind in kinds.items()} | {"steps": _sweep_parser("steps", int)}
        spec.sweep_key, spec.sweep_values = grid_lib.parse_sweep(args.sweep, parsers)
        key = "total_env_steps" if spec.sweep_key == "steps" else spec.sweep_key
        missing = [a for a in spec.algos if not opts.applies(key, a)]
        if missing:
            raise UsageError(f"--sweep {spec.sweep_key.replace('_', '-')} does not apply to {', '.join(missing)}; "
                             "sweep an option every algorithm of --algos takes, or run those in a study of their "
                             "own.")  # fmt: skip
        if key in given or (key == "total_env_steps" and spec.steps is not None):
            raise UsageError(f"--sweep {spec.sweep_key.replace('_', '-')} and {opts.flag(key)} both set it; sweep it "
                             "or set it, not both.")  # fmt: skip
    return spec


def _sweep_parser(name: str, kind: type):
    def parse(text: str):
        return opts.parse_value(name, text, kind, f"--sweep {name.replace('_', '-')}")

    parse.__name__ = {int: "int", float: "float", bool: "bool", str: "str"}[kind]
    return parse


# ---------------------------------------------------------------------------------------------- cells


def cell_options(spec: StudySpec, value, algo: str, seed: int, folder: Path) -> dict:
    """A cell's settings (checked by building its config): algo, seed, steps, the options that apply to it, and the
    config built from them (what ``troll tce train`` writes to the cell's config.json)."""
    options = {k: v for k, v in spec.options.items() if opts.applies(k, algo)}
    steps = spec.steps
    if spec.sweep_key == "steps":
        steps = value
    elif spec.sweep_key:
        options[spec.sweep_key] = value
    config = opts.build_config(algo, spec.env, seed=seed, steps=steps, options=options, threads=spec.threads,
                               workers=spec.workers)  # fmt: skip
    return {"algo": algo, "seed": seed, "steps": steps, "options": options, "config": config}


def plan(spec: StudySpec, out: Path) -> list[Cell]:
    """Every cell of the grid, each config built and checked (nothing is written)."""
    return grid_lib.plan(spec.grid, out, lambda value, algo, seed, folder: cell_options(spec, value, algo, seed,
                                                                                         folder))  # fmt: skip


def cell_argv(cell: Cell, spec: StudySpec, *, resume: bool) -> list[str]:
    """The ``troll tce train`` command line of a cell: its config from its options file (:func:`cell_data`), or
    ``--resume`` from its folder with the study's runtime (which a resumed study may change)."""
    argv = [sys.executable, "-m", "troll.cli", "tce", "train", "--out", str(cell.folder), "--no-progress"]
    argv += ["--video"] if spec.videos else []
    if not resume:
        return argv + [cell_options_file.FLAG, str(cell.options_file)]
    runtime = ["--threads", str(spec.threads)] + (["--workers", str(spec.workers)] if cell.arm != "ppo" else [])
    return argv + ["--resume"] + runtime


def cell_data(cell: Cell) -> dict:
    """A cell's options as data (:mod:`troll.study.options`): every field of its config (the TCEConfig or
    PPOConfig ``troll tce train`` writes to the cell's config.json)."""
    return cell.options["config"].to_dict()


def cell_numbers(summary: dict, rows: list[dict]) -> dict:
    """A cell's numbers (module docstring); None where the run logged nothing to compute one from."""
    evals = [r for r in rows if r.get("eval/return") is not None]

    def series(key: str) -> list[float]:
        return [r[key] for r in evals if r.get(key) is not None]

    success, returns, distances = series("eval/success_rate"), series("eval/return"), series("eval/distance")
    seconds = summary.get("seconds")
    return {
        "success": summary.get("success_rate"),
        "success_any": summary.get("success_any"),
        "best_success": max(success, default=None),
        "success_auc": stats.mean(success),
        "return": summary.get("return"),
        "best_return": max(returns, default=None),
        "distance": summary.get("distance"),
        "best_distance": min(distances, default=None),
        "steps_to_success": summary.get("env_steps_to_success"),
        "max_height": summary.get("max_height"),
        "best_max_height": max(series("eval/max_height"), default=None),
        "env_steps": summary.get("env_steps"),
        "minutes": None if seconds is None else seconds / 60,
    }


TABLE = (
    Number("success", "success rate at the budget"),
    Number("success_any", "success at any step, at the budget"),
    Number("best_success", "best success rate"),
    Number("success_auc", "mean success over the run"),
    Number("return", "return at the budget"),
    Number("best_return", "best return"),
    Number("distance", "final distance at the budget"),
    Number("steps_to_success", "env steps to success >= 0.8"),
    Number("env_steps", "env steps"),
    Number("minutes", "minutes"),
)
# hopper jump's own measure (fancy/hopper-jump logs eval/max_height): its studies' tables add it
HEIGHT_TABLE = (Number("max_height", "max height at the budget (m)"), Number("best_max_height", "best max height (m)"))
HEIGHT_CURVE = Curve("eval/max_height", "max height of the torso (evaluation, m)")
PAIRED = (
    Number("success", "success rate at the budget"),
    Number("success_any", "success at any step, at the budget"),
    Number("success_auc", "mean success over the run"),
    Number("return", "return at the budget"),
    Number("distance", "final distance at the budget"),
)


def tce_minus_baselines(algos: list[str]) -> list[tuple[str, str]]:
    """(tce, bbrl), (tce, bbrl-cov) and (tce, ppo), for the arms the study has."""
    return [("tce", b) for b in ("bbrl", "bbrl-cov", "ppo") if "tce" in algos and b in algos]


PAIRING = Pairing(
    tce_minus_baselines,
    keys=("algo", "baseline"),
    heading="TCE minus baseline",
    column="TCE - baseline",
    none="No paired comparison: the study needs tce and a baseline (bbrl, bbrl-cov or ppo).\n",
)
CURVES = (
    Curve("eval/success_rate", "success rate (evaluation)", ylim=(-0.02, 1.02)),
    Curve("eval/return", "return (evaluation)"),
    Curve("eval/distance", "final distance (evaluation)"),
    Curve("rollout/return", "return (training episodes)"),
    Curve("policy/entropy", "entropy over the ProDMP parameters (TCE/BBRL)"),
    Curve("proj/active_epochs", "share of policy epochs projected (TCE/BBRL)"),
)


def _title(spec: StudySpec) -> str:
    seeds = f"{len(spec.seeds)} seed{'s' if len(spec.seeds) > 1 else ''}"
    budget = "preset budget" if spec.steps is None else f"{spec.steps:,} env steps"
    return f"{spec.env}, {seeds}, {budget}"


def _note(spec: StudySpec, cells: list[Cell]) -> str:
    given = ", ".join(f"{opts.flag(k)} {opts.format_value(v)}" for k, v in spec.options.items()) or "none"
    return (
        f"\nEnv {spec.env}, seeds {', '.join(map(str, spec.seeds))}; budget "
        f"{'the preset' if spec.steps is None else f'{spec.steps} env steps'}; options beyond the presets: {given}. "
        "Evaluations: the mean trajectory (TCE, BBRL) or the deterministic policy (PPO) on fixed episodes, the same "
        "at every evaluation (PPO steps the Python packages: on EnvPool its episodes are other draws). "
        "At the budget = the last evaluation; mean success over the run = the mean of the evaluated success rates "
        "(area under the learning curve over the budget); env steps to success: the first evaluation >= 0.8, over "
        "the seeds that got there. Standard errors use n - 1; the 95% interval is mean ± t(0.975, n - 1) x standard "
        "error of the per-seed differences.\n" + _videos(spec, cells)
    )


def _videos(spec: StudySpec, cells: list[Cell]) -> str:
    """Links to the cells' videos (``--videos``), relative to the study folder."""
    depth = 3 if spec.sweep_key else 2  # [<key>=<value>/]<algo>/seed<k>
    links = [
        f"[{c.arm} seed {c.seed}{'' if c.value is None else f' ({c.value})'}]"
        f"({Path(*c.folder.parts[-depth:]) / VIDEO_FILE})"
        for c in cells
        if (c.folder / VIDEO_FILE).is_file()
    ]
    shown = "the mean trajectory (TCE, BBRL) or the mean action (PPO) on the first evaluation episodes"
    return f"\nVideos ({shown}): {', '.join(links)}.\n" if links else ""


def _can_resume(cell: Cell) -> bool:
    """Whether a cell's folder holds a checkpoint of its run (TCE's and BBRL's, or PPO's) to continue from."""
    from troll.tce import ppo, run

    return bool(run.checkpoints(cell.folder) or ppo.checkpoints(cell.folder))


def frontend(spec: StudySpec) -> Frontend:
    """The engine's view of ``troll tce study``."""
    return Frontend(
        command=COMMAND,
        run_command=RUN_COMMAND,
        arm="algo",
        cell_argv=lambda cell, resume: cell_argv(cell, spec, resume=resume),
        cell_options=cell_data,
        numbers=lambda cell, summary, rows: cell_numbers(summary, rows),
        table=TABLE + (HEIGHT_TABLE if spec.env in opts.HOPPER_ENVS else ()),
        paired=PAIRED + (HEIGHT_TABLE[:1] if spec.env in opts.HOPPER_ENVS else ()),
        pairing=PAIRING,
        curves=CURVES + ((HEIGHT_CURVE,) if spec.env in opts.HOPPER_ENVS else ()),
        x_key="env_steps",
        x_label="environment steps",
        can_resume=_can_resume,
        title=lambda grid, cells: _title(spec),
        note=lambda grid, cells: _note(spec, cells),
        env={"OMP_NUM_THREADS": str(spec.threads)},
        cores=lambda cell: spec.threads + (spec.workers if cell.arm != "ppo" else 0),
        cores_from="--threads + --workers",
    )


def run(out: Path, spec: StudySpec, cells: list[Cell], *, clear: bool, jobs: int, report,
        executor=None) -> dict[str, str]:  # fmt: skip
    """Write config.json, run the cells (``executor``: where, :mod:`troll.study.executors`), then study.json /
    study.md / study.png; returns each cell's status."""
    return runner.run_study(Study(out, frontend(spec), spec.grid, spec.to_json(), cells), clear=clear, jobs=jobs,
                            report=report, executor=executor)  # fmt: skip
