"""Accuracy scans behind two claims of docs/gaussian.md ("Numerics"), each against an independent reference.

mean   The mean projection at high condition numbers: a global or per-state old covariance Sigma_o of condition
       number 1e4 to 1e8 (kind "chol", and "sqrt" with S = Sigma_o^(1/2)), D = 6, 4 states moved ~3 Mahalanobis
       units, mean bound 0.05, 5 seeds. The distance of each projected mean to the old one is recomputed in 60-digit
       mpmath from the exact float64 factor; printed: the worst |d / bound - 1|.
frob   float32 Frobenius projections with covariance eigenvalues in [1, 10^c], c in [4, 6], D = 20 to 63, bounds
       1e-6 to 1e-4, per-state and global, chol and diag, near and unrelated (--problems of them); the distance of
       the returned float32 factor recomputed in float64; printed: how many exceed the bound, and the worst d / bound.

    OMP_NUM_THREADS=1 python benchmarks/gaussian_accuracy.py [--problems 40]
    OMP_NUM_THREADS=1 python benchmarks/gaussian_accuracy.py --quick     # smoke run: 1 seed, 1e4 and 1e8, 4 problems

Writes benchmarks/results/gaussian_accuracy.csv (--quick: gaussian_accuracy-quick.csv) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import os

import mpmath
import torch

import troll.gaussian as tg
from troll.gaussian.distances import factor_distance

F64 = torch.float64


def random_spd(n: int, d: int, g: torch.Generator, log10_cond: float) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, d, d, generator=g, dtype=F64))
    e = 10 ** (log10_cond * torch.rand(n, d, generator=g, dtype=F64))  # eigenvalues in [1, 10^c]
    return q @ torch.diag_embed(e) @ q.mT


def factor_of(cov: torch.Tensor, kind: str) -> torch.Tensor:
    return cov.diagonal(dim1=-2, dim2=-1).sqrt() if kind == "diag" else torch.linalg.cholesky(cov)


def mean_scan(kind: str, single: bool, log10_cond: int, seeds: int = 5, d: int = 6, states: int = 4) -> float:
    """The worst |d / bound - 1| of projected means, d in 60-digit arithmetic."""
    worst = 0.0
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))
        e = torch.logspace(-log10_cond / 2, log10_cond / 2, d, dtype=F64)
        if kind == "chol":
            f = torch.linalg.cholesky(q @ torch.diag(e) @ q.T)
        else:
            f = q @ torch.diag(e.sqrt()) @ q.T
            f = (f + f.T) / 2
        mu_o = torch.randn(states, d, generator=g, dtype=F64)
        mu = mu_o + 3 * (q @ (e.sqrt().unsqueeze(-1) * torch.randn(d, states, generator=g, dtype=F64))).T
        factor = f if single else f.expand(states, d, d).clone()
        distance = "kl" if kind == "chol" else "w2"
        out = tg.project(
            tg.Gaussian(mu, factor, kind),
            tg.Gaussian(mu_o, factor, kind),
            mean_bound=0.05,
            cov_bound=1.0,
            distance=distance,
        )
        with mpmath.workdps(60):
            fm = mpmath.matrix(f.tolist())
            cov = fm * fm.T if kind == "chol" else fm * fm
            half = mpmath.mpf(0.5) if distance == "kl" else 1
            for i in range(states):
                diff = mpmath.matrix(
                    [mpmath.mpf(a) - mpmath.mpf(b) for a, b in zip(out.policy.mean[i].tolist(), mu_o[i].tolist())]
                )
                x = mpmath.lu_solve(cov, diff)
                dist = half * sum(diff[j] * x[j] for j in range(d))
                worst = max(worst, abs(float(dist / mpmath.mpf(0.05)) - 1))
    return worst


def frob_scan(problems: int) -> tuple[int, float]:
    """(problems above their bound, worst d / bound) of float32 Frobenius projections."""
    over, worst = 0, 0.0
    for seed in range(problems):
        g = torch.Generator().manual_seed(1000 + seed)
        kind, single, unrelated = ("chol", "diag")[seed % 2], seed % 4 >= 2, seed % 8 >= 4
        dim = int(torch.randint(20, 64, (1,), generator=g))
        c = 4 + 2 * float(torch.rand(1, generator=g, dtype=F64))
        rows = 1 if single else 3
        cov_o = random_spd(rows, dim, g, c)
        if unrelated:
            cov = random_spd(rows, dim, g, c)
        else:  # the old covariance, moved by exp(scale E) in its own frame
            e = torch.randn(rows, dim, dim, generator=g, dtype=F64)
            lam, v = torch.linalg.eigh((e + e.mT) / (2 * (2 * dim) ** 0.5))
            scale = 10 ** torch.empty(rows, 1, dtype=F64).uniform_(-4, 0.5, generator=g)
            lo = torch.linalg.cholesky(cov_o)
            cov = lo @ v @ torch.diag_embed((scale * lam).exp()) @ v.mT @ lo.mT
            cov = (cov + cov.mT) / 2
        f, f_o = factor_of(cov, kind).float(), factor_of(cov_o, kind).float()
        if single:
            f, f_o = f[0], f_o[0]
        bound = 10 ** float(-6 + 2 * torch.rand(1, generator=g, dtype=F64))
        mean = torch.zeros(3, dim)
        out = tg.project(
            tg.Gaussian(mean, f, kind),
            tg.Gaussian(mean, f_o, kind),
            mean_bound=1.0,
            cov_bound=bound,
            distance="frobenius",
        )
        ratio = float(
            (factor_distance(kind, out.policy.factor.double(), f_o.double(), distance="frobenius") / bound).max()
        )
        over += ratio > 1
        worst = max(worst, ratio)
    return over, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=40, help="float32 Frobenius problems")
    parser.add_argument("--out", default=None, help="default benchmarks/results/gaussian_accuracy[-quick].csv")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 seed, conditions 1e4 and 1e8, 4 problems")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds, conditions = (1, (4, 8)) if args.quick else (5, (4, 6, 7, 8))
    args.problems = 4 if args.quick else args.problems
    name = "gaussian_accuracy-quick.csv" if args.quick else "gaussian_accuracy.csv"
    args.out = args.out or os.path.join(os.path.dirname(__file__), "results", name)
    rows = []
    for kind in ("chol", "sqrt"):
        for single in (True, False):
            for c in conditions:
                rows.append(
                    (
                        "mean",
                        kind,
                        "global" if single else "per-state",
                        f"1e{c}",
                        "",
                        f"{mean_scan(kind, single, c, seeds):.1e}",
                    )
                )
    over, worst = frob_scan(args.problems)
    rows.append(("frob float32", "chol+diag", "both", "1e4-1e6", f"{over} of {args.problems}", f"{worst:.3g}"))
    header = ("scan", "kind", "layout", "condition", "above bound", "worst: abs(d/b - 1) (mean), d/b (frob)")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        csv.writer(fh).writerows([header, *rows])
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
