"""Loss-level benchmark: forward + backward of troll_loss against clip_loss from the same logits.

For each vocabulary size it builds N tokens of realistically peaked old logits (each row puts 1-20 tokens above
the rest, so 1 - 1e-5 of the mass needs 1-20 tokens) and a perturbed new policy so that a good share of rows is
projected. It times forward + backward of both losses (median of --repeats, alternating), measures the peak
memory of each in a fresh subprocess, and checks the projection: the worst |KL_after - eps| / eps over projected
rows (from the float64 sparse support the loss uses).

Peak memory on CPU: each (method, V) runs in its own subprocess; after the inputs exist (and one warm-up call on
a small batch) we reset the kernel's high-water mark (/proc/self/clear_refs), run forward + backward, and take
VmHWM - VmRSS before. Tensors of this size are mmap-backed, so what is freed returns to the system and the
high-water mark is the method's own working set, inputs excluded.

    python benchmarks/bench_loss.py                      # N = 4096, V in {32000, 151936}
    python benchmarks/bench_loss.py --tokens 512 --vocab 32000 --repeats 3    # a quick look
Writes benchmarks/results/bench_loss.csv and prints a markdown table.
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
from _report import reset_peak, status_kb, write_results

import troll

RESULTS = Path(__file__).parent / "results"


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


def run_method(method: str, logits, old_sparse, old_tok, tokens, adv, mask, args):
    """Forward + backward of one loss; ``logits`` is a leaf that requires grad (its .grad is reset)."""
    logits.grad = None
    if method == "troll":
        out = troll.troll_loss(
            logits, old_sparse, tokens, adv, mask, kl_bound=args.eps, top_k=args.top_k, delta=args.delta
        )
    else:
        out = troll.clip_loss(logits, old_tok, tokens, adv, mask)
    out.loss.backward()
    return out


def child(args) -> None:
    """One measurement in a fresh process: prints JSON with the peak memory delta of one forward + backward."""
    # Warm up on a small batch first: the first call allocates thread pools and kernels' scratch once.
    for n in (64, args.tokens):
        old, new, tokens, adv, mask = make_batch(n, args.vocab[0], seed=args.seed, spread=args.spread)
        old_sparse = troll.sparsify(old, top_k=args.top_k, delta=args.delta, include=tokens)
        old_tok = troll.old_token_logp(old_sparse, tokens).float()
        del old
        new.requires_grad_(True)
        if n == 64:
            run_method(args.child, new, old_sparse, old_tok, tokens, adv, mask, args)
    reset_peak()
    base = status_kb("VmRSS")
    run_method(args.child, new, old_sparse, old_tok, tokens, adv, mask, args)
    print(json.dumps({"peak_mb": (status_kb("VmHWM") - base) / 1024}))


def peak_memory(method: str, vocab: int, args) -> float:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        method,
        "--vocab",
        str(vocab),
        "--tokens",
        str(args.tokens),
        "--seed",
        str(args.seed),
        "--spread",
        str(args.spread),
        "--top-k",
        str(args.top_k),
        "--delta",
        str(args.delta),
        "--eps",
        str(args.eps),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def bench_vocab(vocab: int, args) -> dict:
    old, new, tokens, adv, mask = make_batch(args.tokens, vocab, seed=args.seed, spread=args.spread)
    old_sparse = troll.sparsify(old, top_k=args.top_k, delta=args.delta, include=tokens)
    old_tok = troll.old_token_logp(old_sparse, tokens).float()
    new.requires_grad_(True)
    times = {"troll": [], "clip": []}
    for _ in range(args.repeats + 1):  # the first round warms up
        for method in times:
            t0 = time.perf_counter()
            out = run_method(method, new, old_sparse, old_tok, tokens, adv, mask, args)
            times[method].append(time.perf_counter() - t0)
            if method == "troll":
                metrics = out.metrics
    med = {m: statistics.median(t[1:]) for m, t in times.items()}
    with torch.no_grad():
        proj = troll.project_sparse(
            new.detach(), old_sparse, args.eps, top_k=args.top_k, delta=args.delta, include=tokens
        )
        on = proj.eta > 0
        worst = float(((proj.kl_after[on] - args.eps).abs() / args.eps).max()) if on.any() else 0.0
        above = float(((proj.kl_after - args.eps) / args.eps).max())
    mem = {m: peak_memory(m, vocab, args) for m in ("troll", "clip")}
    kept = old_sparse.mask.sum(-1).float()
    return {
        "V": vocab,
        "N": args.tokens,
        "troll_s": round(med["troll"], 4),
        "clip_s": round(med["clip"], 4),
        "time_ratio": round(med["troll"] / med["clip"], 3),
        "troll_peak_mb": round(mem["troll"], 1),
        "clip_peak_mb": round(mem["clip"], 1),
        "mem_ratio": round(mem["troll"] / mem["clip"], 3),
        "projected_frac": round(float(on.double().mean()), 3),
        "worst_rel_kl_err": f"{worst:.2e}",
        "max_rel_excess": f"{above:.2e}",
        "old_kept_mean": round(float(kept.mean()), 2),
        "support_mean": round(float(metrics["support/mean"]), 2),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="N, the number of token positions")
    p.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--eps", type=float, default=0.05)
    p.add_argument("--spread", type=float, default=1.5, help="scale of the new policy's perturbation")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_loss.csv")
    p.add_argument("--child", choices=("troll", "clip"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        return child(args)
    rows = [bench_vocab(v, args) for v in args.vocab]
    header = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, eps {args.eps}, K {args.top_k}, "
        f"delta {args.delta}; medians of {args.repeats}"
    )
    write_results(rows, args.out, header)


if __name__ == "__main__":
    main()
