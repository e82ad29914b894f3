"""The verl plug-in's checks that need no verl: the tested-version guard and the TROLL settings of a config."""

from __future__ import annotations

from collections.abc import Mapping

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from troll._checks import check_troll_settings
from troll.defaults import AGGREGATIONS

SUPPORTED_VERL = ">=0.9,<0.10"
TROLL_LOSS_MODES = ("troll", "troll_seq")
TROLL_KEYS = ("kl_bound", "alpha", "top_k", "delta")
# The optional ``troll.lm_head`` key: how the plug-in evaluates the LM head (the same numbers either way).
LM_HEADS = ("chunked", "dense")
# verl's loss_agg_mode values that map one to one onto troll's aggregations (the same names).
VERL_AGGREGATIONS = AGGREGATIONS
# The prefix of the old sparse policy's tensors in verl's batch (SparseLogProbs.to_dict / from_dict).
OLD_PREFIX = "troll_old_"


def check_verl_version(version: str | None = None) -> None:
    """Raise ImportError unless ``version`` (default: the installed verl's) is in :data:`SUPPORTED_VERL`."""
    if version is None:
        try:
            import verl
        except ImportError as err:
            raise ImportError(
                "troll.integrations.verl needs verl: pip install 'troll[verl]' (verl " + SUPPORTED_VERL + ")."
            ) from err
        version = getattr(verl, "__version__", None)
        if version is None:
            raise ImportError("troll.integrations.verl: the installed verl reports no __version__; reinstall verl.")
    if not SpecifierSet(SUPPORTED_VERL).contains(Version(version), prereleases=True):
        raise ImportError(
            f"troll.integrations.verl supports verl {SUPPORTED_VERL}, found verl {version}; install a supported "
            f"version (pip install 'verl{SUPPORTED_VERL}') or use troll's loss functions directly."
        )


def _get(config, key: str, default=None):
    if isinstance(config, Mapping):
        return config.get(key, default)
    getter = getattr(config, "get", None)  # omegaconf DictConfig and verl's BaseConfig both have .get
    return getter(key, default) if callable(getter) else getattr(config, key, default)


def troll_settings(actor_config) -> dict | None:
    """The TROLL keyword arguments of a verl actor config, or None for a stock loss mode.

    Reads ``policy_loss.loss_mode`` ("troll": token level, "troll_seq": sequence level), ``loss_agg_mode`` and
    the ``troll`` section (``kl_bound``, ``alpha``, ``top_k``, ``delta``), i.e. the Hydra keys
    ``actor_rollout_ref.actor.policy_loss.loss_mode`` and ``actor_rollout_ref.actor.troll.*``. Every key must be
    given (no silent defaults on a run that may cost thousands of GPU hours); a missing or bad one raises a
    ValueError that names the key.
    """
    policy_loss = _get(actor_config, "policy_loss")
    mode = _get(policy_loss, "loss_mode", "vanilla") if policy_loss is not None else "vanilla"
    if mode not in TROLL_LOSS_MODES:
        return None
    section = _get(actor_config, "troll")
    missing = [key for key in TROLL_KEYS if section is None or _get(section, key) is None]
    if missing:
        keys = ", ".join(f"actor_rollout_ref.actor.troll.{key}" for key in missing)
        raise ValueError(
            f"policy_loss.loss_mode={mode!r} needs the TROLL settings {keys}; add e.g. "
            "+actor_rollout_ref.actor.troll.kl_bound=0.05 +actor_rollout_ref.actor.troll.alpha=1.0 "
            "+actor_rollout_ref.actor.troll.top_k=64 +actor_rollout_ref.actor.troll.delta=1e-5 (docs/verl.md)."
        )
    agg = _get(actor_config, "loss_agg_mode", "token-mean")
    if agg not in VERL_AGGREGATIONS:
        raise ValueError(
            f"loss_agg_mode={agg!r} has no TROLL counterpart; use one of {VERL_AGGREGATIONS} with loss_mode={mode!r}."
        )
    settings = {key: _get(section, key) for key in TROLL_KEYS}
    settings["top_k"] = int(settings["top_k"])
    settings.update(kl_bound=float(settings["kl_bound"]), alpha=float(settings["alpha"]))
    settings["delta"] = float(settings["delta"])
    settings.update(level="token" if mode == "troll" else "sequence", agg=agg)
    check_troll_settings(**settings)
    return settings


def troll_lm_head(actor_config) -> str:
    """``actor_rollout_ref.actor.troll.lm_head``: "chunked" (the default: final hidden states and the LM head in
    vocabulary chunks, never the (tokens, V) logits) or "dense" (the model's logits). A bad value is a ValueError."""
    section = _get(actor_config, "troll")
    value = _get(section, "lm_head") if section is not None else None
    value = "chunked" if value is None else value
    if value not in LM_HEADS:
        raise ValueError(
            f"actor_rollout_ref.actor.troll.lm_head={value!r} is not supported; set it to 'chunked' (the default) "
            "or 'dense'."
        )
    return value
