"""Property tests (hypothesis) of the Gaussian projections: random SPD matrices of dimension 1 to 63 (TCE's largest
is 7 DoF x 9), condition numbers up to 1e6, bounds log-uniform in [1e-6, 10], float64 and float32, a new policy near
the old one or unrelated to it, per-state or global covariance.

Every projected distance, recomputed in float64 from the returned values, is within its bound (1e-6 relative in
float64; in float32 too, thanks to the rounding margin); rows inside are returned bit for bit; projected rows land on
the bound (1e-6 relative in float64); values and gradients are finite. Budget: a few seconds.
"""

from __future__ import annotations

import torch
from _gaussian_cases import CASES, F64, factor_of, perturbed, random_spd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import troll.gaussian as tg
from troll.gaussian.distances import factor_distance, mean_distance

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BOUND_RTOL = 1e-6


@st.composite
def problems(draw):
    """(new, old, mean_bound, cov_bound, distance): float64 or float32 policies of a supported (distance, kind)."""
    distance, kind = draw(st.sampled_from(CASES))
    dim, states = draw(st.integers(1, 63)), draw(st.integers(1, 3))
    single = draw(st.booleans())
    log10_cond = draw(st.floats(0.0, 6.0))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    rows = 1 if single else states
    cov_o = random_spd(rows, dim, g, log10_cond=log10_cond)
    if draw(st.booleans()):  # near the old policy, at a distance from tiny to large
        scale = 10 ** torch.empty(rows, dtype=F64).uniform_(-4.0, 0.5, generator=g)
        cov = perturbed(cov_o, scale, g)
    else:  # unrelated to it
        cov = random_spd(rows, dim, g, log10_cond=log10_cond)
    if kind == "diag":
        cov, cov_o = (torch.diag_embed(c.diagonal(dim1=-2, dim2=-1)) for c in (cov, cov_o))
    mu_o = torch.randn(states, dim, generator=g, dtype=F64) * 10 ** draw(st.floats(-2.0, 1.0))
    step = (torch.linalg.cholesky(cov_o) @ torch.randn(states, dim, 1, generator=g, dtype=F64)).squeeze(-1)
    mu = mu_o + 10 ** draw(st.floats(-4.0, 1.0)) * step
    f, f_o = factor_of(cov, kind), factor_of(cov_o, kind)
    if single:
        f, f_o = f[0], f_o[0]
    dtype = draw(st.sampled_from([F64, torch.float32]))
    new, old = tg.Gaussian(mu.to(dtype), f.to(dtype), kind), tg.Gaussian(mu_o.to(dtype), f_o.to(dtype), kind)
    mean_bound, cov_bound = (10 ** draw(st.floats(-6.0, 1.0)) for _ in range(2))
    return new, old, mean_bound, cov_bound, distance


@SETTINGS
@given(problems())
def test_bound_holds_identity_inside_on_the_bound_outside(problem):
    new, old, mean_bound, cov_bound, distance = problem
    mean, factor = new.mean.clone().requires_grad_(), new.factor.clone().requires_grad_()
    out = tg.project(
        tg.Gaussian(mean, factor, new.kind), old, mean_bound=mean_bound, cov_bound=cov_bound, distance=distance
    )
    p, o = out.policy.to(F64), old.to(F64)
    assert torch.isfinite(p.mean).all() and torch.isfinite(p.factor).all()
    m = mean_distance(p.mean.detach(), o, distance=distance)
    c = factor_distance(p.kind, p.factor.detach(), o.factor, distance=distance)
    assert (m <= mean_bound * (1 + BOUND_RTOL)).all(), (m.max() / mean_bound, new.mean.dtype)
    assert (c <= cov_bound * (1 + BOUND_RTOL)).all(), (c.max() / cov_bound, new.mean.dtype)
    # inside: the input's very values; outside: on the bound (float64; float32 aims a margin inside)
    mean_on, cov_on = out.omega > 0, out.eta > 0
    assert torch.equal(mean_on, out.mean_before > mean_bound) and torch.equal(cov_on, out.cov_before > cov_bound)
    assert torch.equal(out.policy.mean[~mean_on], new.mean[~mean_on])
    untouched = out.policy.factor[~cov_on] if cov_on.dim() else (out.policy.factor if not cov_on else None)
    if untouched is not None:
        assert torch.equal(untouched, new.factor[~cov_on] if cov_on.dim() else new.factor)
    if new.mean.dtype == F64:
        assert ((m[mean_on] / mean_bound - 1).abs() < BOUND_RTOL).all(), m[mean_on] / mean_bound
        assert ((c[cov_on] / cov_bound - 1).abs() < BOUND_RTOL).all(), c[cov_on] / cov_bound
    loss = out.policy.mean.sum() + out.policy.log_det().sum() + out.eta.sum() + out.omega.sum()
    grads = torch.autograd.grad(loss, [mean, factor])
    assert all(torch.isfinite(g).all() for g in grads)


@SETTINGS
@given(problems(), st.integers(0, 2**31 - 1))
def test_loss_and_gradient_are_finite(problem, seed):
    new, old, mean_bound, cov_bound, distance = problem
    g = torch.Generator().manual_seed(seed)
    mean, factor = new.mean.clone().requires_grad_(), new.factor.clone().requires_grad_()
    z = torch.randn(old.mean.shape, generator=g, dtype=F64).to(old.mean.dtype)
    actions = old.mean + (old.cholesky() @ z.unsqueeze(-1)).squeeze(-1)  # sampled from the old policy
    advantages = torch.randn(old.mean.shape[0], generator=g, dtype=F64).to(old.mean.dtype)
    out = tg.trpl_loss(
        tg.Gaussian(mean, factor, new.kind),
        old,
        actions,
        advantages,
        mean_bound=mean_bound,
        cov_bound=cov_bound,
        distance=distance,
    )
    grads = torch.autograd.grad(out.loss, [mean, factor])
    assert torch.isfinite(out.loss) and all(torch.isfinite(g).all() for g in grads)
    assert all(torch.isfinite(v) for v in out.metrics.values()), out.metrics
    assert out.metrics["bound_exceeded_frac"] == 0
