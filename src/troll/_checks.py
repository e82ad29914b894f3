"""Checks of the tensors the public functions take (type, dtype, shape, finiteness, masks, sparse rows, token ids),
with messages that name the argument and the fix. A number goes through :mod:`troll.runs.numbers`, the one check of
a user's number; TROLL's top_k and delta through :mod:`troll.categorical.settings`."""

from __future__ import annotations

import torch

from troll.runs import numbers
from troll.runs.numbers import check_choice, check_real  # noqa: F401  (check_choice: one for both wings)


def check_number(name: str, value, *, low: float = 0.0, strict: bool = True, hint: str = "") -> None:
    """A finite real number (not a bool, str or None) above ``low`` (``>= low`` when ``strict=False``)."""
    check_real(name, value, low=low, low_open=strict, hint=hint)


def check_positive(name: str, value: float) -> None:
    check_number(name, value, hint="; pass a positive number (e.g. kl_bound=0.05, eps_low=0.2)")


def check_int(name: str, value, *, low: int = 1, hint: str = "") -> None:
    """An int (not a bool) >= ``low`` (:func:`troll.runs.numbers.check_int`)."""
    numbers.check_int(name, value, low=low, hint=hint)


def check_tensor(name: str, value, *, hint: str = "") -> None:
    """A real (non-meta) torch.Tensor; Python lists and NumPy arrays are refused with the fix."""
    if not torch.is_tensor(value):
        raise ValueError(
            f"{name} must be a torch.Tensor, got {type(value).__name__}; wrap it: torch.tensor({name}){hint}."
        )
    if value.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (shape only, no values); materialise it (e.g. .to('cpu')).")


def check_mask(mask: torch.Tensor) -> torch.Tensor:
    """bool, or integer / float with only 0 and 1 (TRL's int masks); returns the bool mask."""
    check_tensor("mask", mask)
    if mask.dtype == torch.bool:
        return mask
    if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            "mask must be boolean (or 0/1 valued), got other values; per-token weights are not supported: "
            "pass mask > 0 and put weights into the advantages."
        )
    return mask.bool()


def check_sparse(old, vocab_size: int, *, tol: float = 1e-3) -> None:
    """Cheap one-pass validation of a (possibly hand-built) SparseLogProbs (..., K) against vocabulary V."""
    if isinstance(old.vocab_size, bool) or not isinstance(old.vocab_size, int) or old.vocab_size < 2:
        raise ValueError(f"old.vocab_size must be an integer >= 2, got {old.vocab_size!r}.")
    for name in ("ids", "logp", "mask"):
        check_tensor(f"old.{name}", getattr(old, name))
    if old.ids.dim() < 1 or old.ids.shape[-1] < 1:
        raise ValueError(f"old has K = 0 stored ids (shape {tuple(old.ids.shape)}); build it with troll.sparsify.")
    if old.mask.dtype != torch.bool:
        raise ValueError(f"old.mask must be a bool tensor, got {old.mask.dtype}; pass mask.bool().")
    if not old.logp.is_floating_point():
        raise ValueError(f"old.logp must be a floating-point tensor, got {old.logp.dtype}.")
    check_ids("old.ids (at old.mask == True)", old.ids[old.mask], vocab_size)
    logp = torch.where(old.mask, old.logp.double(), float("-inf"))
    if torch.isnan(logp).any() or (logp > tol).any():
        raise ValueError("old.logp holds NaN or log-probs > 0 at kept ids; build old with troll.sparsify.")
    k = old.ids.shape[-1]
    if k > 1:  # a repeated id would count its mass twice
        filler = -torch.arange(1, k + 1, device=old.ids.device).expand_as(old.ids)
        ranked = torch.where(old.mask, old.ids.long(), filler).sort(-1).values
        if bool(((ranked[..., 1:] == ranked[..., :-1]) & (ranked[..., 1:] >= 0)).any()):
            raise ValueError("old.ids repeats an id within a row; each kept id must appear once (see troll.sparsify).")
    kept = logp.exp().sum(-1)
    if bool((kept > 1 + tol).any()):
        raise ValueError(
            "old.logp is not normalised: the kept probabilities of a row sum to more than 1. Pass log-probs over "
            "the full vocabulary (log_softmax of the logits), e.g. from troll.sparsify."
        )
    whole = old.mask.sum(-1) >= vocab_size  # every id kept: nothing is left for the rest
    if bool((whole & ((kept - 1).abs() > tol)).any()):
        raise ValueError(
            "old.logp keeps every id of the vocabulary but its probabilities sum to less than 1; pass log-probs over "
            "the full vocabulary (log_softmax of the logits), e.g. from troll.sparsify."
        )
    if old.log_rest is not None:
        total = kept + old.log_rest.double().exp()
        if not bool(((total - 1).abs() <= tol).all()):
            raise ValueError(
                "old.log_rest is inconsistent: exp(log_rest) plus the kept mass must be 1 per row (it is the log of "
                "the unkept mass). Pass log_rest=None to derive it, or build old with troll.sparsify."
            )


def check_logits(name: str, logits: torch.Tensor, *, scan: bool = True) -> None:
    """Finite or -inf (a masked vocabulary entry) is legal; NaN and +inf are not.

    ``scan=False`` checks type and shape only: callers that compute the rows' logsumexp anyway check the values
    through :func:`check_lse`, which costs nothing extra (NaN and +inf both propagate into it).
    """
    check_tensor(name, logits)
    if not logits.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {logits.dtype}.")
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
