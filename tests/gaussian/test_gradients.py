"""Gradients of the Gaussian projections, three ways (docs/gaussian.md, "The gradient"): torch.autograd.gradcheck in
float64 on small shapes, agreement with central finite differences of the float64 reference (through the mean, the
factor and eta), and the derivative the KL solve uses against finite differences of the reference distance.

Tolerances: gradcheck at eps 1e-6 with atol 1e-7 / rtol 1e-5 (the KL solve stops within 1e-12 of the bound, so its
noise is ~1e-12 / 1e-6 in a difference quotient); the reference's central differences at h = 1e-6 are good to
~1e-8, compared at 1e-6.
"""

from __future__ import annotations

import math

import pytest
import torch
from _gaussian_cases import CASES, F64, policy_pair
from conftest import gen

import troll.gaussian as tg
from troll.gaussian import reference
from troll.gaussian.distances import x_minus_log1p
from troll.gaussian.kl import kl_step

EPS_MU, EPS_COV = 0.05, 0.02


def legal(factor: torch.Tensor, kind: str) -> torch.Tensor:
    """Map a perturbed factor back to its kind's form (gradcheck perturbs every entry)."""
    if kind == "chol":
        return factor.tril()
    if kind == "sqrt":
        return (factor + factor.mT) / 2
    return factor


def outputs(mean, factor, old, kind, distance):
    out = tg.project(
        tg.Gaussian(mean, legal(factor, kind), kind), old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance
    )
    return out.policy.mean, out.policy.factor, out.eta, out.omega


@pytest.mark.parametrize("single", [False, True], ids=["per-state", "global"])
@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_gradcheck_fp64(distance, kind, single):
    new, old = policy_pair(kind, states=4, dim=3, g=gen(20), single=single, spread=(-2.0, 0.0))
    out = tg.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
    assert (out.omega > 0).any() and (out.omega == 0).any() and (out.eta > 0).any()

    def fn(mean, factor):
        return outputs(mean, factor, old, kind, distance)

    inputs = (new.mean.clone().requires_grad_(), new.factor.clone().requires_grad_())
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def reference_outputs(new: tg.Gaussian, old: tg.Gaussian, distance: str):
    """(mean^, factor^, eta, omega) of the reference, the factor in ``new``'s kind (a Cholesky of its covariance)."""
    ref = reference.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
    if new.kind == "diag":
        mat = (
            ref["cov"].diagonal(dim1=-2, dim2=-1).sqrt()
            if distance != "w2"
            else ref["matrix"].diagonal(dim1=-2, dim2=-1)
        )
    elif new.kind == "sqrt":
        mat = ref["matrix"]
    else:
        mat = torch.linalg.cholesky(ref["cov"])
    return ref["mean"], mat, ref["eta"], ref["omega"]


