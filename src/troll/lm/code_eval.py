"""Greedy pass@1 of a model on a code task: the held-out items of a generated family or of a JSONL file, or
HumanEval. One greedy completion an item, scored in the sandbox on all of its tests; pass@1 = the fraction whose
tests all pass (with one greedy sample, pass@1 is that fraction exactly), ``reward`` = the mean fraction passed."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from troll.lm import code_data, humaneval
from troll.lm.code_data import HUMANEVAL
from troll.lm.tasks import HELDOUT_SEED_OFFSET

HUMANEVAL_COMPLETION_LENGTH = 384  # HumanEval's functions are longer than the generated ones


@dataclass
class CodeEval:
    task: str
    n: int
    pass_at_1: float
    reward: float
    unscored: int  # items the sandbox failed to run, counted as failures
    by_family: dict[str, dict] = field(default_factory=dict)  # generated tasks: pass@1 and n per family
    skipped: dict[str, int] = field(default_factory=dict)  # HumanEval: problems not converted, by reason
    samples: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def eval_items(task: str, *, n: int | None, seed: int) -> tuple[list[dict], dict[str, int]]:
    """The items to evaluate: HumanEval's converted problems (the first ``n``; None: all), a JSONL file's lines
    (the first ``n``), or ``n`` held-out items of a generated task (seeded as ``troll train --seed``'s)."""
    if task == HUMANEVAL:
        rows, skipped = humaneval.items()
        return rows[:n] if n else rows, dict(skipped)
    if task.startswith(code_data.JSONL_PREFIX):
        from pathlib import Path

        rows = code_data.read_jsonl(Path(task[len(code_data.JSONL_PREFIX) :]))
        return rows[:n] if n else rows, {}
    from troll.lm import code_tasks

    return code_tasks.items(task, seed=seed + HELDOUT_SEED_OFFSET, size=n or 128), {}


def evaluate(model, tokenizer, task: str, *, n: int | None, seed: int, max_new_tokens: int, system: str | None = None,
             slots: int = 2, keep: int = 3) -> CodeEval:  # fmt: skip
    """Greedy pass@1 of ``model`` on ``task`` (:func:`eval_items`)."""
    from troll.lm.evaluate import greedy_completions, prompt_texts

    rows, skipped = eval_items(task, n=n, seed=seed)
    texts = prompt_texts(tokenizer, [r["question"] for r in rows], system)
    completions = greedy_completions(model, tokenizer, texts, max_new_tokens=max_new_tokens)
    return score_rows(task, rows, completions, skipped, slots=slots, keep=keep)


def score_rows(task: str, rows: list[dict], completions: list[str], skipped: dict, *, slots: int = 2,
               keep: int = 3) -> CodeEval:  # fmt: skip
    """Score one completion an item on all of its tests (HumanEval's after the problem's prompt)."""
    from troll.integrations.code_reward import CodeReward

    programs = [humaneval.with_preamble(c, r["preamble"]) if "preamble" in r else c for c, r in zip(completions, rows)]
    most = max(len(r["tests"]["cases"]) for r in rows)
    rewards = CodeReward(slots=slots, max_tests=most)(None, programs, tests=[r["tests"] for r in rows])
    scores = [0.0 if s is None else s for s in rewards]
    families = defaultdict(list)
    for r, s in zip(rows, scores):
        families[r.get("family", task)].append(s == 1.0)
    by_family = {f: {"pass_at_1": sum(v) / len(v), "n": len(v)} for f, v in sorted(families.items())}
    samples = [{"question": r["question"], "completion": c, "reward": s}
               for r, c, s in list(zip(rows, completions, scores))[:keep]]  # fmt: skip
    n_rows = len(rows)
    return CodeEval(task, n_rows, sum(s == 1.0 for s in scores) / n_rows, sum(scores) / n_rows, rewards.count(None),
                    by_family, skipped, samples)  # fmt: skip
