"""Float64 references for the Gaussian projections, written for clarity rather than speed.

They follow the equations of docs/gaussian.md literally and share nothing with the fast path: covariance matrices
(not factors), explicit inverses and slogdet, the step size eta itself (not s = 1 / (1 + eta)) found by plain
bisection, one row at a time, no closed forms. The tests and the benchmark compare the fast paths against them.
"""

from __future__ import annotations

import torch

from troll.gaussian.policy import Gaussian


def kl_cov(cov: torch.Tensor, cov_o: torch.Tensor, prec_o: torch.Tensor | None = None) -> torch.Tensor:
    """1/2 [tr(Sigma_o^-1 Sigma) - D + log det Sigma_o - log det Sigma] for one pair of (D, D) matrices."""
    d = cov.shape[-1]
    prec_o = torch.linalg.inv(cov_o) if prec_o is None else prec_o
    trace = torch.trace(prec_o @ cov)
    return 0.5 * (trace - d + torch.linalg.slogdet(cov_o)[1] - torch.linalg.slogdet(cov)[1])


def squared_frobenius(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((a - b) ** 2).sum()


def mahalanobis(mu: torch.Tensor, mu_o: torch.Tensor, prec_o: torch.Tensor) -> torch.Tensor:
    """(mu - mu_o)^T Sigma_o^-1 (mu - mu_o), given the old precision Sigma_o^-1."""
    diff = mu - mu_o
    return diff @ prec_o @ diff


def bisect_eta(dist_at, bound: float) -> float:
    """The smallest eta >= 0 with dist_at(eta) <= bound (dist_at falls in eta), to the last bit, by bisection."""
    lo, hi = 0.0, 1.0
    while dist_at(hi) > bound:  # grow the bracket until its upper end is feasible
        lo, hi = hi, 2 * hi
    while True:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            return hi
        if dist_at(mid) > bound:
            lo = mid
        else:
            hi = mid


def project_mean_row(mu, mu_o, cov_o, bound: float, distance: str):
    """(mu^, omega) for one state: mu^ = (mu + omega mu_o) / (1 + omega), the smallest omega within the bound."""
    scale = 0.5 if distance == "kl" else 1.0
    prec_o = torch.linalg.inv(cov_o)

    def at(omega):
        return scale * float(mahalanobis((mu + omega * mu_o) / (1 + omega), mu_o, prec_o))

    if at(0.0) <= bound:
        return mu, 0.0
    omega = bisect_eta(at, bound)
    return (mu + omega * mu_o) / (1 + omega), omega


def interpolate(mat, mat_o, eta: float, distance: str):
    """The family the projection moves along: precisions for "kl", covariances for "frobenius", S for "w2"."""
    if distance == "kl":
        inv = torch.linalg.inv
        return inv((inv(mat) + eta * inv(mat_o)) / (1 + eta))
    return (mat + eta * mat_o) / (1 + eta)


def project_cov_row(mat, mat_o, bound: float, distance: str):
    """(projected matrix, eta) for one covariance (S for "w2"), both (D, D) float64."""
    inv = torch.linalg.inv
    prec, prec_o = inv(mat), inv(mat_o)  # computed once: the bisection below evaluates ~100 steps

    def dist(m):
        return float(kl_cov(m, mat_o, prec_o) if distance == "kl" else squared_frobenius(m, mat_o))

    def at(eta):
        return inv((prec + eta * prec_o) / (1 + eta)) if distance == "kl" else (mat + eta * mat_o) / (1 + eta)

    if dist(mat) <= bound:
        return mat, 0.0
    eta = bisect_eta(lambda e: dist(at(e)), bound)
    return at(eta), eta


def matrix(p: Gaussian, distance: str) -> torch.Tensor:
    """The matrix each distance works on, in float64: the covariance, or for "w2" the square root S."""
    f = p.factor.detach().double()
    if p.kind == "diag":
        f = torch.diag_embed(f)
        return f if distance == "w2" else f @ f
    if p.kind == "sqrt" and distance == "w2":
        return f
    return f @ f.mT


def project(new: Gaussian, old: Gaussian, *, mean_bound: float, cov_bound: float, distance: str = "kl") -> dict:
    """The projection, row by row. Returns float64 tensors: mean (B, D), matrix (the covariance, or S for "w2") and
    cov (the covariance) (B, D, D) or (D, D), omega (B,), eta (B,) or (), mean_before (B,), cov_before."""
    mats, mats_o = matrix(new, distance), matrix(old, distance)
    single = mats.dim() == 2
    if single:
        mats, mats_o = mats.unsqueeze(0), mats_o.unsqueeze(0)
    covs_o = (matrix(old, "kl").unsqueeze(0) if single else matrix(old, "kl")).double()
    mu, mu_o = new.mean.detach().double(), old.mean.detach().double()
    means, omegas, mean_before = [], [], []
    for i in range(mu.shape[0]):
        cov_o = covs_o[0 if single else i]
        m, omega = project_mean_row(mu[i], mu_o[i], cov_o, mean_bound, distance)
        means.append(m)
        omegas.append(omega)
        mean_before.append(
            (0.5 if distance == "kl" else 1.0) * float(mahalanobis(mu[i], mu_o[i], torch.linalg.inv(cov_o)))
        )
    projected, etas, cov_before = [], [], []
    for m, m_o in zip(mats, mats_o):
        p, eta = project_cov_row(m, m_o, cov_bound, distance)
        projected.append(p)
        etas.append(eta)
        cov_before.append(float(kl_cov(m, m_o)) if distance == "kl" else float(squared_frobenius(m, m_o)))
    mat = torch.stack(projected)
    cov = mat @ mat if distance == "w2" else mat
    f64 = dict(dtype=torch.float64)
    out = {
        "mean": torch.stack(means),
        "matrix": mat[0] if single else mat,
        "cov": cov[0] if single else cov,
        "omega": torch.tensor(omegas, **f64),
        "eta": torch.tensor(etas, **f64)[0] if single else torch.tensor(etas, **f64),
        "mean_before": torch.tensor(mean_before, **f64),
        "cov_before": torch.tensor(cov_before, **f64)[0] if single else torch.tensor(cov_before, **f64),
    }
    return out
