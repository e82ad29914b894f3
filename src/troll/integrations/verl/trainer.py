"""The trainer side of the verl plug-in: the TROLL flags on the actor's batches and the captured old policy.

verl 0.9's ``RayPPOTrainer`` calls the actor's worker group (``compute_log_prob``, ``update_actor``) with a
TensorDict, and its ``_compute_old_log_prob`` keeps only the outputs it names. :class:`TrollTrainerMixin` wraps the
worker group in :class:`TrollActorGroup`, which sets the flags the engine reads
(:mod:`troll.integrations.verl.engine`), and adds the captured old policy to the batch the update gets.
:class:`TrollRayPPOTrainer` is the mixin on verl's trainer, the one ``python -m troll.integrations.verl.main`` runs.
"""

# ruff: noqa: E402  (verl is imported after the version guard)
from __future__ import annotations

import warnings

import torch

from troll.integrations.verl.config import check_verl_version

check_verl_version()

from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import no_padding_2_padding

from troll.integrations.verl.config import chunked_blocker, get_key, troll_lm_head, troll_settings
from troll.integrations.verl.engine import FLAG_CAPTURE, FLAG_LM_HEAD, FLAG_LOGPROB_GRAD, FLAG_LOSS
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

    - ``init_workers`` wraps ``actor_rollout_wg`` in :class:`TrollActorGroup` (the TROLL batch flags), with the
      configured LM-head path, or the dense one, with a warning, where the actor config rules the chunked one out
      (:func:`~troll.integrations.verl.config.chunked_blocker`);
    - ``_compute_old_log_prob`` adds the captured ``troll_old_*`` fields, padded to (B, T_resp, K), to the DataProto
      verl returns (verl keeps only the outputs it names, and would drop them);
    - ``_update_actor`` logs the loss's ``troll/*`` metrics under ``troll/`` (verl prefixes every actor metric
      with ``actor/``).
    """

    def init_workers(self):
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
