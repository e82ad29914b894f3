"""LM-head-level benchmark: forward + backward from hidden states, chunked TROLL against the unfused and fused paths.

Methods, all from the same hidden (N, H) and weight (V, H), gradients to both:
    troll_chunked  troll.troll_loss_from_hidden: vocabulary chunks, never an (N, V) tensor
    troll_unfused  logits = hidden @ W.T, then troll.troll_loss
    trl_fused_clip TRL 1.16's fused LM head: trl.kernels.ChunkedLogProbFunction, the autograd Function that
                   trl.trainer.utils.add_fused_lm_head patches into the model's forward, called with the arguments
                   the patched forward passes for GRPO (every position on a device without Triton, TRL's 32768-column
                   chunks, outputs ("log_probs", "entropy")), then GRPO's clipped surrogate (eps 0.2, token-mean)
    clip_plain     logits = hidden @ W.T, then troll.clip_loss with old per-token log-probs (B, T)

Inputs imitate a peaked LM: weight rows ~ N(0, I/H); each old hidden state lifts 1-6 tokens to a logit near 26
(the others ~ N(0, 2-3^2)), so 1 - 1e-5 of the mass needs a few tokens. The current policy moves the lifted logits
by N(0, spread^2 / m) and all others a little, so a good share of rows is projected (reported). The old policy is
captured with troll.sparsify_from_hidden; tokens are sampled from it.

Peak memory on CPU: torch has no CPU allocator statistics, so each (method, shape) runs in a fresh subprocess that
builds its inputs, resets the kernel's resident-set high-water mark (``echo 5 > /proc/self/clear_refs``), reads
VmRSS, runs forward + backward once and reads VmHWM: the difference is the method's own peak working set,
gradients included (tensors this large are mmap-backed, so freed memory leaves the process). Resetting the mark
matters: ru_maxrss would also count the input set-up and, after a vfork-based spawn, the parent's high-water mark.
Without clear_refs (non-Linux) the script falls back to ru_maxrss and says so. Times are medians of --repeats runs
in the same subprocess (the first is the memory run).

    python benchmarks/bench_fused.py                                   # N = 4096, (H, V) = (576, 49152), (896, 151936)
    python benchmarks/bench_fused.py --quick     # smoke run: --tokens 256 --seq-len 128 --shapes 576x16384 --repeats 1
Writes benchmarks/results/bench_fused.csv (--quick: bench_fused-quick.csv) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _report import quick_path, reset_peak, status_kb, write_results

import troll

RESULTS = Path(__file__).parent / "results"
METHODS = ("troll_chunked", "troll_unfused", "trl_fused_clip", "clip_plain")
CLIP_EPS = 0.2


def make_policy(n: int, hidden_size: int, vocab: int, *, seed: int, spread: float):
    """weight (V, H), old hidden (N, H) and current hidden (N, H), deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.empty(vocab, hidden_size).normal_(generator=g).div_(math.sqrt(hidden_size))
    lifted = 6
    ids = torch.randint(0, vocab, (n, lifted), generator=g)
    live = torch.arange(lifted) < torch.randint(1, lifted + 1, (n, 1), generator=g)  # m_i in 1..6
    lift = torch.where(live, 26 + 2 * torch.randn(n, lifted, generator=g), 0.0)
    move = torch.where(live, spread * torch.randn(n, lifted, generator=g) / live.sum(-1, keepdim=True).sqrt(), 0.0)
    old_hidden = torch.empty(n, hidden_size)
    new_hidden = torch.empty(n, hidden_size)
    for s in range(0, n, 512):  # W[ids] is (rows, 6, H): keep it small
        rows = weight[ids[s : s + 512]]
        old_hidden[s : s + 512] = torch.einsum("nk,nkh->nh", lift[s : s + 512], rows)
        new_hidden[s : s + 512] = torch.einsum("nk,nkh->nh", lift[s : s + 512] + move[s : s + 512], rows)
    new_hidden += 0.3 * torch.randn(n, hidden_size, generator=g)  # moves every logit by ~N(0, 0.3^2)
    return weight, old_hidden, new_hidden


