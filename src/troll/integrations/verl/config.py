"""The verl plug-in's configuration: the supported verl, the TROLL settings of a verl actor config, the LM-head
choice, and :class:`TrollFSDPActorConfig`, the actor config class that carries the ``troll`` section.

Everything here but that class is plain Python and works without verl. The names and defaults come from
:mod:`troll.categorical.defaults`; the values are checked by :func:`troll.categorical.settings.check_troll_settings`,
the check the losses,
``TrollGRPOConfig`` and ``troll train`` share, with every message naming the Hydra key to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from troll.categorical.defaults import ALPHA, DELTA, KL_BOUND, LM_HEAD, LM_HEADS, TOP_K, TROLL_LOSSES, troll_level
from troll.categorical.settings import check_troll_settings
from troll.runs.numbers import check_choice

SUPPORTED_VERL = ">=0.9,<0.10"
ACTOR = "actor_rollout_ref.actor"  # verl's actor config in the Hydra config
TROLL = f"{ACTOR}.troll"  # its TROLL section
# The Hydra _target_ of the actor config class (verl's rejects the unknown troll section).
ACTOR_CONFIG = "troll.integrations.verl.config.TrollFSDPActorConfig"
# The keys of the troll section that every TROLL run must set (no silent defaults on a run that may cost thousands
# of GPU hours), with the type a value given as a string is read as, and the paper's value for the messages.
TROLL_KEYS = {"kl_bound": (float, KL_BOUND), "alpha": (float, ALPHA), "top_k": (int, TOP_K), "delta": (float, DELTA)}
_HYDRA_NAMES = {**{key: f"{TROLL}.{key}" for key in TROLL_KEYS}, "agg": f"{ACTOR}.loss_agg_mode"}


def check_verl_version(version: str | None = None) -> None:
    """Raise ImportError unless ``version`` (default: the installed verl's) is in :data:`SUPPORTED_VERL`."""
    if version is None:
        try:
            import verl
        except ImportError as err:
            if err.name != "verl":  # verl is there, but something it imports failed: that error, not ours
                raise
            raise ImportError(
                f"troll.integrations.verl needs verl: pip install 'troll[verl]' (verl {SUPPORTED_VERL})."
            ) from err
        version = getattr(verl, "__version__", None)
        if version is None:
            raise ImportError("troll.integrations.verl: the installed verl reports no __version__; reinstall verl.")
    if not SpecifierSet(SUPPORTED_VERL).contains(Version(version), prereleases=True):
        raise ImportError(
            f"troll.integrations.verl supports verl {SUPPORTED_VERL}, found verl {version}; install a supported "
            f"version (pip install 'verl{SUPPORTED_VERL}') or use troll's loss functions directly."
        )


def get_key(config, key: str, default=None):
    """``config[key]`` of a verl config node: a Mapping, an omegaconf DictConfig, a verl BaseConfig or an object."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    getter = getattr(config, "get", None)  # omegaconf DictConfig and verl's BaseConfig both have .get
    return getter(key, default) if callable(getter) else getattr(config, key, default)


def _from_string(value, kind):
    """A value the command line gave as a string, as ``kind``; anything else as it is, for the check to judge."""
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            return value
    return value


def troll_settings(actor_config) -> dict | None:
    """The TROLL keyword arguments of a verl actor config, or None for a stock loss mode.

    Reads ``policy_loss.loss_mode`` ("troll": token level, "troll_seq": sequence level), ``loss_agg_mode`` and the
    ``troll`` section (``kl_bound``, ``alpha``, ``top_k``, ``delta``), i.e. the Hydra keys
    ``actor_rollout_ref.actor.policy_loss.loss_mode`` and ``actor_rollout_ref.actor.troll.*``. Every key of the
    section must be given; a missing or bad one raises a ValueError that names the key.
    """
    policy_loss = get_key(actor_config, "policy_loss")
    mode = get_key(policy_loss, "loss_mode", "vanilla") if policy_loss is not None else "vanilla"
    if mode not in TROLL_LOSSES:
        return None
    section = get_key(actor_config, "troll")
    missing = [key for key in TROLL_KEYS if section is None or get_key(section, key) is None]
    if missing:
        keys = ", ".join(f"{TROLL}.{key}" for key in missing)
        example = " ".join(f"+{TROLL}.{key}={paper}" for key, (_, paper) in TROLL_KEYS.items())
        raise ValueError(
            f"policy_loss.loss_mode={mode!r} needs the TROLL settings {keys}; add e.g. {example} (docs/verl.md)."
        )
    settings = {key: _from_string(get_key(section, key), kind) for key, (kind, _) in TROLL_KEYS.items()}
    agg = get_key(actor_config, "loss_agg_mode", "token-mean")  # verl's default
    settings.update(level=troll_level(mode), agg=agg)
    check_troll_settings(**settings, names=_HYDRA_NAMES)
    return {**settings, **{key: float(settings[key]) for key in ("kl_bound", "alpha", "delta")}}


ROLLOUT_CORRECTION = "algorithm.rollout_correction"  # verl's rollout correction in the Hydra config


def check_rollout_correction(config) -> None:
    """Refuse the parts of verl's rollout correction that TROLL cannot honour; a ValueError names the key.

    ``config``: the whole verl config. ``rollout_correction.rollout_is`` (TIS/MIS importance weights between the
    rollout engine's and the trainer's log-probs) gives each token a weight that verl's clip losses multiply their
    per-token surrogate by; TROLL's loss has no such weight, and ignoring it would train on another objective in
    silence. ``bypass_mode=True`` makes verl skip ``compute_old_log_prob`` and take the rollout's log-probs as the
    old policy: TROLL's old sparse policy is captured there, so the update would have none. Rejection sampling
    (``rollout_rs``) alone only masks tokens out of ``response_mask``, which TROLL's loss honours: it is allowed.
    """
    section = get_key(get_key(config, "algorithm", {}) or {}, "rollout_correction")
    if section is None:
        return
    weights = get_key(section, "rollout_is")
    if weights is not None:
        raise ValueError(
            f"TROLL in verl does not apply rollout-correction importance weights: {ROLLOUT_CORRECTION}.rollout_is="
            f"{weights!r} would be ignored by the TROLL loss; set {ROLLOUT_CORRECTION}.rollout_is=null (the trust "
            "region bounds each token's change from the old policy; rejection sampling, rollout_rs, is supported)."
        )
    if bool(get_key(section, "bypass_mode", False)):
        raise ValueError(
            f"TROLL in verl needs the old policy from the actor's compute_log_prob, which {ROLLOUT_CORRECTION}"
            f".bypass_mode=True skips; set {ROLLOUT_CORRECTION}.bypass_mode=false."
        )


def troll_lm_head(actor_config) -> str:
    """``actor_rollout_ref.actor.troll.lm_head``: "chunked" (the default: the final hidden states and the LM head in
    vocabulary chunks, never the (tokens, V) logits) or "dense" (the model's logits). A bad value is a ValueError."""
    section = get_key(actor_config, "troll")
    value = get_key(section, "lm_head") if section is not None else None
    value = LM_HEAD if value is None else value
    check_choice(f"{TROLL}.lm_head", value, LM_HEADS)
    return value


def chunked_blocker(actor_config) -> str | None:
    """Why the actor config rules out the chunked LM head (the plug-in then runs the dense one), or None."""
    if float(get_key(actor_config, "entropy_coeff", 0) or 0) != 0:
        return "an entropy bonus (entropy_coeff != 0) needs the entropy's gradient, which the chunked head lacks"
    if get_key(actor_config, "strategy") == "fsdp":
        return (
            "strategy=fsdp (FSDP1, flattened parameters) is not tested with the chunked LM head (verl's FSDP1 engine "
            f"cannot run without a GPU); set {ACTOR}.strategy=fsdp2 for the chunked head"
        )
    return None


# The actor config class subclasses verl's, so it exists where verl is installed, defined after the version guard.
# Importing verl here can import the plug-in (VERL_USE_EXTERNAL_MODULES) while this module is still loading: the
# other modules of the package read only what is defined above.
if find_spec("verl") is not None:
    check_verl_version()
    from verl.workers.config import FSDPActorConfig

    @dataclass
    class TrollFSDPActorConfig(FSDPActorConfig):
        """verl's FSDPActorConfig with a ``troll`` section (kl_bound, alpha, top_k, delta; optional lm_head).

        verl builds the actor config dataclass from Hydra and rejects unknown keys, so
        ``+actor_rollout_ref.actor.troll.*`` alone fails; select this class with
        ``actor_rollout_ref.actor._target_=troll.integrations.verl.config.TrollFSDPActorConfig``. The section is
        read and checked by :func:`troll_settings` and :func:`troll_lm_head`: before Ray starts
        (``troll.integrations.verl.main.check_config``), and where the trainer and the loss use it. Not in
        ``__post_init__``: verl builds this class through Hydra, which would hide the ValueError in its own
        InstantiationException.
        """

        troll: dict = field(default_factory=dict)
