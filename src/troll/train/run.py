"""One ``troll train`` run: a GRPO run with TROLL or a clipped loss, written into a run folder.

The folder holds config.json (the resolved options and versions), metrics.jsonl (one line per logged optimiser
step: TRL's logs, the ``troll/*`` metrics, and ``heldout/*`` lines from the greedy evaluations), plots.png,
model/ (the final weights and tokenizer, ~0.5 GB for the default model; not with ``--no-model``) and summary.json
(held-out greedy accuracy before and after, wall time). While the run trains it also holds checkpoint-N/ (the last
Trainer checkpoint with its optimiser state, ~1.1 GB, for ``--resume`` of an interrupted run); a run that finishes
deletes it unless ``--keep-checkpoints`` (needed only to extend a finished run later with ``--resume --steps``).

Departures from a full-scale setup, all for a 2-core CPU: a 135M model, short completions, a few optimiser steps,
no reference-model KL (beta = 0, as the TROLL paper and DAPO), a constant learning rate.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from troll.train import model as model_lib
from troll.train import options, tasks
from troll.train.options import LOSSES, TROLL_LOSSES, RunOptions

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PLOTS_FILE = "plots.png"
MODEL_DIR = "model"


def trainer_classes(loss: str):
    """(config class, trainer class): TROLL's subclasses for the TROLL losses, TRL's own otherwise."""
    try:
        from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer
    except ImportError as err:
        if loss in TROLL_LOSSES:
            msg = f"--loss {loss} needs troll.integrations.trl, which failed to import: {err}"
            raise options.UsageError(msg) from err
        from trl import GRPOConfig, GRPOTrainer

        return GRPOConfig, GRPOTrainer
    return TrollGRPOConfig, TrollGRPOTrainer


def build_config(opts: RunOptions, config_cls):
    """The TRL config of a run: one CPU process, rollout = prompts x generations, steps_per_rollout steps each."""
    loss_type, level, _, _ = LOSSES[opts.loss]
    extra = {}
    if opts.loss in TROLL_LOSSES:
        extra = dict(troll_kl_bound=opts.eps, troll_alpha=opts.alpha, troll_top_k=opts.top_k, troll_delta=opts.delta)
    elif opts.loss == "cispo":
        extra = dict(epsilon_high=opts.eps)  # TRL's cispo caps the detached ratio at epsilon_high
    else:
        extra = dict(epsilon=opts.eps)
    return config_cls(
        output_dir=opts.out,
        loss_type=loss_type,
        importance_sampling_level=level,
        per_device_train_batch_size=opts.batch_size,
        steps_per_generation=opts.steps_per_rollout,
        gradient_accumulation_steps=1,
        num_generations=opts.generations,
        max_completion_length=opts.max_completion_length,
        temperature=opts.temperature,
        max_steps=opts.steps,
        learning_rate=opts.lr,
        lr_scheduler_type="constant",
        beta=0.0,
        logging_steps=1,
        save_strategy="steps" if opts.save_every else "no",
        save_steps=opts.save_every or 1,
        save_total_limit=1,
        seed=opts.seed,
        data_seed=opts.seed,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **extra,
    )


def write_config(opts: RunOptions, command: str = "train") -> None:
    import torch
    import transformers
    import trl

    import troll

    data = {
        "command": command,
        "options": opts.to_json(),
        "versions": {
            "troll": troll.__version__,
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "argv": sys.argv,
    }
    Path(opts.out, options.CONFIG_FILE).write_text(json.dumps(data, indent=2) + "\n")


def read_metrics(out: Path) -> list[dict]:
    path = out / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_metrics(out: Path, step: int) -> list[dict]:
    """Drop the lines logged after ``step`` (an interrupted run's steps that --resume will redo)."""
    rows = [r for r in read_metrics(out) if r.get("step", 0) <= step]
    (out / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def train(opts: RunOptions, *, resume: bool = False, keep_checkpoints: bool = False, save_model: bool = True) -> dict:
    """Run ``opts`` (resolved and validated; the folder checked) and return the summary written to summary.json.

    ``save_model``: write the final weights to model/. ``keep_checkpoints``: keep checkpoint-N/ after the run
    finishes (otherwise deleted once summary.json is written; an interrupted run keeps its checkpoint).
    """
    import torch

    from troll.train.callbacks import HeldoutEval, RunLog

    start = time.time()
    torch.set_num_threads(opts.threads)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = options.last_checkpoint(out) if resume else None
    rows = truncate_metrics(out, int(checkpoint.name.split("-")[-1])) if checkpoint else []
    write_config(opts)
    config_cls, trainer_cls = trainer_classes(opts.loss)
    model, tokenizer = model_lib.load_model(model_lib.resolve_model(opts.model))
    task = _build_task(opts)
    chat = tokenizer.chat_template is not None
    log = RunLog(out / METRICS_FILE, total=opts.steps)
    heldout = HeldoutEval(task, tokenizer, log, every=opts.eval_every, max_new_tokens=opts.max_completion_length)
    before = _before(rows) if checkpoint else None
    if before is None:
        before = heldout.run(model, step=0)
    trainer = trainer_cls(
        model=model,
        reward_funcs=[tasks.TaskReward(task.train)],
        args=build_config(opts, config_cls),
        train_dataset=tasks.train_dataset(task, chat),
        processing_class=tokenizer,
        callbacks=[log, heldout],
    )
    _drop_printer(trainer)
    train_start = time.time()
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    train_time = time.time() - train_start
    after = heldout.run(trainer.model, step=trainer.state.global_step)
    log.close()
    if save_model:
        trainer.save_model(str(out / MODEL_DIR))
    summary = _summary(
        opts, before, after, read_metrics(out), train_time, time.time() - start, resumed=bool(checkpoint)
    )
    _write_summary(out, summary)
    _plot(out, opts)
    if not keep_checkpoints:
        for path in out.glob("checkpoint-*"):
            shutil.rmtree(path, ignore_errors=True)
    return summary


def _drop_printer(trainer) -> None:
    """With its own bar off (disable_tqdm), Trainer prints every log dict; metrics.jsonl and our bar have them."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def _build_task(opts: RunOptions) -> tasks.Task:
    rollouts = -(-opts.steps // opts.steps_per_rollout)
    n_train = max(64, 2 * rollouts * opts.prompts_per_step)  # spare items for the ones dropped as held out
    return tasks.build_task(opts.task, seed=opts.seed, n_train=n_train, n_heldout=opts.heldout)


def _before(rows: list[dict]) -> dict | None:
    for row in rows:
        if row.get("step") == 0 and "heldout/accuracy" in row:
            return {"accuracy": row["heldout/accuracy"], "score": row.get("heldout/score"), "n": row.get("heldout/n")}
    return None


def _summary(opts, before, after, rows, train_time, wall_time, resumed) -> dict:
    rewards = [r["reward"] for r in rows if "reward" in r]
    tail = rewards[-max(1, len(rewards) // 4) :]
    return {
        "loss": opts.loss,
        "task": opts.task,
        "model": opts.model,
        "steps": opts.steps,
        "eps": opts.eps,
        "heldout_accuracy_before": _value(before, "accuracy"),
        "heldout_accuracy_after": _value(after, "accuracy"),
        "heldout_n": _value(after, "n"),
        "reward_first": rewards[0] if rewards else None,
        "reward_last_quarter_mean": sum(tail) / len(tail) if tail else None,
        "train_time_s": round(train_time, 1),
        "wall_time_s": round(wall_time, 1),
        "resumed": resumed,
        "samples_after": after.get("samples", []) if isinstance(after, dict) else [],
    }


def _value(result, key):
    return result.get(key) if isinstance(result, dict) else None


def _write_summary(out: Path, summary: dict) -> None:
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")


def _plot(out: Path, opts: RunOptions) -> None:
    from troll.train import plots

    title = f"{opts.loss} (eps {opts.eps:g}) on {opts.task}, {opts.model}, seed {opts.seed}"
    plots.plot_run(read_metrics(out), out / PLOTS_FILE, steps_per_rollout=opts.steps_per_rollout, title=title)
