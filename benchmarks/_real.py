"""A real model's next-token distributions for the loss benchmarks: SmolLM2-135M-Instruct's own samples.

``real_batch`` returns old logits (1, N, V), new logits after a weight perturbation, the sampled tokens, advantages
and a mask, with N = sequences x completion tokens:
- 16 chat prompts x 256 completion tokens sampled from the model at temperature 1 (EOS suppressed, no top-k /
  top-p), so every row is a distribution the model actually samples from;
- old logits: the model's logits at the positions that predict the completion tokens;
- new logits: the same positions after every weight matrix moves by ``sigma * std(W) * N(0, 1)``, with sigma
  chosen (by bisection on two sequences) so that about a third of their rows are projected at eps (their KL over
  TROLL's sparse support exceeds it) -- an equivalent of a few optimiser steps off-policy. Over the whole batch
  (seed 0) that gives sigma = 0.021 and 43% of the rows projected.
The batch is cached under benchmarks/results/ (gitignored), so only the first run pays for generation.

``real_head`` returns the new policy's LM-head input (1, N, H) and weight (V, H) at the same positions, so that a
loss from hidden states (the chunked LM head) sees exactly the rows of ``real_batch``: ``hidden @ weight.T``
reproduces its new logits. Cached beside the batch.

For vocabularies larger than the model's (V = 151936, a Qwen-sized head), ``widen`` appends columns drawn from
each row's own tail: the same real head, and a tail with the real model's shape, so the kept count at delta 1e-5
stays near the real one.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = [
    "A train leaves at 3:15 pm and travels 210 km at 84 km/h. At what time does it arrive? Think step by step.",
    "Sort these words alphabetically and count how many contain the letter 'r': river, apple, carrot, moon.",
    "Tom has 3 times as many marbles as Anna. Together they have 64 marbles. How many does Tom have?",
    "What is the sum of all even numbers from 2 to 40 inclusive? Reason step by step.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten-year-old.",
    "Give three tips for writing clear emails at work, with an example for each.",
    "What are the main differences between a list and a tuple in Python?",
    "Describe the water cycle in a few paragraphs.",
    "Plan a three-day trip to a city you like, with a budget.",
    "Why is the sky blue? Answer precisely but simply.",
    "Write a poem about autumn leaves in four stanzas.",
    "A rectangle has a perimeter of 30 cm and an area of 54 cm^2. What are its sides?",
    "Summarise the causes of the First World War.",
    "How do vaccines train the immune system?",
    "Translate into French and explain the grammar: 'I would have come if you had called me.'",
]


def _load():
    from troll.lm.model import load_model, resolve_model

    model, tok = load_model(resolve_model("smollm2"))
    model.eval()
    return model, tok


@torch.no_grad()
def _sample(model, tok, n_seq: int, length: int, seed: int):
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in (PROMPTS * (n_seq // len(PROMPTS) + 1))[:n_seq]
    ]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    torch.manual_seed(seed)
    out = model.generate(
        **enc,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=length,
        min_new_tokens=length,
        pad_token_id=tok.pad_token_id,
    )
    mask = torch.cat([enc.attention_mask, torch.ones_like(out[:, enc.input_ids.shape[1] :])], 1)
    return out, mask, enc.input_ids.shape[1]


@torch.no_grad()
def _logits(model, ids, mask, prompt_len: int, rows=slice(None)):
    """(S, T, V) fp32 logits at the positions predicting the completion tokens, one sequence at a time."""
    outs = []
    for i in range(ids.shape[0])[rows]:
        z = model(input_ids=ids[i : i + 1], attention_mask=mask[i : i + 1]).logits
        outs.append(z[0, prompt_len - 1 : -1].float())
    return torch.stack(outs)


def _perturbed(model, sigma: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g) * (sigma * float(p.std())))
    return state


def _projected_frac(old, new, tokens, eps: float) -> float:
    """Share of the rows (..., V) whose sparse-support KL(new || old) exceeds eps: TROLL projects those."""
    import troll

    old_sparse = troll.sparsify(old, include=tokens)
    return float((troll.project_sparse(new, old_sparse, eps, include=tokens).eta > 0).double().mean())


def _calibrate(model, ids, mask, prompt_len, old, target, eps, seed) -> float:
    """sigma such that about ``target`` of the rows of a few sequences are projected (bisection on log sigma)."""
    lo, hi = 1e-4, 0.2
    few = slice(0, 2)
    tokens = ids[few, prompt_len:]
    for _ in range(8):
        sigma = (lo * hi) ** 0.5
        state = _perturbed(model, sigma, seed)
        frac = _projected_frac(old[few], _logits(model, ids, mask, prompt_len, few), tokens, eps)
        model.load_state_dict(state)
        lo, hi = (sigma, hi) if frac < target else (lo, sigma)
    return (lo * hi) ** 0.5


def real_batch(path: Path, *, n_seq=16, length=256, eps=0.05, target=1 / 3, seed=0):
    """(old, new, tokens, adv, mask, facts) from the cache at ``path`` or generated (and cached) there."""
    if path.exists():
        d = torch.load(path)
        return d["old"], d["new"], d["tokens"], d["adv"], d["mask"], d["facts"]
    model, tok = _load()
    ids, attn, prompt_len = _sample(model, tok, n_seq, length, seed)
    old = _logits(model, ids, attn, prompt_len)
    sigma = _calibrate(model, ids, attn, prompt_len, old, target, eps, seed + 1)
    state = _perturbed(model, sigma, seed + 1)
    new = _logits(model, ids, attn, prompt_len)
    model.load_state_dict(state)
    n = n_seq * length
    tokens = ids[:, prompt_len:].reshape(1, n)
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(n_seq, generator=g).repeat_interleave(length).reshape(1, n)
    facts = {"sigma": sigma, "projected_frac": _projected_frac(old, new, ids[:, prompt_len:], eps)}
    d = dict(old=old.reshape(1, n, -1), new=new.reshape(1, n, -1), tokens=tokens, adv=adv, facts=facts)
    d["mask"] = torch.ones(1, n, dtype=torch.bool)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(d, path)
    return d["old"], d["new"], d["tokens"], d["adv"], d["mask"], facts


def real_head(path: Path, batch_path: Path, *, n_seq=16, length=256, seed=0):
    """(hidden (1, N, H), weight (V, H)) of the perturbed model of ``real_batch`` (cached at ``path``)."""
    if path.exists():
        d = torch.load(path)
        return d["hidden"], d["weight"]
    old, new, tokens, _, _, facts = real_batch(batch_path, n_seq=n_seq, length=length, seed=seed)
    model, tok = _load()
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in (PROMPTS * (n_seq // len(PROMPTS) + 1))[:n_seq]
    ]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    prompt_len = enc.input_ids.shape[1]
    ids = torch.cat([enc.input_ids, tokens.reshape(n_seq, length)], 1)
    mask = torch.cat([enc.attention_mask, torch.ones(n_seq, length, dtype=enc.attention_mask.dtype)], 1)
    _perturbed(model, facts["sigma"], seed + 1)
    hidden = []
    with torch.no_grad():
        for i in range(n_seq):
            out = model(input_ids=ids[i : i + 1], attention_mask=mask[i : i + 1], output_hidden_states=True)
            hidden.append(out.hidden_states[-1][0, prompt_len - 1 : -1].float())
    hidden = torch.cat(hidden).unsqueeze(0)
    weight = model.get_output_embeddings().weight.detach().float().clone()
    err = float((hidden[0, :256] @ weight.T - new[0, :256]).abs().max())
    if err > 1e-3:
        raise RuntimeError(f"hidden @ weight.T departs from the cached new logits by {err:.2e}; delete {batch_path}")
    torch.save({"hidden": hidden, "weight": weight}, path)
    return hidden, weight


def widen(old: torch.Tensor, new: torch.Tensor, vocab: int, *, seed: int = 0, head: int = 64):
    """Widen (1, N, V0) old / new logits to V columns whose extra entries come from each row's own tail.

    Extra column j copies original column perm[j] (one shared random map), except where that is among the row's
    ``head`` largest old logits: there both take the row's median, so no head token is duplicated. The new logits
    use the same map, so each extra column carries the real perturbation of the column it copies.
    """
    v0 = old.shape[-1]
    if vocab <= v0:
        return old[..., :vocab].contiguous(), new[..., :vocab].contiguous()
    g = torch.Generator().manual_seed(seed)
    perm = torch.randint(0, v0, (vocab - v0,), generator=g)
    out_old = torch.empty(*old.shape[:-1], vocab)
    out_new = torch.empty(*new.shape[:-1], vocab)
    for start in range(0, old.shape[1], 256):
        rows = slice(start, start + 256)
        o, w = old[0, rows], new[0, rows]
        thresh = o.topk(head, -1).values[:, -1:]
        med = o.median(-1, keepdim=True).values
        eo, ew = o[:, perm], w[:, perm]
        hit = eo >= thresh
        out_old[0, rows] = torch.cat([o, torch.where(hit, med, eo)], -1)
        out_new[0, rows] = torch.cat([w, torch.where(hit, med, ew)], -1)
    return out_old, out_new
