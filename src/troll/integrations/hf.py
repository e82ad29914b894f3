"""The transformers LM-head plumbing shared by the TRL and verl integrations: the head, the probe, the capture.

A causal LM from transformers scores a completion with ``logits = final_hidden @ lm_head.weight.T + bias``; the
chunked TROLL path (docs/method.md) needs that hidden state and weight instead of the (B, T, V) logits. Both
integrations find the head and rule out what the chunked path cannot reproduce with :func:`head_blocker`, compare
one row of the model's logits with the head applied to its hidden state with :func:`logits_mismatch` (the probe),
and capture the old sparse policy with :func:`sparsify_head` (chunked) or :func:`troll.sparsify` (dense). The TRL
trainer also runs its own forwards through :func:`final_hidden`, :func:`completion_logits` and
:func:`capture_old`; verl's engine reads the hidden states and logits off verl's forward.

Shapes: B sequences, S prompt + completion positions, T completion positions, H hidden size, V vocabulary,
K kept ids per position.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from troll.categorical.distributed import full_shape, is_dtensor
from troll.categorical.lm_head import sparsify_from_hidden
from troll.categorical.sparse import SparseLogProbs, cat_sparse, sparsify

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


def head_blocker(model: torch.nn.Module, *, sharded: bool = False) -> str | None:
    """Why the chunked path cannot reproduce ``model``'s logits from its structure alone, or None.

    Checks: a linear output embedding with a (V, H) weight (the full shape, for a ZeRO-3 partition), no sharded
    DTensor unless ``sharded`` (the caller gathers FSDP2 shards itself), and no logit transform in the config. The
    probe (:func:`probe_linear_head` or :func:`logits_mismatch`) checks the values.
    """
    head = output_embeddings(model)
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or len(full_shape(weight)) != 2:
        return "the model has no linear output embeddings (get_output_embeddings() with a (V, H) weight)"
    if is_dtensor(weight) and not sharded:
        return "the LM head's weight is a sharded DTensor outside FSDP2 (tensor parallelism)"
    return logit_transform(getattr(model, "config", None))


def logits_mismatch(logits_row: torch.Tensor, hidden_row: torch.Tensor, weight, bias) -> str | None:
    """None if ``logits_row`` (1, V) equals ``hidden_row`` (1, H) @ weight.T + bias to :data:`PROBE_TOL`, else why.

    The probe's comparison, computed in the weight's dtype (no float copy of a (V, H) bf16 weight): it catches a
    norm after the hidden state or a logit transform that no config field announces.
    """
    with torch.no_grad():
        expected = torch.nn.functional.linear(hidden_row.to(weight.device, weight.dtype), weight, bias).float()
        got = logits_row.detach().float().to(expected.device)
    error = float((got - expected).abs().max())
    if not error <= PROBE_TOL * (float(expected.abs().max()) + 1):
        return f"its logits are not last_hidden_state @ weight.T + bias (max deviation {error:.3g} on a probe)"
    return None


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
    return with_head(lambda weight, bias: logits_mismatch(logits[:, -1], last, weight, bias))


def completion_logits(
    model: torch.nn.Module, input_ids, attention_mask, completion_len: int, temperature: float, *, autocast=None
) -> torch.Tensor:
    """(B, T, V) logits (fp32, or fp64 for a fp64 model) scoring the last T tokens, divided by ``temperature``."""
    t = completion_len
    with autocast if autocast is not None else contextlib.nullcontext():
        out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=t + 1, use_cache=False)
    logits = out.logits[:, -(t + 1) : -1]
    return (logits if logits.dtype == torch.float64 else logits.float()) / temperature


def sparsify_head(
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    *,
    with_head: Callable,
    temperature: float,
    top_k: int,
    delta: float,
    return_entropy: bool = False,
):
    """The old sparse policy of ``hidden`` (..., H) through the LM head, the sampled ``tokens`` (...) kept.

    ``with_head(fn, *tensors)`` calls ``fn(weight, bias, *tensors)`` with the head's full weight (a sharded head
    gathered for the call, e.g. :func:`troll.categorical.distributed.with_lm_head`). Returns
    :func:`troll.sparsify_from_hidden`'s
    result (and the rows' entropy with ``return_entropy``), computed in fp32 whatever autocast is on.
    """

    def capture(weight, bias, h, t):
        with torch.autocast(h.device.type, enabled=False):
            kwargs = dict(bias=bias, temperature=temperature, top_k=top_k, delta=delta, return_entropy=return_entropy)
            return sparsify_from_hidden(h, weight, include=t, **kwargs)

    return with_head(capture, hidden, tokens)


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
    with_head: Callable | None = None,
) -> SparseLogProbs:
    """The old sparse policy (B, T, K) of a rollout batch at the current weights, ``batch_size`` sequences at a time.

    input_ids, attention_mask: (B, S) prompt + completion; completion_ids: (B, T), the last T of them, always kept
    (the sampled token). ``chunked``: the chunked LM head (:func:`head_blocker` and the probe must have passed)
    instead of the dense logits. ``wrapped``: the model to call if the forward must go through a wrapper (default
    ``model``, which owns the head). ``with_head``: how to reach the head's full weight (default: its parameters
    as they are; pass :func:`troll.categorical.distributed.with_lm_head` bound to the head for FSDP2 / ZeRO-3).
    ``autocast``: a
    callable returning a fresh context manager for each forward (e.g. ``accelerator.autocast``), or None.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}.")
    call = model if wrapped is None else wrapped
    if with_head is None:
        head = output_embeddings(model)

        def with_head(fn, *tensors):
            return fn(head.weight, getattr(head, "bias", None), *tensors)

    kept = dict(temperature=temperature, top_k=top_k, delta=delta)
    t, parts = completion_ids.shape[1], []
    for start in range(0, input_ids.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        ids, att, tokens = input_ids[rows], attention_mask[rows], completion_ids[rows]
        if chunked:
            hidden, _ = final_hidden(call, ids, att, autocast=None if autocast is None else autocast())
            # Position i predicts token i + 1: the last t + 1 positions minus the final one score the completion.
            parts.append(sparsify_head(hidden[:, -(t + 1) : -1], tokens, with_head=with_head, **kept))
        else:
            logits = completion_logits(
                call, ids, att, t, temperature, autocast=None if autocast is None else autocast()
            )
            parts.append(sparsify(logits, top_k=top_k, delta=delta, include=tokens))
    return cat_sparse(parts)


class GenerationRecorder(LogitsProcessor):
    """A logits processor for ``model.generate`` that records the old sparse policy of every generated position.

    transformers calls it at each step with the sequences so far (B, S) and the next-token scores (B, V) after its
    own logits processors (repetition penalty, ...) and before the warpers (temperature, top-k, top-p, min-p), which
    it appends after the processors a caller passes. The recorder keeps the step's scores divided by
    ``temperature`` and, once the next call (or :meth:`finish`) shows which token was sampled, stores
    :func:`troll.sparsify` of them with that token included: the rule and code of the recomputing forward, on the
    generation's own logits, so the trust region is around the temperature-scaled full distribution the token was
    drawn from (before any truncation). Memory: one (B, V) fp32 row of scores at a time plus the (B, K) records.
    """

    def __init__(self, *, temperature: float, top_k: int, delta: float):
        self.temperature, self.top_k, self.delta = temperature, top_k, delta
        self.steps: list[SparseLogProbs] = []
        self.records: list[SparseLogProbs] = []  # one (B, steps, K) entry per finished generate call
        self._scores = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._store(input_ids[:, -1])
        self._scores = scores.detach().float() / self.temperature  # a copy: the warpers change scores in place
        return scores

    def _store(self, sampled: torch.Tensor) -> None:
        if self._scores is not None:
            step = sparsify(self._scores, top_k=self.top_k, delta=self.delta, include=sampled)
            self.steps.append(step[:, None])
            self._scores = None

    def finish(self, sequences: torch.Tensor) -> SparseLogProbs:
        """The records (B, steps, K) of a finished ``generate`` whose output is ``sequences`` (B, S)."""
        self._store(sequences[:, -1])
        if not self.steps:
            raise RuntimeError("generate produced no token, so the sampler recorded no old policy.")
        steps, self.steps = self.steps, []
        return cat_sparse(steps, dim=1)


@contextlib.contextmanager
def recording_generate(model: torch.nn.Module, recorder: GenerationRecorder):
    """Within the block, ``model.generate(...)`` also runs ``recorder`` as its last logits processor (before the
    warpers) and, when a call returns, appends that call's records (B, steps, K) to ``recorder.records``.

    The method is replaced on this model object only, and restored on exit.
    """
    had_own = "generate" in model.__dict__
    original = model.generate

    def generate(*args, **kwargs):
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(recorder)
        out = original(*args, logits_processor=processors, **kwargs)
        recorder.records.append(recorder.finish(out if torch.is_tensor(out) else out.sequences))
        return out

    model.generate = generate
    try:
        yield recorder
    finally:
        if had_own:
            model.generate = original
        else:
            del model.generate
