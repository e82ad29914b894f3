"""Trainer callbacks of a run: metrics to JSONL with a tqdm bar, periodic greedy held-out evaluation, and the mark
that makes a checkpoint count (:mod:`troll.lm.checkpoints`)."""

from __future__ import annotations

import math
from pathlib import Path

from transformers import TrainerCallback

from troll.lm import checkpoints
from troll.lm.evaluate import heldout_accuracy
from troll.lm.tasks import Task
from troll.runs.files import append_jsonl

# Shown on the progress bar when logged (in this order).
BAR_KEYS = {"reward": "reward", "troll/kl_after/max": "kl_max", "clip_ratio/region_mean": "clipped", "entropy": "ent"}
# The last held-out evaluation: greedy accuracy, and the sampled pass@1 when the run samples held-out items.
HELDOUT_BAR_KEYS = {"heldout/accuracy": "heldout", "heldout/sampled_pass@1": "heldout_pass@1"}


class RunLog(TrainerCallback):
    """Appends one JSON line per log event ({"step": N, **logs}) and drives a tqdm bar over the optimiser steps.

    ``lines`` counts the lines of the file (``lines`` already there when a resumed run starts): a checkpoint records
    it, so that resuming from that checkpoint cuts the file back to exactly what had been logged.
    """

    def __init__(self, path: Path, total: int, lines: int = 0):
        self.path = Path(path)
        self.total = total
        self.lines = lines
        self.bar = None
        self.postfix: dict[str, str] = {}

    def write(self, step: int, values: dict) -> None:
        append_jsonl(self.path, {"step": step, **{k: _plain(v) for k, v in values.items()}})
        self.lines += 1
        for key, short in [*BAR_KEYS.items(), *HELDOUT_BAR_KEYS.items()]:
            if key in values and isinstance(values[key], int | float):
                self.postfix[short] = f"{values[key]:.3g}"
        if self.bar is not None:
            self.bar.set_postfix(self.postfix, refresh=False)

    def on_train_begin(self, args, state, control, **kwargs):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, initial=state.global_step, desc="train", unit="step", dynamic_ncols=True)
        self.bar.set_postfix(self.postfix, refresh=False)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Not the Trainer's end-of-training line (runtime, throughput, mean loss of this train() call): after a
        # resume it would describe only the resumed part; summary.json has the times.
        if logs and "train_runtime" not in logs:
            self.write(state.global_step, logs)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class HeldoutEval(TrainerCallback):
    """Greedy held-out accuracy every ``every`` optimiser steps (0: only where called explicitly), logged as
    ``heldout/accuracy``, ``heldout/score`` and ``heldout/n`` lines of the metrics file."""

    def __init__(self, task: Task, tokenizer, log: RunLog, *, every: int, max_new_tokens: int, samples: int = 0,
                 temperature: float = 1.0, seed: int = 0):  # fmt: skip
        self.task, self.tokenizer, self.log = task, tokenizer, log
        self.every, self.max_new_tokens = every, max_new_tokens
        self.samples, self.temperature, self.seed = samples, temperature, seed

    def run(self, model, step: int) -> dict:
        # the samples of each evaluation drawn from their own seed: the same at a step whether resumed or not
        result = heldout_accuracy(model, self.tokenizer, self.task, max_new_tokens=self.max_new_tokens,
                                  samples=self.samples, temperature=self.temperature,
                                  seed=self.seed * 1_000_003 + step).to_json()  # fmt: skip
        self.log.write(step, {f"heldout/{k}": v for k, v in result.items() if k != "samples"})
        return result

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        # The last step is evaluated by the caller after training, once.
        if self.every and step % self.every == 0 and step < state.max_steps and model is not None:
            self.run(model, step)


class Checkpoints(TrainerCallback):
    """Marks ``checkpoint-N`` complete once the Trainer has written all of it (``on_save`` comes after the whole
    save), with the number of metrics lines logged so far, then removes the older checkpoints."""

    def __init__(self, out: Path, log: RunLog):
        self.out, self.log = Path(out), log

    def on_save(self, args, state, control, **kwargs):
        folder = self.out / f"{checkpoints.PREFIX}{state.global_step}"
        checkpoints.mark_complete(folder, step=state.global_step, metrics_lines=self.log.lines)


def _plain(value):
    """JSON-safe scalars: tensors to floats, NaN/inf to None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
