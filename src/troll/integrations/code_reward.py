"""The code reward every trainer shares: tests in JSON, checked, turned into :mod:`troll.sandbox` suites and scored.

The tests of one prompt, as a dict or its JSON string (a dataset column, verl's ``ground_truth``, a line of the
user's JSONL)::

    {"kind": "call", "entry_point": "add", "cases": [{"input": [1, 2], "expected": 3}, ...]}
    {"kind": "stdio", "cases": [{"input": "1 2\\n", "expected": "3\\n"}, ...]}

``call``: each case calls ``entry_point(*input)`` and compares the returned value, as JSON, with ``expected``;
``stdio``: each case runs the whole program with ``input`` on stdin and compares its stdout with ``expected``. The
form of APPS, TACO and the code rows of Eurus-2-RL-Data is accepted too: ``{"inputs": [...], "outputs": [...]}``
(stdio) or with ``"fn_name"`` (call; each input is the list of arguments and, as APPS writes it, each output the
list ``[return value]``, unwrapped here; an output that is not a one-element list is taken as it is).

The reward of a completion is the fraction of its first ``max_tests`` tests passed (the TROLL paper: 10), run in
one sandboxed process; ``None`` when the sandbox itself failed (TRL's "cannot score"), never a guess.
"""

from __future__ import annotations

import json
from typing import Any

KINDS = ("call", "stdio")
MAX_TESTS = 10
OUTPUT = 1 << 20  # bytes a stdio test may print, or one return value may take (troll.sandbox.scoring.OUTPUT)


class TestsError(ValueError):
    """Malformed tests; the message names the field (``where``) and what it must be."""


def parse_tests(obj: Any, *, where: str = "tests") -> dict:
    """``obj`` (a dict or its JSON string, in either form above) checked and in the canonical form
    ``{"kind", "entry_point", "cases": [{"input", "expected"}]}``; :class:`TestsError` naming ``where`` otherwise."""
    if isinstance(obj, str | bytes):
        try:
            obj = json.loads(obj)
        except ValueError as err:
            raise TestsError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(obj, dict):
        raise TestsError(f"{where}: must be an object with kind and cases (or inputs and outputs), got {_kind(obj)}")
    if "inputs" in obj or "outputs" in obj:
        obj = from_io(obj, where=where)
    kind = obj.get("kind")
    if kind not in KINDS:
        raise TestsError(f"{where}.kind: must be 'call' or 'stdio', got {kind!r}")
    entry = obj.get("entry_point")
    if kind == "call" and not (isinstance(entry, str) and entry.isidentifier()):
        raise TestsError(f"{where}.entry_point: a call test needs the function's name, got {entry!r}")
    cases = obj.get("cases")
    if not isinstance(cases, list) or not cases:
        raise TestsError(f"{where}.cases: must be a non-empty list of {{input, expected}}, got {_kind(cases)}")
    for i, case in enumerate(cases):
        _check_case(case, kind, f"{where}.cases[{i}]")
    return {"kind": kind, "entry_point": entry if kind == "call" else None, "cases": cases}


def _check_case(case: Any, kind: str, where: str) -> None:
    if not isinstance(case, dict) or "input" not in case or "expected" not in case:
        raise TestsError(f"{where}: must be an object with input and expected, got {_kind(case)}")
    if kind == "call" and not isinstance(case["input"], list):
        raise TestsError(f"{where}.input: a call test's input is the list of arguments, got {_kind(case['input'])}")
    if kind == "stdio":
        for key in ("input", "expected"):
            if not isinstance(case[key], str):
                raise TestsError(f"{where}.{key}: a stdio test's {key} is a string, got {_kind(case[key])}")
    try:
        json.dumps(case["input"]), json.dumps(case["expected"])
    except (TypeError, ValueError) as err:
        raise TestsError(f"{where}: input and expected must be JSON values ({err})") from None


