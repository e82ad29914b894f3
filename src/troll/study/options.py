"""A cell's options as data: a JSON object of its config's fields, written by the study, read by the cell's command.

Before the cells run, the study writes each cell's options to :attr:`troll.study.grid.Cell.options_file` (beside its
folder, like its log): the fields of the config the cell's command builds (``troll train``'s RunOptions, ``troll
tce train``'s TCEConfig or PPOConfig), from :attr:`troll.study.Frontend.cell_options`. The command reads them with
``--options FILE`` (:func:`read`): no value goes through text on a command line, so each comes back as it was
written (a float to its last bit, a bool, None, a tuple of widths). A field the config class does not have, or a
value not of the field's type, is refused with a :class:`UsageError` naming the field; a field left out takes the
class's default. A resumed cell continues from its own config.json (``--resume``), not from this file.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from pathlib import Path

from troll.runs.files import UsageError

FLAG = "--options"


def write(path: Path, values: dict) -> None:
    """Write ``values`` (field -> value) as the JSON object :func:`read` reads back (tuples as lists)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values, indent=2, allow_nan=False) + "\n")


def read(path: Path, cls: type) -> dict:
    """The fields of ``cls`` (a dataclass) given in the JSON object of ``path``, each of its field's type (a list
    becomes the tuple a ``tuple[int, ...]`` field holds); UsageError naming the file and the field otherwise."""
    return check(load(path), cls, source(path))


def source(path: Path) -> str:
    """How messages name the file: the flag and the path."""
    return f"{FLAG} {path}"


def load(path: Path) -> dict:
    """The JSON object of ``path``, unchecked (:func:`check` checks it); UsageError when it is none."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise UsageError(
            f"{source(path)}: cannot be read ({err.strerror or err}); give the file a study wrote."
        ) from None
    except ValueError as err:
        raise UsageError(f"{source(path)}: not valid JSON ({err}); give a JSON object of option fields.") from None
    if not isinstance(data, dict):
        raise UsageError(f"{source(path)}: must hold a JSON object of option fields, got {type(data).__name__}.")
    return data


def check(data, cls: type, source: str) -> dict:
    """``data`` (a JSON object) as :func:`read` returns it (``source`` leads the messages)."""
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for name, value in data.items():
        if name not in hints or name not in known:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(f"{source}: unknown field {name!r}{hint}; the fields of {cls.__name__} are: "
                             f"{', '.join(known)}.")  # fmt: skip
        try:
            values[name] = _typed(value, hints[name])
        except TypeError:
            raise UsageError(f"{source}: field {name!r} must be {_describe(hints[name])}, got {value!r}.") from None
    return values


def _typed(value, hint):
    """``value`` as a value of the type ``hint`` (TypeError when it is not one)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        for option in typing.get_args(hint):
            try:
                return _typed(value, option)
            except TypeError:
                continue
        raise TypeError(hint)
    if hint is type(None):
        if value is None:
            return None
        raise TypeError(hint)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, (list, tuple)):
            raise TypeError(hint)
        return tuple(_typed(v, item) for v in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:  # a whole number is a float's value too (1 in a file written by hand); never a bool
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif hint in (str, dict):
        if isinstance(value, hint):
            return value
    raise TypeError(hint)


_PLURAL = {int: "integers", float: "numbers", str: "strings"}


def _describe(hint) -> str:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join(_describe(option) for option in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) is tuple:
        return f"a list of {_PLURAL.get(typing.get_args(hint)[0], 'values')}"
    return {bool: "true or false", int: "an integer", float: "a finite number", str: "a string",
            dict: "a JSON object"}.get(hint, str(hint))  # fmt: skip
