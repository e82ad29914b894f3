"""Loss-level benchmark: forward + backward of troll_loss against clip losses from the same logits.

Default (realistic) mode: SmolLM2-135M-Instruct's own distributions -- 16 sequences x 256 tokens it sampled at
temperature 1 (N = 4096, V = 49152), and the new policy after a weight perturbation that projects about a third of
the rows at eps 0.05 (see _real.py; generated once, ~2 minutes, and cached under benchmarks/results/). For
V > 49152 (e.g. 151936, a Qwen-sized head) each row is widened with columns drawn from its own tail, so the kept
count at delta 1e-5 stays the real model's. ``--synthetic`` uses the former peaked rows instead (1-20 tokens carry
1 - 1e-5 of the mass).

Methods, timed in alternating rounds in one process (medians over --repeats rounds after a warm-up round):
    troll        troll.troll_loss (K = 64, delta = 1e-5, eps = 0.05)
    clip         troll.clip_loss (the baseline with its metrics, including the sparse-support KL)
    mclip        a minimal TRL-style clip loss: logsumexp, gather, ratio, clamp, token mean; no metrics
    lse          torch.logsumexp forward + backward alone
    traffic      the memory-traffic floor of any loss from logits: one read of the logits (a row max) and one
                 write of an (N, V) gradient-sized buffer
It also reports the kept and support sizes and checks the projection: the worst |KL_after - eps| / eps over the
projected rows.

Peak memory on CPU: each (method, V) runs in its own subprocess; after the inputs exist (and one warm-up call on
a small batch) we reset the kernel's high-water mark (/proc/self/clear_refs), run forward + backward, and take
VmHWM - VmRSS before. Tensors of this size are mmap-backed, so what is freed returns to the system and the
high-water mark is the method's own working set, inputs excluded.

    python benchmarks/bench_loss.py --threads 1                       # real rows, V in {49152, 151936}
    python benchmarks/bench_loss.py --synthetic --vocab 32000 151936 --threads 1
    python benchmarks/bench_loss.py --tokens 512 --vocab 49152 --repeats 3 --no-memory    # a quick look
    python benchmarks/bench_loss.py --vocab 49152 --threads 2 --load both --no-memory      # idle and under load
    python benchmarks/bench_loss.py --quick --threads 1                # smoke run: synthetic rows, N 256, V 32000
Writes benchmarks/results/bench_loss.csv (--quick: bench_loss-quick.csv) and prints a markdown table. ``--quick``
takes synthetic rows because the real ones take minutes to generate the first time.

``--head`` times the losses from the LM head's input instead, on the same real rows (V = 49152; the perturbed
model's final hidden states and head weight, cached beside the rows): ``troll_chunked`` is
troll.troll_loss_from_hidden (vocabulary chunks, never an (N, V) tensor), ``troll_unfused`` is ``hidden @ W.T`` then
troll.troll_loss, ``mclip`` is ``hidden @ W.T`` then the minimal clip loss; gradients to the hidden states and W.

    python benchmarks/bench_loss.py --head --threads 1 --load both --no-memory

``--load both`` times every round twice, alone and while another process keeps one core busy (a busy loop started
for the round and stopped after it), and reports each condition in its own row; ``--load busy`` only the latter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from _real import real_batch, real_head, widen
from _report import competing_load, quick_path, reset_peak, status_kb, write_results

import troll
from troll.categorical.sparse import kept_ids

RESULTS = Path(__file__).parent / "results"
REAL_CACHE = RESULTS / "real_smollm2_16x256.pt"
REAL_HEAD_CACHE = RESULTS / "real_smollm2_16x256_head.pt"
METHODS = ("troll", "clip", "mclip", "lse", "traffic")
MEMORY_METHODS = ("troll", "clip", "mclip")


def make_batch(n: int, vocab: int, *, seed: int = 0, spread: float = 1.5):
    """Peaked old logits (1, n, V), a perturbed new policy, sampled tokens, advantages and a mask.

    Row i lifts m_i ~ U{1..20} tokens to about 28 above a unit-normal floor: with V = 152k the tail then holds
    ~1e-6 of the mass. The new policy moves those lifted logits by N(0, spread^2 / m_i) and the floor by a little.
    Generated in place, row chunk by row chunk, so that no transient exceeds the tensors themselves.
    """
    g = torch.Generator().manual_seed(seed)
    old = torch.empty(1, n, vocab)
    new = torch.empty(1, n, vocab)
    live = torch.randint(1, 21, (n,), generator=g)
    for start in range(0, n, 256):
        rows = slice(start, min(start + 256, n))
        o, w = old[0, rows], new[0, rows]
        o.normal_(generator=g)
        w.normal_(generator=g).mul_(0.05).add_(o)
        m = live[rows].unsqueeze(-1)
        ids = torch.randint(0, vocab, (o.shape[0], 20), generator=g)
        keep = torch.arange(20) < m
        lift = 28 + 2 * torch.randn(o.shape[0], 20, generator=g)
        moved = lift + spread / m.sqrt() * torch.randn(o.shape[0], 20, generator=g)
        o.scatter_(1, ids, torch.where(keep, lift, o.gather(1, ids)))
        w.scatter_(1, ids, torch.where(keep, moved, w.gather(1, ids)))
    tokens = (
        torch.distributions.Categorical(logits=old[0, :, :]).sample().unsqueeze(0)
        if n * vocab < 2**28
        else (_sample_chunked(old[0], g).unsqueeze(0))
    )
    adv = torch.randn(1, n, generator=g)
    mask = torch.ones(1, n, dtype=torch.bool)
    return old, new, tokens, adv, mask


def _sample_chunked(logits, g):
    out = []
    for start in range(0, logits.shape[0], 256):
        p = torch.softmax(logits[start : start + 256], -1)
        out.append(torch.multinomial(p, 1, generator=g).squeeze(-1))
    return torch.cat(out)


def load_batch(vocab: int, args):
    """(old, new, tokens, adv, mask) over the first ``args.tokens`` rows, real (widened to V) or synthetic."""
    if args.synthetic:
        return make_batch(args.tokens, vocab, seed=args.seed, spread=args.spread)
    old, new, tokens, adv, mask, _ = real_batch(REAL_CACHE, eps=args.eps)
    n = args.tokens
    old, new = widen(old[:, :n], new[:, :n], vocab, seed=args.seed)
    return old, new, tokens[:, :n], adv[:, :n], mask[:, :n]


def minimal_clip(logits, old_tok, tokens, adv, mask, eps=0.2):
    """TRL-style GRPO clip loss with nothing else: log-prob by logsumexp and gather, ratio, clamp, token mean."""
    logp = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
    ratio = torch.exp(logp - old_tok)
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    return (per_token * mask).sum() / mask.sum()


def run_method(method: str, logits, old_sparse, old_tok, tokens, adv, mask, args):
    """Forward + backward of one method; ``logits`` is a leaf that requires grad (its .grad is reset)."""
    logits.grad = None
    if method == "troll":
        out = troll.troll_loss(
            logits, old_sparse, tokens, adv, mask, kl_bound=args.eps, top_k=args.top_k, delta=args.delta
        )
        out.loss.backward()
        return out
    if method == "clip":
        troll.clip_loss(logits, old_tok, tokens, adv, mask).loss.backward()
    elif method == "mclip":
        minimal_clip(logits, old_tok, tokens, adv, mask).backward()
    elif method == "lse":
        torch.logsumexp(logits, -1).sum().backward()
    else:  # traffic: one read of the logits, one write of a gradient-sized buffer
        logits.detach().amax(-1)
        torch.empty_like(logits).fill_(0.0)
    return None


def inputs(vocab: int, args):
    old, new, tokens, adv, mask = load_batch(vocab, args)
    old_sparse = troll.sparsify(old, top_k=args.top_k, delta=args.delta, include=tokens)
    old_tok = troll.old_token_logp(old_sparse, tokens).float()
    return old_sparse, old_tok, new.requires_grad_(True), tokens, adv, mask


def child(args) -> None:
    """One measurement in a fresh process: prints JSON with the peak memory delta of one forward + backward."""
    old_sparse, old_tok, new, tokens, adv, mask = inputs(args.vocab[0], args)
    n = min(64, args.tokens)  # warm-up on a small slice: thread pools and kernels' scratch, allocated once
    small = new.detach()[:, :n].clone().requires_grad_(True)
    run_method(args.child, small, old_sparse[:, :n], old_tok[:, :n], tokens[:, :n], adv[:, :n], mask[:, :n], args)
    del small
    reset_peak()
    base = status_kb("VmRSS")
    run_method(args.child, new, old_sparse, old_tok, tokens, adv, mask, args)
    print(json.dumps({"peak_mb": (status_kb("VmHWM") - base) / 1024}))


PASSED = ("tokens", "seed", "spread", "top_k", "delta", "eps", "threads")


def peak_memory(method: str, vocab: int, args) -> float:
    cmd = [sys.executable, __file__, "--child", method, "--vocab", str(vocab)]
    for name in PASSED:
        value = getattr(args, name)
        if value is not None:
            cmd += [f"--{name.replace('_', '-')}", str(value)]
    cmd += ["--synthetic"] if args.synthetic else []
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


CONDITIONS = {"none": ("idle",), "busy": ("loaded",), "both": ("idle", "loaded")}


def time_methods(methods, call, args):
    """Medians per condition and method: {condition: {method: seconds}}, and the last TROLL metrics.

    ``call(method)`` runs one forward + backward and returns the loss output (or None)."""
    conditions = CONDITIONS[args.load]
    times = {c: {m: [] for m in methods} for c in conditions}
    metrics = None
    for r in range(args.repeats + 1):  # the first round warms up; the order rotates every round
        for condition in conditions:
            with competing_load(condition == "loaded"):
                for method in methods[r % len(methods) :] + methods[: r % len(methods)]:
                    t0 = time.perf_counter()
                    out = call(method)
                    times[condition][method].append(time.perf_counter() - t0)
                    metrics = out.metrics if out is not None else metrics
    return {c: {m: statistics.median(t[1:]) for m, t in ts.items()} for c, ts in times.items()}, metrics


HEAD_METHODS = ("troll_chunked", "troll_unfused", "mclip")


def run_head(method: str, hidden, weight, old_sparse, old_tok, tokens, adv, mask, args):
    """Forward + backward of one method from the LM head's input; gradients to ``hidden`` and ``weight``."""
    hidden.grad = weight.grad = None
    kw = dict(kl_bound=args.eps, top_k=args.top_k, delta=args.delta)
    if method == "troll_chunked":
        out = troll.troll_loss_from_hidden(hidden, weight, old_sparse, tokens, adv, mask, **kw)
        out.loss.backward()
        return out
    logits = hidden @ weight.T
    if method == "troll_unfused":
        out = troll.troll_loss(logits, old_sparse, tokens, adv, mask, **kw)
        out.loss.backward()
        return out
    minimal_clip(logits, old_tok, tokens, adv, mask).backward()
    return None


