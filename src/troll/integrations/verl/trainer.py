"""The trainer side of the verl plug-in: the TROLL flags on the actor's batches and the captured old policy.

verl 0.9's ``RayPPOTrainer`` calls the actor's worker group (``compute_log_prob``, ``update_actor``) with a
TensorDict, and its ``_compute_old_log_prob`` keeps only the outputs it names. :class:`TrollTrainerMixin` wraps the
worker group in :class:`TrollActorGroup`, which sets the flags the engine reads
(:mod:`troll.integrations.verl.engine`), and adds the captured old policy to the batch the update gets.
:class:`TrollRayPPOTrainer` is the mixin on verl's trainer, and :class:`TrollTaskRunner` the Ray task runner that
builds it: the one ``python -m troll.integrations.verl.main`` runs.
"""

# ruff: noqa: E402  (verl is imported after the version guard)
from __future__ import annotations

import warnings

import torch

from troll.integrations.verl.config import check_verl_version

check_verl_version()

from omegaconf import OmegaConf
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass, validate_config
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.utils.padding import no_padding_2_padding

from troll.integrations.verl.config import (
    check_rollout_correction,
    chunked_blocker,
    get_key,
    troll_lm_head,
    troll_settings,
)
from troll.integrations.verl.engine import FLAG_CAPTURE, FLAG_LM_HEAD, FLAG_LOGPROB_GRAD, FLAG_LOSS, register
from troll.integrations.verl.loss import OLD_KEYS


def old_policy_to_padded(output, batch_td) -> dict[str, torch.Tensor]:
    """The captured old policy of a ``compute_log_prob`` output as padded (B, T_resp, K) / (B, T_resp) tensors.

    ``output``: the worker's returned TensorDict (nested (B, j, ...) per-token entries over prompt + response, as
    the engine returns them); ``batch_td``: the no-padding batch it was computed on. This is the step a trainer
    must add next to verl's conversion of ``log_probs`` into ``old_log_probs`` (docs/verl.md: verl's
    ``_compute_old_log_prob`` keeps only the outputs it names).
    """
    missing = [key for key in OLD_KEYS if key not in output.keys()]
    if missing:
        raise KeyError(f"compute_log_prob returned no {missing}: was the {FLAG_CAPTURE} flag set on the batch?")
    return {key: no_padding_2_padding(output[key], batch_td) for key in OLD_KEYS}


class TrollActorGroup:
    """A proxy for the trainer's ``actor_rollout_wg`` that sets the TROLL flags and keeps the capture's output.

    Every attribute other than ``compute_log_prob`` and ``update_actor`` goes to the wrapped worker group. A
    ``compute_log_prob`` call for the reference policy (verl's ``no_lora_adapter`` flag, where the LoRA actor is its
    own reference) is passed through untouched: nothing is captured there.
    """

    def __init__(self, group, capture: dict, lm_head: str = "dense", logprob_grad: bool = False):
        self._group, self._capture, self.last = group, capture, None
        self._lm_head, self._logprob_grad = lm_head, logprob_grad

    def __getattr__(self, name):
        return getattr(self._group, name)

    def compute_log_prob(self, batch_td):
        if tu.get_non_tensor_data(batch_td, "no_lora_adapter", False):
            return self._group.compute_log_prob(batch_td)
        tu.assign_non_tensor(batch_td, **{FLAG_CAPTURE: self._capture, FLAG_LM_HEAD: self._lm_head})
        output = self._group.compute_log_prob(batch_td)
        self.last = (output, batch_td)
        return output

    def update_actor(self, batch_td):
        flags = {FLAG_LOSS: True, FLAG_LM_HEAD: self._lm_head, FLAG_LOGPROB_GRAD: self._logprob_grad}
        tu.assign_non_tensor(batch_td, **flags)
        return self._group.update_actor(batch_td)


