"""The settings of one training run, their defaults, and every check that must pass before a model is loaded.

Nothing here imports torch, transformers or TRL: ``troll train`` validates its input in well under a second of
its own work (reasoning_gym's registry, imported to check the task name, is the slowest part) and writes nothing
when a check fails.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "config.json"

# loss -> (TRL loss_type, importance_sampling_level, default eps, what eps means)
LOSSES: dict[str, tuple[str, str, float, str]] = {
    "troll": ("troll", "token", 0.05, "per-token KL bound of the trust region"),
    "troll_seq": ("troll_seq", "token", 0.05, "per-token KL bound of the trust region"),
    "grpo": ("grpo", "token", 0.2, "clip range of the ratio"),
    "dapo": ("dapo", "token", 0.2, "clip range of the ratio"),
    "dr_grpo": ("dr_grpo", "token", 0.2, "clip range of the ratio"),
    "bnpo": ("bnpo", "token", 0.2, "clip range of the ratio"),
    "cispo": ("cispo", "token", 5.0, "upper cap of the detached ratio"),
    # GSPO: sequence-level ratio with TRL's "grpo" normalisation; the GSPO paper clips at 3e-4 / 4e-4.
    "gspo": ("grpo", "sequence", 3e-4, "clip range of the sequence-level ratio"),
}
TROLL_LOSSES = ("troll", "troll_seq")


class UsageError(ValueError):
    """Bad command-line input; the message says how to fix it. Raised before anything is written."""


@dataclass
class RunOptions:
    """Everything that defines a ``troll train`` run; written to the run folder as config.json.

    One rollout batch holds ``prompts_per_step * generations`` completions and feeds ``steps_per_rollout``
    optimiser steps (TRL's steps_per_generation, gradient accumulation 1), each on an equal share of it. With one
    step per rollout the old and new policies coincide and TROLL's projection (like clipping) never acts.
    """

    model: str = "smollm2"
    task: str = "chain_sum"
    loss: str = "troll"
    eps: float | None = None  # None: the loss's default (LOSSES)
    alpha: float = 1.0
    top_k: int = 64
    delta: float = 1e-5
    steps: int = 16
    lr: float = 1e-5
    prompts_per_step: int = 4
    generations: int = 4
    max_completion_length: int = 16
    steps_per_rollout: int = 2
    temperature: float = 1.0
    # Held-out items, evaluated greedily in batches: 128 puts the standard error of an accuracy near 0.5 at 0.044.
    heldout: int = 128
    eval_every: int | None = None  # None: every quarter of the run (steps // 4); 0: before and after only
    save_every: int | None = None  # None: half the run
    seed: int = 0
    # torch intra-op threads. 1 by default: on a shared 2-core machine two threads per process oversubscribe the
    # cores, and generation (many tiny matmuls) ran 5x slower with 2 threads than with 1 under load (measured).
    threads: int = 1
    out: str = ""  # "": runs/<loss>-<task>-seed<seed>

    def resolved(self) -> RunOptions:
        """A copy with the defaults that depend on other fields filled in."""
        eps = LOSSES[self.loss][2] if self.eps is None else self.eps
        save_every = max(1, self.steps // 2) if self.save_every is None else self.save_every
        eval_every = max(1, self.steps // 4) if self.eval_every is None else self.eval_every
        out = self.out or f"runs/{self.loss}-{self.task}-seed{self.seed}"
        return dataclasses.replace(self, eps=eps, save_every=save_every, eval_every=eval_every, out=out)

    @property
    def rollout_size(self) -> int:
        return self.prompts_per_step * self.generations

    @property
    def batch_size(self) -> int:
        """Completions per optimiser step (TRL's per_device_train_batch_size on one CPU process)."""
        return self.rollout_size // self.steps_per_rollout

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RunOptions:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def check_values(opts: RunOptions) -> None:
    """Raise :class:`UsageError` for any value TRL or TROLL would reject later (or silently misuse).

    Every number must be finite and of the field's type (NaN passes ``x < 0``, so each check is written as the
    condition that must hold).
    """
    if opts.loss not in LOSSES:
        raise UsageError(f"unknown loss {opts.loss!r}; choose one of: {', '.join(LOSSES)}.")
    for name in ("model", "task"):
        if not isinstance(getattr(opts, name), str) or not getattr(opts, name).strip():
            raise UsageError(f"--{name} must be a non-empty string, got {getattr(opts, name)!r}.")
    if opts.eps is not None and not (_is_number(opts.eps) and opts.eps > 0):
        meaning = LOSSES[opts.loss][3]
        raise UsageError(f"--eps must be a finite number > 0 (for {opts.loss} it is the {meaning}), got {opts.eps}.")
    _check_positive(lr=opts.lr, temperature=opts.temperature)
    _check_positive_int(steps=opts.steps, heldout=opts.heldout, prompts_per_step=opts.prompts_per_step)
    _check_positive_int(max_completion_length=opts.max_completion_length, top_k=opts.top_k)
    _check_positive_int(steps_per_rollout=opts.steps_per_rollout, threads=opts.threads)
    if not (_is_number(opts.alpha) and opts.alpha >= 0):
        raise UsageError(
            f"--alpha must be a finite number >= 0 (weight of the regression to the projection), got {opts.alpha}."
        )
    if not (_is_number(opts.delta) and 0 <= opts.delta < 1):
        raise UsageError(f"--delta must lie in [0, 1) (mass left out when sparsifying), got {opts.delta}.")
    for name in ("eval_every", "save_every"):
        value = getattr(opts, name)
        if value is not None and not (_is_int(value) and value >= 0):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be a whole number >= 0 (0: only at the end), got {value}.")
    if not (_is_int(opts.seed) and 0 <= opts.seed < 2**32):
        raise UsageError(f"--seed must be a whole number in [0, 2**32) (numpy's seed range), got {opts.seed}.")
    if not isinstance(opts.out, str):
        raise UsageError(f"--out must be a folder path, got {opts.out!r}.")
    check_batch_shape(opts)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not (_is_number(value) and value > 0):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value}.")


def _check_positive_int(**values: int) -> None:
    for name, value in values.items():
        if not (_is_int(value) and value > 0):
            raise UsageError(f"--{name.replace('_', '-')} must be a whole number > 0, got {value}.")


def check_batch_shape(opts: RunOptions) -> None:
    """The rollout batch must split into whole optimiser batches, and GRPO needs at least two samples a prompt."""
    if not (_is_int(opts.generations) and opts.generations >= 2):
        raise UsageError(
            f"--generations must be >= 2: GRPO's advantage compares the samples of one prompt, got {opts.generations}."
        )
    if opts.rollout_size % opts.steps_per_rollout:
        raise UsageError(
            f"a rollout batch of --prompts-per-step {opts.prompts_per_step} x --generations {opts.generations} = "
            f"{opts.rollout_size} completions cannot be split into --steps-per-rollout {opts.steps_per_rollout} "
            "equal optimiser batches; pick values whose product is a multiple of --steps-per-rollout."
        )


def check_folder(out: Path, *, overwrite: bool, resume: bool) -> bool:
    """Check the run folder; True when it holds an earlier run that ``overwrite`` allows to delete.

    A non-empty folder is refused unless ``overwrite`` (only a folder this tool wrote, i.e. holding config.json,
    is ever deleted) or ``resume`` (which needs config.json and a checkpoint in it). Touches nothing.
    """
    if overwrite and resume:
        raise UsageError("--overwrite and --resume exclude each other: one discards the run, the other continues it.")
    check_out_path(out, "run folder")
    used = out.is_dir() and any(out.iterdir())
    if resume:
        if not (out / CONFIG_FILE).is_file():
            raise UsageError(f"--resume: {out} holds no {CONFIG_FILE}; start the run without --resume.")
        if last_checkpoint(out) is None:
            raise UsageError(
                f"--resume: {out} holds no checkpoint-* folder to continue from (a run that finished deletes its "
                "checkpoints unless it was started with --keep-checkpoints)."
            )
        return False
    if not used:
        return False
    if not overwrite:
        raise UsageError(
            f"run folder {out} is not empty; pass --overwrite to replace it, --resume to continue it, or another --out."
        )
    if not (out / CONFIG_FILE).is_file():
        raise UsageError(
            f"--overwrite: {out} has no {CONFIG_FILE}, so it is not a troll run folder; refusing to delete."
        )
    return True


def check_out_path(out: Path, what: str) -> None:
    """``out`` must be a folder or creatable as one: not "", not a file, not below a file. Touches nothing."""
    if not str(out).strip():
        raise UsageError("--out is empty; give a folder path, or leave --out out for the default folder.")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {what} {out} exists and is not a folder; choose another --out.")
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"--out {out}: {parent} is a file, so no folder can be made below it.")
            break