def central_diff(fn, x: torch.Tensor, where: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    grad = torch.zeros_like(x)
    for idx in where.nonzero().tolist():
        step = torch.zeros_like(x)
        step[tuple(idx)] = h
        grad[tuple(idx)] = (fn(x + step) - fn(x - step)) / (2 * h)
    return grad


@pytest.mark.parametrize("single", [False, True], ids=["per-state", "global"])
@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_gradient_matches_finite_differences_of_reference(distance, kind, single):
    g = gen(21)
    new, old = policy_pair(kind, states=2, dim=3, g=g, single=single, spread=(-0.7, 0.0))
    ws = [torch.randn(t.shape, generator=g, dtype=F64) for t in reference_outputs(new, old, distance)]

    def scalar(outs):
        return sum((w * o).sum() for w, o in zip(ws, outs))

    mean, factor = new.mean.clone().requires_grad_(), new.factor.clone().requires_grad_()
    grads = torch.autograd.grad(scalar(outputs(mean, factor, old, kind, distance)), [mean, factor])
    fd_mean = central_diff(
        lambda m: scalar(reference_outputs(tg.Gaussian(m, new.factor, kind), old, distance)),
        new.mean,
        torch.ones_like(new.mean, dtype=torch.bool),
    )
    free = torch.ones_like(new.factor, dtype=torch.bool)
    if kind == "chol":
        free = free.tril()
    fd_factor = central_diff(
        lambda f: scalar(reference_outputs(tg.Gaussian(new.mean, legal(f, kind), kind), old, distance)),
        new.factor,
        free,
    )
    if kind == "sqrt":  # a symmetric perturbation of entry (i, j) moves both (i, j) and (j, i) by half
        grads = (grads[0], (grads[1] + grads[1].mT) / 2)
    torch.testing.assert_close(grads[0], fd_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.where(free, grads[1], 0.0), fd_factor, rtol=1e-6, atol=1e-6)


def test_implicit_gradient_is_not_the_constant_eta_one():
    """Treating eta as a constant drops a term: the implicit gradient must differ from that by a visible amount."""
    new, old = policy_pair("chol", states=1, dim=3, g=gen(22), spread=(0.0, 0.0))
    factor = new.factor.clone().requires_grad_()
    out = tg.project(tg.Gaussian(new.mean, factor, "chol"), old, mean_bound=EPS_MU, cov_bound=EPS_COV)
    w = torch.randn(factor.shape, generator=gen(23), dtype=F64)
    (grad,) = torch.autograd.grad((out.policy.factor * w).sum(), factor)
    eta = out.eta.detach()
    y = new.factor.clone().requires_grad_()
    prec = torch.linalg.inv(y @ y.mT)
    cov = torch.linalg.inv((prec + eta * torch.linalg.inv(old.covariance())) / (1 + eta))
    (fixed,) = torch.autograd.grad((torch.linalg.cholesky(cov) * w).sum(), y)
    assert (grad - fixed).abs().max() > 1e-3 * grad.abs().max()


@pytest.mark.parametrize("log10_cond", [0.5, 3.0, 6.0])
def test_kl_step_function_and_slope_match_the_reference(log10_cond):
    """d(v) from the eigenvalues equals the reference KL of the interpolated covariance, and dd/dv = 1/2 sum y^2 equals
    its central difference (the derivative the Newton solve relies on)."""
    new, old = policy_pair("chol", states=1, dim=5, g=gen(24), log10_cond=log10_cond, spread=(0.3, 0.3))
    cov, cov_o = new.covariance()[0], old.covariance()[0]
    a = torch.linalg.solve_triangular(new.factor[0], old.factor[0], upper=False)
    lam = torch.linalg.eigvalsh(a.mT @ a)

    def d_of(v):
        t = math.exp(v) * (lam - 1)
        y = -t / (1 + t)
        return 0.5 * x_minus_log1p(y).sum(), 0.5 * y.square().sum()

    for v in (-3.0, -1.0, -0.2):
        eta = math.exp(-v) - 1
        d, slope = d_of(v)
        ref = reference.kl_cov(reference.interpolate(cov, cov_o, eta, "kl"), cov_o)
        torch.testing.assert_close(d, ref, rtol=1e-8, atol=1e-12)
        h = 1e-5
        fd = (d_of(v + h)[0] - d_of(v - h)[0]) / (2 * h)
        torch.testing.assert_close(slope, fd, rtol=1e-6, atol=1e-12)
    s = kl_step(lam.unsqueeze(0), torch.tensor([0.01], dtype=F64))
    eta = float(1 / s - 1)
    got = reference.kl_cov(reference.interpolate(cov, cov_o, eta, "kl"), cov_o)
    assert abs(float(got) / 0.01 - 1) < 1e-9


def test_gradients_are_finite_for_extreme_inputs():
    """Condition number 1e6, a bound of 1e-6 and a far-away new policy (eta ~ 1e5): no NaN or inf anywhere."""
    new, old = policy_pair("chol", states=3, dim=8, g=gen(25), log10_cond=6.0, spread=(0.0, 0.5))
    mean, factor = new.mean.clone().requires_grad_(), new.factor.clone().requires_grad_()
    out = tg.project(tg.Gaussian(mean, factor, "chol"), old, mean_bound=1e-6, cov_bound=1e-6)
    assert (out.eta > 1e2).all()
    loss = out.policy.mean.sum() + out.policy.factor.sum() + out.eta.sum() + out.policy.log_det().sum()
    grads = torch.autograd.grad(loss, [mean, factor])
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_factor_distance_gradient_matches_autograd(distance, kind):
    """The analytic gradient that the float32 rounding margin uses."""
    from troll.gaussian.distances import factor_distance, factor_distance_grad

    new, old = policy_pair(kind, states=4, dim=3, g=gen(26))
    y = new.factor.clone().requires_grad_()
    (auto,) = torch.autograd.grad(factor_distance(kind, y, old.factor, distance=distance).sum(), y)
    got = factor_distance_grad(kind, new.factor, old.factor, distance=distance)
    if kind == "chol":
        got, auto = got.tril(), auto.tril()
    torch.testing.assert_close(got, auto, rtol=1e-10, atol=1e-12)
