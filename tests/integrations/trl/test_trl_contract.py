"""The TRL contract of TrollGRPOTrainer: every TRL method it overrides or mirrors, and every TRL attribute, batch key
and config field it reads, pinned so that a TRL upgrade fails loudly (docs/trl.md, "Upgrading TRL").

TRL removed its experimental DPPO trainer after a GRPOTrainer subclass overriding private methods drifted silently
between releases. Here each pinned method has its signature and a fingerprint of its source checked (any change of
TRL's body fails); tests/integrations/trl/test_trl_contract_behaviour.py checks its contract by behaviour on a tiny
random Llama (one trainer for that module, from tests/support/_trl_contract.py). Every failure reads "TRL changed <X>:
<what differs>; see docs/trl.md, 'Upgrading TRL'".

The trainer is built past the TRL version gate, so that on a new TRL these tests say what changed rather than only
that the version is new; ``test_supported_version_and_pins_agree`` is the gate. After reading TRL's diff and adapting
the trainer, ``python tests/integrations/trl/test_trl_contract.py --write`` re-pins PINNED for the installed TRL
(without --write it prints them).
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
from pathlib import Path
from unittest.mock import ANY

import pytest

pytest.importorskip("trl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import trl  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from troll.integrations.trl import SUPPORTED_TRL, TRL_LOSS_TYPES, TrollGRPOTrainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[2] / "support"))  # also when run as a script (--write)
from _trl_contract import changed, one_thread, report  # noqa: E402, F401 -- one_thread: the autouse fixture

ROOT = Path(__file__).parents[3]

# GRPOTrainer members TrollGRPOTrainer overrides; the test below fails when the trainer overrides any other.
OVERRIDDEN = ("__init__", "_generate_and_score_completions", "_get_per_token_logps_and_entropies", "_compute_loss")
OVERRIDDEN_ATTRIBUTES = ("_tag_names",)  # extended with "troll"; create_model_card reads it
# Source fingerprint and signature (annotations dropped) of the overridden methods and of those whose behaviour the
# trainer relies on: compute_loss (dispatches to _compute_loss), _prepare_inputs (buffers, shuffles and splits the
# scored batch, troll_old_* included), log (one mean per metric list and logging window). Re-pin with
# `python tests/integrations/trl/test_trl_contract.py --write` once TRL's diff is read and the trainer adapted.
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
_CLASS_BOOKKEEPING = {"__module__", "__doc__", "__qualname__", "__annotations__", "__firstlineno__"}
_CLASS_BOOKKEEPING |= {"__static_attributes__", "__dict__", "__weakref__"}


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


# ------------------------------------------------------------------------------------------ signatures and sources


def test_overrides_are_exactly_the_pinned_ones():
    ours = TrollGRPOTrainer.__mro__[: TrollGRPOTrainer.__mro__.index(GRPOTrainer)]  # the trainer and its mixins
    members = {n for cls in ours for n in vars(cls)}
    overrides = {n for n in members if n not in _CLASS_BOOKKEEPING and hasattr(GRPOTrainer, n)}
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
