"""Random Gaussian policies for the troll.gaussian tests: SPD matrices of a chosen condition number, and new/old
pairs whose distance grows along the states, so that a batch mixes rows inside and outside the trust region."""

from __future__ import annotations

import torch

from troll.gaussian import Gaussian
from troll.gaussian.projection import KINDS_FOR

F64 = torch.float64
CASES = [(dist, kind) for dist, kinds in KINDS_FOR.items() for kind in kinds]  # every supported (distance, kind)


def random_spd(n: int, d: int, g: torch.Generator, *, log10_cond: float = 2.0) -> torch.Tensor:
    """(n, d, d) float64 SPD matrices Q diag(e) Q^T, e log-uniform over ``log10_cond`` decades around 1."""
    q, _ = torch.linalg.qr(torch.randn(n, d, d, generator=g, dtype=F64))
    e = 10 ** (log10_cond * (torch.rand(n, d, generator=g, dtype=F64) - 0.5))
    return q @ torch.diag_embed(e) @ q.mT


def sym_sqrt(cov: torch.Tensor) -> torch.Tensor:
    """The symmetric square root of SPD matrices (..., d, d)."""
    e, v = torch.linalg.eigh(cov)
    s = v @ torch.diag_embed(e.sqrt()) @ v.mT
    return (s + s.mT) / 2


def factor_of(cov: torch.Tensor, kind: str) -> torch.Tensor:
    """The factor of kind ``kind`` for covariances (..., d, d) ("diag" keeps only their diagonal)."""
    if kind == "diag":
        return cov.diagonal(dim1=-2, dim2=-1).sqrt()
    return torch.linalg.cholesky(cov) if kind == "chol" else sym_sqrt(cov)


def perturbed(cov_o: torch.Tensor, scale: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Sigma = L_o exp(scale * E) L_o^T, E random symmetric with eigenvalues in about [-1, 1]: SPD, its condition
    number at most e^(2 scale) times the old one's, and about scale^2 d / 8 away in KL."""
    n, d, _ = cov_o.shape
    e = torch.randn(n, d, d, generator=g, dtype=F64)
    lam, v = torch.linalg.eigh((e + e.mT) / (2 * (2 * d) ** 0.5))
    m = v @ torch.diag_embed((scale.reshape(-1, 1) * lam).exp()) @ v.mT
    lo = torch.linalg.cholesky(cov_o)
    cov = lo @ m @ lo.mT
    return (cov + cov.mT) / 2


def policy_pair(
    kind: str,
    *,
    states: int,
    dim: int,
    g: torch.Generator,
    single: bool = False,
    log10_cond: float = 2.0,
    spread: tuple[float, float] = (-3.0, 0.0),
    dtype: torch.dtype = F64,
) -> tuple[Gaussian, Gaussian]:
    """(new, old): old random, new moved away by 10^spread (log-spaced over the states) in mean and covariance.

    ``single``: one global covariance (moved by the largest scale). ``kind`` "diag" uses diagonal covariances.
    """
    rows = 1 if single else states
    cov_o = random_spd(rows, dim, g, log10_cond=log10_cond)
    if kind == "diag":
        cov_o = torch.diag_embed(cov_o.diagonal(dim1=-2, dim2=-1))
    scale = torch.logspace(*spread, steps=states, dtype=F64)
    cov_scale = scale[-1:] if single else scale
    cov = perturbed(cov_o, cov_scale, g)
    if kind == "diag":
        cov = torch.diag_embed(cov.diagonal(dim1=-2, dim2=-1))
    mu_o = torch.randn(states, dim, generator=g, dtype=F64)
    lo = torch.linalg.cholesky(cov_o)
    step = (lo @ torch.randn(states, dim, 1, generator=g, dtype=F64)).squeeze(-1)
    mu = mu_o + scale.unsqueeze(-1) * step
    f, f_o = factor_of(cov, kind), factor_of(cov_o, kind)
    if single:
        f, f_o = f[0], f_o[0]
    return Gaussian(mu.to(dtype), f.to(dtype), kind), Gaussian(mu_o.to(dtype), f_o.to(dtype), kind)
