"""TROLL in verl 0.9 (https://github.com/volcengine/verl) as a plug-in: no fork, no verl file changed.

Run ``python -m troll.integrations.verl.main <verl overrides>`` instead of ``python -m verl.trainer.main_ppo`` and
select the actor config class ``actor_rollout_ref.actor._target_=troll.integrations.verl.config.TrollFSDPActorConfig``
(docs/verl.md has the recipe, what is tested and what is not). Where each piece lives, each module importing only
those before it:

- :mod:`~troll.integrations.verl.config`: the supported verl (:data:`SUPPORTED_VERL`, :func:`check_verl_version`),
  the TROLL settings of a verl actor config and their checks, the LM-head choice, and ``TrollFSDPActorConfig``
  (verl's ``FSDPActorConfig`` with a ``troll`` section);
- :mod:`~troll.integrations.verl.loss`: ``troll_ppo_loss``, the drop-in for verl's ``ppo_loss``; ``verl_scale``,
  verl's normalisation over the global mini-batch; ``old_policy_from_batch``, the stored old policy of a micro-batch;
- :mod:`~troll.integrations.verl.engine`: ``TrollFSDPEngine``, verl's FSDP engine that adds the old policy's capture
  and the loss's inputs to the model's outputs (the LM head through :mod:`troll.integrations.hf`, as in the TRL
  trainer); ``register``, which puts the engine and the loss into verl's registry and worker;
- :mod:`~troll.integrations.verl.trainer`: ``TrollTrainerMixin`` and ``TrollActorGroup`` (the TROLL flags on the
  actor's batches, the captured old policy kept for the update) and ``TrollRayPPOTrainer``, the mixin on verl's
  ``RayPPOTrainer``;
- :mod:`~troll.integrations.verl.main`: the entry point (verl's Hydra main; the config is checked before Ray starts);
- :mod:`~troll.integrations.verl.plugin`: the module named in ``VERL_USE_EXTERNAL_MODULES``, whose import registers.

Importing this package needs no verl: it imports ``config``, whose checks are plain Python. Where verl is installed,
that import checks verl's version at once (an ImportError outside :data:`SUPPORTED_VERL`) and imports verl before
any other module of the package starts, so that verl's own import of the plug-in (``VERL_USE_EXTERNAL_MODULES``)
never meets a half-imported module. The other modules need verl, and say how to install it when it is missing.
"""

from troll.integrations.verl.config import SUPPORTED_VERL, check_verl_version

__all__ = ["SUPPORTED_VERL", "check_verl_version"]