def make_rollout(old: troll.SparseLogProbs, seq_len: int, *, seed: int):
    """Tokens sampled from the stored old policy, per-sequence advantages and a ragged response mask (B, T)."""
    g = torch.Generator().manual_seed(seed + 1)
    n = old.ids.shape[0]
    probs = old.logp.exp().masked_fill(~old.mask, 0.0)
    tokens = old.ids.gather(-1, torch.multinomial(probs, 1, generator=g)).reshape(-1, seq_len)
    bsz = n // seq_len
    lengths = torch.randint(seq_len // 2, seq_len + 1, (bsz, 1), generator=g)
    mask = torch.arange(seq_len) < lengths
    adv = torch.randn(bsz, generator=g)
    return tokens, adv, mask


def run_method(method, hidden, weight, batch, args):
    """One forward + backward; returns the loss output's scalar and metrics."""
    old, tokens, adv, mask, old_tok = batch
    bsz, seq = tokens.shape
    h = hidden.reshape(bsz, seq, -1)
    opts = dict(kl_bound=args.eps, top_k=args.top_k, delta=args.delta)
    if method == "troll_chunked":
        out = troll.troll_loss_from_hidden(h, weight, old, tokens, adv, mask, chunk_size=args.chunk_size, **opts)
    elif method == "troll_unfused":
        out = troll.troll_loss(h @ weight.T, old, tokens, adv, mask, **opts)
    elif method == "clip_plain":
        out = troll.clip_loss(h @ weight.T, old_tok, tokens, adv, mask, eps_low=CLIP_EPS)
    else:
        out = trl_fused_clip(hidden, weight, tokens, adv, mask, old_tok)
    out.loss.backward()
    return out


def trl_fused_clip(hidden, weight, tokens, adv, mask, old_tok):
    """TRL's fused log-probs as its patched forward computes them on CPU, then GRPO's clipped surrogate."""
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    logps, _entropy, *_ = ChunkedLogProbFunction.apply(
        hidden, weight, None, tokens.reshape(-1), 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, ("log_probs", "entropy")
    )
    logps = logps.view(mask.shape).masked_fill(~mask, 0)
    ratio = torch.exp(logps - old_tok)
    a = adv.unsqueeze(-1)
    per_token = -torch.min(ratio * a, ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * a)
    return troll.LossOutput((per_token * mask).sum() / mask.sum().clamp(min=1), {})


def child(args) -> None:
    """One (method, shape) in a fresh process: prints JSON with the peak memory and the times."""
    hidden_size, vocab = args.shapes[0]
    weight, _, hidden = make_policy(args.tokens, hidden_size, vocab, seed=args.seed, spread=args.spread)
    saved = torch.load(args.batch_file)
    batch = (troll.SparseLogProbs(*saved["old"]), *saved["rollout"])
    weight.requires_grad_(True)
    hidden.requires_grad_(True)
    exact = reset_peak()
    base = status_kb("VmRSS") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for i in range(args.repeats):
        weight.grad = hidden.grad = None
        t0 = time.perf_counter()
        out = run_method(args.child, hidden, weight, batch, args)
        times.append(time.perf_counter() - t0)
        if i == 0:
            peak = status_kb("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    metrics = {k: float(v) for k, v in out.metrics.items()}
    result = {"peak_mb": (peak - base) / 1024, "times": times, "loss": float(out.loss), "exact": exact}
    print(json.dumps({**result, "metrics": metrics}))


def capture(shape, args, path: Path) -> dict:
    """The old policy and the rollout for one shape, saved for the children; returns input statistics."""
    hidden_size, vocab = shape
    weight, old_hidden, _ = make_policy(args.tokens, hidden_size, vocab, seed=args.seed, spread=args.spread)
    old_hidden = old_hidden.reshape(-1, args.seq_len, hidden_size)  # (B, T, H)
    old = troll.sparsify_from_hidden(old_hidden, weight, top_k=args.top_k, delta=args.delta)
    tokens, adv, mask = make_rollout(old.flatten(), args.seq_len, seed=args.seed)
    old_tok = troll.old_token_logp(old, tokens).float()
    fields = (old.ids, old.logp, old.mask, vocab, old.log_rest)
    torch.save({"old": fields, "rollout": (tokens, adv, mask, old_tok)}, path)
    return {"old_kept_mean": float(old.mask.sum(-1).float().mean())}


def run_child(method, shape, args, path: Path) -> dict:
    opts = {
        "--child": method,
        "--batch-file": path,
        "--shapes": f"{shape[0]}x{shape[1]}",
        **{f"--{k.replace('_', '-')}": getattr(args, k) for k in ("tokens", "seq_len", "repeats", "seed", "spread")},
        **{f"--{k.replace('_', '-')}": getattr(args, k) for k in ("top_k", "delta", "eps")},
    }
    cmd = [sys.executable, __file__, *(str(x) for kv in opts.items() for x in kv)]
    if args.chunk_size:
        cmd += ["--chunk-size", str(args.chunk_size)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:  # e.g. killed for lack of memory: report it, keep going
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        print(f"  {method} {shape} failed: {tail}", file=sys.stderr)
        return {"failed": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_shape(shape, args) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batch.pt"
        stats = capture(shape, args, path)
        res = {m: run_child(m, shape, args, path) for m in args.methods}
    rows = []
    ref = {m: res.get(m, {}).get("peak_mb") for m in ("trl_fused_clip", "clip_plain")}
    for m, r in res.items():
        peak = r.get("peak_mb")
        metrics = r.get("metrics", {})
        rows.append(
            {
                "H": shape[0],
                "V": shape[1],
                "N": args.tokens,
                "method": m,
                "time_s": round(statistics.median(r["times"]), 2) if "times" in r else "",
                "peak_mb": round(peak, 1) if peak is not None else "",
                "peak_vs_trl_fused": _ratio(peak, ref["trl_fused_clip"]),
                "peak_vs_clip_plain": _ratio(peak, ref["clip_plain"]),
                "loss": f"{r['loss']:.6g}" if "loss" in r else r.get("failed", ""),
                "projected_frac": _fmt(metrics.get("projected_frac")),
                "support_mean": _fmt(metrics.get("support/mean")),
                "kl_after_max": _fmt(metrics.get("kl_after/max")),
                "old_kept_mean": round(stats["old_kept_mean"], 2),
            }
        )
    return rows


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else ""


def _fmt(x):
    return "" if x is None else f"{x:.4g}"


def _shape(text: str) -> tuple[int, int]:
    h, v = text.lower().split("x")
    return int(h), int(v)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="N, the number of token positions")
    p.add_argument("--seq-len", type=int, default=256, help="T; B = N / T sequences")
    p.add_argument("--shapes", type=_shape, nargs="+", default=[(576, 49152), (896, 151936)], help="HxV ...")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--eps", type=float, default=0.05)
    p.add_argument("--spread", type=float, default=1.5, help="scale of the current policy's move on lifted tokens")
    p.add_argument("--chunk-size", type=int, default=None, help="troll_chunked's vocabulary chunk (default: auto)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_fused.csv")
    p.add_argument("--quick", action="store_true", help="smoke run: N 256, (H, V) = (576, 16384), 1 repeat")
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    p.add_argument("--batch-file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.seq_len, args.shapes, args.repeats = 256, 128, [(576, 16384)], 1
        args.out = quick_path(args.out) if args.out == RESULTS / "bench_fused.csv" else args.out
    if args.tokens % args.seq_len:
        p.error(f"--tokens ({args.tokens}) must be a multiple of --seq-len ({args.seq_len}).")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        return child(args)
    t0 = time.perf_counter()
    rows = [r for shape in args.shapes for r in bench_shape(shape, args)]
    header = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; eps {args.eps}, "
        f"K {args.top_k}, delta {args.delta}; medians of {args.repeats}; {time.perf_counter() - t0:.0f} s"
    )
    write_results(rows, args.out, header)
    print("\nTargets: troll_chunked peak <= 1.10 x trl_fused_clip and <= 0.35 x clip_plain.")
    for r in rows:
        if r["method"] == "troll_chunked" and r["peak_vs_trl_fused"] != "" and r["peak_vs_clip_plain"] != "":
            ok = r["peak_vs_trl_fused"] <= 1.10 and r["peak_vs_clip_plain"] <= 0.35
            print(
                f"  (H, V) = ({r['H']}, {r['V']}): {r['peak_vs_trl_fused']} x fused, {r['peak_vs_clip_plain']} x "
                f"plain -> {'met' if ok else 'NOT met'}"
            )


if __name__ == "__main__":
    main()
