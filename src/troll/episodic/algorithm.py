"""TCE and BBRL as objects a user holds, in the shape of stable-baselines3's algorithms (docs/tce.md, "Python API").

    from troll.episodic import TCE
    model = TCE("toy/viapoint", seed=0, episodes=16)      # an env name, or an EpisodicEnv of your own
    model.learn(200_000)                                   # env steps in all; callback(row) -> False stops early
    model.evaluate()                                       # {"return": ..., "success_rate": ...}
    theta, pos, vel = model.predict(context, pos0, vel0)   # MP parameters and the desired trajectory
    model.save("tce.pt"); model = TCE.load("tce.pt")       # one file: config and weights

Construction: the env's preset (:meth:`TCEConfig.preset`: its family's settings and the algorithm's), or another
family's with ``preset="metaworld"``, or TCEConfig's own defaults with ``preset="default"`` (a user's env has no
preset of its own), then ``overrides`` (TCEConfig fields). With an env object, ``episodes`` and ``eval_episodes``
default to its ``num_episodes``. ``troll tce train`` runs this object (troll.tce.run) and keeps its checkpoints
in the format :meth:`save` writes, so :meth:`TCE.load` reads a run folder too (its newest checkpoint).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from troll._threads import threads
from troll.episodic.agent import EVAL_STREAM, TCEAgent, reset_seed
from troll.episodic.config import TCEConfig, check_critic_batches
from troll.episodic.envs.base import EpisodeStart, EpisodicEnv
from troll.episodic.envs.registry import make_env
from troll.episodic.presets import ALGO_PRESETS, PRESETS, env_family
from troll.runs.checkpoints import numbered_files
from troll.runs.files import CHECKPOINT_FILE

FORMAT = 1  # of the saved file: {"format", "config", "dims", "agent"} (+ "iteration", "metrics_lines" in a run)
DIMS = ("context_dim", "state_dim", "dof", "horizon", "dt")


class Prediction(NamedTuple):
    """theta (E, P): the movement primitive's parameters; pos, vel (E, T + 1, D): the desired trajectory at
    t_k = k dt, float64 (None when no start position was given)."""

    theta: torch.Tensor
    pos: torch.Tensor | None
    vel: torch.Tensor | None


class TCE:
    """TCE (``algo="tce"``): one Gaussian over a ProDMP's parameters per context, updated through per-segment
    likelihoods under a KL trust region (docs/tce.md). See the module docstring for the methods."""

    algo = "tce"
    algos: tuple[str, ...] = ("tce",)

    def __init__(self, env: str | EpisodicEnv, *, preset: str | None = None, seed: int = 0, **overrides):
        given = env if isinstance(env, EpisodicEnv) else None
        name = given.name if given is not None else env
        if given is not None:
            overrides.setdefault("episodes", given.num_episodes)
            overrides.setdefault("eval_episodes", given.num_episodes)
        overrides.setdefault("algo", self.algo)
        if overrides["algo"] not in self.algos:
            other = "BBRL" if self.algo == "tce" else "TCE"
            raise ValueError(f"{type(self).__name__} runs algo {' or '.join(map(repr, self.algos))}, got "
                             f"{overrides['algo']!r}; use {other} for that.")  # fmt: skip
        self._setup(make_config(name, preset=preset, seed=seed, **overrides), given)

    # ------------------------------------------------------------------------------------------ building

    @classmethod
    def from_config(cls, config: TCEConfig, env: EpisodicEnv | None = None) -> TCE:
        """The algorithm of ``config.algo`` with exactly ``config`` (no preset applied); ``env`` or one built from
        ``config.env``."""
        model = object.__new__(BBRL if config.algo != "tce" else TCE)
        model._setup(config, env)
        return model

    def _setup(self, config: TCEConfig, env: EpisodicEnv | None, dims: dict | None = None) -> None:
        if not isinstance(config, TCEConfig):
            raise TypeError(f"config must be a TCEConfig, got {type(config).__name__}.")
        self.config, self._env, self._eval_env, self._owned = config, env, None, []
        if env is not None and env.num_episodes != config.episodes:
            raise ValueError(f"the env runs {env.num_episodes} episodes at a time but episodes={config.episodes}; "
                             "build it with num_episodes=episodes, or leave episodes out.")  # fmt: skip
        if dims is None:
            env = self._train_env()
            dims = {k: getattr(env, k) for k in DIMS}
        self.dims = dict(dims)
        check_critic_batches(config, self.dims["horizon"])
        self.agent = TCEAgent(self.config, **self.dims, total_iterations=self.iterations())
        self._sampler = torch.Generator().manual_seed(config.seed + 1)  # predict's own draws: learn's stay as they are

    def _build(self, episodes: int) -> EpisodicEnv:
        cfg = self.config
        env = make_env(cfg.env, num_episodes=episodes, workers=cfg.workers, seed=cfg.seed, **cfg.env_options)
        self._owned.append(env)
        return env

    def _train_env(self) -> EpisodicEnv:
        if self._env is None:
            self._env = self._build(self.config.episodes)
        return self._env

    def _eval_env_for(self, episodes: int) -> EpisodicEnv:
        """An env of ``episodes`` episodes: the training env, the evaluation env, or a new one from the name."""
        for env in (self._env, self._eval_env):
            if env is not None and env.num_episodes == episodes:
                return env
        if self._env is not None and self._env not in self._owned:
            raise ValueError(f"the env given runs {self._env.num_episodes} episodes at a time; evaluate with "
                             f"episodes={self._env.num_episodes}, or pass an env name.")  # fmt: skip
        self._eval_env = self._build(episodes)
        return self._eval_env

    def iterations(self, total_env_steps: int | None = None) -> int:
        """Iterations of ``total_env_steps`` (default the config's budget): ceil(steps / (episodes * horizon))."""
        total = self.config.total_env_steps if total_env_steps is None else total_env_steps
        return math.ceil(total / (self.config.episodes * self.dims["horizon"]))

    @property
    def iteration(self) -> int:
        """Iterations trained so far."""
        return self.agent.iteration

    # ------------------------------------------------------------------------------------------ learning

    def learn(self, total_env_steps: int | None = None, callback: Callable[[dict], bool | None] | None = None,
              progress_bar: bool = True) -> TCE:  # fmt: skip
        """Train until ``total_env_steps`` env steps in all (default: the config's budget, which also sets the length
        of the learning-rate and entropy schedules). ``callback(row)`` gets each iteration's metrics (the rows of a
        run folder's metrics.jsonl); returning False stops after that iteration. Returns self."""
        if total_env_steps is not None and self.iteration == 0 and total_env_steps != self.config.total_env_steps:
            self.config = dataclasses.replace(self.config, total_env_steps=total_env_steps)  # checked again
            self.agent = TCEAgent(self.config, **self.dims, total_iterations=self.iterations())
        end = self.iterations(total_env_steps)
        with threads(self.config.threads):
            bar = _bar(self, end, progress_bar)
            try:
                while self.iteration < end:
                    row = self._iterate(last=self.iteration + 1 == end)
                    bar.update(1)
                    shown = {k: row[k] for k in ("eval/success_rate", "rollout/return") if row.get(k) is not None}
                    bar.set_postfix({k.split("/")[-1]: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
                    if callback is not None and callback(row) is False:
                        break
            finally:
                bar.close()
        return self

    def _iterate(self, *, last: bool) -> dict:
        cfg, it, env = self.config, self.iteration, self._train_env()
        t0 = time.perf_counter()
        batch = self.agent.rollout(env, reset_seed(cfg.seed, it))
        t1 = time.perf_counter()
        row = {"iteration": it + 1, "env_steps": (it + 1) * cfg.episodes * self.dims["horizon"]}
        row |= self.agent.update(batch)
        row["time/rollout"] = t1 - t0
        if (it + 1) % cfg.eval_every == 0 or last:
            t2 = time.perf_counter()
            row |= self.agent.evaluate(self._eval_env_for(cfg.eval_episodes), reset_seed(cfg.seed, EVAL_STREAM))
            row["time/eval"] = time.perf_counter() - t2
        row["time/iteration"] = time.perf_counter() - t0
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}

    # ------------------------------------------------------------------------------------------ acting

    def predict(self, context, pos=None, vel=None, *, deterministic: bool = True) -> Prediction:
        """The movement primitive's parameters for ``context`` (C,) or (E, C), and, given the start position and
        velocity (D,) or (E, D), the desired trajectory: the policy's mean, or a sample (``deterministic=False``)."""
        context = torch.as_tensor(context, dtype=torch.float32)
        single = context.dim() == 1
        batch = lambda x: torch.as_tensor(x, dtype=torch.float32).reshape(len(context), -1)  # noqa: E731
        context = context.reshape(1, -1) if single else context
        start_pos = batch(pos) if pos is not None else torch.zeros(len(context), self.dims["dof"])
        start_vel = batch(vel) if vel is not None else torch.zeros_like(start_pos)
        start = EpisodeStart(context=context, pos=start_pos, vel=start_vel)
        theta, traj_pos, traj_vel = self.agent.trajectories(start, deterministic=deterministic,
                                                            generator=self._sampler)  # fmt: skip
        if pos is None:
            traj_pos = traj_vel = None
        out = Prediction(theta, traj_pos, traj_vel)
        return Prediction(*(x[0] if single and x is not None else x for x in out))

    def evaluate(self, episodes: int | None = None, *, seed: int | None = None) -> dict[str, float]:
        """The mean trajectory (no sampling) on ``episodes`` episodes (default the config's eval_episodes) reset from
        ``seed`` (default: the training's evaluation seed): mean return, success rate, final distance, ..."""
        episodes = self.config.eval_episodes if episodes is None else episodes
        seed = reset_seed(self.config.seed, EVAL_STREAM) if seed is None else seed
        with threads(self.config.threads):
            metrics = self.agent.evaluate(self._eval_env_for(episodes), seed)
        return {k.removeprefix("eval/"): v for k, v in metrics.items()}

    # ------------------------------------------------------------------------------------------ saving

    def state(self) -> dict:
        """What :meth:`save` writes: the config, the env's dimensions and the agent (networks, normalisers, Adam,
        the sampling generator, the iteration)."""
        return {"format": FORMAT, "config": self.config.to_dict(), "dims": dict(self.dims),
                "agent": self.agent.state_dict()}  # fmt: skip

    def load_agent(self, state: dict) -> None:
        """Take the agent of ``state`` (:meth:`state`), whose config must build the same networks."""
        self.agent.load_state_dict(state["agent"])

    def save(self, path: str | os.PathLike) -> Path:
        """One file (torch.save, written to a temporary name and moved into place): config and weights."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        torch.save(self.state(), tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, env: str | EpisodicEnv | None = None) -> TCE:
        """A model from :meth:`save`'s file, or from a ``troll tce train`` run folder (its newest checkpoint). The
        env is built from the config's name when :meth:`learn` or :meth:`evaluate` first needs it; ``env`` (an
        object, or a name) replaces it."""
        state = read_state(path)
        config = TCEConfig.from_dict(state["config"])
        if isinstance(env, str):
            config = dataclasses.replace(config, env=env)
        given = env if isinstance(env, EpisodicEnv) else None
        if given is not None:
            found = {k: getattr(given, k) for k in DIMS}
            if found != state["dims"]:
                raise ValueError(f"{path}: saved for an env with {state['dims']}, the env given has {found}.")
        model = object.__new__(BBRL if config.algo != "tce" else TCE)
        model._setup(config, given, dims=state["dims"])
        model.load_agent(state)
        return model

    def close(self) -> None:
        """Close the envs this object built (worker processes)."""
        if self._env in self._owned:  # a user's env stays open: it is theirs
            self._env = None
        for env in self._owned:
            env.close()
        self._owned, self._eval_env = [], None

    def __enter__(self) -> TCE:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env={self.config.env!r}, seed={self.config.seed}, iteration={self.iteration})"


class BBRL(TCE):
    """BBRL, the black-box baseline (``algo="bbrl"``, diagonal covariance; ``algo="bbrl-cov"``: full): one
    likelihood of theta and one advantage R - V(c) per episode, under the same trust region (docs/tce.md)."""

    algo = "bbrl"
    algos = ("bbrl", "bbrl-cov")


def make_config(env: str, *, preset: str | None = None, seed: int = 0, **overrides) -> TCEConfig:
    """The TCEConfig of :class:`TCE`'s constructor (module docstring)."""
    if preset is None:
        return TCEConfig.preset(env, seed=seed, **overrides)
    if preset == "default":
        return TCEConfig(env=env, seed=seed, **overrides)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(map(repr, PRESETS))}, 'default' "
                         "(TCEConfig's own) or None (the env's).")  # fmt: skip
    algo = overrides.get("algo", "tce")
    fields = {**PRESETS[preset], **ALGO_PRESETS.get((preset, algo), {})}
    if env_family(env) != preset:
        fields.pop("env_options", None)  # options of another family's envs
    return TCEConfig(**{**fields, "env": env, "seed": seed, **overrides})


def read_state(path: str | os.PathLike) -> dict:
    """The saved state of a file from :meth:`TCE.save`, or of a run folder's newest checkpoint."""
    path = Path(path)
    if path.is_dir():
        found = numbered_files(path, CHECKPOINT_FILE)
        if not found:
            raise FileNotFoundError(f"{path} holds no {CHECKPOINT_FILE.format('<n>')}: no TCE or BBRL run saved there.")
        path = found[-1][1]
    state = torch.load(path, weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a TCE or BBRL file of format {FORMAT} (TCE.save or troll tce train).")
    return state


def _bar(model: TCE, end: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    cfg = model.config
    return tqdm(total=end, initial=model.iteration, desc=f"{cfg.algo} {cfg.env}", unit="it", file=sys.stderr)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def set_postfix(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass
