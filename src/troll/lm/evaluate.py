"""Held-out accuracy: greedy decoding of every held-out prompt, scored like the training reward.

Greedy rather than sampled so that "before" and "after" differ only by the weights. A completion counts as
right when the task's scorer gives it full marks (partial credit is averaged into ``score``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from troll.lm.code_data import is_code_task
from troll.lm.tasks import Task, make_prompt, task_reward

PASS_KS = (1, 4)  # the k of the sampled pass@k, each where an item has at least k samples


@dataclass
class HeldoutResult:
    accuracy: float  # fraction scored 1.0, greedy (greedy pass@1)
    score: float  # mean score (partial credit included)
    n: int
    samples: list[dict] = field(default_factory=list)  # the first few (question, completion, answer, score)
    unscored: int = 0  # code tasks: items the sandbox failed to run (None), counted as 0
    cut: float | None = None  # share of greedy completions that reached the token limit (no end of sequence)
    prose_first: float | None = None  # code tasks: share of greedy completions with text before their first fence
    sampled: dict[str, float] = field(default_factory=dict)  # {"pass@1": ..., "pass@4": ...} at the temperature

    def to_json(self) -> dict:
        out = {"accuracy": self.accuracy, "score": self.score, "n": self.n, "samples": self.samples}
        extra = {"unscored": self.unscored or None, "cut": self.cut, "prose_first": self.prose_first}
        return out | {k: v for k, v in extra.items() if v is not None} | {f"sampled_{k}": v for k, v in
                                                                          self.sampled.items()}  # fmt: skip


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from ``n`` samples of which ``c`` are right: 1 - C(n - c, k) / C(n, k), the
    chance that ``k`` of the ``n`` drawn without replacement hold at least one right one (Chen et al., 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1)."""
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int) and 0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs whole numbers 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(rights: list[list[bool]], ks=PASS_KS) -> dict[str, float]:
    """{"pass@k": mean over items of :func:`pass_at_k`} for each k of ``ks`` that every item's samples reach."""
    if not rights:
        return {}
    least = min(len(r) for r in rights)
    return {f"pass@{k}": sum(pass_at_k(len(r), sum(r), k) for r in rights) / len(rights) for k in ks if k <= least}


def prompt_texts(tokenizer, questions: list[str], system: str | None = None) -> list[str]:
    """The prompts exactly as TRL renders them: the chat template with the generation prompt, or plain text."""
    chat = tokenizer.chat_template is not None
    prompts = [make_prompt(q, chat, system) for q in questions]
    if not chat:
        return prompts
    return [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]


EVAL_BATCH = 64


def greedy_completions(
    model, tokenizer, texts: list[str], *, max_new_tokens: int, batch_size: int = EVAL_BATCH
) -> list[str]:
    """Greedy completions of ``texts``, decoded without special tokens, in the order of ``texts``.

    The prompts go through ``generate`` in left-padded batches of ``batch_size``, shortest first, so that a batch
    holds prompts of similar length (little padding); 64 prompts a batch cost about as much per step as a few, on
    CPU as on GPU.
    """
    return [c[0] for c in generate(model, tokenizer, texts, max_new_tokens=max_new_tokens, batch_size=batch_size)[0]]


@torch.no_grad()
def generate(model, tokenizer, texts: list[str], *, max_new_tokens: int, samples: int = 0, temperature: float = 1.0,
             seed: int = 0, batch_size: int = EVAL_BATCH) -> tuple[list[list[str]], list[list[bool]]]:  # fmt: skip
    """(completions, cut) a text: one greedy completion (``samples`` 0) or ``samples`` sampled at ``temperature``
    (no top-k or top-p, as TRL samples its rollouts), and whether each reached ``max_new_tokens`` without ending.

    Sampling draws from a generator seeded with ``seed`` inside :func:`torch.random.fork_rng`, so the caller's
    random state (a training run's) is left as it was. Batches of ``batch_size`` sequences, shortest prompts first.
    """
    from transformers import GenerationConfig

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    per = max(1, samples)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, num_return_sequences=per)
    config = GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=tokenizer.eos_token_id,
                              **(sampling if samples else dict(do_sample=False)))  # fmt: skip
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    out: list[list[str]] = [[] for _ in texts]
    cut: list[list[bool]] = [[] for _ in texts]
    step = max(1, batch_size // per)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for start in range(0, len(texts), step):
                picked = order[start : start + step]
                batch = tokenizer([texts[i] for i in picked], return_tensors="pt", padding=True,
                                  add_special_tokens=False).to(model.device)  # fmt: skip
                new = model.generate(**batch, generation_config=config)[:, batch["input_ids"].shape[1] :]
                decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
                ended = (new == tokenizer.eos_token_id).any(dim=1).tolist()
                for j, text in enumerate(decoded):
                    i = picked[j // per]
                    out[i].append(text)
                    cut[i].append(not ended[j] and new.shape[1] >= max_new_tokens)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out, cut


def prose_first(text: str) -> bool:
    """Whether a completion says something before its first code fence (or has no fence at all)."""
    head, fence, _ = text.partition("```")
    return not fence or bool(head.strip())


def heldout_accuracy(model, tokenizer, task: Task, *, max_new_tokens: int, keep: int = 3, samples: int = 0,
                     temperature: float = 1.0, seed: int = 0) -> HeldoutResult:  # fmt: skip
    """Greedy accuracy on ``task.heldout`` (a code task: the fraction of items whose tests all pass; ``score``: the
    mean fraction of tests passed; an item the sandbox could not run counts 0 and in ``unscored``); with
    ``samples``, also pass@1 and pass@4 of that many samples an item at ``temperature`` (:func:`mean_pass_at_k`)."""
    entries = list(task.heldout)
    texts = prompt_texts(tokenizer, [e["question"] for e in entries], task.system)
    greedy, cut = generate(model, tokenizer, texts, max_new_tokens=max_new_tokens)
    completions = [c[0] for c in greedy]
    reward = task_reward(task, "heldout")
    raw = reward.scores(completions, entries)
    scores = [0.0 if s is None else s for s in raw]
    samples_kept = [
        {"question": e["question"], "completion": c, "answer": e.get("answer", e.get("tests")), "score": s}
        for e, c, s in list(zip(entries, completions, scores))[:keep]
    ]
    n = len(scores)
    code = is_code_task(task.name)
    result = HeldoutResult(sum(s == 1.0 for s in scores) / n, sum(scores) / n, n, samples_kept, raw.count(None),
                           cut=sum(c[0] for c in cut) / n,
                           prose_first=sum(map(prose_first, completions)) / n if code else None)  # fmt: skip
    if samples:
        drawn, _ = generate(model, tokenizer, texts, max_new_tokens=max_new_tokens, samples=samples,
                            temperature=temperature, seed=seed)  # fmt: skip
        flat = reward.scores([c for cs in drawn for c in cs], [e for e in entries for _ in range(samples)])
        rights = [[s == 1.0 for s in flat[i * samples : (i + 1) * samples]] for i in range(n)]
        result.sampled = mean_pass_at_k(rights)
    return result
