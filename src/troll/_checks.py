"""Input validation shared by the public functions: one place for every error message."""

from __future__ import annotations

import torch


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}; pass a positive number (the paper uses 0.05).")


def check_top_k(top_k: int) -> None:
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}; the paper uses top_k=64.")


def check_delta(delta: float) -> None:
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must lie in [0, 1), got {delta!r}; the paper uses delta=1e-5 (0 keeps top_k tokens).")


def check_logits(name: str, logits: torch.Tensor, *, scan: bool = True) -> None:
    """Finite or -inf (a masked vocabulary entry) is legal; NaN and +inf are not.

    ``scan=False`` checks type and shape only: callers that compute the rows' logsumexp anyway check the values
    through :func:`check_lse`, which costs nothing extra (NaN and +inf both propagate into it).
    """
    if not torch.is_tensor(logits) or not logits.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {type(logits).__name__}.")
    if logits.dim() < 1 or logits.shape[-1] < 2:
        raise ValueError(f"{name} must have a vocabulary dimension of size >= 2 last, got shape {tuple(logits.shape)}.")
    if scan and (torch.isnan(logits).any() or torch.isposinf(logits).any()):
        raise ValueError(_BAD_VALUES.format(name=name))
    if scan and (logits == float("-inf")).all(-1).any():
        raise ValueError(_ALL_MASKED.format(name=name))


_BAD_VALUES = (
    "{name} contains NaN or +inf; only finite values and -inf (masked tokens) are allowed. "
    "Check the model output and the temperature you divided by."
)
_ALL_MASKED = "{name} has a row whose every entry is -inf; at least one token per position must stay allowed."


def check_lse(name: str, lse: torch.Tensor) -> None:
    """Value check of logits through their rows' logsumexp: NaN / +inf in a row make it NaN / +inf."""
    if torch.isnan(lse).any() or torch.isposinf(lse).any():
        raise ValueError(_BAD_VALUES.format(name=name))
    if torch.isneginf(lse).any():
        raise ValueError(_ALL_MASKED.format(name=name))


def check_ids(name: str, ids: torch.Tensor, vocab_size: int) -> None:
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ValueError(f"{name} must be an integer tensor of token ids, got dtype {ids.dtype}.")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"{name} holds ids outside the vocabulary [0, {vocab_size}): min {int(ids.min())}, max {int(ids.max())}. "
            "Use the same tokenizer/vocabulary for the logits and the ids (pad with a valid id and mask it)."
        )


def check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...], hint: str = "") -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)} but {tuple(shape)} is expected{hint}.")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, choices))}.")
