"""The distances of the Gaussian trust regions (docs/gaussian.md, "Distances"), as pure tensor functions.

Shapes: B states, D action dimensions. Each distance splits into a mean part and a covariance part:

    mean part   m = (mu_p - mu_q)^T Sigma_q^-1 (mu_p - mu_q)      (distance "kl" uses m / 2)
    "kl"        KL_cov(p, q) = 1/2 [tr(Sigma_q^-1 Sigma_p) - D + log det Sigma_q - log det Sigma_p]
    "frobenius" |Sigma_p - Sigma_q|_F^2
    "w2"        |S_p - S_q|_F^2 with S the symmetric square roots (the W2 distance when they commute)

The second argument ``q`` is the reference (the old policy in a projection, the projected one in the regression).
"""

from __future__ import annotations

import torch

from troll._checks import check_choice, check_tensor
from troll.gaussian.policy import (
    Gaussian,
    all_finite,
    check_comparable,
    check_gaussian,
    check_like,
    check_range,
    whiten,
)

DISTANCES = ("kl", "w2", "frobenius")
SERIES_BELOW = 1e-2  # |x| below which x - log1p(x) is summed as a series (the direct form cancels there)


def x_minus_log1p(x: torch.Tensor) -> torch.Tensor:
    """x - log(1 + x) for x > -1, accurate to a few ulp also near 0, where it is x^2 / 2 - x^3 / 3 + ...

    Direct evaluation at |x| = 1e-4 keeps only ~12 digits (both terms are ~1e-4, the result ~5e-9); the KL of two
    close Gaussians is a sum of such terms, and the solver's tolerance is 1e-12 relative (docs/gaussian.md).
    """
    small = x.abs() < SERIES_BELOW
    if bool(small.all()):  # the common cases (all terms small, or none) skip the other branch
        return x_minus_log1p_series(x)
    if not bool(small.any()):
        return x - torch.log1p(x)
    return torch.where(
        small, x_minus_log1p_series(torch.where(small, x, 0.0)), x - torch.log1p(torch.where(small, 0.0, x))
    )


def x_minus_log1p_series(x: torch.Tensor) -> torch.Tensor:
    """x - log1p(x) for |x| < SERIES_BELOW, to ~2 ulp: with u = x / (2 + x), log1p(x) = 2 atanh(u) and x - 2u = u x,
    so x - log1p(x) = u x - 2 u^3 (1/3 + u^2/5 + u^4/7 + u^6/9 + ...), two terms that do not cancel."""
    u = x / (2 + x)
    u2 = u * u
    return u * x - 2 * u * u2 * (1 / 3 + u2 * (1 / 5 + u2 * (1 / 7 + u2 / 9)))


def psi(b: torch.Tensor) -> torch.Tensor:
    """b^2 - 1 - 2 log b for b > 0, written as (b - 1)^2 + 2 ((b - 1) - log b) so that b ~ 1 keeps its digits.

    (b - 1) - log b is :func:`x_minus_log1p` of x = b - 1 near b = 1; elsewhere log b is taken of b itself, not as
    log1p(b - 1): for b < 1e-16, b - 1 rounds to -1 and log1p(-1) = -inf (a std 1e-80 has a finite KL, 184 a dim).
    """
    x = b - 1
    small = x.abs() < SERIES_BELOW
    if bool(small.all()):
        return x * x + 2 * x_minus_log1p_series(x)
    direct = x - torch.log(b)
    if bool(small.any()):
        direct = torch.where(small, x_minus_log1p_series(torch.where(small, x, 0.0)), direct)
    return x * x + 2 * direct


def kl_from_relative_factor(rel: torch.Tensor) -> torch.Tensor:
    """KL_cov of N(0, Sigma_p) from N(0, Sigma_q) given ``rel = L_q^-1 L_p`` (lower triangular), (..., D, D) -> (...).

    tr(Sigma_q^-1 Sigma_p) = |rel|_F^2 and log det(Sigma_q^-1 Sigma_p) = 2 sum log rel_ii, so
    KL = 1/2 [sum_{i>j} rel_ij^2 + sum_i psi(rel_ii)]: no cancellation of D against the trace when p ~ q.
    """
    strict_lower = torch.ones(rel.shape[-2:], dtype=rel.dtype, device=rel.device).tril(-1)
    off = rel * strict_lower  # a mask product: much cheaper than tril on a batch of small matrices
    off = (off * off).sum((-2, -1))
    return 0.5 * (off + psi(rel.diagonal(dim1=-2, dim2=-1)).sum(-1))


def mean_distance(mean: torch.Tensor, q: Gaussian, *, distance: str) -> torch.Tensor:
    """The mean part: m = |W_q^-1 (mean - mu_q)|^2, halved for "kl". mean (B, D) -> (B,).

    Checks its input as :func:`troll.gaussian.project` does (docs/gaussian.md, "Input checks"): ``mean`` a finite
    tensor of q.mean's shape, dtype and device, ``q`` a valid policy; a distance the dtype cannot hold is refused.
    """
    check_choice("distance", distance, DISTANCES)
    check_tensor("mean", mean)
    check_gaussian("q", q)
    check_like("mean", mean, "q.mean", q.mean)
    if not all_finite(mean.detach()):
        raise ValueError("mean contains NaN or inf; check the network output (and its learning rate).")
    out = mean_part(mean, q, distance=distance)
    check_range("mean", out.detach(), mean.dtype, "its distance to q.mean")
    return out


