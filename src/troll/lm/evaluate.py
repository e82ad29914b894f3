"""Held-out accuracy: greedy decoding of every held-out prompt, scored like the training reward.

Greedy rather than sampled so that "before" and "after" differ only by the weights. A completion counts as
right when the task's scorer gives it full marks (partial credit is averaged into ``score``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from troll.lm.tasks import Task, make_prompt, task_reward


@dataclass
class HeldoutResult:
    accuracy: float  # fraction scored 1.0
    score: float  # mean score (partial credit included)
    n: int
    samples: list[dict] = field(default_factory=list)  # the first few (question, completion, answer, score)
    unscored: int = 0  # code tasks: items the sandbox failed to run (None), counted as 0

    def to_json(self) -> dict:
        out = {"accuracy": self.accuracy, "score": self.score, "n": self.n, "samples": self.samples}
        return out | ({"unscored": self.unscored} if self.unscored else {})


def prompt_texts(tokenizer, questions: list[str], system: str | None = None) -> list[str]:
    """The prompts exactly as TRL renders them: the chat template with the generation prompt, or plain text."""
    chat = tokenizer.chat_template is not None
    prompts = [make_prompt(q, chat, system) for q in questions]
    if not chat:
        return prompts
    return [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]


EVAL_BATCH = 64


@torch.no_grad()
def greedy_completions(
    model, tokenizer, texts: list[str], *, max_new_tokens: int, batch_size: int = EVAL_BATCH
) -> list[str]:
    """Greedy completions of ``texts``, decoded without special tokens, in the order of ``texts``.

    The prompts go through ``generate`` in left-padded batches of ``batch_size``, shortest first, so that a batch
    holds prompts of similar length (little padding); 64 prompts a batch cost about as much per step as a few, on
    CPU as on GPU.
    """
    from transformers import GenerationConfig

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad_id, eos_token_id=tokenizer.eos_token_id
    )
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    out: list[str] = [""] * len(texts)
    try:
        for start in range(0, len(texts), batch_size):
            picked = order[start : start + batch_size]
            batch = tokenizer([texts[i] for i in picked], return_tensors="pt", padding=True, add_special_tokens=False)
            batch = batch.to(model.device)
            ids = model.generate(**batch, generation_config=config)
            decoded = tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            for i, text in zip(picked, decoded):
                out[i] = text
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out


def heldout_accuracy(model, tokenizer, task: Task, *, max_new_tokens: int, keep: int = 3) -> HeldoutResult:
    """Greedy accuracy on ``task.heldout`` (a code task: the fraction of items whose tests all pass; ``score``: the
    mean fraction of tests passed; an item the sandbox could not run counts 0 and in ``unscored``)."""
    entries = list(task.heldout)
    texts = prompt_texts(tokenizer, [e["question"] for e in entries], task.system)
    completions = greedy_completions(model, tokenizer, texts, max_new_tokens=max_new_tokens)
    raw = task_reward(task, "heldout").scores(completions, entries)
    scores = [0.0 if s is None else s for s in raw]
    samples = [
        {"question": e["question"], "completion": c, "answer": e.get("answer", e.get("tests")), "score": s}
        for e, c, s in list(zip(entries, completions, scores))[:keep]
    ]
    n = len(scores)
    return HeldoutResult(sum(s == 1.0 for s in scores) / n, sum(scores) / n, n, samples, raw.count(None))
