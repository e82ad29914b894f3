"""The TRL contract of TrollGRPOTrainer: every TRL method it overrides or mirrors, and every TRL attribute, batch key
and config field it reads, pinned so that a TRL upgrade fails loudly (docs/trl.md, "Upgrading TRL").

TRL removed its experimental DPPO trainer after a GRPOTrainer subclass overriding private methods drifted silently
between releases. Here each pinned method has its signature and a fingerprint of its source checked (any change of
TRL's body fails), and its contract checked by behaviour on a tiny random Llama (one trainer for the module). Every
failure reads "TRL changed <X>: <what differs>; see docs/trl.md, 'Upgrading TRL'".

The trainer is built past the TRL version gate, so that on a new TRL these tests say what changed rather than only
that the version is new; ``test_supported_version_and_pins_agree`` is the gate. After reading TRL's diff and adapting
the trainer, ``python tests/test_trl_contract.py --write`` re-pins PINNED for the installed TRL (without --write it
prints them).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import json
import os
import re
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from unittest.mock import ANY, patch

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("trl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import trl  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.utils import split_tensor_dict  # noqa: E402

from troll.integrations.trl import SUPPORTED_TRL, TRL_LOSS_TYPES, TrollGRPOConfig, TrollGRPOTrainer  # noqa: E402
from troll.integrations.trl.trainer import TROLL_PAPER  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny import PROMPTS, reward_letter_a, tiny_dataset, tiny_model, tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).parent.parent

# GRPOTrainer members TrollGRPOTrainer overrides; the test below fails when the trainer overrides any other.
OVERRIDDEN = ("__init__", "_generate_and_score_completions", "_get_per_token_logps_and_entropies", "_compute_loss")
OVERRIDDEN_ATTRIBUTES = ("_tag_names",)  # extended with "troll"; create_model_card reads it
# Source fingerprint and signature (annotations dropped) of the overridden methods and of those whose behaviour the
# trainer relies on: compute_loss (dispatches to _compute_loss), _prepare_inputs (buffers, shuffles and splits the
# scored batch, troll_old_* included), log (one mean per metric list and logging window). Re-pin with
# `python tests/test_trl_contract.py --write` once TRL's diff is read and the trainer adapted.
# BEGIN PINNED (TRL 1.16.0)
# fmt: off
PINNED = {
    "GRPOTrainer.__init__": ("08b825a073b699ff", ("self", "model", "reward_funcs=None", "args=None",
        "train_dataset=None", "eval_dataset=None", "processing_class=None", "reward_processing_classes=None",
        "callbacks=None", "optimizers=(None, None)", "quantization_config=None", "peft_config=None", "tools=None",
        "rollout_func=None", "environment_factory=None",
    )),
    "GRPOTrainer._generate_and_score_completions": ("3d5cec813b83b396", ("self", "inputs",)),
    "GRPOTrainer._get_per_token_logps_and_entropies": ("fecf708797b16e29", ("self", "model", "input_ids",
        "attention_mask", "logits_to_keep", "batch_size=None", "compute_entropy=False", "compute_aux_loss=False",
        "pixel_values=None", "image_grid_thw=None", "num_images=None", "pixel_attention_mask=None",
        "spatial_shapes=None", "num_tiles=None", "image_sizes=None", "token_type_ids=None", "mm_token_type_ids=None",
        "image_position_ids=None",
    )),
    "GRPOTrainer._compute_loss": ("16c4f3917b9fd264", ("self", "model", "inputs",)),
    "GRPOTrainer.compute_loss": ("adf7308e034ac6c4", ("self", "model", "inputs", "return_outputs=False",
        "num_items_in_batch=None",
    )),
    "GRPOTrainer._prepare_inputs": ("40caff99c2cf1292", ("self", "generation_batch",)),
    "GRPOTrainer.log": ("14517d3dbad259c0", ("self", "logs", "start_time=None",)),
}
# fmt: on
# END PINNED

# GRPOConfig fields the trainer or TrollGRPOConfig reads: (annotation, default; ANY: any default). The fields TROLL
# rejects need TRL's default to be the compatible value, so that TrollGRPOConfig() is valid as it stands.
CONFIG_FIELDS = {
    "loss_type": ("str", ANY),
    "temperature": ("float", ANY),
    "max_completion_length": ("int | None", ANY),
    "num_iterations": ("int", ANY),
    "steps_per_generation": ("int | None", ANY),
    "gradient_accumulation_steps": ("int", ANY),
    "per_device_train_batch_size": ("int", ANY),
    "importance_sampling_level": ("str", "token"),
    "beta": ("float", 0.0),
    "entropy_coef": ("float", 0.0),
    "use_adaptive_entropy": ("bool", False),
    "top_entropy_quantile": ("float", 1.0),
    "off_policy_mask_threshold": ("float | None", None),
    "use_vllm": ("bool", False),
    "vllm_importance_sampling_correction": ("bool", ANY),
    "router_aux_loss_coef": ("float | None", ANY),  # named in the trainer's MoE error message
    "epsilon": ("float", ANY),  # TRL's clip options: documented as unused by the TROLL loss types
    "epsilon_high": ("float | None", ANY),
    "delta": ("float | None", ANY),
}
# Keys of TRL's scored batch that the trainer reads (tool_mask only exists with tools; its use is checked below).
BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch")
OLD_KEY = "old_per_token_logps"  # present exactly when TRL computes old log-probs: when the trainer captures
_CLASS_BOOKKEEPING = {"__module__", "__doc__", "__qualname__", "__annotations__", "__firstlineno__"}
_CLASS_BOOKKEEPING |= {"__static_attributes__", "__dict__", "__weakref__"}


def changed(what: str, detail: str) -> str:
    return f"TRL changed {what}: {detail}; see docs/trl.md, 'Upgrading TRL'"


def report(problems: list[str]) -> None:
    assert not problems, "\n".join(problems)


def resolve(name: str):
    owner, attr = name.split(".")
    return getattr({"GRPOTrainer": GRPOTrainer}[owner], attr)


def parameters(fn) -> tuple[str, ...]:
    """The parameters of ``fn`` as written, annotations dropped: "name", "name=default", "*args", "**kwargs"."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        text = str(p.replace(annotation=inspect.Parameter.empty))
        out.append(f"kw-only {text}" if p.kind is inspect.Parameter.KEYWORD_ONLY else text)
    return tuple(out)