def mean_part(mean: torch.Tensor, q: Gaussian, *, distance: str) -> torch.Tensor:
    """:func:`mean_distance` without the checks (for callers that checked their policies)."""
    z = whiten(q, mean - q.mean)
    m = (z * z).sum(-1)
    return m / 2 if distance == "kl" else m


def cov_distance(p: Gaussian, q: Gaussian, *, distance: str) -> torch.Tensor:
    """The covariance part of ``distance`` between p and q: (B,), or () when both covariances are global.

    "w2" needs the symmetric square root: kinds "sqrt" or "diag" (for "diag", S = diag(std)). Policies of different
    kinds are compared through their Cholesky factors ("kl", "frobenius"). Checks both policies as ``project`` does
    (:func:`troll.gaussian.policy.check_comparable`); a distance the dtype cannot hold (e.g. against a numerically
    singular q) is refused, never returned as NaN or inf.
    """
    check_choice("distance", distance, DISTANCES)
    check_comparable("p", p, "q", q)
    out = cov_part(p, q, distance=distance)
    check_range("p", out.detach(), p.factor.dtype, f"its {distance} distance to q (the covariance part)")
    return out


def cov_part(p: Gaussian, q: Gaussian, *, distance: str) -> torch.Tensor:
    """:func:`cov_distance` without the checks (for callers that checked their policies)."""
    if p.kind == q.kind:
        return factor_distance(p.kind, p.factor, q.factor, distance=distance)
    if distance == "w2":
        raise ValueError(_W2_KINDS.format(kinds=f"{p.kind!r} and {q.kind!r}"))
    return factor_distance("chol", p.cholesky(), q.cholesky(), distance=distance)


def factor_distance(kind: str, fp: torch.Tensor, fq: torch.Tensor, *, distance: str) -> torch.Tensor:
    """The covariance part of ``distance`` from two factors of the same kind, (..., D) or (..., D, D) -> (...)."""
    if kind == "diag":
        if distance == "kl":
            return 0.5 * psi(fp / fq).sum(-1)
        if distance == "frobenius":
            diff = fp * fp - fq * fq
            return (diff * diff).sum(-1)
        diff = fp - fq
        return (diff * diff).sum(-1)
    if distance == "w2":
        if kind != "sqrt":
            raise ValueError(_W2_KINDS.format(kinds=repr(kind)))
        diff = fp - fq
        return (diff * diff).sum((-2, -1))
    if kind == "sqrt":
        fp, fq = sqrt_to_chol(fp), sqrt_to_chol(fq)
    if distance == "kl":
        return kl_from_relative_factor(torch.linalg.solve_triangular(fq, fp, upper=False))
    diff = fp @ fp.mT - fq @ fq.mT
    return (diff * diff).sum((-2, -1))


def factor_distance_grad(kind: str, fp: torch.Tensor, fq: torch.Tensor, *, distance: str) -> torch.Tensor:
    """d factor_distance / d fp, analytically (the float32 rounding margin of the projections needs it).

    kl: diag (b - 1/b) / fq with b = fp / fq; chol Sigma_q^-1 L - diag(1 / L_ii).  frobenius: diag 4 (fp^2 - fq^2) fp;
    chol 4 (L L^T - Sigma_q) L.  w2: 2 (fp - fq).
    """
    if distance == "w2":
        return 2 * (fp - fq)
    if kind == "diag":
        if distance == "kl":
            b = fp / fq
            return (b - 1 / b) / fq
        return 4 * (fp * fp - fq * fq) * fp
    if distance == "kl":
        rel = torch.linalg.solve_triangular(fq, fp, upper=False)
        prec_l = torch.linalg.solve_triangular(fq.mT, rel, upper=True)
        return prec_l - torch.diag_embed(1 / fp.diagonal(dim1=-2, dim2=-1))
    return 4 * (fp @ fp.mT - fq @ fq.mT) @ fp


def sqrt_to_chol(s: torch.Tensor) -> torch.Tensor:
    """The Cholesky factor of S S for a symmetric square root S."""
    return torch.linalg.cholesky(s @ s)


_W2_KINDS = (
    "distance='w2' needs the symmetric square root of the covariance (kind 'sqrt' or 'diag'), got kind {kinds}; "
    "build the policy with Gaussian.from_sqrt(mean, S), or use distance='kl' or 'frobenius'."
)


def total_distance(p: Gaussian, q: Gaussian, *, distance: str) -> torch.Tensor:
    """Mean part + covariance part, per state: (B,). A global covariance part is added to every state. Checks its
    input as :func:`cov_distance` does."""
    check_choice("distance", distance, DISTANCES)
    check_comparable("p", p, "q", q)
    out = mean_part(p.mean, q, distance=distance) + cov_part(p, q, distance=distance)
    check_range("p", out.detach(), p.mean.dtype, f"its {distance} distance to q")
    return out
