"""pass@k of a model on a code task: the held-out items of a generated family or of a JSONL file, or HumanEval.

One greedy completion an item, scored in the sandbox on all of its tests: ``pass_at_1`` = the fraction whose tests
all pass (with one greedy sample, pass@1 is that fraction exactly), ``reward`` = the mean fraction passed. With
``samples`` n > 0, also n completions an item sampled at ``temperature``: ``sampled`` holds the unbiased pass@1 and
pass@4 (:func:`troll.lm.evaluate.pass_at_k`) over them. Items go through in chunks, with a progress bar of the items
done, the greedy pass rate so far and the time left."""

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
    # generated tasks: greedy pass@1, n and family per function asked for (its name: `prefix`, `linear`, ...), and
    # with samples their pass@1 and pass@4 ("sampled"). A family's items repeat a few functions with other constants
    # and tests (code_string's 64 held-out items ask for 6), so its greedy pass@1 moves by whole functions.
    by_function: dict[str, dict] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # HumanEval: problems not converted, by reason
    samples: list[dict] = field(default_factory=list)
    sampled: dict[str, float] = field(default_factory=dict)  # {"pass@1", "pass@4"} of the sampled completions
    temperature: float | None = None  # of the sampled completions (None: greedy only)
    samples_per_item: int = 0
    cut: float | None = None  # share of greedy completions that reached the token limit without ending
    prose_first: float | None = None  # share of greedy completions with text before their first code fence

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


CHUNK = 16  # items a chunk: generated, scored and shown on the bar together


def evaluate(model, tokenizer, task: str, *, n: int | None, seed: int, max_new_tokens: int, system: str | None = None,
             slots: int = 2, keep: int = 3, samples: int = 0, temperature: float = 1.0, bar: bool = True,
             chunk: int = CHUNK, output: int = 1 << 20) -> CodeEval:  # fmt: skip
    """Greedy pass@1 of ``model`` on ``task`` (:func:`eval_items`), and with ``samples`` the sampled pass@1 and
    pass@4 at ``temperature`` (seeded by ``seed``); ``bar``: a tqdm bar on stderr; ``output``: the sandbox's
    output cap per test in bytes."""
    from tqdm.auto import tqdm

    from troll.lm.evaluate import generate, mean_pass_at_k, prompt_texts, prose_first

    rows, skipped = eval_items(task, n=n, seed=seed)
    texts = prompt_texts(tokenizer, [r["question"] for r in rows], system)
    completions: list[str] = []
    raw: list[float | None] = []
    cut: list[bool] = []
    rights: list[list[bool]] = []
    with tqdm(total=len(rows), desc=f"eval-code {task}", unit="item", disable=not bar, dynamic_ncols=True) as progress:
        for start in range(0, len(rows), chunk):
            part = slice(start, start + chunk)
            greedy, ended = generate(model, tokenizer, texts[part], max_new_tokens=max_new_tokens)
            completions += [c[0] for c in greedy]
            cut += [c[0] for c in ended]
            raw += [item[0] for item in item_scores(rows[part], greedy, slots, output=output)]
            if samples:
                drawn, _ = generate(model, tokenizer, texts[part], max_new_tokens=max_new_tokens, samples=samples,
                                    temperature=temperature, seed=seed * 1_000_003 + start)  # fmt: skip
                rights += [[s == 1.0 for s in item] for item in item_scores(rows[part], drawn, slots, output=output)]
            progress.set_postfix({"pass": f"{sum(s == 1.0 for s in raw) / len(raw):.3f}"}, refresh=False)
            progress.update(len(greedy))  # draws the bar with the pass rate of the items done so far
    result = summarise(task, rows, completions, raw, skipped, keep=keep)
    result.cut, result.prose_first = sum(cut) / len(rows), sum(map(prose_first, completions)) / len(rows)
    if samples:
        result.sampled, result.temperature, result.samples_per_item = mean_pass_at_k(rights), temperature, samples
        for name, items in by_function(rows, rights).items():
            result.by_function[name]["sampled"] = mean_pass_at_k([right for _, right in items])
    return result


def item_scores(rows: list[dict], completions: list[list[str]], slots: int,
                output: int = 1 << 20) -> list[list[float | None]]:  # fmt: skip
    """Each item's completions scored on all of its tests (HumanEval's after the problem's prompt); None where the
    sandbox could not run one."""
    from troll.integrations.code_reward import CodeReward

    flat = [(r, c) for r, cs in zip(rows, completions) for c in cs]
    programs = [humaneval.with_preamble(c, r["preamble"]) if "preamble" in r else c for r, c in flat]
    most = max(len(r["tests"]["cases"]) for r in rows)
    reward = CodeReward(slots=slots, max_tests=most, output=output)
    rewards = reward(None, programs, tests=[r["tests"] for r, _ in flat])
    out, at = [], 0
    for cs in completions:
        out.append(list(rewards[at : at + len(cs)]))
        at += len(cs)
    return out


def score_rows(task: str, rows: list[dict], completions: list[str], skipped: dict, *, slots: int = 2,
               keep: int = 3) -> CodeEval:  # fmt: skip
    """Score one completion an item on all of its tests (HumanEval's after the problem's prompt)."""
    raw = [item[0] for item in item_scores(rows, [[c] for c in completions], slots)]
    return summarise(task, rows, completions, raw, skipped, keep=keep)


def by_function(rows: list[dict], values: list) -> dict[str, list[tuple[dict, object]]]:
    """The (row, value) pairs of the generated items (those with a family), by the function each asks for."""
    groups = defaultdict(list)
    for row, value in zip(rows, values):
        if "family" in row:
            groups[row["tests"]["entry_point"]].append((row, value))
    return groups


def summarise(task: str, rows: list[dict], completions: list[str], raw: list[float | None], skipped: dict, *,
              keep: int = 3) -> CodeEval:  # fmt: skip
    """The greedy result of scored items: pass@1 overall, by family and by function, the mean reward, the first
    ``keep``."""
    scores = [0.0 if s is None else s for s in raw]
    families = defaultdict(list)
    for r, s in zip(rows, scores):
        families[r.get("family", task)].append(s == 1.0)
    by_family = {f: {"pass_at_1": sum(v) / len(v), "n": len(v)} for f, v in sorted(families.items())}
    functions = {}
    for name, items in sorted(by_function(rows, scores).items()):
        right = sum(s == 1.0 for _, s in items)
        functions[name] = {"pass_at_1": right / len(items), "n": len(items), "family": items[0][0]["family"]}
    samples = [{"question": r["question"], "completion": c, "reward": s}
               for r, c, s in list(zip(rows, completions, scores))[:keep]]  # fmt: skip
    n_rows = len(rows)
    return CodeEval(task, n_rows, sum(s == 1.0 for s in scores) / n_rows, sum(scores) / n_rows, raw.count(None),
                    by_family, functions, skipped, samples)  # fmt: skip