def bench_head(args) -> list[dict]:
    """The LM-head rows (--head): chunked and unfused TROLL against hidden @ W.T + the minimal clip loss."""
    old, _, tokens, adv, mask, _ = real_batch(REAL_CACHE, eps=args.eps)
    hidden, weight = real_head(REAL_HEAD_CACHE, REAL_CACHE)
    n = args.tokens
    old, tokens, adv, mask = old[:, :n], tokens[:, :n], adv[:, :n], mask[:, :n]
    old_sparse = troll.sparsify(old, top_k=args.top_k, delta=args.delta, include=tokens)
    old_tok = troll.old_token_logp(old_sparse, tokens).float()
    hidden = hidden[:, :n].clone().requires_grad_(True)
    weight = weight.clone().requires_grad_(True)
    medians, metrics = time_methods(
        HEAD_METHODS, lambda m: run_head(m, hidden, weight, old_sparse, old_tok, tokens, adv, mask, args), args
    )
    rows = []
    for condition, med in medians.items():
        row = {"V": weight.shape[0], "H": weight.shape[1], "N": n, "rows": "real", "path": "head"}
        row.update({"threads": torch.get_num_threads(), "load": condition})
        row.update({f"{m}_s": round(med[m], 4) for m in HEAD_METHODS})
        row.update({f"{m}/mclip": round(med[m] / med["mclip"], 3) for m in HEAD_METHODS[:2]})
        row["support_mean"] = round(float(metrics["support/mean"]), 2)
        rows.append(row)
    return rows


