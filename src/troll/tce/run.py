"""``train``: one TCE or BBRL run into a run folder, resumable (docs/tce.md, "How to run").

    from troll.episodic.config import TCEConfig
    from troll.tce.run import train
    summary = train(TCEConfig.preset("toy/viapoint"), Path("runs/toy"))
    summary = train(None, Path("runs/toy"), resume=True)        # continue it (the folder's own config)

The run folder:

    config.json        {"command": "tce train", "config": {...TCEConfig...}}, written before the first iteration
    metrics.jsonl      one line per iteration: iteration, env_steps, rollout/*, critic/*, proj/*, loss/*, ratio/*,
                       adv/*, policy/*, time/* and, every ``eval_every`` iterations and after the last, eval/*
    checkpoint-<i>.pt  the agent after iteration i (networks, normalisers, Adam, RNG) and the number of metrics lines
                       it belongs to; one is kept, written atomically (temporary file, then os.replace)
    summary.json       written last, once the run has finished (report.summarise)
    plots.png          success / return, entropy and the projection against env steps

Resume: the newest checkpoint is loaded and metrics.jsonl cut back to the lines it belongs to, so no iteration is
lost or logged twice; the iterations after it run again and, as everything random is drawn from the run's seed
(env resets from (seed, iteration), sampling from the checkpointed generator), give the same numbers on the CPU.
A folder that holds anything but a run of this command is refused before anything is written, as is a finished or
unfinished run without ``resume``, or a resume with a config that differs from the folder's (``threads`` and
``workers`` may change). The library prints nothing; the progress bar (tqdm, stderr) can be turned off.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from troll import runs
from troll._threads import threads
from troll.episodic.agent import EVAL_STREAM, TCEAgent, reset_seed
from troll.episodic.config import RUNTIME_FIELDS, TCEConfig, check_critic_batches
from troll.episodic.envs import make_env
from troll.runs import numbered_files, protocol
from troll.runs.files import (
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    UsageError,
    append_jsonl,
    check_out_path,
    read_jsonl,
    write_json,
)
from troll.tce.report import plot_run, summarise

COMMAND = "tce train"
CHECKPOINT = "checkpoint-{}.pt"
PLOT_FILE = "plots.png"


def train(
    config: TCEConfig | None,
    out: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    plot: bool = True,
    on_iteration: Callable[[dict], None] | None = None,
) -> dict:
    """Run ``config`` into the folder ``out``; returns the summary (summary.json's content).

    config:       the run's settings; with ``resume`` it may be None (the folder's config.json is used).
    resume:       continue the run in ``out`` from its last checkpoint (a finished run returns its summary; an
                  empty or missing folder starts a new run).
    progress:     show a tqdm bar on stderr.
    plot:         draw plots.png at the end (matplotlib; skipped when it is not installed).
    on_iteration: called with each iteration's metrics row after it is logged (e.g. a command line's report).
    Raises :class:`troll.study.UsageError` (a ValueError) for a folder or config that cannot be used, before
    anything is written; :class:`troll.runs.protocol.Stopped` after a checkpoint when SIGTERM or SIGUSR1 came during
    an iteration but the last (their handlers are this function's while it iterates, in the main thread).
    """
    out = Path(out)
    return protocol.run(
        out,
        lambda: _prepare(config, out, resume=resume),
        lambda cfg: _train(cfg, out, progress=progress, plot=plot, on_iteration=on_iteration),
    )


def _train(config: TCEConfig, out: Path, *, progress: bool, plot: bool, on_iteration) -> dict:
    with threads(config.threads):
        with contextlib.ExitStack() as stack:
            try:  # what refuses the settings (env options, sizes, a missing simulator) does so before any write
                env = stack.enter_context(_make_env(config, config.episodes))
                eval_env = env
                if config.eval_episodes != config.episodes:
                    eval_env = stack.enter_context(_make_env(config, config.eval_episodes))
                iterations = math.ceil(config.total_env_steps / (config.episodes * env.horizon))
                check_critic_batches(config, env.horizon)
                agent = TCEAgent.for_env(config, env, total_iterations=iterations)
            except (ValueError, ImportError) as err:
                raise UsageError(str(err)) from err
            start = _restore(agent, config, out)
            _loop(agent, env, eval_env, out, start, iterations, progress, on_iteration)
    rows = read_jsonl(out / METRICS_FILE)
    summary = summarise(rows, config.to_dict(), iterations=iterations)
    if plot:
        plot_run(
            rows,
            out / PLOT_FILE,
            title=f"{config.algo.upper()} on {config.env} (seed {config.seed})",
            mean_bound=config.mean_bound,
            cov_bound=config.cov_bound,
        )
    write_json(out / SUMMARY_FILE, summary)
    return summary


# ---------------------------------------------------------------------------------------------- folder


def _prepare(config: TCEConfig | None, out: Path, *, resume: bool) -> tuple[TCEConfig, bool]:
    """Check ``out`` and the config before anything is written; returns (config to run, finished already)."""
    check_out_path(out, "run folder")
    if config is not None and not isinstance(config, TCEConfig):
        raise UsageError(f"config must be a TCEConfig (or None with resume=True), got {type(config).__name__}.")
    return protocol.prepare(
        config, out, command=COMMAND, resume=resume, saved=saved_config, kind="TCE", runtime=RUNTIME_FIELDS
    )


def saved_config(out: Path) -> TCEConfig | None:
    """The TCEConfig of the run folder ``out``, or None when it holds no run of this command."""
    data = protocol.saved_config(out, COMMAND)
    if data is None:
        return None
    try:
        return TCEConfig.from_dict(data)
    except ValueError as err:
        raise UsageError(f"{out / CONFIG_FILE} holds a TCE config this version cannot read: {err}") from err


def _make_env(config: TCEConfig, episodes: int):
    return make_env(config.env, num_episodes=episodes, workers=config.workers, seed=config.seed, **config.env_options)


def checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(iteration, path) of the folder's checkpoint files, by iteration."""
    return numbered_files(out, CHECKPOINT)


def _restore(agent: TCEAgent, config: TCEConfig, out: Path) -> int:
    """Load the newest checkpoint (cutting metrics.jsonl back to it) and return the next iteration; or start the
    folder (config.json, an empty metrics.jsonl) and return 0."""
    runs.begin(out, COMMAND)  # the manifest first; stale temporary files of a killed process go
    found = checkpoints(out)
    if found:
        state = torch.load(found[-1][1], weights_only=True)
        try:
            agent.load_state_dict(state["agent"])
        except (RuntimeError, KeyError) as err:  # e.g. a size mismatch: the env or the config changed under it
            raise UsageError(
                f"--resume: {found[-1][1]} does not fit the policy and critic this config builds for {config.env} "
                f"({str(err).splitlines()[0][:300]}); start a new folder."
            ) from err
        protocol.resume_metrics(out, state["metrics_lines"])
        return int(state["iteration"])
    protocol.start(out, COMMAND, config.to_dict())
    return 0


def save_checkpoint(out: Path, agent: TCEAgent, iteration: int) -> Path:
    """checkpoint-<iteration>.pt, whole (:func:`troll.runs.protocol.save_checkpoint`: one is kept): the agent and
    the number of metrics lines it belongs to."""
    state = {"iteration": iteration, "metrics_lines": iteration, "agent": agent.state_dict()}
    return protocol.save_checkpoint(out, CHECKPOINT, iteration, lambda f: torch.save(state, f))


# ---------------------------------------------------------------------------------------------- loop


def _clean(row: dict) -> dict:
    """JSON-safe: non-finite floats become None (strict JSON has no NaN)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _loop(agent, env, eval_env, out: Path, start: int, iterations: int, progress: bool, on_iteration) -> None:
    """Iterations ``start`` to ``iterations``. A stop request (SIGTERM, SIGUSR1: :func:`troll.runs.protocol.
    stop_requests`) ends them after the iteration it came in, with a checkpoint of that iteration
    (:class:`troll.runs.protocol.Stopped`)."""
    from tqdm.auto import tqdm

    cfg = agent.config
    steps_per_iteration = cfg.episodes * env.horizon
    bar = tqdm(
        total=iterations, initial=start, desc=f"{cfg.algo} {cfg.env}", unit="it", file=sys.stderr, disable=not progress
    )
    with protocol.stop_requests() as stop:
        try:
            for it in range(start, iterations):
                t0 = time.perf_counter()
                batch = agent.rollout(env, reset_seed(cfg.seed, it))
                t1 = time.perf_counter()
                row = {"iteration": it + 1, "env_steps": (it + 1) * steps_per_iteration}
                row |= agent.update(batch)
                row["time/rollout"] = t1 - t0
                if (it + 1) % cfg.eval_every == 0 or it + 1 == iterations:
                    t2 = time.perf_counter()
                    row |= agent.evaluate(eval_env, reset_seed(cfg.seed, EVAL_STREAM))
                    row["time/eval"] = time.perf_counter() - t2
                row["time/iteration"] = time.perf_counter() - t0
                row = _clean(row)
                append_jsonl(out / METRICS_FILE, row)
                if on_iteration is not None:
                    on_iteration(row)
                if (it + 1) % cfg.checkpoint_every == 0 or it + 1 == iterations or stop.signal is not None:
                    path = save_checkpoint(out, agent, it + 1)
                    if stop.signal is not None and it + 1 < iterations:  # the last iteration just ends the run
                        raise protocol.Stopped(stop.signal, it + 1, path)
                bar.update(1)
                shown = {k: row[k] for k in ("eval/success_rate", "rollout/return") if row.get(k) is not None}
                bar.set_postfix({k.split("/")[-1]: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
        finally:
            bar.close()
