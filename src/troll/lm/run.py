"""One ``troll train`` run: a GRPO run with TROLL or a clipped loss, written into a run folder.

The folder holds config.json (the resolved options and versions), metrics.jsonl (one line per logged optimiser
step: TRL's logs, the ``troll/*`` metrics, and ``heldout/*`` lines from the greedy evaluations), plots.png,
model/ (the final weights and tokenizer with a model card, ~0.5 GB for the default model; not with ``--no-model``)
and summary.json (held-out greedy accuracy before and after, wall time), written last: a run is finished when it
exists. While the run trains it also holds checkpoint-N/ (the last complete Trainer checkpoint with its optimiser
state, ~1.1 GB, for ``--resume`` of an interrupted run); a run that finishes deletes it unless
``--keep-checkpoints`` (needed only to extend a finished run later with ``--resume --steps``).

Killed at any moment (SIGKILL included), a run resumes with ``--resume`` from its newest complete checkpoint
(:mod:`troll.lm.checkpoints`), with metrics.jsonl cut back to what that checkpoint had logged, so that every
step appears once; it starts over when no checkpoint was complete. JSON files are replaced atomically. Checkpoints
fall between rollout batches (``save_every`` is a multiple of ``steps_per_rollout``), and the Trainer restores the
RNG states, optimiser and data order, so on CPU with one thread a resumed run ends with the same weights and
metrics as an uninterrupted one (tests/lm/test_run_faults.py).

Departures from a full-scale setup, all for a 2-core CPU: a 135M model, short completions, a few optimiser steps,
no reference-model KL by default (beta = 0, as the TROLL paper and DAPO; --beta for the other losses), a
constant learning rate.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from troll import runs
from troll.lm import checkpoints, tasks
from troll.lm import model as model_lib
from troll.lm.metrics import read_metrics
from troll.lm.options import (
    COMMAND,
    LOSSES,
    RESUMABLE_FIELDS,
    TROLL_LOSSES,
    RunOptions,
    UsageError,
    bound_name,
    check_run,
    saved_options,
)
from troll.runs import protocol
from troll.runs.files import METRICS_FILE, SUMMARY_FILE, write_json

PLOTS_FILE = "plots.png"
MODEL_DIR = "model"


def trainer_classes(loss: str):
    """(config class, trainer class): TROLL's subclasses for the TROLL losses, TRL's own otherwise."""
    try:
        from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer
    except ImportError as err:
        if loss in TROLL_LOSSES:
            msg = f"--loss {loss} needs troll.integrations.trl, which failed to import: {err}"
            raise UsageError(msg) from err
        from trl import GRPOConfig, GRPOTrainer

        return GRPOConfig, GRPOTrainer
    return TrollGRPOConfig, TrollGRPOTrainer


def build_config(opts: RunOptions, config_cls):
    """The TRL config of a run: one CPU process, rollout = prompts x generations, steps_per_rollout steps each."""
    spec = LOSSES[opts.loss]
    support = dict(troll_top_k=opts.top_k, troll_delta=opts.delta, troll_tail=opts.tail)
    if opts.loss in TROLL_LOSSES:
        extra = dict(troll_kl_bound=opts.kl_bound, troll_alpha=opts.alpha, troll_agg=opts.agg, **support)
    elif opts.loss == "cispo":
        extra = dict(epsilon_high=opts.cispo_cap)  # TRL's cispo caps the detached ratio at epsilon_high
    else:  # a clip loss: TRL's epsilon, epsilon_high (clip-higher) and delta (dual clip)
        extra = dict(epsilon=opts.clip_eps, epsilon_high=opts.clip_eps_high, delta=opts.dual_clip or None)
    if opts.measures_kl:
        if not hasattr(config_cls, "troll_measure_kl"):
            raise UsageError("--measure-kl needs troll.integrations.trl, which failed to import; pass --measure-kl off")
        extra.update(troll_measure_kl=True, **support)
    return config_cls(
        output_dir=opts.out,
        loss_type=spec.loss_type,
        importance_sampling_level=spec.level,
        per_device_train_batch_size=opts.batch_size,
        steps_per_generation=opts.steps_per_rollout,
        gradient_accumulation_steps=1,
        num_generations=opts.generations,
        max_completion_length=opts.max_completion_length,
        temperature=opts.temperature,
        max_steps=opts.steps,
        learning_rate=opts.lr,
        lr_scheduler_type="constant",
        beta=opts.beta,
        logging_steps=1,
        save_strategy="steps" if opts.save_every else "no",
        save_steps=opts.save_every or 1,
        save_total_limit=None,  # our Checkpoints callback keeps one, removing the old only once the new is whole
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


def versions() -> dict[str, str]:
    import torch
    import transformers
    import trl

    import troll

    return {"troll": troll.__version__, "trl": trl.__version__, "transformers": transformers.__version__,
            "torch": torch.__version__}  # fmt: skip


def write_config(opts: RunOptions, *, fresh: bool) -> None:
    """config.json: the options, the library versions and the command line (:mod:`troll.runs.protocol`); ``fresh``:
    with an empty metrics.jsonl. A resumed run writes it again, with the options it may change (--steps, ...)."""
    write = protocol.start if fresh else protocol.write_config
    write(Path(opts.out), COMMAND, opts.to_json(), "options", versions=versions(), argv=sys.argv)


def train(opts: RunOptions, *, resume: bool = False, keep_checkpoints: bool = False, save_model: bool = True) -> dict:
    """Run ``opts`` (resolved) and return the summary written to summary.json, through the run protocol
    (:func:`troll.runs.protocol.run`): the folder held, checked before anything is written, a finished run's summary
    returned as it is.

    ``resume``: continue from the newest complete checkpoint (or start over if there is none); the folder's options
    may differ from ``opts`` only in :data:`~troll.lm.options.RESUMABLE_FIELDS`, and a finished run continues only
    when ``opts.steps`` goes past its kept checkpoint. ``save_model``: write the final weights and the model card to
    model/. ``keep_checkpoints``: keep checkpoint-N/ after the run finishes (otherwise deleted once summary.json is
    written; an interrupted run keeps its checkpoint).
    """
    import torch

    check_run(opts)  # shared options (loss None) are no run: refused before the folder is touched
    start = time.time()
    torch.set_num_threads(opts.threads)
    out = Path(opts.out)

    def prepare():
        config, finished = protocol.prepare(
            opts,
            out,
            command=COMMAND,
            resume=resume,
            saved=saved_options,  # UsageError naming what is wrong in a damaged config.json
            kind="GRPO",
            resumable=(*RESUMABLE_FIELDS, "out"),
            finished=lambda o: _finished(out, o),
        )
        if finished and not keep_checkpoints:  # killed after its summary, before its checkpoints were removed
            checkpoints.remove_all(out)
        return config, finished

    return protocol.run(
        out,
        prepare,
        lambda o: _train(o, out, start, resume=resume, keep_checkpoints=keep_checkpoints, save_model=save_model),
    )  # fmt: skip


def _finished(out: Path, opts: RunOptions) -> bool:
    """Whether a resumed run has nothing left: its summary is written, and no kept checkpoint lies before its steps
    (``--resume --steps`` extends a run that kept one)."""
    checkpoint = checkpoints.last_checkpoint(out)
    extend = checkpoint is not None and checkpoints.step_of(checkpoint) < opts.steps
    return (out / SUMMARY_FILE).is_file() and not extend


def _train(opts: RunOptions, out: Path, start: float, *, resume: bool, keep_checkpoints: bool, save_model: bool):
    from troll.lm.callbacks import Checkpoints, HeldoutEval, RunLog

    runs.begin(out, COMMAND)  # the manifest first; stale temporary files of a killed process go
    checkpoint, rows = checkpoints.prepare_resume(out) if resume else (None, [])
    write_config(opts, fresh=checkpoint is None)
    config_cls, trainer_cls = trainer_classes(opts.loss)
    ref = model_lib.resolve_model(opts.model)
    model, tokenizer = model_lib.load_model(ref)
    task = _build_task(opts)
    log = RunLog(out / METRICS_FILE, total=opts.steps, lines=len(rows))
    heldout = HeldoutEval(task, tokenizer, log, every=opts.eval_every, max_new_tokens=opts.max_completion_length,
                          samples=opts.heldout_samples, temperature=opts.temperature, seed=opts.seed)  # fmt: skip
    before = (_before(rows) if checkpoint else None) or heldout.run(model, step=0)
    # Killed after its last optimiser step (during the final evaluation or the writing of model/): the checkpoint
    # holds the final weights. Not through trainer.train(), which on a checkpoint at max_steps runs one step more.
    trained = checkpoint is not None and checkpoints.step_of(checkpoint) >= opts.steps
    if trained:
        model = model_lib.load_weights(checkpoint)
    trainer = trainer_cls(
        model=model,
        reward_funcs=[tasks.task_reward(task, code_reward=opts.code_reward)],
        args=build_config(opts, config_cls),
        train_dataset=tasks.train_dataset(task, tokenizer.chat_template is not None),
        processing_class=tokenizer,
        callbacks=[log, heldout, Checkpoints(out, log)],
    )
    _quiet_trainer(trainer)
    train_start = time.time()
    if not trained:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    train_time = time.time() - train_start
    after = heldout.run(trainer.model, step=checkpoints.step_of(checkpoint) if trained else trainer.state.global_step)
    log.close()
    if save_model:
        _save_model(trainer, out / MODEL_DIR, opts, ref, before, after)
        runs.seal(out, MODEL_DIR)  # its files one by one: a user's file put there later is not the run's
    _plot(out, opts)
    summary = _summary(opts, before, after, read_metrics(out), train_time, time.time() - start, bool(checkpoint))
    write_json(out / SUMMARY_FILE, summary)  # last: from here on the run counts as finished
    if not keep_checkpoints:
        checkpoints.remove_all(out)
    return summary


def _save_model(trainer, folder: Path, opts: RunOptions, ref, before: dict, after: dict) -> None:
    """The final weights and tokenizer, then the model card written from this run's facts."""
    from troll.lm.card import RunFacts, write_card

    trainer.save_model(str(folder))
    args, model = trainer.args, trainer.model
    optimizer = (
        f"{getattr(args.optim, 'value', args.optim)} (betas {args.adam_beta1:g}, {args.adam_beta2:g}, weight decay "
        f"{args.weight_decay:g}, gradient norm clipped at {args.max_grad_norm:g})"
    )
    size = sum(p.numel() for p in model.parameters())
    facts = RunFacts(ref, f"{model.config.model_type}, {size:,} parameters", optimizer, before, after, versions())
    write_card(folder, opts, facts)


