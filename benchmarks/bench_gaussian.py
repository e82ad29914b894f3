"""Gaussian projection benchmark: forward + backward of troll.gaussian.project against a Gaussian PPO clip loss.

For a batch of B states (default 4096) at action dimensions D (default 4, 12, 36, 63: TCE's largest is 7 DoF x 9),
diagonal and full covariances, float32 and float64, per-state ("state") and one global ("global", TCE's case)
covariance. Methods, timed in alternating rounds in one process (medians over --repeats rounds after a warm-up):
    clip    the baseline: log-prob of the batch's actions + PPO clip loss (eps 0.2), forward + backward
    kl      troll.gaussian.project(distance="kl") + backward of a random linear function of its outputs
    frob    the same with distance="frobenius" (closed form)
    w2      the same with distance="w2" on the symmetric square root of the same covariance (closed form)
    trpl    troll.gaussian.trpl_loss (KL projection, log-prob, surrogate, regression, metrics), forward + backward
Ratios are against clip on the same layout. The synthetic new policy is the old one moved so that about half of
the per-state rows are projected (mean bound 0.05, covariance bound 0.005); the global covariance is projected.
It also reports the share projected and the worst |d_after / bound - 1| over projected rows.

Times are the process's CPU time (time.process_time) with --threads 1, the default: on a machine shared with other
work it does not count the time the process waits for a core, which wall time would. With more threads, wall time.

    python benchmarks/bench_gaussian.py --threads 1
    python benchmarks/bench_gaussian.py --quick                                 # smoke run: D 4, 12, B 256
    python benchmarks/bench_gaussian.py --precision 400                         # the float64 / float32 figures
Writes benchmarks/results/bench_gaussian.csv (--quick: bench_gaussian-quick.csv) and prints a markdown table.
``--precision N`` instead projects N random problems (dimensions 1-63, condition numbers up to 1e6, bounds 1e-6 to
10, every distance and kind, float64 and float32) and prints how far the distances recomputed in float64 from the
returned values lie from the bounds (docs/gaussian.md, "Numerics").
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from _report import quick_path, write_results

import troll.gaussian as tg

RESULTS = Path(__file__).parent / "results"
METHODS = ("clip", "kl", "frob", "w2", "trpl")
MEAN_BOUND, COV_BOUND = 0.05, 0.005


def sym_sqrt(cov: torch.Tensor) -> torch.Tensor:
    e, v = torch.linalg.eigh(cov)
    s = v @ torch.diag_embed(e.sqrt()) @ v.mT
    return (s + s.mT) / 2


def make_policies(batch: int, dim: int, *, full: bool, single: bool, seed: int = 0):
    """(new, old) as Gaussians in float64 plus the new/old covariances: old random (condition number ~100), new moved
    by a per-state amount log-spaced so that about half the rows leave the trust region."""
    g = torch.Generator().manual_seed(seed)
    rows = 1 if single else batch
    q, _ = torch.linalg.qr(torch.randn(rows, dim, dim, generator=g, dtype=torch.float64))
    eig = 10 ** (2 * torch.rand(rows, dim, generator=g, dtype=torch.float64) - 1)
    cov_o = q @ torch.diag_embed(eig) @ q.mT
    if not full:
        cov_o = torch.diag_embed(eig)
    scale = torch.logspace(-2.5, -0.5, rows, dtype=torch.float64).reshape(-1, 1, 1) * (dim / 4) ** -0.5
    if single:  # the global covariance is moved far enough to be projected
        scale = scale.clamp_min(0.3 * (dim / 4) ** -0.5)
    e = torch.randn(rows, dim, dim, generator=g, dtype=torch.float64)
    e = (e + e.mT) / 2 if full else torch.diag_embed(e.diagonal(dim1=-2, dim2=-1))
    lam, v = torch.linalg.eigh(scale * e)
    lo = torch.linalg.cholesky(cov_o)
    cov = lo @ (v @ torch.diag_embed(lam.exp()) @ v.mT) @ lo.mT
    cov = (cov + cov.mT) / 2
    mean_o = torch.randn(batch, dim, generator=g, dtype=torch.float64)
    shift = torch.logspace(-2, 0, batch, dtype=torch.float64).unsqueeze(-1) / dim**0.5
    mean = mean_o + shift * torch.randn(batch, dim, generator=g, dtype=torch.float64)
    if single:
        cov, cov_o = cov[0], cov_o[0]
    return mean, mean_o, cov, cov_o


def policies(mean, mean_o, cov, cov_o, *, full: bool, kind: str, dtype):
    if not full:
        f, f_o = cov.diagonal(dim1=-2, dim2=-1).sqrt(), cov_o.diagonal(dim1=-2, dim2=-1).sqrt()
        kind = "diag"
    elif kind == "chol":
        f, f_o = torch.linalg.cholesky(cov), torch.linalg.cholesky(cov_o)
    else:
        f, f_o = sym_sqrt(cov), sym_sqrt(cov_o)
    new = tg.Gaussian(mean.to(dtype), f.to(dtype).requires_grad_(), kind)
    new.mean.requires_grad_()
    return new, tg.Gaussian(mean_o.to(dtype), f_o.to(dtype), kind)


def clip_loss(policy, actions, old_logp, adv, eps=0.2):
    ratio = (policy.log_prob(actions) - old_logp).exp()
    return -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv).mean()


def run(method, inputs):
    chol, sqrt, actions, old_logp, adv, weights = inputs
    new, old = sqrt if method == "w2" else chol
    for t in (new.mean, new.factor):
        t.grad = None
    if method == "clip":
        clip_loss(new, actions, old_logp, adv).backward()
    elif method == "trpl":
        tg.trpl_loss(new, old, actions, adv, mean_bound=MEAN_BOUND, cov_bound=COV_BOUND).loss.backward()
    else:
        distance = {"kl": "kl", "frob": "frobenius", "w2": "w2"}[method]
        out = tg.project(new, old, mean_bound=MEAN_BOUND, cov_bound=COV_BOUND, distance=distance)
        w_mean, w_factor = weights
        ((out.policy.mean * w_mean).sum() + (out.policy.factor * w_factor).sum()).backward()


def bench(dim: int, full: bool, single: bool, dtype, args) -> dict:
    raw = make_policies(args.batch, dim, full=full, single=single, seed=args.seed)
    chol = policies(*raw, full=full, kind="chol", dtype=dtype)
    sqrt = policies(*raw, full=full, kind="sqrt", dtype=dtype)
    g = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        old = chol[1]
        z = torch.randn(args.batch, dim, generator=g, dtype=torch.float64).to(dtype)
        actions = old.mean + (old.cholesky() @ z.unsqueeze(-1)).squeeze(-1)
        old_logp = old.log_prob(actions)
    adv = torch.randn(args.batch, generator=g, dtype=torch.float64).to(dtype)
    weights = (torch.randn_like(chol[0].mean), torch.randn_like(chol[0].factor))
    inputs = (chol, sqrt, actions, old_logp, adv, weights)
    cpu, wall = timed_rounds(args.methods, lambda m: run(m, inputs), args.rounds, args.min_round)
    with torch.no_grad():
        out = tg.project(*chol, mean_bound=MEAN_BOUND, cov_bound=COV_BOUND)
        on = out.eta > 0
        err = (out.cov_after[on].double() / COV_BOUND - 1).abs()
    row = {"D": dim, "cov": "full" if full else "diag", "layout": "global" if single else "state"}
    row |= {"dtype": str(dtype).removeprefix("torch."), "B": args.batch}
    row |= {f"{m}_ms": round(1e3 * cpu[m], 2) for m in args.methods}
    row |= {f"{m}/clip": round(cpu[m] / cpu["clip"], 2) for m in args.methods[1:]}
    row |= {f"{m}/clip wall": round(wall[m] / wall["clip"], 2) for m in args.methods[1:]}
    row |= {"cov_projected": round(float(on.double().mean()), 2), "mean_projected": _share(out.omega)}
    row["worst_rel_err"] = f"{float(err.max()) if err.numel() else 0.0:.1e}"
    return row


def timed_rounds(methods, call, rounds: int, min_round: float):
    """Median CPU and wall seconds per call of each method over ``rounds`` rounds that interleave the methods.

    One warm-up round (not counted) also sets how many calls a round makes of each method (enough for ``min_round``
    CPU seconds, at least 1), so that fast methods are not measured at the clock's resolution. The order of the
    methods rotates from round to round, so none always runs right after the same neighbour.
    """
    calls = {}
    for m in methods:  # warm-up
        t0 = time.process_time()
        call(m)
        calls[m] = max(1, min(50, round(min_round / max(time.process_time() - t0, 1e-6))))
    cpu, wall = ({m: [] for m in methods} for _ in range(2))
    for r in range(rounds):
        k = r % len(methods)
        for m in methods[k:] + methods[:k]:
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(calls[m]):
                call(m)
            cpu[m].append((time.process_time() - c0) / calls[m])
            wall[m].append((time.perf_counter() - w0) / calls[m])
    return ({m: statistics.median(t) for m, t in times.items()} for times in (cpu, wall))


def _share(x: torch.Tensor) -> float:
    return round(float((x > 0).double().mean()), 2)


def random_problem(g: torch.Generator, kind: str, dtype):
    """(new, old, bound): D in 1-63, condition number 10^U(0, 6), bound 10^U(-6, 1), new moved by 10^U(-2, 0.5)."""
    dim = int(torch.randint(1, 64, (1,), generator=g))
    log_cond = 6 * float(torch.rand(1, generator=g))
    bound = 10 ** (-6 + 7 * float(torch.rand(1, generator=g)))
    f64 = dict(generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(3, dim, dim, **f64))
    cov_o = q @ torch.diag_embed(10 ** (log_cond * (torch.rand(3, dim, **f64) - 0.5))) @ q.mT
    e = torch.randn(3, dim, dim, **f64)
    lam, v = torch.linalg.eigh((e + e.mT) / (2 * (2 * dim) ** 0.5))
    scale = 10 ** (-2 + 2.5 * torch.rand(3, 1, **f64))
    lo = torch.linalg.cholesky(cov_o)
    cov = lo @ v @ torch.diag_embed((scale * lam).exp()) @ v.mT @ lo.mT
    cov = (cov + cov.mT) / 2
    mean_o = 3 * torch.randn(3, dim, **f64)
    mean = mean_o + (lo @ torch.randn(3, dim, 1, **f64)).squeeze(-1) * 10 ** (
        -2 + 2.5 * float(torch.rand(1, generator=g))
    )
    if kind == "diag":
        f, f_o = cov.diagonal(dim1=-2, dim2=-1).sqrt(), cov_o.diagonal(dim1=-2, dim2=-1).sqrt()
    elif kind == "chol":
        f, f_o = torch.linalg.cholesky(cov), lo
    else:
        f, f_o = sym_sqrt(cov), sym_sqrt(cov_o)
    return tg.Gaussian(mean.to(dtype), f.to(dtype), kind), tg.Gaussian(mean_o.to(dtype), f_o.to(dtype), kind), bound


def precision_scan(n: int, seed: int) -> None:
    """Print, per dtype and part, the largest d_after / bound - 1 and how far inside projected rows land."""
    from troll.gaussian.distances import factor_distance, mean_distance
    from troll.gaussian.projection import KINDS_FOR

    cases = [(d, k) for d, kinds in KINDS_FOR.items() for k in kinds]
    g = torch.Generator().manual_seed(seed)
    ratios = {}
    for i in range(n):
        distance, kind = cases[i % len(cases)]
        for dtype in (torch.float64, torch.float32):
            new, old, bound = random_problem(g, kind, dtype)
            out = tg.project(new, old, mean_bound=bound, cov_bound=bound, distance=distance)
            p, o = out.policy.to(torch.float64), old.to(torch.float64)
            m = mean_distance(p.mean, o, distance=distance) / bound
            c = factor_distance(kind, p.factor, o.factor, distance=distance) / bound
            name = str(dtype).removeprefix("torch.")
            ratios.setdefault((name, "mean"), []).extend(m[out.omega > 0].tolist())
            ratios.setdefault((name, "cov"), []).extend(c[out.eta > 0].tolist())
    print(f"{n} random problems per dtype; d = distance recomputed in float64 from the returned values, b = bound")
    print("| dtype | part | projected rows | max d/b - 1 | median 1 - d/b | 99th pct 1 - d/b | max 1 - d/b |")
    print("|---|---|---|---|---|---|---|")
    for (name, part), values in ratios.items():
        x = torch.tensor(values, dtype=torch.float64)
        median, p99 = (1 - x.quantile(torch.tensor([0.5, 0.01], dtype=torch.float64))).tolist()
        worst_over, worst_inside = float(x.max() - 1), float(1 - x.min())
        print(f"| {name} | {part} | {x.numel()} | {worst_over:.1e} | {median:.1e} | {p99:.1e} | {worst_inside:.1e} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=4096, help="B, the number of states")
    p.add_argument("--dims", type=int, nargs="+", default=[4, 12, 36, 63])
    p.add_argument("--covs", nargs="+", default=["diag", "full"], choices=["diag", "full"])
    p.add_argument("--layouts", nargs="+", default=["global", "state"], choices=["global", "state"])
    p.add_argument("--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="clip is always measured")
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds (after one warm-up); medians over them")
    p.add_argument("--min-round", type=float, default=0.02, help="CPU seconds a method runs per round, at least")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_gaussian.csv")
    p.add_argument("--precision", type=int, default=0, help="instead: the precision scan over this many problems")
    p.add_argument("--quick", action="store_true", help="smoke run: D 4 and 12, B 256, 1 round of >= 5 ms")
    args = p.parse_args(argv)
    if args.quick:
        args.dims, args.batch, args.rounds, args.min_round = [4, 12], 256, 1, 0.005
        args.out = quick_path(args.out) if args.out == RESULTS / "bench_gaussian.csv" else args.out
    args.methods = ["clip"] + [m for m in args.methods if m != "clip"]
    torch.set_num_threads(args.threads)
    if args.precision:
        return precision_scan(args.precision, args.seed)
    rows, keys = [], ("cov", "layout", "dtype")
    load = os.getloadavg()
    for dim in args.dims:
        for cov in args.covs:
            for layout in args.layouts:
                for dtype in args.dtypes:
                    row = bench(dim, cov == "full", layout == "global", getattr(torch, dtype), args)
                    print({k: v for k, v in row.items() if k == "D" or "clip" in k or k in keys}, flush=True)
                    rows.append(row)
    load = [round(x, 1) for x in (*load, *os.getloadavg())]
    header = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, B = {args.batch}, mean bound {MEAN_BOUND}, "
        f"cov bound {COV_BOUND}; forward + backward, medians of {args.rounds} alternating rounds; ms and x/clip: CPU "
        f"time, 'x/clip wall': wall time. Load average (1, 5, 15 min) before {load[:3]}, after {load[3:]}, "
        f"{os.cpu_count()} cores"
    )
    write_results(rows, args.out, header)


if __name__ == "__main__":
    main()