def fingerprint(fn) -> str:
    """sha256 (16 hex digits) of the dedented source: any change of the body, a comment included, changes it."""
    return hashlib.sha256(textwrap.dedent(inspect.getsource(fn)).encode()).hexdigest()[:16]


def annotation(t) -> str:
    return t if isinstance(t, str) else t.__name__ if isinstance(t, type) else str(t)


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores: intra-op threads only add contention on these shapes
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tr(tmp_path_factory):
    """One tiny trainer: the TROLL loss type, two optimiser steps per rollout batch (TRL computes old log-probs),
    a sampling temperature other than 1 (so that dividing by it is checked)."""
    kwargs = dict(
        output_dir=str(tmp_path_factory.mktemp("contract")),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        steps_per_generation=2,
        temperature=0.7,
        max_steps=1,
        learning_rate=1e-2,
        bf16=False,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    tok = tiny_tokenizer()
    try:
        args = TrollGRPOConfig(**kwargs)
        with patch("troll.integrations.trl.trainer.check_trl_version"):  # say what changed, not only the version
            trainer = TrollGRPOTrainer(
                model=tiny_model(tok),
                reward_funcs=reward_letter_a,
                args=args,
                train_dataset=tiny_dataset(),
                processing_class=tok,
            )
    except Exception as err:  # every test below needs it: say so once, in the contract's words
        pytest.fail(changed("GRPOTrainer.__init__ or GRPOConfig", f"building the tiny TrollGRPOTrainer raised {err!r}"))
    trainer.model.train()
    return trainer


def rollout_rows(tr, groups: int = 2) -> list[dict]:
    return [{"prompt": p} for p in PROMPTS[:groups] for _ in range(tr.num_generations)] * tr.args.steps_per_generation


class Spy:
    """Records each call of TRL's own _get_per_token_logps_and_entropies made through the trainer instance."""

    def __init__(self, tr):
        self.tr, self.calls = tr, []

    def __call__(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        out = GRPOTrainer._get_per_token_logps_and_entropies(
            self.tr, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        grad = torch.is_grad_enabled()
        self.calls.append(dict(model=model, ids=input_ids, mask=attention_mask, t=logits_to_keep, grad=grad, out=out))
        self.calls[-1].update(kwargs)
        return out

    def score(self, rows):
        """TRL's own _generate_and_score_completions (not the trainer's override), with this spy installed."""
        with patch.object(self.tr, "_get_per_token_logps_and_entropies", self):
            return GRPOTrainer._generate_and_score_completions(self.tr, rows)


@pytest.fixture(scope="module")
def scored(tr):
    """TRL's scored rollout batch (16 rows) and the log-prob calls TRL made while scoring it."""
    spy = Spy(tr)
    try:
        return spy.score(rollout_rows(tr)), spy.calls
    except Exception as err:
        pytest.fail(changed("GRPOTrainer._generate_and_score_completions", f"scoring 16 rollouts raised {err!r}"))


# ------------------------------------------------------------------------------------------ signatures and sources


def test_overrides_are_exactly_the_pinned_ones():
    overrides = {n for n in vars(TrollGRPOTrainer) if n not in _CLASS_BOOKKEEPING and hasattr(GRPOTrainer, n)}
    expected = set(OVERRIDDEN) | set(OVERRIDDEN_ATTRIBUTES)
    problems = []
    if overrides - expected:
        new = sorted(overrides - expected)
        problems.append(changed("GRPOTrainer's members", f"TrollGRPOTrainer now overrides {new}; pin each or rename"))
    if expected - overrides:
        gone = sorted(expected - overrides)
        problems.append(changed("GRPOTrainer's members", f"{gone} no longer overridden; update OVERRIDDEN"))
    problems += [changed(f"GRPOTrainer.{n}", "not pinned") for n in OVERRIDDEN if f"GRPOTrainer.{n}" not in PINNED]
    report(problems)


@pytest.mark.parametrize("name", list(PINNED))
def test_signature_pinned(name):
    if not hasattr(GRPOTrainer, name.split(".")[1]):
        pytest.fail(changed(name, "it no longer exists"))
    now, pinned = parameters(resolve(name)), PINNED[name][1]
    if now != pinned:
        gone, new = [p for p in pinned if p not in now], [p for p in now if p not in pinned]
        detail = f"parameters removed {gone}, added {new}" if gone or new else f"parameters reordered to {now}"
        pytest.fail(changed(f"the signature of {name}", detail))


@pytest.mark.parametrize("name", list(PINNED))
def test_source_fingerprint_pinned(name):
    if not hasattr(GRPOTrainer, name.split(".")[1]):
        pytest.fail(changed(name, "it no longer exists"))
    now, pinned = fingerprint(resolve(name)), PINNED[name][0]
    assert now == pinned, changed(
        f"the source of {name}", f"fingerprint {now}, pinned {pinned} (its body changed: read TRL's diff of it)"
    )


def test_supported_version_and_pins_agree():
    """The version gate, and the three places the TRL range is written (config, pyproject extra, constraints)."""
    problems = []
    supported = SpecifierSet(SUPPORTED_TRL)
    if not supported.contains(Version(trl.__version__), prereleases=True):
        problems.append(
            changed(
                "version",
                f"TRL {trl.__version__} is installed, SUPPORTED_TRL is {SUPPORTED_TRL!r}; once every other test here "
                "passes, widen SUPPORTED_TRL and the pins",
            )
        )
    extra = re.search(r'"trl\s*([<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text())
    if extra is None or SpecifierSet(extra.group(1)) != supported:
        found = extra.group(1) if extra else None
        problems.append(changed("version pins", f"pyproject.toml's trl extra says {found!r}, not {SUPPORTED_TRL!r}"))
    pin = re.search(r"^trl==(\S+)", (ROOT / "constraints.txt").read_text(), flags=re.M)
    if pin is None or not supported.contains(Version(pin.group(1)), prereleases=True):
        found = pin.group(1) if pin else None
        problems.append(changed("version pins", f"constraints.txt pins trl=={found}, outside {SUPPORTED_TRL!r}"))
    report(problems)


def test_loss_types_are_trl_loss_types():
    """TRL_LOSS_TYPES (the config's list of TRL loss types) is every value _compute_loss compares loss_type to."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(GRPOTrainer._compute_loss)))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and ast.unparse(node.left) == "self.loss_type":
            for right in node.comparators:
                found |= {c.value for c in ast.walk(right) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    assert found == set(TRL_LOSS_TYPES), changed(
        "GRPOTrainer._compute_loss's loss types",
        f"added {sorted(found - set(TRL_LOSS_TYPES))}, removed {sorted(set(TRL_LOSS_TYPES) - found)}; update "
        "TRL_LOSS_TYPES in src/troll/integrations/trl/config.py",
    )


# ------------------------------------------------------------------------------------------ fields and attributes


def test_config_fields():
    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    problems = []
    for name, (kind, default) in CONFIG_FIELDS.items():
        if name not in fields:
            problems.append(changed(f"GRPOConfig.{name}", "the field is gone"))
            continue
        if annotation(fields[name].type) != kind:
            problems.append(changed(f"GRPOConfig.{name}", f"its type is {annotation(fields[name].type)}, not {kind}"))
        if default != fields[name].default:
            problems.append(changed(f"GRPOConfig.{name}", f"its default is {fields[name].default!r}, not {default!r}"))
    report(problems)


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


def test_model_card_attributes():
    """The class attributes create_model_card reads; the trainer's __init__ cites GRPO by _paper["citation"]."""
    problems = []
    paper = GRPOTrainer.__dict__.get("_paper")
    if not isinstance(paper, dict) or not all(isinstance(paper.get(k), str) for k in ("title", "id", "citation")):
        problems.append(changed("GRPOTrainer._paper", f"{paper!r} is not a dict of title, id and citation strings"))
    if not isinstance(GRPOTrainer.__dict__.get("_name"), str):
        problems.append(changed("GRPOTrainer._name", f"{GRPOTrainer.__dict__.get('_name')!r} is not a string"))
    if not isinstance(GRPOTrainer.__dict__.get("_tag_names"), list):
        problems.append(changed("GRPOTrainer._tag_names", "not a list of tags"))
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


def _wrap(items: list[str], first: int, rest: int) -> list[str]:
    """``items`` joined by spaces into rows of at most ``first`` characters, then ``rest``."""
    rows, row = [], ""
    for item in items:
        if row and len(row) + 1 + len(item) > (rest if rows else first):
            rows, row = [*rows, row], item
        else:
            row = f"{row} {item}".lstrip()
    return [*rows, row]


def pinned_block() -> str:
    """PINNED for the installed TRL, as this file holds it: name: (fingerprint, parameters), rows of <= 120."""
    lines = [f"# BEGIN PINNED (TRL {trl.__version__})", "# fmt: off", "PINNED = {"]
    for name in PINNED:
        fn = resolve(name)
        head = f'    "{name}": ("{fingerprint(fn)}", ('
        rows = _wrap([json.dumps(p) + "," for p in parameters(fn)], 120 - len(head) - 3, 120 - 8)
        if len(rows) == 1:
            lines.append(f"{head}{rows[0]})),")
        else:
            lines += [head + rows[0], *(f"        {row}" for row in rows[1:]), "    )),"]
    return "\n".join([*lines, "}", "# fmt: on", "# END PINNED"])


if __name__ == "__main__":  # docs/trl.md, "Upgrading TRL": print the pins, or --write them into this file
    block = pinned_block()
    if sys.argv[1:] == ["--write"]:
        path = Path(__file__)
        pattern = re.compile(r"^# BEGIN PINNED.*?^# END PINNED$", flags=re.S | re.M)
        path.write_text(pattern.sub(lambda _: block, path.read_text(), count=1))
        print(f"wrote PINNED for TRL {trl.__version__} into {path}")
    else:
        print(block)
