"""The Gaussian projections (docs/gaussian.md) against the float64 reference and their own properties.

Tolerances:
- values vs ``troll.gaussian.reference`` in float64: 1e-9 (the KL solve stops within 1e-12 of the bound, the
  reference bisects eta to the last bit; measured gaps ~1e-13);
- feasibility: d_after <= bound * (1 + 1e-6) in float64 (measured: 3e-11 at worst, condition numbers up to 1e6);
- on the bound: |d_after - bound| / bound < 1e-6 for every projected row in float64.
"""

from __future__ import annotations

import pytest
import torch
from _gaussian_cases import CASES, F64, policy_pair
from conftest import gen

import troll.gaussian as tg
from troll.gaussian import kl, reference
from troll.gaussian.distances import factor_distance, mean_distance

EPS_MU, EPS_COV = 0.05, 0.02


def recomputed(proj, old, distance):
    """(mean distance, covariance distance) in float64 from the returned policy, independently of the metrics."""
    p, o = proj.policy.to(F64), old.to(F64)
    return mean_distance(p.mean, o, distance=distance), factor_distance(p.kind, p.factor, o.factor, distance=distance)


@pytest.mark.parametrize("single", [False, True], ids=["per-state", "global"])
@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_matches_reference_fp64(distance, kind, single):
    new, old = policy_pair(kind, states=7, dim=4, g=gen(0), single=single)
    out = tg.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
    ref = reference.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
    mean_on = ref["omega"] > 0
    assert mean_on.any() and (~mean_on).any(), "the case must mix projected and untouched states"
    if not single:
        assert (ref["eta"] > 0).any() and (ref["eta"] == 0).any()
    torch.testing.assert_close(out.policy.mean, ref["mean"], rtol=0, atol=1e-9)
    torch.testing.assert_close(out.policy.covariance(), ref["cov"], rtol=0, atol=1e-9)
    torch.testing.assert_close(out.omega, ref["omega"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.eta, ref["eta"], rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(out.mean_before, ref["mean_before"], rtol=1e-10, atol=0)
    torch.testing.assert_close(out.cov_before, ref["cov_before"], rtol=1e-9, atol=1e-14)  # the reference cancels
    assert out.eta.shape == (() if single else (7,)) and out.policy.factor.shape == new.factor.shape


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_bound_holds_and_projected_rows_land_on_it(distance, kind, dtype):
    new, old = policy_pair(kind, states=16, dim=6, g=gen(1), spread=(-2.0, 0.5), dtype=dtype)
    out = tg.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
    m, c = recomputed(out, old, distance)
    assert (m <= EPS_MU * (1 + 1e-6)).all() and (c <= EPS_COV * (1 + 1e-6)).all(), (m.max(), c.max())
    torch.testing.assert_close(out.mean_after.double(), m, rtol=1e-6, atol=0)
    torch.testing.assert_close(out.cov_after.double(), c, rtol=1e-6, atol=0)
    mean_on, cov_on = out.omega > 0, out.eta > 0
    assert mean_on.sum() >= 4 and cov_on.sum() >= 4
    # float32: the margin that keeps the rounded values inside costs at most 1e-4 of the bound on these inputs
    tol = 1e-6 if dtype == F64 else 1e-4
    assert ((m[mean_on] - EPS_MU).abs() / EPS_MU < tol).all(), m[mean_on] / EPS_MU
    assert ((c[cov_on] - EPS_COV).abs() / EPS_COV < tol).all(), c[cov_on] / EPS_COV


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_identity_inside_the_region(distance, kind, dtype):
    """Rows inside both bounds come back bit for bit, with the identity's gradient."""
    new, old = policy_pair(kind, states=5, dim=3, g=gen(2), spread=(-4.0, -3.0), dtype=dtype)
    mean = new.mean.clone().requires_grad_()
    factor = new.factor.clone().requires_grad_()
    out = tg.project(tg.Gaussian(mean, factor, kind), old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
    assert (out.mean_before <= EPS_MU).all() and (out.cov_before <= EPS_COV).all(), "the case must lie inside"
    assert torch.equal(out.policy.mean, new.mean) and torch.equal(out.policy.factor, new.factor)
    assert (out.omega == 0).all() and (out.eta == 0).all()
    assert torch.equal(out.mean_after, out.mean_before) and torch.equal(out.cov_after, out.cov_before)
    w_mean, w_factor = torch.randn_like(mean), torch.randn_like(factor)
    grads = torch.autograd.grad((out.policy.mean * w_mean).sum() + (out.policy.factor * w_factor).sum(), [mean, factor])
    assert torch.equal(grads[0], w_mean) and torch.equal(grads[1], w_factor)


def test_untouched_rows_keep_their_bits_in_a_mixed_batch():
    new, old = policy_pair("chol", states=12, dim=5, g=gen(3), spread=(-3.0, 0.5), dtype=torch.float32)
    out = tg.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV)
    inside, outside = out.eta == 0, out.eta > 0
    assert inside.any() and outside.any()
    assert torch.equal(out.policy.factor[inside], new.factor[inside])
    assert torch.equal(out.policy.mean[out.omega == 0], new.mean[out.omega == 0])
    assert not torch.equal(out.policy.factor[outside], new.factor[outside])


@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_rows_are_independent_of_the_batch(distance, kind):
    new, old = policy_pair(kind, states=6, dim=4, g=gen(4))
    full = tg.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
    for i in range(6):
        one = tg.Gaussian(new.mean[i : i + 1], new.factor[i : i + 1], kind)
        one_old = tg.Gaussian(old.mean[i : i + 1], old.factor[i : i + 1], kind)
        alone = tg.project(one, one_old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
        torch.testing.assert_close(alone.policy.factor[0], full.policy.factor[i], rtol=0, atol=1e-13)
        torch.testing.assert_close(alone.policy.mean[0], full.policy.mean[i], rtol=0, atol=1e-13)


@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_global_covariance_is_projected_once(distance, kind, monkeypatch):
    """A (D, D) factor stays (D, D), has one eta, and equals the projection of that covariance on its own; the KL
    solve sees one row however many states there are."""
    new, old = policy_pair(kind, states=50, dim=4, g=gen(5), single=True, spread=(-3.0, 0.3))
    rows_solved = []
    real_step, real_single = kl.kl_step, kl.solve_single
    monkeypatch.setattr(kl, "kl_step", lambda lam, t, **kw: rows_solved.append(lam.shape[0]) or real_step(lam, t, **kw))
    monkeypatch.setattr(kl, "solve_single", lambda *a, **kw: rows_solved.append(1) or real_single(*a, **kw))
    out = tg.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
    assert out.policy.factor.shape == new.factor.shape and out.eta.shape == () and out.eta > 0
    assert all(n == 1 for n in rows_solved) and (distance != "kl" or rows_solved)
    one = tg.project(
        tg.Gaussian(new.mean[:1], new.factor, kind),
        tg.Gaussian(old.mean[:1], old.factor, kind),
        mean_bound=EPS_MU,
        cov_bound=EPS_COV,
        distance=distance,
    )
    assert torch.equal(one.policy.factor, out.policy.factor) and torch.equal(one.eta, out.eta)
    assert out.omega.shape == (50,) and (out.omega > 0).any()


def test_diagonal_kl_agrees_with_full_kl_on_diagonal_inputs():
    new, old = policy_pair("diag", states=9, dim=5, g=gen(6), spread=(-2.0, 0.5))
    diag = tg.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV)
    full_new = tg.Gaussian.from_chol(new.mean, torch.diag_embed(new.factor))
    full_old = tg.Gaussian.from_chol(old.mean, torch.diag_embed(old.factor))
    full = tg.project(full_new, full_old, mean_bound=EPS_MU, cov_bound=EPS_COV)
    assert (diag.eta > 0).sum() >= 3
    torch.testing.assert_close(torch.diag_embed(diag.policy.factor), full.policy.factor, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(diag.eta, full.eta, rtol=1e-9, atol=1e-13)
    torch.testing.assert_close(diag.cov_after, full.cov_after, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize(("distance", "kind"), [("kl", "chol"), ("frobenius", "chol"), ("w2", "sqrt")])
def test_projection_is_optimal(distance, kind):
    """KKT, independently of how the solution was found: at the projected covariance X, the gradients of the
    objective d(X, Sigma) and of the constraint d(X, Sigma_o) are anti-parallel with multiplier eta."""
    new, old = policy_pair(kind, states=4, dim=3, g=gen(7), spread=(0.0, 0.5))
    out = tg.project(new, old, mean_bound=EPS_MU, cov_bound=EPS_COV, distance=distance)
    mats = reference.matrix(out.policy, distance)
    for i in range(4):
        x = mats[i].clone().requires_grad_()
        if distance == "kl":
            objective = reference.kl_cov(x, reference.matrix(new, "kl")[i])
            constraint = reference.kl_cov(x, reference.matrix(old, "kl")[i])
        else:
            objective = reference.squared_frobenius(x, reference.matrix(new, distance)[i])
            constraint = reference.squared_frobenius(x, reference.matrix(old, distance)[i])
        (g_obj,) = torch.autograd.grad(objective, x)
        (g_con,) = torch.autograd.grad(constraint, x)
        assert out.eta[i] > 0
        torch.testing.assert_close(g_obj + out.eta[i] * g_con, torch.zeros_like(x), rtol=0, atol=1e-9)
