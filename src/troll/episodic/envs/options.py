"""Checked env options: every option of every env has a type and a range, checked before anything is built.

An option table maps an option's name to a :class:`Option` (its kind and range, or its choices). ``check`` raises a
ValueError naming the env and the option (a :class:`troll.runs.numbers.FieldError`, the option its ``field``) for an
unknown name, a wrong type (a string, None, a bool for a number), a non-finite or out-of-range number, or a choice not
in the list: `{"dt": "abc"}`, `{"kp": null}`, `{"max_accel": 1e300}` and NaN all stop here, before a run writes
anything.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from troll.runs.numbers import FieldError


@dataclass(frozen=True)
class Option:
    """kind: "float", "int", "bool" or "choice"; low/high: the closed range of a number (None: unbounded, which
    never holds for a float: every float option has a finite range); choices: the allowed values of a choice;
    optional: None is allowed too; help: what it sets."""

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple = ()
    optional: bool = False
    help: str = ""


def _describe(opt: Option) -> str:
    if opt.kind == "choice":
        return " or ".join(repr(c) for c in opt.choices)
    if opt.kind == "bool":
        return "true or false"
    kind = "an integer" if opt.kind == "int" else "a finite number"
    none = " (or null)" if opt.optional else ""
    return f"{kind} in [{opt.low:g}, {opt.high:g}]{none}"


def check(env: str, options: dict, table: dict[str, Option]) -> dict:
    """``options`` checked against ``table``; returns them unchanged (ints given for floats become floats)."""
    if not isinstance(options, dict):
        raise ValueError(f"{env}: the env options must be a JSON object (a dict), got {options!r}")
    out = {}
    for name, value in options.items():
        if name not in table:
            close = difflib.get_close_matches(str(name), table, n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise FieldError(
                f"{env}: unknown option {name!r}.{hint} This env takes: {', '.join(table) or 'no options'}.", name
            )
        out[name] = _value(env, name, value, table[name])
    return out


def _value(env: str, name: str, value, opt: Option):
    bad = FieldError(f"{env}: option {name!r} must be {_describe(opt)}, got {value!r}", name)
    if value is None and opt.optional:
        return None
    if opt.kind == "choice":
        if not isinstance(value, (str, int, float)) or isinstance(value, bool) or value not in opt.choices:
            raise bad
        return value
    if opt.kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad
    if opt.kind == "int" and not (isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())):
        raise bad
    if not math.isfinite(float(value)) or not opt.low <= value <= opt.high:
        raise bad
    return int(value) if opt.kind == "int" else float(value)