def _quiet_trainer(trainer) -> None:
    """Drop what the Trainer would write besides our files.

    With its own bar off (disable_tqdm), Trainer prints every log dict; metrics.jsonl and our bar have them. TRL
    drafts a model card into the run folder at each checkpoint, without the base model, the task or the scores;
    the run writes its own into model/ (:mod:`troll.lm.card`).
    """
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    trainer.create_model_card = lambda *args, **kwargs: None


def _build_task(opts: RunOptions) -> tasks.Task:
    rollouts = -(-opts.steps // opts.steps_per_rollout)
    n_train = max(64, 2 * rollouts * opts.prompts_per_step)  # spare items for the ones dropped as held out
    return tasks.build_task(opts.task, seed=opts.seed, n_train=n_train, n_heldout=opts.heldout, system=opts.system)


def _before(rows: list[dict]) -> dict | None:
    for row in rows:
        if row.get("step") == 0 and "heldout/accuracy" in row:
            return {k.removeprefix("heldout/"): v for k, v in row.items() if k.startswith("heldout/")}
    return None


def _summary(opts: RunOptions, before, after, rows: list[dict], train_time, wall_time, resumed: bool) -> dict:
    rewards = [r["reward"] for r in rows if "reward" in r]
    tail = rewards[-max(1, len(rewards) // 4) :]
    return {
        "loss": opts.loss,
        "task": opts.task,
        "model": opts.model,
        "steps": opts.steps,
        bound_name(opts.loss): opts.bound,  # kl_bound, clip_eps or cispo_cap, as in config.json
        "heldout_accuracy_before": _value(before, "accuracy"),
        "heldout_accuracy_after": _value(after, "accuracy"),
        "heldout_n": _value(after, "n"),
        # pass@k of --heldout-samples samples an item at the run's temperature (none when it is 0)
        **{
            f"heldout_sampled_{k}_{when}": _value(result, f"sampled_{k}")
            for when, result in (("before", before), ("after", after))
            for k in ("pass@1", "pass@4")
            if _value(result, f"sampled_{k}") is not None
        },  # fmt: skip
        "reward_first": rewards[0] if rewards else None,
        "reward_last_quarter_mean": sum(tail) / len(tail) if tail else None,
        "train_time_s": round(train_time, 1),
        "wall_time_s": round(wall_time, 1),
        "resumed": resumed,
        "samples_after": after.get("samples", []) if isinstance(after, dict) else [],
    }


def _value(result, key):
    return result.get(key) if isinstance(result, dict) else None


def _plot(out: Path, opts: RunOptions) -> None:
    from troll.lm import plots

    title = f"{opts.loss} ({bound_name(opts.loss)} {opts.bound:g}) on {opts.task}, {opts.model}, seed {opts.seed}"
    plots.plot_run(read_metrics(out), out / PLOTS_FILE, steps_per_rollout=opts.steps_per_rollout, title=title)