def bench_vocab(vocab: int, args) -> list[dict]:
    old_sparse, old_tok, new, tokens, adv, mask = inputs(vocab, args)
    medians, metrics = time_methods(
        METHODS, lambda m: run_method(m, new, old_sparse, old_tok, tokens, adv, mask, args), args
    )
    new.grad = None
    with torch.no_grad():
        proj = troll.project_sparse(
            new.detach(), old_sparse, args.eps, top_k=args.top_k, delta=args.delta, include=tokens
        )
        on = proj.eta > 0
        worst = float(((proj.kl_after[on] - args.eps).abs() / args.eps).max()) if on.any() else 0.0
        flat = new.detach()[0]
        new_kept = kept_ids(flat, torch.logsumexp(flat, -1, keepdim=True), args.top_k, args.delta)[1]
    mem = {m: peak_memory(m, vocab, args) for m in MEMORY_METHODS} if args.memory else {}
    rows = []
    for condition, med in medians.items():
        row = {"V": vocab, "N": args.tokens, "rows": "synthetic" if args.synthetic else "real"}
        row.update({"threads": torch.get_num_threads(), "load": condition})
        row.update({f"{m}_s": round(med[m], 4) for m in METHODS})
        row.update({f"troll/{m}": round(med["troll"] / med[m], 3) for m in METHODS[1:]})
        row.update({f"{m}_peak_mb": round(v, 1) for m, v in mem.items()})
        if mem:
            row["mem troll/mclip"] = round(mem["troll"] / mem["mclip"], 3)
            row["mem troll/clip"] = round(mem["troll"] / mem["clip"], 3)
        row.update(
            {
                "projected_frac": round(float(on.double().mean()), 3),
                "worst_rel_kl_err": f"{worst:.2e}",
                "old_kept_mean": round(float(old_sparse.mask.sum(-1).float().mean()), 2),
                "new_kept_mean": round(float(new_kept.sum(-1).float().mean()), 2),
                "support_mean": round(float(metrics["support/mean"]), 2),
            }
        )
        rows.append(row)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="N, the number of token positions (at most 4096 real)")
    p.add_argument("--vocab", type=int, nargs="+", default=None, help="default 49152 151936 (synthetic: 32000 151936)")
    p.add_argument("--synthetic", action="store_true", help="peaked synthetic rows instead of the real model's")
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--eps", type=float, default=0.05)
    p.add_argument("--spread", type=float, default=1.5, help="synthetic: scale of the new policy's perturbation")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory subprocesses")
    p.add_argument(
        "--load",
        choices=sorted(CONDITIONS),
        default="none",
        help="time alone (none), while another process keeps one core busy (busy), or both, round by round",
    )
    p.add_argument("--head", action="store_true", help="the losses from the LM head's input (chunked TROLL)")
    p.add_argument("--out", type=Path, default=None, help="default benchmarks/results/bench_loss[_head][-quick].csv")
    p.add_argument("--quick", action="store_true", help="smoke run: synthetic rows, N 256, V 32000, 1 round")
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick and args.head:
        p.error("--head needs the real model's rows, which take minutes to generate; drop --quick")
    if args.quick:
        args.synthetic, args.tokens, args.vocab, args.repeats = True, 256, [32000], 1
        print("--quick: synthetic rows (not the real model's), N 256, V 32000, 1 round: a smoke run, not figures")
    args.vocab = args.vocab or ([32000, 151936] if args.synthetic else [49152, 151936])
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        return child(args)
    if args.head and args.synthetic:
        p.error("--head uses the real model's rows; drop --synthetic")
    if args.out is None:
        args.out = RESULTS / ("bench_loss_head.csv" if args.head else "bench_loss.csv")
        args.out = quick_path(args.out) if args.quick else args.out
    rows = bench_head(args) if args.head else [row for v in args.vocab for row in bench_vocab(v, args)]
    header = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{'synthetic' if args.synthetic else 'SmolLM2-135M-Instruct'} rows, eps {args.eps}, K {args.top_k}, "
        f"delta {args.delta}; medians of {args.repeats} alternating rounds"
    )
    write_results(rows, args.out, header)


if __name__ == "__main__":
    main()
