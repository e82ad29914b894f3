"""reasoning_gym tasks as GRPO prompts and rewards: seeded, offline, each scored by the task's own scorer.

The training set and the held-out set are the same task drawn from two seeds; training items whose question
also appears in the held-out set are dropped (small tasks such as one-digit sums repeat questions).
The reward is ``dataset.score_answer(extract_answer(completion), entry)``: 1 for the right answer, partial credit
as the task defines it, 0 otherwise.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from troll.lm import code_data
from troll.lm.options import DEFAULT_TASK, UsageError

HELDOUT_SEED_OFFSET = 1_000_000  # items are seeded seed + index, so the two splits never share a generator seed

# Task settings at which SmolLM2-135M-Instruct is right some of the time (greedy, 48 items, measured):
# chain_sum ~0.35, basic_arithmetic ~0.3. reasoning_gym's own defaults (up to 6 terms of 4 digits) give ~0.
PRESETS: dict[str, dict[str, Any]] = {
    "chain_sum": dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
    "basic_arithmetic": dict(
        min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=("+", "-", "*"), allow_parentheses=False
    ),
}

_NUMBER = re.compile(r"[-\u2212]?\d[\d,]*(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ANSWER_WORD = re.compile(r"answer", re.I)
_SENTENCE_END = re.compile(r"\.(?!\d)|\n")  # a full stop that is not a decimal point, or a line break
_LEAD = re.compile(r"^(?:\s|[:=*]|\bis\b|\bwould be\b)*", re.I)  # "answer is: ..." -> "..."


def task_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_task(name: str, *, heldout: int | None = None) -> None:
    """Raise :class:`UsageError` naming a few valid tasks when ``name`` is neither a reasoning_gym task nor a code
    task (:mod:`troll.lm.code_data`, whose files are read and checked here; ``heldout``: --heldout)."""
    if code_data.is_code_task(name):
        code_data.check_code_task(name, heldout=heldout)
        return
    names = task_names()
    if name in names:
        return
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    examples = ", ".join([DEFAULT_TASK, "basic_arithmetic", "leg_counting", "gcd", "letter_counting", "code"])
    raise UsageError(
        f"unknown task {name!r}.{hint} reasoning_gym has {len(names)} tasks, e.g. {examples} "
        "(`troll train --list-tasks` lists them all), or a code task: code, code_<family>, jsonl:PATH."
    )


@dataclass
class Task:
    """One task's two splits. ``train_indices`` index ``train`` (the items kept after removing held-out questions);
    ``system``: the system message of its chat prompts (None: the chat template's own default)."""

    name: str
    train: Any  # reasoning_gym ProceduralDataset
    heldout: Any
    train_indices: list[int]
    system: str | None = None


def build_task(name: str, *, seed: int, n_train: int, n_heldout: int, system: str | None = None) -> Task:
    """The task with its preset settings (if any): ``n_train`` items from ``seed``, held-out from another seed."""
    if code_data.is_code_task(name):
        train, heldout, indices = code_data.code_splits(
            name, seed=seed, heldout_seed=seed + HELDOUT_SEED_OFFSET, n_train=n_train, n_heldout=n_heldout
        )
        if not indices:
            raise UsageError(f"task {name!r}: every training question is also held out; the task is too small.")
        return Task(name, train, heldout, indices, system)
    from reasoning_gym import create_dataset

    kwargs = PRESETS.get(name, {})
    heldout = create_dataset(name, seed=seed + HELDOUT_SEED_OFFSET, size=n_heldout, **kwargs)
    train = create_dataset(name, seed=seed, size=n_train, **kwargs)
    seen = {entry["question"] for entry in heldout}
    indices = [i for i in range(len(train)) if train[i]["question"] not in seen]
    if not indices:
        raise UsageError(f"task {name!r}: every training question is also held out; the task is too small.")
    return Task(name, train, heldout, indices, system)


def make_prompt(question: str, chat: bool, system: str | None = None) -> list[dict[str, str]] | str:
    """A one-turn conversation for chat models (after a ``system`` message if one is given: without one the chat
    template may add its own, SmolLM2's 17 tokens long); plain text with an answer cue otherwise."""
    if chat:
        head = [] if system is None else [{"role": "system", "content": system}]
        return [*head, {"role": "user", "content": question}]
    return f"Question: {question}\nAnswer:"


def train_dataset(task: Task, chat: bool):
    """A ``datasets.Dataset`` with TRL's ``prompt`` column and ``rg_index`` (the item, for the reward)."""
    from datasets import Dataset

    prompts = [make_prompt(task.train[i]["question"], chat, task.system) for i in task.train_indices]
    return Dataset.from_dict({"prompt": prompts, "rg_index": list(task.train_indices)})


def extract_answer(text: str, numeric: bool = True) -> str | None:
    """The final answer in a completion, or None.

    In order: the last ``\\boxed{...}``; the last ``<answer>...</answer>``; the sentence after the last word
    "answer" (its last number when ``numeric``: "The answer to 6 - 2 is 4." gives 4); the last number (``numeric``)
    or the last non-empty line. Numbers lose thousands separators and a zero fraction ("1,200.0" -> "1200").
    """
    for pattern in (_BOXED, _TAGGED):
        found = pattern.findall(text)
        if found:
            return _clean(found[-1], numeric)
    words = list(_ANSWER_WORD.finditer(text))
    if words:
        sentence = _SENTENCE_END.split(text[words[-1].end() :].strip(), maxsplit=1)[0]
        picked = _clean(_LEAD.sub("", sentence), numeric)
        if picked:
            return picked
    if numeric:
        numbers = _NUMBER.findall(text)
        return _number(numbers[-1]) if numbers else None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _clean(text: str, numeric: bool) -> str | None:
    if not numeric:
        return text.strip().rstrip(".").strip() or None
    found = _NUMBER.findall(text)
    return _number(found[-1]) if found else None


def _number(raw: str) -> str:
    s = raw.replace(",", "").replace("\u2212", "-")
    if "." in s and set(s.split(".")[1]) <= {"0"}:
        s = s.split(".")[0]
    return s


def is_numeric(answer: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(?:\.\d+)?", answer.strip()))


def completion_text(completion: Any) -> str:
    """TRL passes conversational completions as a list of messages, plain ones as a string."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


class TaskReward:
    """TRL reward function: the task's score of the extracted answer; reads the ``rg_index`` dataset column."""

    __name__ = "correct"  # TRL names the reward's log keys after it: rewards/correct/mean

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def score(self, text: str, entry: dict) -> float:
        answer = extract_answer(text, numeric=is_numeric(str(entry["answer"])))
        return float(self.dataset.score_answer(answer, entry))

    def scores(self, completions: list, entries: list[dict]) -> list[float]:
        return [self.score(completion_text(c), e) for c, e in zip(completions, entries)]

    def __call__(self, prompts=None, completions=None, rg_index=None, **kwargs) -> list[float]:
        return [self.score(completion_text(c), self.dataset[int(i)]) for c, i in zip(completions, rg_index)]


def task_reward(task: Task, split: str = "train", *, code_reward: str | None = None):
    """The reward of ``task``'s ``split`` ("train" or "heldout"): the reasoning_gym scorer, or the sandbox's
    fraction of tests passed for a code task (:class:`troll.lm.code_data.CodeTaskReward`; ``code_reward="all"``:
    1 when all pass). Both have ``scores(completions, entries)`` for the held-out evaluation."""
    data = task.train if split == "train" else task.heldout
    if code_data.is_code_task(task.name):
        return code_data.CodeTaskReward(data, shape=code_reward or "fraction")
    return TaskReward(data)
