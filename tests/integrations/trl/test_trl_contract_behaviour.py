"""The TRL contract of TrollGRPOTrainer by behaviour, on a tiny random Llama (one trainer for the module, from
tests/support/_trl_contract.py): the attributes the trainer reads, TRL's scored batch and when it holds old log-probs,
_prepare_inputs' split, the log-prob method, _compute_loss's normalisations, compute_loss, log, the model card and
one training step. The signatures and source fingerprints are pinned in tests/integrations/trl/test_trl_contract.py.
Every failure reads "TRL changed <X>: <what differs>; see docs/trl.md, 'Upgrading TRL'".
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from unittest.mock import ANY, patch

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("trl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# one_thread, scored_fixture and tr_fixture: the fixtures of this module (pytest finds them among its names)
from _trl_contract import Spy, changed, one_thread, report, rollout_rows, scored_fixture, tr_fixture  # noqa: E402, F401
from accelerate import Accelerator  # noqa: E402
from tiny import PROMPTS  # noqa: E402
from trl import GRPOTrainer  # noqa: E402
from trl.trainer.utils import split_tensor_dict  # noqa: E402

from troll.integrations.trl.trainer import TROLL_PAPER  # noqa: E402

# Keys of TRL's scored batch that the trainer reads (tool_mask only exists with tools; its use is checked below).
BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch")
OLD_KEY = "old_per_token_logps"  # present exactly when TRL computes old log-probs: when the trainer captures


# ------------------------------------------------------------------------------------------ fields and attributes


def test_trainer_attributes(tr):
    """The GRPOTrainer (and transformers Trainer) attributes the trainer reads, with their types and meaning."""
    args = tr.args
    expected = {  # attribute: (type, value or ANY)
        "loss_type": (str, args.loss_type),
        "temperature": (float, args.temperature),
        "max_completion_length": (int, args.max_completion_length),
        "num_iterations": (int, args.num_iterations),
        "aux_loss_enabled": (bool, False),  # a dense Llama: no MoE auxiliary loss
        "beta": (float, 0.0),
        "is_fsdp_enabled": (bool, False),
        "loss_is_scaled_for_ga": (bool, True),  # transformers must not divide the loss by the accumulation again
        "accelerator": (Accelerator, ANY),
        "_metrics": (dict, ANY),
    }
    problems = []
    for name, (kind, value) in expected.items():
        if not hasattr(tr, name):
            problems.append(changed(f"GRPOTrainer.{name}", "the attribute is gone"))
        elif not isinstance(getattr(tr, name), kind) or getattr(tr, name) != value:
            got = getattr(tr, name)
            problems.append(changed(f"GRPOTrainer.{name}", f"{got!r} ({type(got).__name__}), expected {value!r}"))
    if not isinstance(args.steps_per_generation, int):
        problems.append(changed("GRPOConfig.steps_per_generation", "not resolved to an int in __post_init__"))
    metrics = getattr(tr, "_metrics", {})
    for mode in ("train", "eval"):
        window = metrics.get(mode)
        if not isinstance(window, defaultdict) or window.default_factory is not list:
            problems.append(changed(f"GRPOTrainer._metrics[{mode!r}]", f"{window!r} is not a defaultdict(list)"))
    for name in ("unwrap_model", "autocast", "gather", "num_processes", "device"):
        if not hasattr(tr.accelerator, name):
            problems.append(changed("GRPOTrainer.accelerator", f"it has no {name}"))
    unwrapped = tr.accelerator.unwrap_model(tr.model)
    if not isinstance(getattr(unwrapped, "base_model", None), torch.nn.Module) or unwrapped.base_model is unwrapped:
        problems.append(changed("the model's backbone", "model.base_model is not the backbone module"))
    report(problems)


# ------------------------------------------------------------------------------------------ behaviour


def test_generate_and_score_completions_contract(tr, scored):
    """A dict holding the keys the trainer reads, every tensor with the batch dim first (num_items_in_batch a
    scalar), prompts left- and completions right-padded, old log-probs from one no-grad call of
    _get_per_token_logps_and_entropies on self.model in chunks of per_device_train_batch_size."""
    what = "GRPOTrainer._generate_and_score_completions"
    batch, calls = scored
    problems = [changed(what, f"its batch has no {key!r}") for key in (*BATCH_KEYS, OLD_KEY) if key not in batch]
    report(problems)
    b, t = batch["completion_ids"].shape
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0 and value.size(0) != b:
            problems.append(changed(what, f"{key!r} has shape {tuple(value.shape)}, not the batch dim ({b}) first"))
    n = batch["num_items_in_batch"]
    if n.ndim != 0 or n.item() != batch["completion_mask"].sum().item():
        problems.append(changed(what, f"num_items_in_batch is {n!r}, not the 0-dim count of loss tokens"))
    if batch["advantages"].shape != (b,):
        problems.append(changed(what, f"advantages has shape {tuple(batch['advantages'].shape)}, not ({b},)"))
    if not bool(batch["prompt_mask"][:, -1].all()):
        problems.append(changed(what, "prompts are not left-padded (a completion must follow its prompt's last token)"))
    mask = batch["completion_mask"]
    if not bool((mask[:, 1:] <= mask[:, :-1]).all()):
        problems.append(changed(what, "completions are not right-padded"))
    no_grad = [c for c in calls if not c["grad"]]
    if len(no_grad) != 1:
        problems.append(changed(what, f"{len(no_grad)} no-grad log-prob calls while scoring, expected 1"))
    else:
        call = no_grad[0]
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        used = (call["model"] is tr.model, call["t"], call.get("batch_size"))
        if used != (True, t, tr.args.per_device_train_batch_size):
            problems.append(
                changed(what, f"old log-probs computed with (self.model, logits_to_keep, batch_size) {used}")
            )
        if not torch.equal(call["ids"], ids) or not torch.equal(call["out"][0], batch.get(OLD_KEY)):
            problems.append(changed(what, f"{OLD_KEY} is not the log-probs of prompt + completion ids"))
    report(problems)


@pytest.mark.parametrize(
    ("accumulation", "steps", "iterations"), [(1, 2, 1), (2, 2, 1), (1, 1, 2), (2, 1, 1), (3, 2, 1)]
)
def test_old_log_probs_exactly_when_a_batch_feeds_several_steps(tr, accumulation, steps, iterations):
    """TRL's criterion for old log-probs, which TrollGRPOTrainer._troll_needs_old mirrors to decide whether to capture
    the old policy: iff gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0."""
    args, saved = tr.args, (tr.args.gradient_accumulation_steps, tr.args.steps_per_generation, tr.num_iterations)
    args.gradient_accumulation_steps, args.steps_per_generation, tr.num_iterations = accumulation, steps, iterations
    try:
        spy = Spy(tr)
        batch = spy.score([{"prompt": p} for p in PROMPTS[:2] for _ in range(tr.num_generations)])
    finally:
        args.gradient_accumulation_steps, args.steps_per_generation, tr.num_iterations = saved
    expected = accumulation % (steps * iterations) != 0
    computed = any(not c["grad"] for c in spy.calls)
    assert computed == expected == (OLD_KEY in batch), changed(
        "GRPOTrainer._generate_and_score_completions",
        f"with gradient_accumulation_steps={accumulation}, steps_per_generation={steps}, num_iterations={iterations} "
        f"old log-probs computed: {computed}, {OLD_KEY} in the batch: {OLD_KEY in batch}, expected {expected}; "
        "adapt TrollGRPOTrainer._troll_needs_old",
    )


def test_prepare_inputs_keeps_each_row_together(tr):
    """TRL's buffering: one scoring per steps_per_generation * num_iterations steps, then shuffled and split into
    steps_per_generation micro-batches, every tensor with a batch dim (the trainer's troll_old_* (B, T, K) too) by
    the same rows, 0-dim tensors kept whole."""
    what = "GRPOTrainer._prepare_inputs"
    b, spg = 16, tr.args.steps_per_generation
    row = torch.arange(b)

    def score(rows):
        return {
            "prompt_ids": row[:, None].repeat(1, 5),
            "completion_ids": row[:, None].repeat(1, 3),
            "advantages": row.double(),
            "num_items_in_batch": torch.tensor(123.0),
            "troll_old_ids": row[:, None, None].repeat(1, 3, 2),
            "troll_old_log_rest": row[:, None].repeat(1, 3).float(),
        }

    tr._step, tr._buffered_inputs = 0, None
    micro = []
    try:
        with patch.object(tr, "_generate_and_score_completions", side_effect=score) as generate:
            for step in range(2 * spg * tr.num_iterations):
                tr._step = step
                micro.append(tr._prepare_inputs(rollout_rows(tr)))
    finally:
        tr._step, tr._buffered_inputs = 0, None
    problems = []
    if generate.call_count != 2:
        problems.append(changed(what, f"scored {generate.call_count} times in {len(micro)} steps, expected 2"))
    for i, batch in enumerate(micro):
        ids = batch["prompt_ids"][:, 0]
        if ids.numel() != b // spg:
            problems.append(changed(what, f"micro-batch {i} has {ids.numel()} rows, expected {b // spg}"))
        for key, value in batch.items():
            if value.ndim == 0:
                if value.item() != 123.0:
                    problems.append(changed(what, f"the 0-dim {key!r} became {value!r}"))
            elif not torch.equal(flat := value.reshape(len(value), -1), ids[:, None].to(value.dtype).expand_as(flat)):
                problems.append(changed(what, f"{key!r} is not split and shuffled with the batch's rows"))
    first = torch.cat([m["prompt_ids"][:, 0] for m in micro[:spg]]).sort().values
    if not torch.equal(first, row):
        problems.append(changed(what, "one scored batch's micro-batches do not cover each row once"))
    report(problems)


def test_per_token_logps_contract(tr, scored):
    """(B, T) log-probs of the sampled tokens under softmax(logits / temperature), through the model's forward (its
    hooks fire once per chunk of batch_size rows) which calls the backbone, model.base_model, with input_ids; the
    backbone's last_hidden_state is the LM head's input (what the trainer's capture hook reads)."""
    what = "GRPOTrainer._get_per_token_logps_and_entropies"
    batch, _ = scored
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    tokens, keep = batch["completion_ids"], batch["completion_mask"].bool()
    b, t = tokens.shape
    unwrapped = tr.accelerator.unwrap_model(tr.model)
    seen = []

    def backbone_hook(module, args, kwargs, output):  # what TrollGRPOTrainer._troll_capture_hooks reads
        seen.append(("backbone", kwargs.get("input_ids", args[0] if args else None), output.last_hidden_state))

    hooks = [
        unwrapped.base_model.register_forward_hook(backbone_hook, with_kwargs=True),
        unwrapped.register_forward_hook(lambda module, args, output: seen.append(("model",))),
    ]
    try:
        with torch.no_grad():
            out = GRPOTrainer._get_per_token_logps_and_entropies(
                tr, tr.model, ids, mask, t, batch_size=3, compute_entropy=True
            )
    finally:
        for hook in hooks:
            hook.remove()
    problems = []
    if not (isinstance(out, tuple) and len(out) == 3):
        pytest.fail(changed(what, f"returns a {type(out).__name__}, not (logps, entropies, aux_loss)"))
    logps, entropies, aux = out
    if logps.shape != (b, t) or entropies is None or entropies.shape != (b, t) or aux is not None:
        problems.append(changed(what, f"returns shapes {logps.shape}, {getattr(entropies, 'shape', None)}, {aux}"))
    starts = list(range(0, b, 3))
    order = [kind[0] for kind in seen]
    if order != ["backbone", "model"] * len(starts):
        problems.append(changed(what, f"forward hooks fired {order}, expected backbone then model per chunk of 3"))
    else:
        for start, (_, chunk_ids, _) in zip(starts, seen[::2]):
            if chunk_ids is None or not torch.equal(chunk_ids, ids[start : start + 3]):
                problems.append(changed(what, f"the backbone got no input_ids keyword for rows {start}:{start + 3}"))
        with torch.no_grad():
            logits = unwrapped(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -(t + 1) : -1]
            hidden = torch.cat([entry[2] for entry in seen[::2]])[:, -(t + 1) : -1]
            head = unwrapped.get_output_embeddings()(hidden)
        for source, z in (("the model's logits", logits), ("the backbone's last_hidden_state", head)):
            ref = F.log_softmax(z.float() / tr.temperature, -1).gather(-1, tokens[..., None]).squeeze(-1)
            err = (logps - ref)[keep].abs().max().item()
            if err > 1e-5:
                problems.append(
                    changed(what, f"log-probs differ from log_softmax({source} / temperature) by {err:.3g}")
                )
    report(problems)


def _ratio_one_inputs(batch, spg):
    """A micro-batch of TRL's scored batch without old log-probs (ratio exactly 1), with spread advantages and ragged
    completion masks so that the loss types' normalisations differ."""
    inputs = {k: v for k, v in split_tensor_dict(batch, spg)[0].items() if k != OLD_KEY}
    b = inputs["completion_ids"].size(0)
    inputs["advantages"] = torch.linspace(-1.0, 2.0, b)
    inputs["completion_mask"] = inputs["completion_mask"].clone()
    inputs["completion_mask"][::2, 5:] = 0
    inputs["completion_mask"][1::3, 2:] = 0
    return inputs


def _expected_loss(tr, inputs, loss_type, train, accumulation, mask):
    """What TRL's loss is at ratio 1 (per-token loss -A): the normalisation TrollGRPOTrainer._troll_loss_scale and the
    TROLL aggregations mirror. "dapo": token sum over num_items_in_batch / processes (times accumulation over
    steps_per_generation in training); "grpo": mean over sequences of token means; "dr_grpo": token sum over
    B x max_completion_length; both divided by the accumulation in training."""
    per_token = -inputs["advantages"][:, None] * mask
    if loss_type == "dapo":
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / tr.accelerator.num_processes
        if train:
            normalizer = normalizer * accumulation / tr.args.steps_per_generation
        return per_token.sum() / normalizer
    if loss_type == "grpo":
        loss = (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    else:
        loss = per_token.sum() / (mask.size(0) * tr.max_completion_length)
    return loss / (accumulation if train else 1)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_compute_loss_normalisation(tr, scored, loss_type):
    """The scaled scalar TRL's _compute_loss returns at ratio 1, in training (current_gradient_accumulation_steps)
    and evaluation, with tool tokens (tool_mask) left out of the loss; TRL's "entropy" metric, one value a call; one
    backbone forward on the whole micro-batch (troll_measure_kl keeps its hidden states with a hook)."""
    what = f"GRPOTrainer._compute_loss (loss_type={loss_type!r})"
    inputs = _ratio_one_inputs(scored[0], tr.args.steps_per_generation)
    tool = torch.ones_like(inputs["completion_mask"])
    tool[:, 1] = 0
    problems, rows = [], []
    backbone = tr.accelerator.unwrap_model(tr.model).base_model
    hook = backbone.register_forward_hook(lambda module, args, output: rows.append(len(output.last_hidden_state)))
    try:
        tr.loss_type, tr.current_gradient_accumulation_steps = loss_type, 2
        for train, extra in ((True, {}), (False, {}), (True, {"tool_mask": tool})):
            tr.model.train(train)
            mode = "train" if train else "eval"
            tr._metrics[mode].clear()
            case = {**inputs, **extra}
            rows.clear()
            with torch.no_grad():
                loss = GRPOTrainer._compute_loss(tr, tr.model, case)
            if rows != [len(case["completion_ids"])]:
                problems.append(changed(what, f"backbone forwards on {rows} rows, not one on the micro-batch"))
            mask = case["completion_mask"] * case.get("tool_mask", 1)
            expected = _expected_loss(tr, case, loss_type, train, 2, mask)
            label = f"{mode}{' with tool_mask' if extra else ''}"
            if loss.ndim != 0 or not torch.allclose(loss.float(), expected.float(), rtol=1e-5, atol=1e-7):
                problems.append(changed(what, f"{label}: returns {loss.tolist()}, expected {expected.item():.6g}"))
            if len(tr._metrics[mode].get("entropy", [])) != 1:
                problems.append(changed(what, f"{label}: logged {dict(tr._metrics[mode])}, no one 'entropy' value"))
    finally:
        hook.remove()
        tr.loss_type = tr.args.loss_type
        tr.model.train()
        tr._metrics["train"].clear()
        tr._metrics["eval"].clear()
    report(problems)


def test_compute_loss_returns_private_compute_loss(tr):
    """Transformers calls compute_loss; TRL's hands (model, inputs) to _compute_loss, which the trainer overrides."""
    sentinel, model, inputs = torch.tensor(1.5), object(), {"a": torch.zeros(1)}
    with patch.object(tr, "_compute_loss", return_value=sentinel) as private:
        out = GRPOTrainer.compute_loss(tr, model, inputs, num_items_in_batch=torch.tensor(3))
    assert out is sentinel and private.call_args.args == (model, inputs), changed(
        "GRPOTrainer.compute_loss", f"returned {out!r} after calling _compute_loss with {private.call_args}"
    )


def test_log_averages_each_metric_list_over_the_window(tr):
    """TRL's log: the mean of each _metrics[mode] list, then the lists are cleared. The trainer keeps a window's max
    (min) as a one-element list so that it is logged as such."""
    tr.model.train()
    tr._metrics["train"].clear()
    tr._metrics["train"]["troll/a/mean"] += [1.0, 2.0, 6.0]
    tr._metrics["train"]["troll/a/max"] += [5.0]
    tr.log({"loss": 0.5})
    logged = tr.state.log_history[-1]
    got = {k: logged.get(k) for k in ("troll/a/mean", "troll/a/max", "loss")}
    problems = []
    if got != {"troll/a/mean": 3.0, "troll/a/max": 5.0, "loss": 0.5}:
        problems.append(changed("GRPOTrainer.log", f"logged {got} for the windows [1, 2, 6] and [5]"))
    if dict(tr._metrics["train"]):
        problems.append(changed("GRPOTrainer.log", f"_metrics['train'] not cleared: {dict(tr._metrics['train'])}"))
    report(problems)


def test_model_card_reads_name_paper_and_tags(tr):
    tr.create_model_card()
    card = (Path(tr.args.output_dir) / "README.md").read_text()
    wanted = {
        "_name": tr._name,
        "_paper['id']": TROLL_PAPER["id"],
        "_paper['citation'] (TROLL's)": "becker2025troll",
        "_paper['citation'] (GRPO's)": "shao2024deepseekmath",
        "_tag_names": "- troll",
    }
    missing = [key for key, text in wanted.items() if text not in card]
    assert not missing, changed("create_model_card", f"the card does not show the trainer's {missing}")


def test_training_sets_the_accumulation_steps(tr):
    """current_gradient_accumulation_steps is set by the training loop (transformers), read by TRL's loss and by
    TrollGRPOTrainer._troll_loss_scale. One real step: the TROLL metrics reach the log through TRL's _metrics."""
    tr.current_gradient_accumulation_steps = -1
    try:
        tr.train()
    except Exception as err:
        pytest.fail(changed("GRPOTrainer's training step", f"one TROLL training step raised {err!r}"))
    problems = []
    if tr.current_gradient_accumulation_steps != tr.args.gradient_accumulation_steps:
        got = tr.current_gradient_accumulation_steps
        problems.append(changed("current_gradient_accumulation_steps", f"{got!r} after a training step"))
    logged = [entry for entry in tr.state.log_history if "loss" in entry and "troll/ratio/mean" in entry]
    if not logged:
        problems.append(changed("GRPOTrainer.log", "the TROLL metrics of a training step were not logged"))
    report(problems)