def last_checkpoint(out: Path) -> Path | None:
    """The checkpoint-N folder with the largest N, or None."""
    found = [p for p in out.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return max(found, key=lambda p: int(p.name.split("-")[-1]), default=None)


def read_config(out: Path):
    """The folder's config.json as parsed JSON; :class:`UsageError` when it cannot be read."""
    path = out / CONFIG_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"--resume: {path} cannot be read as JSON ({err}); it is damaged, start a new --out.") from err


def load_config(out: Path, key: str = "options") -> dict:
    """The folder's config.json, which must be a JSON object holding ``key``; :class:`UsageError` otherwise."""
    path = out / CONFIG_FILE
    data = read_config(out)
    if not isinstance(data, dict) or not isinstance(data.get(key), dict):
        raise UsageError(f"--resume: {path} has no {key!r} object; it was not written by this tool, start a new --out.")
    return data


def saved_options(out: Path) -> RunOptions:
    """The RunOptions saved in a run folder's config.json, checked; :class:`UsageError` if damaged."""
    try:
        opts = RunOptions.from_json(load_config(out)["options"])
        check_values(opts)
    except (TypeError, UsageError) as err:
        raise UsageError(
            f"--resume: the options in {out / CONFIG_FILE} are not valid ({err}); start a new --out."
        ) from err
    return opts
