"""``python -m troll.integrations.verl.main <verl overrides>``: verl 0.9's PPO/GRPO entry point, with TROLL.

The same Hydra config and overrides as ``python -m verl.trainer.main_ppo`` (docs/verl.md lists the keys to change
from a stock GRPO run). What differs:

1. The trainer is :class:`~troll.integrations.verl.trainer.TrollRayPPOTrainer`, verl's ``RayPPOTrainer`` with the
   TROLL mixin (the old sparse policy is captured in ``compute_log_prob`` and kept in the batch for the update),
   built in verl's Ray task-runner actor by :class:`~troll.integrations.verl.trainer.TrollTaskRunner`.
2. Every Ray process imports :data:`PLUGIN` (``VERL_USE_EXTERNAL_MODULES`` in the Ray runtime environment), so the
   workers build ``TrollFSDPEngine`` and install troll's ``ppo_loss``.
3. It runs verl's ``RayPPOTrainer`` (the trainer of ``main_ppo_v0``) whatever ``trainer.use_v1`` says: verl's v1
   trainers (transfer-queue based) are not supported yet.
4. The TROLL settings are checked before Ray starts (:func:`check_config`), each error naming the Hydra key.
"""

# ruff: noqa: E402  (verl is imported after the version guard)
from __future__ import annotations

import os

from troll.integrations.verl.config import check_verl_version

check_verl_version()

import hydra
import ray
from omegaconf import OmegaConf
from verl.trainer import main_ppo

from troll.categorical.defaults import TROLL_LOSSES
from troll.integrations.verl.config import (
    ACTOR,
    ACTOR_CONFIG,
    check_rollout_correction,
    troll_lm_head,
    troll_settings,
)
from troll.integrations.verl.trainer import TrollTaskRunner

PLUGIN = "troll.integrations.verl.plugin"  # the module that registers the engine and the loss when imported


def check_config(config) -> dict | None:
    """The TROLL settings of a composed verl config, or None for a stock loss mode; a ValueError names the key.

    Checks what the plug-in needs beyond :func:`~troll.integrations.verl.config.troll_settings`: the actor config
    class, the remove-padding path, no Ulysses sequence parallelism, no fused kernels, an FSDP strategy, no
    distillation, and no rollout-correction weights or bypass mode
    (:func:`~troll.integrations.verl.config.check_rollout_correction`).
    """
    actor = config.actor_rollout_ref.actor
    mode = actor.get("policy_loss", {}).get("loss_mode", "vanilla")
    if mode not in TROLL_LOSSES:
        return None
    if actor.get("_target_") != ACTOR_CONFIG:
        raise ValueError(
            f"policy_loss.loss_mode={mode!r} needs the actor config class with a troll section: add "
            f"{ACTOR}._target_={ACTOR_CONFIG} (docs/verl.md)."
        )
    settings = troll_settings(actor)
    troll_lm_head(actor)  # a bad troll.lm_head names itself here, before Ray starts
    check_rollout_correction(config)
    model = config.actor_rollout_ref.model
    required = [
        (f"{ACTOR}.strategy", actor.get("strategy"), ("fsdp", "fsdp2")),
        ("actor_rollout_ref.model.use_remove_padding", model.get("use_remove_padding", False), (True,)),
        ("actor_rollout_ref.model.use_fused_kernels", model.get("use_fused_kernels", False), (False,)),
        (f"{ACTOR}.ulysses_sequence_parallel_size", actor.get("ulysses_sequence_parallel_size", 1), (1,)),
        ("distillation.enabled", bool(config.get("distillation", {}).get("enabled", False)), (False,)),
    ]
    for key, value, allowed in required:
        if value not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"TROLL in verl supports {key}={want} only, got {value!r}; set {key}={allowed[0]}.")
    return settings


def add_plugin_to_runtime_env(config) -> None:
    """Add :data:`PLUGIN` to ``VERL_USE_EXTERNAL_MODULES`` in ``ray_kwargs.ray_init.runtime_env``, after the modules
    already named there or, where the config names none, in this process's ``VERL_USE_EXTERNAL_MODULES``.

    verl's ``run_ppo`` merges that runtime environment into its own before ``ray.init``, so every Ray process
    imports the plug-in when it imports verl. The runtime environment's value replaces the variable in Ray's
    processes, so modules the caller set in the environment (a platform plug-in, say) are carried over, first.
    """
    key = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES"
    given = OmegaConf.select(config, key, default=None) or os.environ.get("VERL_USE_EXTERNAL_MODULES", "")
    current = [m for m in str(given).split(",") if m]
    if PLUGIN not in current:
        OmegaConf.update(config, key, ",".join([*current, PLUGIN]), force_add=True)


_CONFIG_DIR = os.path.join(os.path.dirname(main_ppo.__file__), "config")


@hydra.main(config_path=_CONFIG_DIR, config_name="ppo_trainer", version_base=None)
def main(config) -> None:
    """verl's ``main_ppo.main`` with :class:`~troll.integrations.verl.trainer.TrollTaskRunner` and the plug-in in
    every Ray process."""
    check_config(config)
    add_plugin_to_runtime_env(config)
    main_ppo.auto_set_device(config)
    main_ppo.validate_config(
        config=config,
        use_reference_policy=main_ppo.need_reference_policy(config),
        use_critic=main_ppo.need_critic(config),
    )
    main_ppo.run_ppo(config, task_runner_class=ray.remote(TrollTaskRunner))


if __name__ == "__main__":
    main()
