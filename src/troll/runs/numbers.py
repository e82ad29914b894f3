"""The one check of a number given by a user: a finite real (not a bool), in a range, named as the user wrote it.

Every check of a hyper-parameter or a flag goes through here (:mod:`troll.categorical.settings`, :mod:`troll._checks`,
``troll train``'s options, the TRL config, the episodic configs), so that "a finite real number, not a bool" is
written once. Torch-free. ``name`` is what the user typed: ``"--policy-lr"`` on the command line, ``"policy_lr"``
for a config field, so that the message points at the thing to change. ``error`` picks the exception class: a
library raises ValueError, the command line its :class:`troll.runs.UsageError` (a ValueError).

Upper bounds: a value that is finite but so large that the arithmetic it enters overflows (``--policy-lr 1e300``,
``--init-std 1e300``) is refused as well; the caller gives the bound with a reason.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

SEED_LIMIT = 2**32  # numpy's and the env's seed range: a seed is a whole number in [0, 2**32)


class FieldError(ValueError):
    """A ValueError about one named value: ``field`` is the name it was checked under, so that a caller can say which
    flag to change (``--mean-bound``) without reading the message."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def _error(error: type[Exception], message: str, name: str) -> Exception:
    """``error`` with ``message``; a plain ValueError becomes a :class:`FieldError` naming ``name``."""
    return FieldError(message, name) if error is ValueError else error(message)


def is_real(value) -> bool:
    """A finite real number that is not a bool (``True`` is an int to Python, never a number to a user)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value) -> bool:
    """A whole number of an integer type, not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def _describe(low, high, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return " and ".join(parts)


def check_real(
    name: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = True,
    high_open: bool = False,
    hint: str = "",
    error: type[Exception] = ValueError,
) -> None:
    """``value`` must be a finite real number (not a bool) with ``low < value`` (``<=`` unless ``low_open``) and
    ``value <= high`` (``<`` when ``high_open``); otherwise ``error`` naming ``name``, the range and ``hint``."""
    ok = is_real(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        where = _describe(low, high, low_open, high_open)
        rule = f"{where} and a finite number" if where else "a finite number"
        kind = " (a bool is not a number)" if isinstance(value, bool) else ""
        raise _error(error, f"{name} must be {rule}, got {value!r}{kind}{_sep(hint)}.", name)


def check_int(name: str, value, *, low: int | None = 1, high: int | None = None, hint: str = "",
              error: type[Exception] = ValueError) -> None:  # fmt: skip
    """``value`` must be an integer (not a bool) in ``[low, high)``; otherwise ``error`` naming ``name``."""
    ok = is_int(value) and (low is None or value >= low) and (high is None or value < high)
    if not ok:
        rule = "an integer" + (f" >= {low}" if low is not None else "")
        rule += (" and" if low is not None else "") + f" < {_big(high)}" if high is not None else ""
        shown = f"{value:.3e} ({len(str(abs(value)))} digits)" if is_int(value) and abs(value) > 10**15 else repr(value)
        raise _error(error, f"{name} must be {rule}, got {shown}{_sep(hint)}.", name)


def check_seed(name: str, value, *, error: type[Exception] = ValueError) -> None:
    """A seed: a whole number in [0, 2**32), the range numpy and the environments accept."""
    check_int(name, value, low=0, high=SEED_LIMIT, hint="numpy's seed range", error=error)


def _big(n: int) -> str:
    return "2**32" if n == SEED_LIMIT else str(n)


def _sep(hint: str) -> str:
    if not hint:
        return ""
    return hint if hint.startswith((";", ":", ",", " (")) else f"; {hint}"


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """``value`` is one of ``choices``; the message lists them."""
    if value not in choices:
        raise FieldError(f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, choices))}.", name)