def from_io(obj: dict, *, where: str = "tests") -> dict:
    """APPS/TACO/Eurus ``{"inputs", "outputs"[, "fn_name"]}`` in the canonical form (see the module docstring)."""
    inputs, outputs = obj.get("inputs"), obj.get("outputs")
    for key, value in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(value, list) or not value:
            raise TestsError(f"{where}.{key}: must be a non-empty list, got {_kind(value)}")
    if len(inputs) != len(outputs):
        raise TestsError(f"{where}: {len(inputs)} inputs but {len(outputs)} outputs; they must pair up")
    name = obj.get("fn_name")
    if name is None:
        return {"kind": "stdio", "cases": [{"input": i, "expected": o} for i, o in zip(inputs, outputs)]}
    unwrap = [o[0] if isinstance(o, list) and len(o) == 1 else o for o in outputs]
    return {"kind": "call", "entry_point": name, "cases": [{"input": i, "expected": o} for i, o in zip(inputs, unwrap)]}


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def to_suite(tests: dict, *, output: int = OUTPUT):
    """A :class:`troll.sandbox.TestSuite` of canonical ``tests`` (from :func:`parse_tests`), ``output`` bytes of
    output allowed per test."""
    from troll.sandbox import TestCase, TestSuite

    cases = tuple(TestCase(c["input"], c["expected"]) for c in tests["cases"])
    return TestSuite(kind=tests["kind"], cases=cases, entry_point=tests["entry_point"], output=output)


def completion_text(completion: Any) -> str:
    """TRL passes a conversational completion as a list of messages, a plain one as a string."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def score(completions: list[str], tests: list, *, sandbox=None, slots: int = 2, max_tests: int = MAX_TESTS,
          output: int = OUTPUT) -> list:  # fmt: skip
    """The :class:`troll.sandbox.Score` (or None) of each completion against its tests (dicts or JSON strings);
    ``output``: the bytes a stdio test may print, or one return value may take (more fails the test)."""
    from troll.sandbox import score_completions

    suites = [to_suite(parse_tests(t, where=f"tests[{i}]"), output=output) for i, t in enumerate(tests)]
    return score_completions(list(completions), suites, sandbox=sandbox, slots=slots, max_tests=max_tests)


class CodeReward:
    """A TRL reward function (``GRPOTrainer(reward_funcs=[CodeReward()])``): the fraction of tests passed.

    TRL calls it with ``prompts``, ``completions`` and every other dataset column as keyword arguments; the tests
    are read from the column ``column`` (default ``tests``: a dict or JSON string per row, in either form of the
    module docstring). Returns one float per completion, or ``None`` where the sandbox failed. The sandbox is made
    on first use (bubblewrap by default) unless one is given. ``output``: the bytes a stdio test may print, or one
    return value may take (more fails the test; at most 16 MiB).
    """

    __name__ = "code"  # TRL names the reward's log keys after it: rewards/code/mean

    def __init__(self, *, column: str = "tests", sandbox=None, slots: int = 2, max_tests: int = MAX_TESTS,
                 output: int = OUTPUT):  # fmt: skip
        if isinstance(output, bool) or not isinstance(output, int) or not 0 < output <= 16 << 20:
            raise ValueError(f"CodeReward: output must be bytes in (0, 16 MiB] per test, got {output!r}")
        self.column, self.sandbox, self.slots, self.max_tests = column, sandbox, slots, max_tests
        self.output = output

    def scores(self, completions: list, tests: list) -> list:
        texts = [completion_text(c) for c in completions]
        return score(texts, tests, sandbox=self.sandbox, slots=self.slots, max_tests=self.max_tests,
                     output=self.output)  # fmt: skip

    def __call__(self, prompts=None, completions=None, **kwargs) -> list[float | None]:
        if self.column not in kwargs:
            raise KeyError(f"CodeReward: the dataset has no column {self.column!r} with the tests; columns passed: "
                           f"{', '.join(sorted(kwargs)) or 'none'}")  # fmt: skip
        return [None if s is None else float(s.reward) for s in self.scores(completions, kwargs[self.column])]
