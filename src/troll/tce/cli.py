"""``troll tce train``, ``study``, ``render`` and ``status``: TCE, BBRL and stable-baselines3's PPO on the episodic
tasks.

The provider of ``troll tce`` (see :mod:`troll.cli`): :func:`add_commands` builds the parsers from the flag tables of
:mod:`troll.tce.flags` and imports neither torch nor a simulator; the handlers import what a run needs. Every
input is checked before anything runs or is written (exit status 2 and a message that names the flag and the fix);
a run that fails once started (a non-finite value from an environment, a crashed environment worker) stops with its
error and exit status 1, and ``--resume`` continues it from its last checkpoint. docs/tce.md, "How to run".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from troll import runs
from troll.runs import protocol
from troll.runs.files import CONFIG_FILE, TCE_STUDY, TCE_TRAIN, VIDEO_FILE, UsageError, read_config
from troll.study import executors
from troll.tce import flags as opts

TRAIN_DOC = (
    "One run of TCE, BBRL (same code, one advantage per episode) or stable-baselines3's PPO on an episodic task. "
    "Writes into the run folder config.json, metrics.jsonl (a line per iteration, with env_steps), a checkpoint, "
    "and at the end summary.json and plots.png (success / return, entropy and the projection against env steps). "
    "Every option left out takes the env family's preset (docs/tce.md)."
)
STUDY_DOC = (
    "Runs every algorithm of --algos for every seed of --seeds (and every value of --sweep) as 'troll tce train' "
    "would, into <out>/[<key>=<value>/]<algo>/seed<k>/, --jobs at a time, then writes study.json, study.md (mean "
    "and standard error over seeds of the success rate, return and final distance at the budget and their best, "
    "paired TCE - baseline differences (bbrl, bbrl-cov, ppo) with 95% intervals) and study.png (curves against env "
    "steps with standard-error bands). --resume continues an interrupted study without rerunning finished cells, "
    "and more --algos or --seeds add to its grid."
)

RENDER_DOC = (
    "Renders a run's newest checkpoint on its first evaluation episodes (TCE / BBRL: the mean trajectory, PPO: the "
    "mean action at every step, no sampling; the episodes every evaluation of the run uses) with MuJoCo's offscreen "
    "renderer (EGL, or MUJOCO_GL=osmesa), and writes a GIF or an MP4. gym/* and metaworld/* are drawn on their "
    "Python simulators (EnvPool has no renderer)."
)
STATUS_DOC = (
    "Reads every 'troll tce study' at or below FOLDER, while it runs or after it stopped, and prints a line per cell: "
    "finished, running, failed, stopped (resumes from its checkpoint), not started or unreadable; its env steps of "
    "its budget, its run time and its last evaluation. Then per study the env steps run and an estimate of the time "
    "left. Writes nothing. Exit status 1 when a study cannot be read (it gets a line saying why), 2 when FOLDER "
    "holds no study."
)


def add_commands(sub) -> None:
    """Register ``tce train``, ``study``, ``render`` and ``status`` (the provider hook of :mod:`troll.cli`)."""
    tce = sub.add_parser("tce", help="episodic RL: TCE, BBRL and PPO on ProDMP tasks (docs/tce.md)")
    tce_sub = tce.add_subparsers(dest="tce_command", required=True, metavar="{train,study,render,status}")
    train = tce_sub.add_parser("train", help="one run", description=TRAIN_DOC)
    train.add_argument("--env", default=argparse.SUPPRESS, help="toy/viapoint[-sparse], gym/reacher[-sparse], "
                       "metaworld/<task>-v3, fancy/box-pushing-{dense,sparse}, fancy/hopper-jump, or your own: "
                       "module:function or an entry point's name (needed unless --resume)")  # fmt: skip
    train.add_argument(
        "--algo",
        default=argparse.SUPPRESS,
        help="tce, bbrl (diagonal covariance), bbrl-cov (full) or ppo (default: tce)",
    )
    train.add_argument("--seed", default=argparse.SUPPRESS, help="seed of everything random (default: 0)")
    train.add_argument("--out", default=argparse.SUPPRESS,
                       help="run folder (default: runs/tce-<env>-<algo>-seed<seed>, '/' made '-')")  # fmt: skip
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    train.add_argument("--overwrite", action="store_true", help="replace the run in --out (only a folder of this "
                       "command holding nothing else is deleted)")  # fmt: skip
    train.add_argument("--video", action="store_true", help=f"at the end, render the evaluation episodes into "
                       f"<out>/{VIDEO_FILE} (MuJoCo tasks; see 'troll tce render')")  # fmt: skip
    train.add_argument("--options", default=argparse.SUPPRESS, metavar="FILE", help="the run's config as a JSON "
                       "object of its fields instead of flags (a study writes one for each cell)")  # fmt: skip
    _add_run_flags(train)
    train.set_defaults(run=cmd_train, name=TCE_TRAIN)

    study = tce_sub.add_parser("study", help="algorithms x seeds (x one swept option), with statistics",
                               description=STUDY_DOC)  # fmt: skip
    study.add_argument("--env", default=argparse.SUPPRESS, help="the task (required unless --resume)")
    study.add_argument(
        "--algos",
        default=argparse.SUPPRESS,
        help="comma-separated algorithms, each once (default: tce,bbrl,bbrl-cov,ppo; tce,bbrl on the toy task)",
    )
    study.add_argument("--seeds", default=argparse.SUPPRESS, help="a count (3: seeds 0,1,2) or a list (default: 3)")
    study.add_argument("--sweep", default=argparse.SUPPRESS, help="one option and its values, KEY=V1,V2 with KEY in "
                       "flag form, e.g. mean-bound=0.005,0.05 or ppo-learning-rate=1e-4,3e-4; it must apply to every "
                       "algorithm of --algos")  # fmt: skip
    study.add_argument("--jobs", default="1", help="cells run at once, each a subprocess (default: 1)")
    study.add_argument("--out", default=argparse.SUPPRESS, help="study folder (default: runs/tce-study-<env>)")
    study.add_argument(
        "--resume", action="store_true", help="continue the study in --out (--algos and --seeds may add to its grid)"
    )
    study.add_argument("--overwrite", action="store_true", help="replace the study in --out")
    study.add_argument("--videos", action="store_true", help=f"each cell renders its evaluation episodes into "
                       f"<cell>/{VIDEO_FILE} when it ends, and study.md links them")  # fmt: skip
    _add_run_flags(study, study=True)
    executors.add_flags(study)
    study.set_defaults(run=cmd_study, name=TCE_STUDY)

    _add_viewers(tce_sub)


def _add_viewers(tce_sub) -> None:
    """``tce render`` and ``tce status``: commands that read runs and studies (and write only a video)."""
    render = tce_sub.add_parser("render", help="a video of a run's policy", description=RENDER_DOC)
    render.add_argument("run_folder", metavar="RUN", help="a run folder of 'troll tce train' (TCE, BBRL or PPO)")
    render.add_argument("--out", default=None, help=f"the video, .gif or .mp4 (default: RUN/{VIDEO_FILE}, the run's "
                        "own video, which a new rendering replaces)")  # fmt: skip
    render.add_argument("--overwrite", action="store_true", help="replace --out when it exists")
    render.add_argument("--episodes", default="3", help="evaluation episodes shown one after the other (default: 3)")
    render.add_argument("--width", default="320", help="pixels (default: 320)")
    render.add_argument("--height", default="240", help="pixels (default: 240)")
    render.add_argument("--fps", default="30", help="frames per second of simulated time, played in real time "
                        "(default: 30)")  # fmt: skip
    render.set_defaults(run=cmd_render, name="tce render")

    status = tce_sub.add_parser("status", help="where the studies below a folder stand", description=STATUS_DOC)
    status.add_argument("folder", metavar="FOLDER", help="a study's --out, or a folder holding studies")
    status.set_defaults(run=cmd_status, name="tce status")


def _add_run_flags(p: argparse.ArgumentParser, *, study: bool = False) -> None:
    """The budget, runtime, TCE and PPO flags; defaults SUPPRESSed so that a handler sees what was given."""
    p.add_argument("--steps", default=argparse.SUPPRESS, help="total env steps of a run (default: the preset's: "
                   "toy 896k, Reacher 400k, Meta-World 2M, hopper jump and box pushing 10M)")  # fmt: skip
    workers = "1 in a study: --jobs 2 then steps two simulators on two cores" if study else "2"
    p.add_argument(
        "--workers",
        default=argparse.SUPPRESS,
        help=f"environment worker processes of a tce / bbrl run, 0: in-process (default: {workers})",
    )
    p.add_argument("--threads", default=argparse.SUPPRESS, help="torch threads of a run (default: 1)")
    p.add_argument("--backend", default=argparse.SUPPRESS, choices=("envpool", "python"),
                   help="simulator of gym/* and metaworld/*: envpool (EnvPool's C++ port; --workers sets its "
                   "threads) or python (gymnasium / the metaworld package in --workers processes); the default "
                   "depends on the env (docs/tce.md, 'Backends'); the env option 'backend'")  # fmt: skip
    if not study:
        p.add_argument("--no-progress", action="store_true", help="no progress bar: a line per evaluation instead")
    group = p.add_argument_group("TCE and BBRL (default: the env family's preset; docs/tce.md, 'Config and presets')")
    for name, metavar, text in opts.TCE_FLAGS:
        group.add_argument(opts.flag(name), default=argparse.SUPPRESS, metavar=metavar, help=text)
    group = p.add_argument_group("PPO (stable-baselines3's defaults)")
    for name, metavar, text in opts.PPO_FLAGS:
        group.add_argument(opts.flag(f"ppo_{name}"), default=argparse.SUPPRESS, metavar=metavar, help=text)


# ---------------------------------------------------------------------------------------------- shared


def given_options(args: argparse.Namespace) -> dict:
    """Field -> parsed value of every TCE / PPO option on the command line (``ppo_<field>`` for PPO's)."""
    kinds = opts.kinds()
    names = [name for name, _, _ in opts.TCE_FLAGS] + [f"ppo_{name}" for name, _, _ in opts.PPO_FLAGS]
    given = {n: opts.parse_value(n, getattr(args, n), kinds[n]) for n in names if hasattr(args, n)}
    if hasattr(args, "backend"):  # --backend B is the env option {"backend": B}
        given["env_options"] = {**given.get("env_options", {}), "backend": args.backend}
    return given


def safe(env: str) -> str:
    """An env name as one folder-name component: ``metaworld/reach-v3`` -> ``metaworld-reach-v3``."""
    return env.replace("/", "-").replace("\\", "-")


def saved_run(out: Path) -> dict | None:
    """The config dict of the run of this command in ``out`` to continue; None when there is none to continue (a
    missing or empty folder, or one a start was killed in before its config.json was whole). UsageError when
    the folder cannot be resumed (:func:`troll.runs.check_folder`)."""
    if runs.check_folder(out, TCE_TRAIN, resume=True, overwrite=False) == "new":
        return None
    data = read_config(out)
    if not (isinstance(data, dict) and data.get("command") == TCE_TRAIN and isinstance(data.get("config"), dict)):
        raise UsageError(f"--resume: {out / CONFIG_FILE} holds no config of 'troll {TCE_TRAIN}'; choose another --out.")
    return data["config"]


# ---------------------------------------------------------------------------------------------- train


def train_config(args: argparse.Namespace, saved: dict | None):
    """The run's config: from the flags and the preset, or from ``--options FILE``, or (resuming) the folder's,
    which given flags must match."""
    if hasattr(args, "options"):
        return _file_config(args)
    given = given_options(args)
    threads = opts.int_flag(args, "threads", 1)
    workers = opts.int_flag(args, "workers", 0)
    seed = opts.int_flag(args, "seed", 0)
    steps = opts.int_flag(args, "steps", 1)
    if saved is None:
        algo = opts.check_algo(getattr(args, "algo", "tce"))
        if not hasattr(args, "env"):
            raise UsageError("--env is required to start a run, e.g. --env toy/viapoint or --env metaworld/reach-v3.")
        env = opts.check_env(args.env, algo)
        return opts.build_config(algo, env, seed=seed or 0, steps=steps, options=given, threads=threads or 1,
                                 workers=2 if workers is None else workers)  # fmt: skip
    return _resumed_config(args, saved, given, seed, steps, threads, workers)


def _file_config(args: argparse.Namespace):
    """``--options FILE``: every setting of the run from the file (:func:`troll.tce.flags.config_from_file`), which
    no setting's flag may join (nor ``--resume``: :func:`cmd_train`)."""
    names = ["env", "algo", "seed", "steps", "threads", "workers", "backend"]
    names += [name for name, _, _ in opts.TCE_FLAGS] + [f"ppo_{name}" for name, _, _ in opts.PPO_FLAGS]
    given = [opts.flag(name) for name in names if hasattr(args, name)]
    if given:
        raise UsageError(f"--options {args.options} gives every setting of the run; drop {', '.join(given)} (or "
                         "drop --options and give them as flags).")  # fmt: skip
    return opts.config_from_file(Path(args.options))


def _resumed_config(args, saved: dict, given: dict, seed, steps, threads, workers):
    algo = saved.get("algo")
    if algo == "ppo":
        opts.check_algo(algo)
    try:
        config = opts.resumed_config(saved)
    except ValueError as err:
        raise UsageError(f"--resume: the folder's {CONFIG_FILE} cannot be read by this version: {err}") from None
    import dataclasses

    if "env_options" in given and algo != "ppo":  # the run's env options, as given ones complete them
        given = {**given, "env_options": {**config.env_options, **given["env_options"]}}
    wanted = {"algo": getattr(args, "algo", None), "env": getattr(args, "env", None), "seed": seed,
              "total_env_steps": steps, **given}  # fmt: skip
    differ = []
    if algo == "ppo" and ("eval_every" in given or "episodes" in given):
        # a PPO run keeps eval_every x episodes x T (env steps between evaluations), not the two flags
        two = {k: wanted.pop(k) for k in ("eval_every", "episodes") if k in wanted}
        every = opts.build_config("ppo", config.env, seed=config.seed, steps=None, options=two, threads=1,
                                  workers=0).eval_every_steps  # fmt: skip
        if every != config.eval_every_steps:
            shown = " ".join(f"{opts.flag(k)} {v}" for k, v in two.items())
            differ.append(f"{shown} (evaluations every {every} env steps; the run has {config.eval_every_steps})")
    flags = {(name[4:] if algo == "ppo" and name.startswith("ppo_") else name): name for name in wanted}
    given_fields = {attr: wanted[name] for attr, name in flags.items() if wanted[name] is not None}
    for attr, (have, value) in protocol.differences(config, given_fields).items():
        have = f"the run has {have!r}" if have is not protocol.MISSING else f"not a setting of a {algo} run"
        differ.append(f"{opts.flag(flags[attr])} {opts.format_value(value)} ({have})")
    if differ:
        raise UsageError(f"--resume continues the run with its own settings, and {'; '.join(differ)} differ; drop "
                         "them (only --threads and --workers may change), or start a new --out.")  # fmt: skip
    runtime = {"threads": threads} if threads is not None else {}
    if workers is not None and algo != "ppo":
        runtime["workers"] = workers
    return dataclasses.replace(config, **runtime)


def cmd_train(args: argparse.Namespace) -> int:
    runs.exclusive(resume=args.resume, overwrite=args.overwrite)
    if args.resume and hasattr(args, "options"):
        raise UsageError("--resume continues with the settings in the folder's config.json; drop --options.")
    if not hasattr(args, "out") and args.resume:
        raise UsageError("--resume needs --out, the run folder to continue.")
    out = Path(args.out) if hasattr(args, "out") else None
    if out is not None and not args.out.strip():  # Path("") is "."
        raise UsageError("--out is empty; give a folder path, or leave --out out for the default folder.")
    if out is None:
        return _train_command(args, out)
    with runs.holding(out):  # from the first look on: no other process changes it between the checks and the run
        return _train_command(args, out)


def _train_command(args: argparse.Namespace, out: Path | None) -> int:
    saved = saved_run(out) if out is not None and args.resume else None
    if args.resume and saved is None and not hasattr(args, "env"):
        raise UsageError(f"--resume: --out {out} holds no run to resume; start one without --resume, with --env "
                         "(e.g. --env toy/viapoint).")  # fmt: skip
    config = train_config(args, saved)
    out = out or Path("runs") / f"tce-{safe(config.env)}-{config.algo}-seed{config.seed}"
    if config.algo == "ppo":
        from troll.tce.ppo import require_sb3

        require_sb3()
    if args.video:  # checked before the folder is touched, and before any simulator imports mujoco (its GL backend)
        from troll.tce.render import RenderError

        try:
            _check_videos(config.env, "--video")
        except RenderError as err:
            print(f"troll tce train: error: --video: {err}", file=sys.stderr)
            return 1
    action = runs.check_folder(out, TCE_TRAIN, resume=args.resume, overwrite=args.overwrite)
    if action == "replace":
        runs.clear(out, TCE_TRAIN)
    return _run(config, out, resume=args.resume, progress=not args.no_progress, video=args.video)


def _run(config, out: Path, *, resume: bool, progress: bool, video: bool = False) -> int:
    """Run ``config`` into ``out``; a failure after the start is reported with the way to resume (exit 1)."""
    from troll.episodic.envs import EnvWorkerError, NonFiniteError

    def line(row: dict) -> None:
        if row.get("eval/return") is not None:
            keys = ("eval/success_rate", "eval/return", "eval/distance", "eval/max_height")
            shown = ", ".join(f"{k[5:]} {row[k]:.4g}" for k in keys if row.get(k) is not None)
            print(f"{row['env_steps']} env steps: eval {shown}", flush=True)

    hook = None if progress else line
    try:
        if config.algo == "ppo":
            from troll.tce import ppo

            summary = ppo.train(config, out, resume=resume, progress=progress, on_row=hook)
        else:
            from troll.tce.run import train

            summary = train(config, out, resume=resume, progress=progress, on_iteration=hook)
    except (NonFiniteError, EnvWorkerError, FloatingPointError) as err:
        print(f"troll tce train: error: {err}", file=sys.stderr)
        print(f"the run stopped; {out} keeps the iterations up to its last checkpoint: continue with "
              f"troll tce train --out {out} --resume", file=sys.stderr)  # fmt: skip
        return 1
    except KeyboardInterrupt:
        print(f"interrupted; continue with: troll tce train --out {out} --resume", file=sys.stderr)
        return 130
    except protocol.Stopped as stopped:  # SIGTERM / SIGUSR1: a checkpoint of the last whole iteration
        print(f"troll tce train: {stopped}; continue with: troll tce train --out {out} --resume", file=sys.stderr)
        return stopped.exit_code
    keys = ("algo", "env", "seed", "env_steps", "success_rate", "return", "distance", "best_success_rate", "seconds")
    print(json.dumps({k: summary.get(k) for k in keys}))
    print(f"run folder: {out}")
    if video and not (out / VIDEO_FILE).is_file():
        return _render(out, None, episodes=3, width=320, height=240, fps=30)
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    names = ("episodes", "width", "height", "fps")
    sizes = {name: opts.parse_value(name, getattr(args, name), int, f"--{name}") for name in names}
    path = None if args.out is None else Path(args.out)
    return _render(Path(args.run_folder), path, overwrite=args.overwrite, **sizes)


def _render(out: Path, path: Path | None, *, overwrite: bool = False, **sizes) -> int:
    """Render a run's video (troll.tce.render); a machine without offscreen OpenGL gets exit status 1."""
    from troll.tce.render import RenderError, render_run

    try:
        done = render_run(out, path=path, overwrite=overwrite, **sizes)
    except RenderError as err:
        print(f"troll tce render: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {done['path']}: {done['episodes']} evaluation episode(s), {done['frames']} frames at "
          f"{done['fps']:g} fps")  # fmt: skip
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print where the studies stand; exit status 1 when one of them could not be read."""
    from troll.study.status import show
    from troll.tce.status import status_text

    return show(*status_text(Path(args.folder)))


# ---------------------------------------------------------------------------------------------- study


def _check_videos(env: str, option: str, *, here: bool = True) -> None:
    """Before anything is written, when the runs of ``env`` cannot render a video: UsageError for the toy task (no
    scene); RenderError (naming the packages) when they render ``here`` (not on a cluster's nodes) on a machine
    without offscreen OpenGL."""
    if env in opts.TOY_ENVS:
        raise UsageError(f"{option} renders MuJoCo tasks; {env} is torch code with no scene: drop it.")
    if here:
        from troll.tce.render import check_gl

        check_gl()


def cmd_study(args: argparse.Namespace) -> int:
    from troll.study import check_folder
    from troll.study.command import cmd_study
    from troll.tce import study

    runs.exclusive(resume=args.resume, overwrite=args.overwrite)
    jobs = opts.int_flag(args, "jobs", 1)
    executor = executors.from_args(args)
    spec, out = study.spec_from_args(args, given_options(args))
    out = executors.resolve_out(executor, out)
    cells = study.plan(spec, out)
    if args.resume:
        study.check_started(cells, out)
    if "ppo" in spec.algos:
        from troll.tce.ppo import require_sb3

        require_sb3()
    clear = check_folder(out, command=study.COMMAND, overwrite=args.overwrite, resume=args.resume)
    if spec.videos:  # refused before anything is written; GL is checked where the cells render (here, if local)
        from troll.tce.render import RenderError

        try:
            _check_videos(spec.env, "--videos", here=executor.name == "local")
        except RenderError as err:
            raise UsageError(f"--videos: {err}") from None
    engine = study.frontend(spec)
    executor = executors.prepare(executor, out, engine, cells)
    script = executors.script(executor, engine, cells)
    if script is not None:
        print(script)
        return 0
    return cmd_study(TCE_STUDY, out, len(cells), jobs, lambda report: study.run(out, spec, cells, clear=clear,
                     jobs=jobs, report=report, executor=executor), executor=executor)  # fmt: skip
