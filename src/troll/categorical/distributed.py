"""The LM head's weight under a sharding engine (FSDP2, DeepSpeed ZeRO-3), gathered so that the chunked path can use it.

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

DeepSpeed ZeRO-3 partitions a parameter (``ds_id``) outside the forward of the modules that own it; its hooks
gather the full weight just before a module's forward and again before that module's backward, and reduce-scatter
the gradient afterwards. :func:`call_in_forward` therefore runs the head computation as the LM head module's own
forward call, with the hidden states as its input: ZeRO-3 then gathers, re-gathers for backward, reduces the
gradient over ranks (the mean, as for every other parameter) and releases the full copy, exactly as for the
model's own ``lm_head(hidden)``. :func:`with_lm_head` picks the right one of the two for a head module.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch

from troll.output import LossOutput


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


def full_shape(t: torch.Tensor) -> torch.Size:
    """The shape of the whole parameter: a ZeRO-3 partition's ``ds_shape`` (its local data is empty), else ``shape``
    (a DTensor's shape is already the global one)."""
    return torch.Size(t.ds_shape) if is_zero3_param(t) else t.shape


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
    ValueError for a DeepSpeed ZeRO-3 parameter (use :func:`call_in_forward` or :func:`with_lm_head` instead).
    """
    if is_zero3_param(weight):
        raise ValueError(
            "the LM head's weight is a DeepSpeed ZeRO-3 partition; gather_lm_head handles FSDP2 DTensors only. "
            "Run the head computation with troll.categorical.distributed.with_lm_head (or call_in_forward) instead."
        )
    if is_dtensor(weight):
        weight = _full(weight)
    if bias is not None and is_dtensor(bias):
        bias = _full(bias)
    return weight, bias


class _Opaque:
    """Hides a result from the module hooks, which walk the tensors of a forward's output (ZeRO-3 wraps them)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _needs_grad(value) -> bool:
    """Whether ``value`` is, or holds in a tuple, list, dict or dataclass, a tensor that needs a gradient."""
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, (tuple, list)) and any(_needs_grad(x) for x in value)


def call_in_forward(module: torch.nn.Module, fn: Callable[..., Any], *tensors: torch.Tensor) -> Any:
    """``fn(module, *tensors)``, computed as ``module``'s own forward call, so that its hooks run around it.

    Under DeepSpeed ZeRO-3 this is how a partitioned head is used outside the model's forward: the pre-forward hook
    gathers ``module``'s parameters; the hook on the output re-gathers them before the backward; the hook on the
    inputs (``tensors``: pass the hidden states here, not through a closure) releases them after it; the gradient
    hooks reduce-scatter the weight's gradient. ``fn`` must use the tensors it is given, which the hooks may have
    wrapped. ``fn`` returns a tensor, a :class:`~troll.output.LossOutput`, or anything without a tensor that needs
    a gradient. A tensor (a LossOutput's loss) that needs a gradient is routed through the module's output, so that
    the backward from it fires the hooks; the rest is returned untouched. Any other tensor that needs a gradient
    would reach a released partition in its backward, so it is refused with a TypeError. The module's forward is
    restored afterwards, also on error.
    """

    def forward(self, *args):
        out = fn(self, *args)
        if isinstance(out, LossOutput) and out.loss.requires_grad and not _needs_grad(out.metrics):
            return out.loss, _Opaque(lambda loss: LossOutput(loss, out.metrics))
        if isinstance(out, torch.Tensor) and out.requires_grad:
            return out, _Opaque(lambda tensor: tensor)
        if _needs_grad(out):
            raise TypeError(
                "call_in_forward: fn returned a tensor that needs a gradient inside a "
                f"{type(out).__name__}; return that tensor itself (or a LossOutput with it as the loss), so that its "
                "backward runs through the module's hooks."
            )
        return (_Opaque(out),)

    had_own = "forward" in module.__dict__
    own = module.__dict__.get("forward")
    module.forward = types.MethodType(forward, module)
    try:
        result = module(*tensors)
    finally:
        if had_own:
            module.forward = own
        else:
            del module.forward
    if len(result) == 2:
        return result[1].value(result[0])
    return result[0].value


def with_lm_head(head: torch.nn.Module, fn: Callable[..., Any], *tensors: torch.Tensor) -> Any:
    """``fn(weight, bias, *tensors)`` with the head's full weight (V, H) and bias (V,) or None, on any engine.

    ZeRO-3 partitions: through :func:`call_in_forward` where autograd records (the loss); under ``torch.no_grad``
    gathered by ``deepspeed.zero.GatheredParameters`` for the duration of ``fn`` (the old policy's capture: call it
    outside the model's forward, so that ZeRO-3's trace of module calls stays that of the model; ``fn``'s result
    must not keep the weight). Otherwise :func:`gather_lm_head` (FSDP2 DTensors are all-gathered; plain tensors,
    as in one process or DDP, are used as they are). Gradients flow back to the parameters, sharded or not.
    """
    weight, bias = head.weight, getattr(head, "bias", None)
    if is_zero3_param(weight):
        if torch.is_grad_enabled():
            return call_in_forward(head, lambda m, *t: fn(m.weight, getattr(m, "bias", None), *t), *tensors)
        # No gradient: gather for the duration of fn (outside any forward, so ZeRO-3's module trace is untouched).
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for p in (weight, bias) if p is not None]):
            return fn(weight, bias, *tensors)
    weight, bias = gather_lm_head(weight, getattr(head, "bias", None))
    return fn(weight, bias, *tensors)
