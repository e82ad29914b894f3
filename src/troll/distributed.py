"""The LM head's weight under a sharding engine, gathered so that the chunked path can use it.

:func:`troll.troll_loss_from_hidden` needs the head's full (V, H) weight (and (V,) bias) next to the hidden states
of the model's own forward. Under FSDP2 (``torch.distributed.fsdp.fully_shard``) the weight is a DTensor sharded
on dim 0 whenever its FSDP unit is resharded (the LM head wrapped as its own unit, or any unit after its forward).
:func:`gather_lm_head` all-gathers it with ``DTensor.full_tensor`` *inside the loss call*, outside the module's
forward; autograd then carries the gradient back as a reduce-scatter onto the shard. Each rank's gradient is a
different partial value (its own micro-batch), so the gather declares it ``Partial("avg")``: the shards receive
the mean over ranks, which is what FSDP2 applies to every other parameter (its default gradient divide factor).

Memory: the gathered weight is (V, H) on every rank, as when FSDP unshards the head for its own forward (e.g.
152k x 3584 in bf16 = 1.1 GB), freed once the loss's backward has run; the chunked path then adds its
O(N x C) chunk and a (V, H) gradient buffer in the compute dtype (fp32), before the reduce-scatter.

DeepSpeed ZeRO-3 parameters (``ds_id``) are not gathered here: :func:`is_zero3_param` lets a caller detect them
and keep the dense path (see docs/trl.md).
"""

from __future__ import annotations

import torch


def is_dtensor(t) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (FSDP2 or tensor-parallel shards), without importing it."""
    return type(t).__name__ == "DTensor" or type(getattr(t, "data", None)).__name__ == "DTensor"


def is_fsdp2_model(model: torch.nn.Module) -> bool:
    """True if ``model`` or one of its submodules was wrapped by FSDP2's ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def is_zero3_param(t) -> bool:
    """True for a DeepSpeed ZeRO-3 partitioned parameter (it carries ``ds_id`` / ``ds_status``)."""
    return hasattr(t, "ds_id") and hasattr(t, "ds_status")


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import Partial, Replicate, Shard

    if not all(isinstance(p, Replicate) or (isinstance(p, Shard) and p.dim == 0) for p in t.placements):
        raise ValueError(
            f"the LM head's weight is a DTensor with placements {t.placements}: only FSDP2's Shard(0) (or "
            "Replicate, as in HSDP) can be gathered for the chunked path; use troll_lm_head='dense'."
        )
    # Each rank's gradient is its own micro-batch's: partial values, averaged as FSDP2 averages the other grads.
    return t.full_tensor(grad_placements=[Partial("avg")] * len(t.placements))


def gather_lm_head(weight: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight (V, H), bias (V,) or None) as full local tensors whose gradient flows back to the shards.

    A plain tensor is returned as is (one process, DDP, or an FSDP2 unit still unsharded after its forward). A
    DTensor sharded by FSDP2 is all-gathered with ``full_tensor``; call this inside the loss computation (after the
    model's forward), once per loss call, so the gathered copy lives only as long as the loss's graph. Raises a
    ValueError for a DeepSpeed ZeRO-3 parameter (gather it with ``deepspeed.zero.GatheredParameters`` instead).
    """
    if is_zero3_param(weight):
        raise ValueError(
            "the LM head's weight is a DeepSpeed ZeRO-3 partition; gather_lm_head handles FSDP2 DTensors only. "
            "Use the dense path (troll_lm_head='dense') under ZeRO-3."
        )
    if is_dtensor(weight):
        weight = _full(weight)
    if bias is not None and is_dtensor(bias):
        bias = _full(bias)
    return weight, bias
