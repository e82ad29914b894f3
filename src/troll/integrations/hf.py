"""The transformers LM-head plumbing shared by the TRL and verl integrations.

A causal LM from transformers scores a completion with ``logits = final_hidden @ lm_head.weight.T + bias``; the
chunked TROLL path (docs/method.md) needs that hidden state and weight instead of the (B, T, V) logits. These
functions find the head, check that the model's logits really are that linear map (a probe), run the forward that
returns the final hidden state, and capture the old sparse policy of a rollout batch in chunks of sequences.

Shapes: B sequences, S prompt + completion positions, T completion positions, H hidden size, V vocabulary,
K kept ids per position.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from troll.distributed import full_shape
from troll.lm_head import sparsify_from_hidden
from troll.sparse import SparseLogProbs, cat_sparse, sparsify

# Config fields that rescale or soft-cap the logits after the LM head (the ones TRL's fused head reads too), with
# their neutral value: the chunked path computes hidden @ weight.T + bias only.
LOGIT_TRANSFORMS = {
    "final_logit_softcapping": None,
    "logit_scale": 1.0,
    "output_multiplier": 1.0,
    "lm_head_multiplier": 1.0,
    "logits_scaling": 1.0,
}
# Probe: |logits - hidden @ weight.T - bias| <= tol * (max |logits| + 1); bf16 rounding stays far below this.
PROBE_TOL = 1e-2


def output_embeddings(model: torch.nn.Module):
    """The LM head module of an (already unwrapped) ``model``, or None when it has no get_output_embeddings()."""
    getter = getattr(model, "get_output_embeddings", None)
    return None if getter is None else getter()


def logit_transform(config) -> str | None:
    """Why ``config`` says the logits are not the plain LM head's output (a scale or soft-cap), or None."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key, neutral in LOGIT_TRANSFORMS.items():
        value = getattr(config, key, None)
        if value is not None and value != neutral:
            return f"the model rescales or soft-caps its logits after the LM head (config.{key}={value!r})"
    return None


