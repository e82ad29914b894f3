"""Generated code tasks: "write the Python function NAME(ARGS) that ..." with tests computed by a trusted reference.

Each item is drawn from a family by its own ``random.Random(seed + index)``, like the reasoning_gym presets: the
prompt describes one function in words (its name and arguments in backquotes) and asks for it in a ```python block;
its tests are call-style cases (``{"input": [args], "expected": value}``) whose expected values this module
computes in the trainer's own process with a reference written here. The model's code only ever runs in
:mod:`troll.sandbox`.

Families (``code_<family>`` tasks; ``code`` mixes them, one family per item in turn; ``code_except_<family>`` mixes
the other four):

- ``affine``: ``a * x + b`` of an integer;
- ``piecewise``: two branches on a threshold (a number or a word);
- ``list``: sum, largest, count of evens, scale each, keep the positive ones, sum of squares of a list of ints;
- ``string``: count vowels, repeat, first k characters, drop the vowels, double each letter, count one letter;
- ``compose``: two of these in a row (sum of those above t, affine map of each element, reverse then upper case,
  length times k).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CASES = 6  # tests per item; the reward is the fraction passed (the sandbox runs at most 10)
INSTRUCTION = "Reply with only the function in a ```python code block."


@dataclass(frozen=True)
class Spec:
    """One generated function: its name, its argument names, what it does in words, and the reference."""

    name: str
    args: tuple[str, ...]
    does: str  # "returns ..."
    reference: Callable[..., Any]
    draw: Callable[[random.Random], list]  # one test input: the positional arguments


def _int(rng: random.Random) -> list:
    return [rng.randint(-20, 20)]


def _ints(rng: random.Random) -> list:
    return [[rng.randint(-9, 9) for _ in range(rng.randint(0, 6))]]


def _word(rng: random.Random) -> list:
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 8)))]


def affine(rng: random.Random) -> Spec:
    a, b = rng.choice([2, 3, 4, 5, -2, -3]), rng.choice([1, 2, 3, 5, 7, -1, -4])
    name = rng.choice(["scale_and_shift", "linear", "affine_value", "transform"])
    sign = "plus" if b >= 0 else "minus"
    return Spec(name, ("x",), f"returns {a} times x {sign} {abs(b)}", lambda x: a * x + b, _int)


def piecewise(rng: random.Random) -> Spec:
    t = rng.randint(-5, 10)
    if rng.random() < 0.5:
        name = rng.choice(["size_label", "classify", "big_or_small"])
        return Spec(name, ("x",), f'returns "big" if x is greater than {t}, and "small" otherwise',
                    lambda x: "big" if x > t else "small", _int)  # fmt: skip
    a, b = rng.choice([2, 3, 10]), rng.choice([1, 5, 100])
    name = rng.choice(["piecewise", "adjust", "step_value"])
    return Spec(name, ("x",), f"returns x times {a} if x is greater than {t}, and x plus {b} otherwise",
                lambda x: x * a if x > t else x + b, _int)  # fmt: skip


def list_op(rng: random.Random) -> Spec:
    k = rng.choice([2, 3, 5])
    ops = [
        ("total", "returns the sum of the numbers in the list nums", lambda nums: sum(nums)),
        ("largest", "returns the largest number in the non-empty list nums", lambda nums: max(nums)),
        ("count_even", "returns how many numbers in the list nums are even",
         lambda nums: sum(n % 2 == 0 for n in nums)),
        ("scale_all", f"returns a new list with each number of the list nums multiplied by {k}",
         lambda nums: [n * k for n in nums]),
        ("keep_positive", "returns a list of the numbers in the list nums that are greater than 0, in order",
         lambda nums: [n for n in nums if n > 0]),
        ("sum_of_squares", "returns the sum of the squares of the numbers in the list nums",
         lambda nums: sum(n * n for n in nums)),
    ]  # fmt: skip
    name, does, ref = rng.choice(ops)
    draw = _nonempty if name == "largest" else _ints
    return Spec(name, ("nums",), does, ref, draw)


def _nonempty(rng: random.Random) -> list:
    return [[rng.randint(-9, 9) for _ in range(rng.randint(1, 6))]]


def string_op(rng: random.Random) -> Spec:
    k = rng.choice([2, 3])
    letter = rng.choice("aeiou")
    ops = [
        ("count_vowels", "returns how many of the characters of the string s are vowels (a, e, i, o, u)",
         lambda s: sum(c in "aeiou" for c in s)),
        ("repeat_text", f"returns the string s repeated {k} times", lambda s: s * k),
        ("prefix", f"returns the first {k} characters of the string s", lambda s: s[:k]),
        ("remove_vowels", "returns the string s without its vowels (a, e, i, o, u)",
         lambda s: "".join(c for c in s if c not in "aeiou")),
        ("double_letters", "returns the string s with each of its characters written twice",
         lambda s: "".join(c + c for c in s)),
        ("count_letter", f'returns how many times the letter "{letter}" occurs in the string s',
         lambda s: s.count(letter)),
    ]  # fmt: skip
    name, does, ref = rng.choice(ops)
    return Spec(name, ("s",), does, ref, _word)


def compose(rng: random.Random) -> Spec:
    t, k = rng.randint(-3, 4), rng.choice([2, 3])
    a, b = rng.choice([2, 3, -1]), rng.choice([1, 2, -3])
    sign = "plus" if b >= 0 else "minus"
    ops = [
        ("sum_above", f"returns the sum of the numbers in the list nums that are greater than {t}",
         lambda nums: sum(n for n in nums if n > t), _ints),
        ("map_affine",
         f"returns a new list with each number n of the list nums replaced by {a} times n {sign} {abs(b)}",
         lambda nums: [a * n + b for n in nums], _ints),
        ("reverse_upper", "returns the string s reversed and in upper case", lambda s: s[::-1].upper(), _word),
        ("scaled_length", f"returns the length of the string s times {k}", lambda s: len(s) * k, _word),
    ]  # fmt: skip
    name, does, ref, draw = rng.choice(ops)
    return Spec(name, ("nums",) if draw is _ints else ("s",), does, ref, draw)


FAMILIES: dict[str, Callable[[random.Random], Spec]] = {
    "affine": affine,
    "piecewise": piecewise,
    "list": list_op,
    "string": string_op,
    "compose": compose,
}
TASKS = {
    "code": tuple(FAMILIES),
    **{f"code_{name}": (name,) for name in FAMILIES},
    # Four families, the fifth left out: train on one of these, evaluate on code_<name> to see what carries over
    **{f"code_except_{name}": tuple(f for f in FAMILIES if f != name) for name in FAMILIES},
}


def prompt(spec: Spec) -> str:
    return f"Write a Python function `{spec.name}({', '.join(spec.args)})` that {spec.does}. {INSTRUCTION}"


def item(task: str, seed: int) -> dict:
    """One item of ``task`` drawn from ``seed``: {"question", "tests", "family"}; tests in the JSON form of
    :func:`troll.integrations.code_reward.parse_tests` (distinct inputs, at most :data:`CASES`)."""
    rng = random.Random(seed)
    families = TASKS[task]
    family = families[seed % len(families)]
    spec = FAMILIES[family](rng)
    cases, seen = [], set()
    for _ in range(10 * CASES):
        args = spec.draw(rng)
        key = repr(args)
        if key not in seen:
            seen.add(key)
            cases.append({"input": args, "expected": spec.reference(*args)})
        if len(cases) == CASES:
            break
    tests = {"kind": "call", "entry_point": spec.name, "cases": cases}
    return {"question": prompt(spec), "tests": tests, "family": family}


def items(task: str, *, seed: int, size: int) -> list[dict]:
    if task not in TASKS:
        raise KeyError(task)
    return [item(task, seed + i) for i in range(size)]
