"""Code tasks for ``troll train --task``: the generated families, the user's JSONL, and HumanEval, as a :class:`Task`.

``--task code`` / ``code_<family>`` (:mod:`troll.lm.code_tasks`): training and held-out items from two seeds,
training questions that are also held out dropped, as the reasoning_gym presets. ``--task jsonl:PATH``: the user's
own prompts and tests, one JSON object a line::

    {"prompt": "Write add(a, b) ...", "tests": {"kind": "call", "entry_point": "add",
                                                "cases": [{"input": [1, 2], "expected": 3}]}}
    {"prompt": "Read two numbers ...", "tests": {"kind": "stdio", "cases": [{"input": "1 2\\n", "expected": "3\\n"}]}}

``prompt`` may also be a chat (a list of ``{"role", "content"}``; its last user message is the question) and may be
called ``question`` (APPS); ``tests`` may be a JSON string, in the APPS/Eurus form ``{"inputs", "outputs"[,
"fn_name"]}`` too (:mod:`troll.integrations.code_reward`), and may be given as ``input_output`` (APPS) or
``reward_model.ground_truth`` (Eurus-2-RL-Data and verl's parquet rows). Every line is checked when the command
starts, before a model is loaded; a bad one fails naming its line number and field. The held-out items are
``--heldout`` lines picked by a fixed shuffle (the same for every seed); the others train.
``--task humaneval`` (evaluation only: ``troll eval-code``) is :mod:`troll.lm.humaneval`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from troll.lm import code_tasks
from troll.runs.files import UsageError

JSONL_PREFIX = "jsonl:"
HUMANEVAL = "humaneval"
# Completion tokens for code by default: the default model's function with its fence fits in ~100 (measured on the
# generated families, greedy), the reasoning_gym presets' 16 cuts every one of them short.
CODE_COMPLETION_LENGTH = 160


def is_code_task(name: str) -> bool:
    return isinstance(name, str) and (name in code_tasks.TASKS or name.startswith(JSONL_PREFIX) or name == HUMANEVAL)


def check_code_task(name: str, *, heldout: int | None = None, training: bool = True) -> None:
    """Raise :class:`UsageError` for a code task that cannot be built: a JSONL file that is missing or malformed
    (naming the line and the field), too few lines for ``--heldout``, HumanEval given for training."""
    if name == HUMANEVAL:
        if training:
            raise UsageError("--task humaneval is a held-out transfer set, not a training task; evaluate on it with "
                             "`troll eval-code --task humaneval --model ...`.")  # fmt: skip
        return
    if name.startswith(JSONL_PREFIX):
        rows = read_jsonl(Path(name[len(JSONL_PREFIX) :]))
        if training and heldout is not None and heldout >= len(rows):
            raise UsageError(f"--heldout {heldout} leaves no training item: {name} has {len(rows)} lines; pass "
                             f"--heldout {max(1, len(rows) - 1)} or fewer (by default a quarter of the lines are "
                             "held out).")  # fmt: skip


def jsonl_heldout(name: str, most: int) -> int:
    """The default --heldout of ``jsonl:PATH``: a quarter of the file's lines (at least 1), at most ``most``."""
    rows = read_jsonl(Path(name[len(JSONL_PREFIX) :]))
    return min(most, max(1, len(rows) // 4))


def read_jsonl(path: Path) -> list[dict]:
    """The items of a user's JSONL ({"question", "tests"} each, tests canonical), every line checked."""
    from troll.integrations.code_reward import TestsError, parse_tests

    if not path.is_file():
        raise UsageError(f"--task jsonl:{path}: no such file; give the path of a JSONL file of prompts and tests.")
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"--task jsonl:{path} line {number}"
            try:
                row = json.loads(line)
            except ValueError as err:
                raise UsageError(f"{where}: not valid JSON ({err}).") from None
            if not isinstance(row, dict):
                raise UsageError(f"{where}: must be a JSON object with prompt and tests.")
            question = _question(row, where)
            field, tests = _tests_field(row, where)
            try:
                rows.append({"question": question, "tests": parse_tests(tests, where=field)})
            except TestsError as err:
                raise UsageError(f"{where}: {err}.") from None
    if not rows:
        raise UsageError(f"--task jsonl:{path}: the file holds no line; one JSON object a line is expected.")
    return rows


def _question(row: dict, where: str) -> str:
    key = "question" if "question" in row and "prompt" not in row else "prompt"
    value = row.get(key)
    if isinstance(value, list):  # a chat: its last user message
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = users[-1] if users else None
    if not (isinstance(value, str) and value.strip()):
        raise UsageError(f"{where}: field {key}: must be a non-empty string or a chat with a user message, got "
                         f"{str(value)[:60]!r}.")  # fmt: skip
    return value


def _tests_field(row: dict, where: str) -> tuple[str, Any]:
    for key in ("tests", "input_output"):
        if key in row:
            return key, row[key]
    ground = row.get("reward_model")
    if isinstance(ground, dict) and "ground_truth" in ground:
        return "reward_model.ground_truth", ground["ground_truth"]
    raise UsageError(f"{where}: field tests: missing (also looked for input_output and reward_model.ground_truth).")


def card_section(name: str, *, seed: int, system: str | None, reward: str = "fraction") -> str:
    """The model card's task section of a code task."""
    if name.startswith(JSONL_PREFIX):
        what = f"the user's prompts and tests in `{name[len(JSONL_PREFIX) :]}` (held-out lines by a fixed shuffle)"
    else:
        what = f"troll's generated code task `{name}` (training items from seed {seed}, held-out items from another)"
    note = "" if system is None else f" The chat prompts start with the system message {system!r}."
    return (
        f"## Task\n\nWriting Python functions: {what}. The reward is {REWARD_WORDS[reward]} (at most 10) "
        f"that the completion's last code block passes, run in troll's sandbox.{note}\n"
    )


REWARD_WORDS = {"fraction": "the fraction of an item's tests", "all": "1 when it passes all of an item's tests"}


class CodeItems(list):
    """A split of a code task: a list of {"question", "tests", ...} items (what a Task's train/heldout hold)."""


def code_splits(name: str, *, seed: int, heldout_seed: int, n_train: int, n_heldout: int):
    """(train, heldout, train_indices) of a generated family (items from ``seed`` and ``heldout_seed``) or of a
    JSONL file; ``train_indices`` leave out training items whose question is also held out."""
    if name.startswith(JSONL_PREFIX):
        check_code_task(name, heldout=n_heldout)
        rows = read_jsonl(Path(name[len(JSONL_PREFIX) :]))
        order = list(range(len(rows)))
        random.Random(0).shuffle(order)
        heldout = CodeItems(rows[i] for i in order[:n_heldout])
        train = CodeItems(rows[i] for i in order[n_heldout:])
    else:
        heldout = CodeItems(code_tasks.items(name, seed=heldout_seed, size=n_heldout))
        train = CodeItems(code_tasks.items(name, seed=seed, size=n_train))
    seen = {e["question"] for e in heldout}
    return train, heldout, [i for i, e in enumerate(train) if e["question"] not in seen]


class CodeTaskReward:
    """The TRL reward of a code task: the sandbox's fraction of tests passed of item ``rg_index`` (``shape="all"``:
    1.0 when all passed, else 0.0); None where the sandbox failed. ``scores`` serves the held-out evaluation (the
    fraction passed of given items whatever the shape; 1.0: all passed)."""

    __name__ = "correct"  # the same log keys as the math tasks' reward: rewards/correct/mean

    def __init__(self, items: list[dict], *, sandbox=None, slots: int = 2, shape: str = "fraction"):
        from troll.integrations.code_reward import CodeReward

        if shape not in REWARD_WORDS:
            raise ValueError(f"shape must be one of {', '.join(REWARD_WORDS)}, got {shape!r}")
        self.items = items
        self.shape = shape
        self.reward = CodeReward(sandbox=sandbox, slots=slots)

    def scores(self, completions: list, entries: list[dict]) -> list[float | None]:
        return self.reward(None, completions, tests=[e["tests"] for e in entries])

    def __call__(self, prompts=None, completions=None, rg_index=None, **kwargs) -> list[float | None]:
        tests = [self.items[int(i)]["tests"] for i in rg_index]
        scores = self.reward(prompts, completions, tests=tests)
        if self.shape == "all":
            return [None if s is None else float(s == 1.0) for s in scores]
        return scores