def final_hidden(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, autocast=None, **extra
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S, H) final hidden states (the LM head's input) and (B, 1, V) logits of the last position.

    The model's own forward (so that DDP or any wrapper sees the call); ``hidden_states[-1]`` is the output after
    the final norm, and ``output_hidden_states=-1`` keeps only that one. ``logits_to_keep=1``: the head runs on one
    position. ``autocast``: a context manager to run under (e.g. accelerate's), none by default; ``extra`` goes to
    the forward (e.g. position_ids).
    """
    with autocast if autocast is not None else contextlib.nullcontext():
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=-1,
            logits_to_keep=1,
            use_cache=False,
            **extra,
        )
    states = getattr(out, "hidden_states", None)
    if not states or states[-1] is None:
        raise RuntimeError(
            f"{type(model).__name__} returned no hidden states for output_hidden_states=-1; use the dense (logits) "
            "path for this model (troll_lm_head='dense' in TrollGRPOTrainer)."
        )
    return states[-1], out.logits


@torch.no_grad()
def probe_linear_head(model: torch.nn.Module, head, device=None, *, autocast=None, with_head=None) -> str | None:
    """One forward of 4 tokens: are the returned logits last-hidden-state @ weight.T + bias? None if so, else why.

    Fails e.g. where the hidden state is not the head's input (a norm after it) or the forward transforms the logits
    in a way no config field announces. The model's train/eval mode is restored. ``with_head(fn)``, if given, calls
    ``fn(weight, bias)`` with the head's full weight (a sharded head is gathered only for that call, which returns
    one row of logits, never a copy of the weight); by default ``head.weight`` and ``head.bias`` are used.
    """
    if with_head is None:
        device = head.weight.device if device is None else device
        vocab = head.weight.shape[0]

        def with_head(fn):
            return fn(head.weight, getattr(head, "bias", None))
    else:
        device = next(model.parameters()).device if device is None else device
        vocab = full_shape(head.weight)[0]
    ids = torch.arange(1, 5, device=device).remainder(vocab).unsqueeze(0)
    was_training = model.training
    model.eval()
    try:
        hidden, logits = final_hidden(model, ids, torch.ones_like(ids), autocast=autocast)
    except Exception as err:  # any failure means: use the model's own logits
        return f"a forward with output_hidden_states failed ({type(err).__name__}: {err})"
    finally:
        model.train(was_training)
    last = hidden[:, -1].detach()

    def head_row(weight, bias):  # in the weight's dtype: no float copy of a (V, H) bf16 weight
        return torch.nn.functional.linear(last.to(weight.device, weight.dtype), weight, bias).float()

    expected = with_head(head_row)
    error = float((logits[:, -1].float().to(expected.device) - expected).abs().max())
    if not error <= PROBE_TOL * (float(expected.abs().max()) + 1):
        return f"its logits are not last_hidden_state @ weight.T + bias (max deviation {error:.3g} on a probe)"
    return None


def linear_head_blocker(model: torch.nn.Module) -> str | None:
    """Why the chunked path would not reproduce ``model``'s logits (sharding aside), or None if it does.

    Checks: a linear output embedding with a (V, H) weight, not a sharded DTensor, no logit transform in the
    config, and the probe. The caller adds what only it knows (FSDP / ZeRO-3 wrapping).
    """
    head = output_embeddings(model)
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return "the model has no linear output embeddings (get_output_embeddings() with a (V, H) weight)"
    if type(weight).__name__ == "DTensor" or type(weight.data).__name__ == "DTensor":
        return "the LM head's weight is a sharded DTensor (tensor parallelism or FSDP2)"
    reason = logit_transform(getattr(model, "config", None))
    return reason if reason is not None else probe_linear_head(model, head)


def head_inputs(model: torch.nn.Module, input_ids, attention_mask, completion_len: int, *, autocast=None, wrapped=None):
    """(hidden (B, T, H) at the positions that score the last ``completion_len`` tokens, weight (V, H), bias).

    Position i predicts token i + 1: the last T + 1 positions minus the final one score the completion.
    ``model`` is the unwrapped model (it owns the head); ``wrapped``, if given, is the one called (e.g. DDP's).
    """
    call = model if wrapped is None else wrapped
    hidden, _ = final_hidden(call, input_ids, attention_mask, autocast=autocast)
    head = output_embeddings(model)
    t = completion_len
    return hidden[:, -(t + 1) : -1], head.weight, getattr(head, "bias", None)


def completion_logits(
    model: torch.nn.Module, input_ids, attention_mask, completion_len: int, temperature: float, *, autocast=None
) -> torch.Tensor:
    """(B, T, V) logits (fp32, or fp64 for a fp64 model) scoring the last T tokens, divided by ``temperature``."""
    t = completion_len
    with autocast if autocast is not None else contextlib.nullcontext():
        out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=t + 1, use_cache=False)
    logits = out.logits[:, -(t + 1) : -1]
    return (logits if logits.dtype == torch.float64 else logits.float()) / temperature


@torch.no_grad()
def capture_old(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    *,
    temperature: float,
    top_k: int,
    delta: float,
    chunked: bool,
    batch_size: int,
    autocast=None,
    wrapped: Callable | None = None,
) -> SparseLogProbs:
    """The old sparse policy (B, T, K) of a rollout batch at the current weights, ``batch_size`` sequences at a time.

    input_ids, attention_mask: (B, S) prompt + completion; completion_ids: (B, T), the last T of them, always kept
    (the sampled token). ``chunked``: the chunked LM head (needs :func:`linear_head_blocker` to be None) instead of
    the dense logits. ``wrapped``: the model to call if the forward must go through a wrapper (default ``model``).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}.")
    call = model if wrapped is None else wrapped
    t, parts = completion_ids.shape[1], []
    for start in range(0, input_ids.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        ids, att, tokens = input_ids[rows], attention_mask[rows], completion_ids[rows]
        if chunked:
            hidden, weight, bias = head_inputs(model, ids, att, t, autocast=autocast, wrapped=wrapped)
            parts.append(
                sparsify_from_hidden(
                    hidden,
                    weight,
                    bias=bias,
                    temperature=temperature,
                    top_k=top_k,
                    delta=delta,
                    include=tokens,
                )
            )
        else:
            logits = completion_logits(call, ids, att, t, temperature, autocast=autocast)
            parts.append(sparsify(logits, top_k=top_k, delta=delta, include=tokens))
    return cat_sparse(parts)
