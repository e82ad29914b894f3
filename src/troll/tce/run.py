"""``train``: one TCE or BBRL run into a run folder, resumable (docs/tce.md, "How to run"): the algorithm object
(:class:`troll.episodic.TCE` / ``BBRL``) learning, with this command's folder around it.

    from troll.episodic.config import TCEConfig
    from troll.tce.run import train
    summary = train(TCEConfig.preset("toy/viapoint"), Path("runs/toy"))
    summary = train(None, Path("runs/toy"), resume=True)        # continue it (the folder's own config)

The run folder:

    config.json        {"command": "tce train", "config": {...TCEConfig...}}, written before the first iteration
    metrics.jsonl      one line per iteration: iteration, env_steps, rollout/*, critic/*, proj/*, loss/*, ratio/*,
                       adv/*, policy/*, time/* and, every ``eval_every`` iterations and after the last, eval/*
    checkpoint-<i>.pt  what TCE.save writes (config, weights, normalisers, Adam, RNG) after iteration i, and the number
                       of metrics lines it belongs to; one is kept, written atomically (temporary file, then
                       os.replace); TCE.load(folder) reads it
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

from collections.abc import Callable
from pathlib import Path

import torch

from troll import runs
from troll._threads import threads
from troll.episodic.algorithm import TCE, read_state
from troll.episodic.config import RESUMABLE_FIELDS, TCEConfig
from troll.runs import numbered_files, protocol
from troll.runs.files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    PLOTS_FILE,
    SUMMARY_FILE,
    TCE_TRAIN,
    UsageError,
    append_jsonl,
    check_out_path,
    read_jsonl,
    write_json,
)
from troll.tce.report import plot_run, summarise


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
        try:  # what refuses the settings (env options, sizes, a missing simulator) does so before any write
            model = TCE.from_config(config)
        except (ValueError, ImportError) as err:
            raise UsageError(str(err)) from err
        with model:
            _restore(model, config, out)
            _learn(model, out, progress, on_iteration)
            iterations = model.iterations()
    rows = read_jsonl(out / METRICS_FILE)
    summary = summarise(rows, config.to_dict(), iterations=iterations)
    if plot:
        plot_run(
            rows,
            out / PLOTS_FILE,
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
        config, out, command=TCE_TRAIN, resume=resume, saved=saved_config, kind="TCE", resumable=RESUMABLE_FIELDS
    )


def saved_config(out: Path) -> TCEConfig | None:
    """The TCEConfig of the run folder ``out``, or None when it holds no run of this command."""
    data = protocol.saved_config(out, TCE_TRAIN)
    if data is None:
        return None
    try:
        return TCEConfig.from_dict(data)
    except ValueError as err:
        raise UsageError(f"{out / CONFIG_FILE} holds a TCE config this version cannot read: {err}") from err


def checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(iteration, path) of the folder's checkpoint files, by iteration."""
    return numbered_files(out, CHECKPOINT_FILE)


def _restore(model: TCE, config: TCEConfig, out: Path) -> None:
    """Load the newest checkpoint into ``model`` (cutting metrics.jsonl back to it); or start the folder
    (config.json, an empty metrics.jsonl)."""
    runs.begin(out, TCE_TRAIN)  # the manifest first; stale temporary files of a killed process go
    found = checkpoints(out)
    if not found:
        protocol.start(out, TCE_TRAIN, config.to_dict())
        return
    try:
        state = read_state(found[-1][1])
        model.load_agent(state)
    except (RuntimeError, KeyError, ValueError) as err:  # e.g. a size mismatch: the env or the config changed under it
        raise UsageError(
            f"--resume: {found[-1][1]} does not fit the policy and critic this config builds for {config.env} "
            f"({str(err).splitlines()[0][:300]}); start a new folder."
        ) from err
    protocol.resume_metrics(out, state["metrics_lines"])


def save_checkpoint(out: Path, model: TCE, iteration: int) -> Path:
    """checkpoint-<iteration>.pt, whole (:func:`troll.runs.protocol.save_checkpoint`: one is kept): what
    :meth:`TCE.save` writes and the number of metrics lines it belongs to."""
    state = model.state() | {"iteration": iteration, "metrics_lines": iteration}
    return protocol.save_checkpoint(out, CHECKPOINT_FILE, iteration, lambda f: torch.save(state, f))


# ---------------------------------------------------------------------------------------------- loop


def _learn(model: TCE, out: Path, progress: bool, on_iteration) -> None:
    """The model learns its budget, each iteration's row appended to metrics.jsonl and a checkpoint saved every
    ``checkpoint_every`` iterations and after the last. A stop request (SIGTERM, SIGUSR1:
    :func:`troll.runs.protocol.stop_requests`) ends the run after the iteration it came in, with a checkpoint of
    that iteration (:class:`troll.runs.protocol.Stopped`)."""
    iterations, every = model.iterations(), model.config.checkpoint_every
    with protocol.stop_requests() as stop:

        def record(row: dict) -> None:
            append_jsonl(out / METRICS_FILE, row)
            if on_iteration is not None:
                on_iteration(row)
            it = row["iteration"]
            if it % every == 0 or it == iterations or stop.signal is not None:
                path = save_checkpoint(out, model, it)
                if stop.signal is not None and it < iterations:  # the last iteration just ends the run
                    raise protocol.Stopped(stop.signal, it, path)

        model.learn(callback=record, progress_bar=progress)
