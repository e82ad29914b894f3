"""Step-based PPO from stable-baselines3 on the episodic tasks, the third arm of ``troll tce``.

docs/tce.md, "How to run".

PPO acts every step: it sees the simulator's own observation and sends the simulator's own action (Reacher's two
joint torques, Meta-World's hand displacement and gripper command, box pushing's seven joint torques, gravity
compensated, hopper jump's three motor commands); there is no movement primitive and no tracking controller (the PD
gains of box pushing and hopper jump track a desired trajectory, which a step-based policy does not have).
:mod:`troll.episodic.envs.step` is the episodic task as a gymnasium env: the same simulator, T steps, the same
rewards (gym/reacher-sparse pays the whole episode at its last step, as the episodic env does), the same success
rule at the end of an episode, the same non-finite checks, the same final metrics (hopper jump: no success rule; max
height, final and landing distance). The toy task has no step interface (it is a batched torch simulation of whole
trajectories), so PPO runs on gym/*, metaworld/*, fancy/box-pushing-* and fancy/hopper-jump only.

Settings: ``stable_baselines3.PPO("MlpPolicy")`` with SB3's defaults (2.x): 2048 steps a rollout, 10 epochs of
minibatches of 64, Adam 3e-4, gamma 0.99, GAE lambda 0.95, clip 0.2, no entropy bonus, value weight 0.5, gradient
norm 0.5, advantages normalised, two 64-unit tanh layers for the policy and for the value, a state-independent
log std starting at 0, one environment, no observation or reward normalisation. The episode end at T is a time
limit (SB3 bootstraps it with the value), as the policy sees no time.

Same-task seeding: PPO steps the Python packages (gymnasium's Reacher-v5, the metaworld package), whatever backend
the episodic runs use. Meta-World's MT1 is built from the run's seed (the same 50 task variations as the episodic
env on the Python backend) and each episode picks its variation from its own seed; Reacher resets from its episode
seed. Evaluations use the episode seeds of TCE's (``episode_seeds(reset_seed(seed, EVAL_STREAM), eval_episodes)``):
exactly TCE's episodes when TCE runs on the Python backend, draws from the same distribution when it runs on EnvPool
(the default; docs/tce.md, "Backends"). With the deterministic policy (the mean action), at the env steps where a
TCE run of the same preset evaluates (every
``eval_every x episodes x T`` steps; PPO checks after each rollout, so up to ``n_steps`` later) and at the end.

Run folder: the same files as :mod:`troll.tce.run`: config.json ({"command": "tce train", "config": ...}
with ``algo: "ppo"``), metrics.jsonl (one row a rollout: ``env_steps``, rollout/* of the episodes that ended in it,
SB3's train/* losses, eval/* when evaluated, time/*), checkpoint-<env steps>.zip (SB3's save, atomic; one kept),
summary.json last, plots.png. Resume loads the newest checkpoint (weights, Adam, the env-step count), cuts
metrics.jsonl back to it and continues; the episode in progress at the checkpoint is dropped and the random stream
reseeded, so unlike TCE a resumed PPO run is not bit-identical to an uninterrupted one. SB3 is optional
(``pip install troll[baselines]``): :func:`require_sb3` says how to install it.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from troll import runs
from troll.episodic.agent import EVAL_STREAM, reset_seed
from troll.episodic.envs.base import episode_seeds
from troll.episodic.envs.step import make_step_task
from troll.runs import numbered_files, protocol
from troll.runs.files import (
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
from troll.tce.ppo_config import PPOConfig
from troll.tce.report import plot_run, summarise

INSTALL = "pip install 'troll[baselines]' (stable-baselines3)"
# an episode's final metrics in the step env's info -> the name of their mean in rollout/* and eval/*
FINAL_METRICS = {"episode_return": "return", "is_success": "success_rate", "distance": "distance",
                 "max_height": "max_height"}  # fmt: skip
CHECKPOINT = "checkpoint-{}.zip"  # stable-baselines3's own file
RESUMABLE_FIELDS = ("threads",)
# PPOConfig fields passed to stable_baselines3.PPO as they are (net_arch goes into policy_kwargs)
SB3_FIELDS = ("learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "clip_range", "ent_coef",
              "vf_coef", "max_grad_norm")  # fmt: skip


def require_sb3() -> None:
    """UsageError with the install command when stable-baselines3 is missing (checked before anything is written)."""
    if importlib.util.find_spec("stable_baselines3") is None:
        raise UsageError(f"--algo ppo needs stable-baselines3, which is not installed: {INSTALL}.")


def play(model, task, seed: int, on_step: Callable[[int], None] | None = None) -> dict:
    """One episode of the deterministic policy (the mean action) from episode seed ``seed``; its last step's info.
    ``on_step(t)`` (None), when set, is called after the reset (t = 0) and after every step t = 1..T (the
    renderer's frames)."""
    obs, _ = task.reset(options={"episode_seed": seed})
    if on_step is not None:
        on_step(0)
    for t in range(1, task.horizon + 1):
        action, _ = model.predict(obs, deterministic=True)
        obs, _, _, _, info = task.step(action)
        if on_step is not None:
            on_step(t)
    return info


def evaluate(model, task, seeds: list[int]) -> dict[str, float]:
    """The deterministic policy on the episodes of ``seeds``: the mean of each final metric the task reports
    (:data:`FINAL_METRICS`: return, and success rate, final distance, max height where the task has them)."""
    return _means([play(model, task, s) for s in seeds], "eval")


# ---------------------------------------------------------------------------------------------- the run


def saved_config(out: Path) -> PPOConfig | None:
    """The PPOConfig of the run folder ``out``, or None when it holds no PPO run of ``tce train``."""
    data = protocol.saved_config(out, TCE_TRAIN)
    if data is None or data.get("algo") != "ppo":
        return None
    try:
        return PPOConfig.from_dict(data)
    except ValueError as err:
        raise UsageError(f"{out / CONFIG_FILE} holds a PPO config this version cannot read: {err}") from err


def _prepare(config: PPOConfig | None, out: Path, *, resume: bool) -> tuple[PPOConfig, bool]:
    """Check ``out`` and the config before anything is written; returns (config to run, finished already)."""
    check_out_path(out, "run folder")
    return protocol.prepare(
        config, out, command=TCE_TRAIN, resume=resume, saved=saved_config, kind="PPO", resumable=RESUMABLE_FIELDS
    )


def checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(env steps, path) of the folder's PPO checkpoints, oldest first."""
    return numbered_files(out, CHECKPOINT)


def save_checkpoint(out: Path, model) -> Path:
    """checkpoint-<env steps>.zip (SB3's save), whole (:func:`troll.runs.protocol.save_checkpoint`: one is kept)."""
    return protocol.save_checkpoint(out, CHECKPOINT, int(model.num_timesteps), model.save)


def train(
    config: PPOConfig | None,
    out: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    plot: bool = True,
    on_row: Callable[[dict], None] | None = None,
) -> dict:
    """Run PPO into ``out`` (same arguments, refusals and stop signals as :func:`troll.tce.run.train`: a stop
    comes after the rollout's update); the summary."""
    require_sb3()
    out = Path(out)
    return protocol.run(
        out,
        lambda: _prepare(config, out, resume=resume),
        lambda cfg: _train(cfg, out, progress=progress, plot=plot, on_row=on_row),
    )


def _train(config: PPOConfig, out: Path, *, progress: bool, plot: bool, on_row) -> dict:
    from troll._threads import threads

    with threads(config.threads):
        _run(config, out, progress, on_row)
    rows = read_jsonl(out / METRICS_FILE)
    summary = summarise(rows, config.to_dict(), iterations=math.ceil(config.total_env_steps / config.n_steps))
    if plot:
        plot_run(rows, out / PLOTS_FILE, title=f"PPO (stable-baselines3) on {config.env} (seed {config.seed})",
                 mean_bound=1.0, cov_bound=1.0)  # fmt: skip
    write_json(out / SUMMARY_FILE, summary)
    return summary


def step_task(config: PPOConfig):
    """The step env of ``config``'s env and seed; a missing simulator or fancy-gym's assets is a UsageError (refused
    before anything is written)."""
    try:
        return make_step_task(config.env, seed=config.seed)
    except (ImportError, FileNotFoundError) as err:
        raise UsageError(str(err)) from err


def _build(config: PPOConfig, out: Path):
    """(model, training task, evaluation task): from the newest checkpoint, or new (writing config.json)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger

    task, eval_task = step_task(config), step_task(config)
    runs.begin(out, TCE_TRAIN)  # the manifest first; stale temporary files of a killed process go
    found = checkpoints(out)
    if found:
        steps, path = found[-1]
        # force_reset: a new episode starts (the one in progress at the checkpoint is not in the file); SB3 saves
        # no random state, so the stream is reseeded from (seed, env steps)
        model = PPO.load(path, env=task, device="cpu", force_reset=True)
        model.set_random_seed(config.seed + steps)
        task.index = steps // task.horizon + 1  # a fresh training episode index, never one used before
        rows = read_jsonl(out / METRICS_FILE)
        protocol.resume_metrics(out, sum(1 for r in rows if r["env_steps"] <= steps))
    else:
        protocol.start(out, TCE_TRAIN, config.to_dict())
        arch = list(config.net_arch)
        sb3 = {k: getattr(config, k) for k in SB3_FIELDS}
        model = PPO("MlpPolicy", task, seed=config.seed, device="cpu", verbose=0,
                    policy_kwargs={"net_arch": {"pi": arch, "vf": arch}}, **sb3)  # fmt: skip
    # values are kept for our rows; with no folder and no outputs SB3 writes nothing (its configure() would still
    # make an empty SB3-<date> folder in the system's temporary directory on every run)
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model, task, eval_task


def _run(config: PPOConfig, out: Path, progress: bool, on_row) -> None:
    from tqdm.auto import tqdm

    model, task, eval_task = _build(config, out)
    start = int(model.num_timesteps)
    bar = tqdm(total=config.total_env_steps, initial=min(start, config.total_env_steps), unit="step",
               desc=f"ppo {config.env}", file=sys.stderr, disable=not progress)  # fmt: skip
    try:
        remaining = config.total_env_steps - start
        if remaining > 0:
            with protocol.stop_requests() as stop:  # SIGTERM / SIGUSR1: stop after this rollout's update, resumable
                log = _logger(config, out, start, eval_task, bar, stop, on_row)
                model.learn(total_timesteps=remaining, callback=log, reset_num_timesteps=False)
    finally:
        bar.close()
        task.close()
        eval_task.close()


def _logger(config: PPOConfig, out: Path, start: int, eval_task, bar, stop, on_row):
    """SB3's callback of a run from env step ``start``: after each rollout's update one metrics row (evaluated on
    ``eval_task`` on schedule), a checkpoint every few rollouts, the progress ``bar``; on a stop request (``stop``)
    a checkpoint and :class:`~troll.runs.protocol.Stopped`."""
    from stable_baselines3.common.callbacks import BaseCallback

    seeds = episode_seeds(reset_seed(config.seed, EVAL_STREAM), config.eval_episodes)

    class Log(BaseCallback):
        def _on_training_start(self) -> None:
            self.episodes, self.t0, self.rollout_t = [], time.perf_counter(), 0.0
            self.rows = len(read_jsonl(out / METRICS_FILE))
            self.next_eval = (start // config.eval_every_steps + 1) * config.eval_every_steps

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"]):
                if done and "episode_return" in info:
                    self.episodes.append(info)
            return True

        def _on_rollout_start(self) -> None:
            if self.model.num_timesteps > start:
                self._row(last=False)
                if stop.signal is not None:  # after the update and its row: the checkpoint resumes from here
                    raise protocol.Stopped(stop.signal, int(self.model.num_timesteps), save_checkpoint(out, self.model))

        def _on_rollout_end(self) -> None:
            self.rollout_t = time.perf_counter() - self.t0

        def _on_training_end(self) -> None:
            self._row(last=True)

        def _row(self, last: bool) -> None:
            steps = int(self.model.num_timesteps)
            evaluated = last or steps >= self.next_eval
            row = _row(self.model, config, self.episodes, self.rollout_t, (eval_task, seeds) if evaluated else None)
            if evaluated:
                self.next_eval = (steps // config.eval_every_steps + 1) * config.eval_every_steps
            row["time/iteration"] = time.perf_counter() - self.t0
            row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
            append_jsonl(out / METRICS_FILE, row)
            self.rows += 1
            self.episodes, self.t0 = [], time.perf_counter()
            if on_row is not None:
                on_row(row)
            if last or self.rows % config.checkpoint_every == 0:
                save_checkpoint(out, self.model)
            bar.update(min(steps, config.total_env_steps) - bar.n)
            shown = {k.split("/")[-1]: f"{row[k]:.3g}" for k in ("eval/success_rate", "eval/return") if k in row}
            bar.set_postfix(shown, refresh=False)

    return Log()


def _row(model, config: PPOConfig, episodes: list[dict], rollout_t: float, evaluation) -> dict:
    """One rollout's metrics row: its episodes, SB3's train/* values, and (``evaluation`` = (task, episode seeds))
    the deterministic policy's evaluation."""
    steps = int(model.num_timesteps)
    row = {"iteration": steps // config.n_steps, "env_steps": steps} | _episode_metrics(episodes)
    row |= {k: float(v) for k, v in model.logger.name_to_value.items() if k.startswith("train/")}
    if "train/entropy_loss" in row:  # SB3 logs minus the mean entropy of its action Gaussian
        row["policy/action_entropy"] = -row["train/entropy_loss"]
    row["time/rollout"] = rollout_t
    if evaluation is not None:
        t = time.perf_counter()
        row |= evaluate(model, *evaluation)
        row["time/eval"] = time.perf_counter() - t
    return row


def _episode_metrics(episodes: list[dict]) -> dict[str, float]:
    """rollout/* over the episodes that ended in a rollout (none: no keys)."""
    if not episodes:
        return {}
    return _means(episodes, "rollout") | {"rollout/episodes": len(episodes)}


def _means(infos: list[dict], prefix: str) -> dict[str, float]:
    """<prefix>/<name>: the mean over episodes of each final metric of :data:`FINAL_METRICS` their infos hold."""
    return {f"{prefix}/{name}": float(np.mean([float(i[key]) for i in infos]))
            for key, name in FINAL_METRICS.items() if key in infos[0]}  # fmt: skip