class TrollTrainerMixin:
    """Put before verl's ``RayPPOTrainer`` (``class T(TrollTrainerMixin, RayPPOTrainer)``) to train with TROLL.

    Three overrides, each calling verl's method first:

    - ``init_workers`` refuses a rollout correction TROLL cannot honour
      (:func:`~troll.integrations.verl.config.check_rollout_correction`), then wraps ``actor_rollout_wg`` in
      :class:`TrollActorGroup` (the TROLL batch flags), with the configured LM-head path, or the dense one, with a
      warning, where the actor config rules the chunked one out
      (:func:`~troll.integrations.verl.config.chunked_blocker`);
    - ``_compute_old_log_prob`` adds the captured ``troll_old_*`` fields, padded to (B, T_resp, K), to the DataProto
      verl returns (verl keeps only the outputs it names, and would drop them);
    - ``_update_actor`` logs the loss's ``troll/*`` metrics under ``troll/`` (verl prefixes every actor metric
      with ``actor/``).
    """

    def init_workers(self):
        if troll_settings(self.config.actor_rollout_ref.actor) is not None:
            check_rollout_correction(self.config)  # before any worker starts
        super().init_workers()
        self._troll_wrap_workers()

    def _troll_wrap_workers(self) -> None:
        actor = self.config.actor_rollout_ref.actor
        settings = troll_settings(actor)
        if settings is not None and not isinstance(self.actor_rollout_wg, TrollActorGroup):
            capture = {"top_k": settings["top_k"], "delta": settings["delta"]}
            lm_head = troll_lm_head(actor)
            reason = chunked_blocker(actor) if lm_head == "chunked" else None
            if reason is not None:
                warnings.warn(f"troll.lm_head=chunked falls back to dense (full logits): {reason}.", stacklevel=2)
                lm_head = "dense"
            logprob_grad = bool(get_key(actor, "use_kl_loss", False))  # verl's KL loss differentiates the log-probs
            self.actor_rollout_wg = TrollActorGroup(self.actor_rollout_wg, capture, lm_head, logprob_grad)

    def _compute_old_log_prob(self, batch):
        old, mfu = super()._compute_old_log_prob(batch)
        group = self.actor_rollout_wg
        if isinstance(group, TrollActorGroup):
            if group.last is None:
                raise RuntimeError("TROLL: _compute_old_log_prob ran without compute_log_prob; nothing was captured.")
            output, batch_td = group.last
            group.last = None
            for key, value in old_policy_to_padded(output, batch_td).items():
                old.batch[key] = value
        return old, mfu

    def _update_actor(self, batch):
        output = super()._update_actor(batch)
        metrics = output.meta_info.get("metrics")
        if metrics:
            prefix = "actor/troll/"
            output.meta_info["metrics"] = {
                (k[len("actor/") :] if k.startswith(prefix) else k): v for k, v in metrics.items()
            }
        return output


class TrollRayPPOTrainer(TrollTrainerMixin, RayPPOTrainer):
    """verl 0.9's ``RayPPOTrainer`` that trains with TROLL when the actor's loss_mode is "troll" or "troll_seq"."""


class TrollTaskRunner(BaseTaskRunner):
    """verl 0.9's v0 task runner (``main_ppo_v0.TaskRunner``) building :attr:`trainer_class` instead of
    ``RayPPOTrainer``; ``python -m troll.integrations.verl.main`` starts it as a Ray actor (``ray.remote(...)``).

    verl's ``TaskRunner.run`` builds its trainer inline by a module-level name and offers no hook to choose the class,
    so :meth:`run` is the one method replaced: the same steps through verl's own helpers (the worker roles and
    resource pools of ``BaseTaskRunner``, ``validate_config``, the tokenizer of the model config, the datasets and
    sampler), then :attr:`trainer_class`'s ``init_workers`` and ``fit``. The class is deliberately not decorated with
    ``ray.remote``: a plain class of an importable module is pickled by reference, so the Ray actor imports this
    module and its ``run`` sees this module's names (a decorated class is pickled by value, with a private copy of its
    module's globals: rebinding a name there does not reach it).
    """

    trainer_class = TrollRayPPOTrainer

    def run(self, config):
        register()  # the plug-in, in this process too (the Ray runtime environment imports it in every worker)
        OmegaConf.resolve(config)
        actor_rollout_cls, worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        self.add_ref_policy_worker(config, actor_rollout_cls)
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
        model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        data = config.data
        datasets = {
            split: create_rl_dataset(
                files, data, model.tokenizer, model.processor, is_train=train, max_samples=data.get(limit, -1)
            )
            for split, files, train, limit in [
                ("train_dataset", data.train_files, True, "train_max_samples"),
                ("val_dataset", data.val_files, False, "val_max_samples"),
            ]
        }
        trainer = self.trainer_class(
            config=config,
            tokenizer=model.tokenizer,
            processor=model.processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=worker_group_cls,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(data, datasets["train_dataset"]),
            **datasets,
        )
        trainer.init_workers()
        trainer.fit()
