"""The Gaussian policy pieces (log-prob, entropy, distances), entropy control and the TRPL loss (docs/gaussian.md)."""

from __future__ import annotations

import math

import pytest
import torch
from _gaussian_cases import CASES, F64, policy_pair
from conftest import gen

import troll.gaussian as tg
from troll.gaussian import reference

KW = {"mean_bound": 0.05, "cov_bound": 0.02}


def torch_mvn(p: tg.Gaussian) -> torch.distributions.MultivariateNormal:
    cov = p.covariance()
    return torch.distributions.MultivariateNormal(p.mean, covariance_matrix=cov.expand(p.mean.shape[0], -1, -1))


@pytest.mark.parametrize("single", [False, True], ids=["per-state", "global"])
@pytest.mark.parametrize("kind", tg.KINDS)
def test_log_prob_and_entropy_match_torch_distributions(kind, single):
    new, _ = policy_pair(kind, states=5, dim=3, g=gen(50), single=single)
    x = torch.randn(5, 3, generator=gen(51), dtype=F64)
    mvn = torch_mvn(new)
    torch.testing.assert_close(new.log_prob(x), mvn.log_prob(x), rtol=1e-12, atol=1e-12)
    entropy = new.entropy()
    assert entropy.shape == (() if single else (5,))
    torch.testing.assert_close(entropy.expand(5), mvn.entropy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_distances_match_the_reference(distance, kind):
    new, old = policy_pair(kind, states=4, dim=3, g=gen(52))
    cov = tg.cov_distance(new, old, distance=distance)
    mats, mats_o = reference.matrix(new, distance), reference.matrix(old, distance)
    fn = reference.kl_cov if distance == "kl" else reference.squared_frobenius
    torch.testing.assert_close(cov, torch.stack([fn(a, b) for a, b in zip(mats, mats_o)]), rtol=1e-10, atol=1e-14)
    prec = torch.linalg.inv(reference.matrix(old, "kl"))
    m = torch.stack([reference.mahalanobis(a, b, p) for a, b, p in zip(new.mean, old.mean, prec)])
    torch.testing.assert_close(tg.mean_distance(new.mean, old, distance=distance), m / 2 if distance == "kl" else m)
    assert (tg.total_distance(new, new, distance=distance).abs() < 1e-28).all()


def manual_loss(new, old, actions, adv, distance, alpha):
    proj = tg.project(new, old, **KW, distance=distance)
    ratio = (proj.policy.log_prob(actions) - old.log_prob(actions)).exp()
    reg = tg.total_distance(new, proj.policy.detach(), distance=distance)
    return -(ratio * adv).mean() + alpha * reg.mean()


@pytest.mark.parametrize("single", [False, True], ids=["per-state", "global"])
@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_trpl_loss_is_surrogate_plus_regression(distance, kind, single):
    g = gen(53)
    new, old = policy_pair(kind, states=8, dim=3, g=g, single=single, spread=(-2.0, 0.3))
    actions = old.mean + torch.randn(8, 3, generator=g, dtype=F64) * 0.3
    adv = torch.randn(8, generator=g, dtype=F64)
    mean, factor = new.mean.clone().requires_grad_(), new.factor.clone().requires_grad_()
    out = tg.trpl_loss(tg.Gaussian(mean, factor, kind), old, actions, adv, **KW, distance=distance, alpha=0.7)
    grads = torch.autograd.grad(out.loss, [mean, factor])
    mean2, factor2 = new.mean.clone().requires_grad_(), new.factor.clone().requires_grad_()
    expected = manual_loss(tg.Gaussian(mean2, factor2, kind), old, actions, adv, distance, 0.7)
    expected_grads = torch.autograd.grad(expected, [mean2, factor2])
    torch.testing.assert_close(out.loss, expected, rtol=1e-12, atol=1e-14)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    m = out.metrics
    assert m["loss/reg"] > 0 and 0 < m["projected_frac/mean"] < 1
    assert m["mean_dist_after/max"] <= KW["mean_bound"] * (1 + 1e-9) < m["mean_dist_before/max"]
    assert m["bound_exceeded_frac"] == 0 and m["eta/max"] > 0
    assert all(v.dim() == 0 and torch.isfinite(v) for v in m.values())


def test_old_log_prob_argument_is_used_as_given():
    g = gen(54)
    new, old = policy_pair("chol", states=6, dim=2, g=g)
    actions, adv = old.mean + 0.1, torch.randn(6, generator=g, dtype=F64)
    computed = tg.trpl_loss(new, old, actions, adv, **KW)
    given = tg.trpl_loss(new, old, actions, adv, **KW, old_log_prob=old.log_prob(actions))
    shifted = tg.trpl_loss(new, old, actions, adv, **KW, old_log_prob=old.log_prob(actions) - math.log(2))
    torch.testing.assert_close(computed.loss, given.loss, rtol=0, atol=0)
    torch.testing.assert_close(shifted.metrics["ratio/mean"], 2 * computed.metrics["ratio/mean"])


@pytest.mark.parametrize(("distance", "kind"), CASES)
def test_regression_is_zero_where_inactive_and_pulls_towards_the_projection(distance, kind):
    new, old = policy_pair(kind, states=6, dim=3, g=gen(55), spread=(-4.0, 0.3))
    mean, factor = new.mean.clone().requires_grad_(), new.factor.clone().requires_grad_()
    policy = tg.Gaussian(mean, factor, kind)
    proj = tg.project(policy, old, **KW, distance=distance)
    reg = tg.regression(policy, proj.policy, distance=distance)
    inside = (proj.omega == 0) & (proj.eta == 0)
    assert inside.any() and (~inside).any()
    assert (reg[inside] == 0).all() and (reg[~inside] > 0).all()
    g_mean, g_factor = torch.autograd.grad(reg.sum(), [mean, factor])
    assert (g_mean[inside] == 0).all() and (g_factor[inside] == 0).all()
    # a small step down the gradient moves pi~ towards pi^ (kept in the kind's form: regression checks it)
    g_factor = g_factor.tril() if kind == "chol" else (g_factor + g_factor.mT) / 2 if kind == "sqrt" else g_factor
    step = tg.Gaussian(new.mean - 1e-3 * g_mean, new.factor - 1e-3 * g_factor, kind)
    after = tg.regression(step, proj.policy, distance=distance)
    assert (after[~inside] < reg[~inside].detach()).all()


@pytest.mark.parametrize("single", [False, True], ids=["per-state", "global"])
@pytest.mark.parametrize("kind", tg.KINDS)
def test_entropy_control_sets_the_bound_exactly(kind, single):
    new, _ = policy_pair(kind, states=5, dim=3, g=gen(56), single=single)
    h = new.entropy()
    bound = float(h.median()) if not single else float(h) + 0.5
    out = tg.control_entropy(new, bound)
    low = h < bound
    torch.testing.assert_close(out.entropy()[low], torch.full_like(h[low], bound), rtol=1e-12, atol=1e-12)
    if low.dim():
        assert torch.equal(out.factor[~low], new.factor[~low]) and low.any() and (~low).any()
    assert torch.equal(out.mean, new.mean) and out.kind == kind
    assert tg.control_entropy(new, -math.inf) is new


def test_entropy_schedules():
    lin = tg.EntropySchedule("linear", initial=2.0, target=-1.0, total_steps=10)
    assert [lin.bound(t) for t in (0, 5, 10, 20)] == [2.0, 0.5, -1.0, -1.0]
    exp = tg.EntropySchedule("exponential", initial=2.0, target=-1.0, total_steps=10, rate=0.01)
    assert exp.bound(0) == 2.0 and math.isclose(exp.bound(10), -1.0 + 3 * 0.01) and exp.bound(20) < exp.bound(10)
    assert tg.EntropySchedule().bound(3) == -math.inf


def test_entropy_bound_in_the_loss_reaches_the_surrogate_and_the_regression():
    g = gen(57)
    new, old = policy_pair("chol", states=4, dim=2, g=g, spread=(-1.0, 0.0))
    actions, adv = old.mean.clone(), torch.randn(4, generator=g, dtype=F64)
    target = float(new.entropy().max()) + 1.0
    out = tg.trpl_loss(new, old, actions, adv, **KW, entropy_bound=target)
    torch.testing.assert_close(out.metrics["entropy/mean"], torch.tensor(target, dtype=F64))
    assert out.metrics["loss/reg"] > tg.trpl_loss(new, old, actions, adv, **KW).metrics["loss/reg"]


def test_a_bound_float32_cannot_hold_is_reported():
    """mu_o = 1024 (float32 spacing 2^-13 there), std 1: with a mean bound of (0.8 spacings)^2 no float32 mean but
    mu_o itself is inside, and rounding the projected mean to nearest picks mu_o + 1 spacing. The metrics say so."""
    ulp = 2.0**-13
    mean_o = torch.full((1, 1), 1024.0)
    old = tg.Gaussian.from_std(mean_o, torch.ones(1, 1))
    new = tg.Gaussian.from_std(mean_o + 64 * ulp, torch.ones(1, 1))
    bound = (0.8 * ulp) ** 2
    out = tg.project(new, old, mean_bound=bound, cov_bound=0.1, distance="frobenius")
    assert out.mean_after > bound * (1 + 1e-6)
    loss = tg.trpl_loss(new, old, mean_o, torch.ones(1), mean_bound=bound, cov_bound=0.1, distance="frobenius")
    assert loss.metrics["bound_exceeded_frac"] == 1
