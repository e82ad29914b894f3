"""ProDMP (troll.episodic.prodmp) against an independent float64 RK4 integration of the DMP and its own properties.

The reference below re-implements the documented basis and integrates the ODE
``tau^2 y'' = alpha (beta (g - y) - tau y') + f(x)`` directly from (y0, v0), so it shares no formula with the
closed-form solution (not c1/c2, not the variation-of-parameters integrals).

Tolerances:
- vs RK4 (step dt / 80, error ~5e-11 at alpha 25, 1e-12 otherwise; dt / 160 gave 3e-12 and less): 1e-10 of the
  motion's scale at the default resolution;
- a single weight column (positions and velocities) vs scipy's adaptive quad in float64 at rtol 1e-13: 1e-12 of
  its peak;
- initial conditions: exact (torch.equal) in float32 and float64, on the step grid and at t = 0 given as a time;
- Monte Carlo: every entry within 5 standard errors (mean: sqrt(S_ii / n); covariance: sqrt((S_ij^2 + S_ii S_jj) / n)).
"""

from __future__ import annotations

import math

import pytest
import torch

from troll.episodic.prodmp import ProDMP, gather_times

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def start(g: torch.Generator, episodes: int, dof: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(episodes, dof, generator=g, dtype=F64), torch.randn(episodes, dof, generator=g, dtype=F64)


def random_factor(g: torch.Generator, *lead: int, p: int) -> torch.Tensor:
    """A lower-triangular factor with a positive diagonal, (*lead, P, P)."""
    low = torch.randn(*lead, p, p, generator=g, dtype=F64).tril(-1) * 0.3
    return low + torch.diag_embed(0.2 + torch.rand(*lead, p, generator=g, dtype=F64))


def reference_layout(mp: ProDMP) -> tuple[torch.Tensor, torch.Tensor]:
    """Centres (N,) and widths (N,) of the documented basis."""
    n = mp.num_basis
    centres = torch.exp(-mp.alpha_x * torch.linspace(0, mp.tau, n, dtype=F64) / mp.tau)
    gaps = (centres[:-1] - centres[1:]).abs() if n > 1 else torch.ones(1, dtype=F64)
    widths = torch.cat([gaps, gaps[-1:]]).pow(-2) * (mp.basis_bandwidth / 2) if n > 1 else gaps
    return centres, widths


def rk4_reference(mp: ProDMP, theta, y0, v0, *, per_step: int = 40, scales=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and velocities (E, T + 1, D) at the step times by classical RK4 on (y, y'), ``per_step`` RK steps
    per env step. Basis: centres x(t_i), t_i equally spaced over [0, tau], h_i = (b / 2) / gap_i^2 (module docs).
    ``scales`` (N + 1,): per-column factors of an auto-scaled basis (ones otherwise)."""
    n, d, tau, alpha = mp.num_basis, mp.num_dof, mp.tau, mp.alpha
    beta = alpha / 4
    centres, widths = reference_layout(mp)
    blocks = theta.reshape(-1, d, n + 1) * (torch.ones(n + 1, dtype=F64) if scales is None else scales)
    w, goal = blocks[..., :n] * mp.weights_scale, blocks[..., n] * mp.goal_scale
    if mp.relative_goal:
        goal = goal + y0
    h = mp.dt / per_step
    steps = mp.num_steps * per_step
    t = torch.arange(2 * steps + 1, dtype=F64) * (h / 2)  # the nodes and midpoints RK4 evaluates at
    x = torch.exp(-mp.alpha_x * t / tau).unsqueeze(-1)
    phi = torch.exp(-widths * (x - centres) ** 2)
    psi = phi / phi.sum(-1, keepdim=True)
    forcing = torch.einsum("ti,edi->ted", x * psi, w)  # f(x(t)), (2 steps + 1, E, D)

    def accel(i, y, v):  # y'' from the ODE at half-step node i
        return (alpha * (beta * (goal - y) - tau * v) + forcing[i]) / tau**2

    y, v = y0.clone(), v0.clone()
    ys, vs = [y], [v]
    for k in range(steps):
        i = 2 * k
        k1y, k1v = v, accel(i, y, v)
        k2y, k2v = v + h / 2 * k1v, accel(i + 1, y + h / 2 * k1y, v + h / 2 * k1v)
        k3y, k3v = v + h / 2 * k2v, accel(i + 1, y + h / 2 * k2y, v + h / 2 * k2v)
        k4y, k4v = v + h * k3v, accel(i + 2, y + h * k3y, v + h * k3v)
        y = y + h / 6 * (k1y + 2 * k2y + 2 * k3y + k4y)
        v = v + h / 6 * (k1v + 2 * k2v + 2 * k3v + k4v)
        if (k + 1) % per_step == 0:
            ys.append(y)
            vs.append(v)
    return torch.stack(ys, 1), torch.stack(vs, 1)


def rel_error(got: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> float:
    """Largest error over positions and velocities, each relative to its own largest magnitude."""
    return max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, ref))


# ----------------------------------------------------------------------------------------------- the ODE


@pytest.mark.parametrize(
    ("kwargs", "seed"),
    [
        ({}, 0),
        ({"num_basis": 3, "alpha": 25.0, "alpha_x": 2.0, "weights_scale": 0.3, "goal_scale": 0.5}, 1),
        ({"relative_goal": True, "tau": 1.5, "num_basis": 5}, 2),
        ({"num_basis": 1}, 3),
        ({"tau": 1.6, "basis_bandwidth": 5.0, "relative_goal": True}, 4),  # TCE's Meta-World layout
    ],
)
def test_matches_rk4_at_any_resolution(kwargs, seed):
    g = gen(seed)
    shape = {"num_dof": 2, "duration": 2.0, "num_steps": 25}
    mp = ProDMP(**shape, **kwargs)
    theta = torch.randn(3, mp.num_params, generator=g, dtype=F64) * 20  # forcing comparable to alpha beta (g - y)
    y0, v0 = start(g, 3, 2)
    ref = rk4_reference(mp, theta, y0, v0, per_step=80)
    assert rel_error(mp.trajectory(theta, y0, v0), ref) < 1e-10


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # quad at rtol 1e-13 warns of rounding
@pytest.mark.parametrize("kwargs", [{}, {"tau": 5.0, "basis_bandwidth": 5.0}])
def test_weight_column_matches_an_independent_float64_integral(kwargs):
    """Each weight column alone (unit weight, scale 1) at every 25th step of a Meta-World episode, positions and
    velocities, against scipy's adaptive quad of y_p(t) = int_0^t (t - s) e^(lam (t - s)) r(s) ds and of its
    derivative int_0^t (1 + lam (t - s)) e^(lam (t - s)) r(s) ds: within 1e-12 of the column's peak."""
    quad = pytest.importorskip("scipy.integrate").quad
    mp = ProDMP(num_dof=1, duration=6.25, num_steps=500, **kwargs)
    pos, vel = mp.basis()
    centres, widths = (x.tolist() for x in reference_layout(mp))
    lam, tau, ax = mp.lam, mp.tau, mp.alpha_x
    for i in range(mp.num_basis):

        def r(s, i=i):
            x = math.exp(-ax * s / tau)
            phi = [math.exp(-h * (x - c) ** 2) for c, h in zip(centres, widths)]
            return x * phi[i] / sum(phi) / tau**2

        for got, velocity in ((pos[::25, i], 0.0), (vel[::25, i], 1.0)):

            def integrand(s, t, velocity=velocity, r=r):  # (t - s) e^(lam (t - s)) r(s), or its t-derivative
                u = t - s
                return ((1 + lam * u) if velocity else u) * math.exp(lam * u) * r(s)

            ref = [
                quad(integrand, 0.0, t, args=(t,), epsabs=0.0, epsrel=1e-13, limit=200)[0]
                for t in mp.times[::25].tolist()
            ]
            ref = torch.tensor(ref, dtype=F64)
            assert float((got - ref).abs().max() / ref.abs().max()) < 1e-12, (i, kwargs)


def test_auto_scaled_basis_peaks_at_one_and_matches_rk4():
    shape = {"num_dof": 2, "duration": 6.25, "num_steps": 50, "tau": 5.0, "basis_bandwidth": 5.0}
    mp = ProDMP(**shape, auto_scale=True, weights_scale=0.1, goal_scale=0.1)
    fine_shape = {**shape, "num_steps": 10_000}  # its step grid is the fine grid the peaks are taken on
    fine, plain = ProDMP(**fine_shape, auto_scale=True), ProDMP(**fine_shape)
    torch.testing.assert_close(
        fine.basis()[0].abs().amax(0), torch.ones(mp.num_basis + 1, dtype=F64), rtol=1e-14, atol=0
    )
    # the 50-step grid samples that fine grid: within 1 % below 0.1 (the scales), never above
    peaks = mp.basis()[0].abs().amax(0)
    assert bool((peaks <= 0.1 * (1 + 1e-12)).all()) and bool((peaks > 0.1 * (1 - 1e-2)).all())
    # by hand: the goal column peaks at the end, G(T) = 1 - (1 - lam T) e^(lam T)
    lam, t_end = -plain.alpha / (2 * 5.0), 6.25
    goal_peak = 1 - (1 - lam * t_end) * math.exp(lam * t_end)
    assert abs(float(plain.basis()[0][:, -1].abs().max()) - goal_peak) < 1e-15
    # the motion is the unscaled one with every column divided by its peak (RK4 on the rescaled parameters)
    scales = 1 / plain.basis()[0].abs().amax(0)
    g = gen(9)
    theta = torch.randn(2, mp.num_params, generator=g, dtype=F64)
    y0, v0 = start(g, 2, 2)
    ref = rk4_reference(mp, theta, y0, v0, scales=scales, per_step=10)
    assert rel_error(mp.trajectory(theta, y0, v0), ref) < 1e-7  # RK4 at dt / 10: ~1e-9


def test_initial_conditions_are_exact():
    g = gen(4)
    for relative_goal in (False, True):
        mp = ProDMP(num_dof=3, duration=1.0, num_steps=10, relative_goal=relative_goal, goal_scale=0.3)
        for dtype in (torch.float32, F64):
            theta = (torch.randn(4, mp.num_params, generator=g, dtype=F64) * 50).to(dtype)
            y0, v0 = (x.to(dtype) for x in start(g, 4, 3))
            for times in (None, torch.tensor([0.0, 0.37], dtype=F64)):
                pos, vel = mp.trajectory(theta, y0, v0, times)
                assert pos.dtype == dtype
                assert torch.equal(pos[:, 0], y0) and torch.equal(vel[:, 0], v0)


def test_float32_step_times_match_the_step_grid():
    """Times computed as k * dt in float32 (rounded up to ~1e-7 past the duration) give the step-grid motion."""
    g = gen(14)
    mp = ProDMP(num_dof=2, duration=5.0, num_steps=500)
    theta = torch.randn(2, mp.num_params, generator=g, dtype=F64)
    y0, v0 = start(g, 2, 2)
    times = torch.arange(501, dtype=torch.float32) * torch.tensor(mp.dt, dtype=torch.float32)
    for got, ref in zip(mp.trajectory(theta, y0, v0, times), mp.trajectory(theta, y0, v0)):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5 * float(ref.abs().max()))


def test_linear_in_theta_and_linear_map_agrees():
    g = gen(5)
    mp = ProDMP(num_dof=3, duration=1.5, num_steps=30, num_basis=4, weights_scale=0.5, relative_goal=True)
    t1, t2 = torch.randn(2, 2, mp.num_params, generator=g, dtype=F64)
    y0, v0 = start(g, 2, 3)
    zero = torch.zeros_like(t1)
    for times in (None, torch.rand(7, generator=g, dtype=F64) * 1.5):
        base = mp.trajectory(zero, y0, v0, times)
        one, two = mp.trajectory(t1, y0, v0, times), mp.trajectory(t2, y0, v0, times)
        both = mp.trajectory(0.7 * t1 - 2.0 * t2, y0, v0, times)
        for b, x, y, z in zip(base, one, two, both):
            torch.testing.assert_close(z - b, 0.7 * (x - b) - 2.0 * (y - b), rtol=1e-12, atol=1e-12)
        for velocity, traj in ((False, one[0]), (True, one[1])):
            matrix, offset = mp.linear_map(y0, v0, times, velocity=velocity)
            assert matrix.shape == (traj.shape[1] * 3, mp.num_params) and offset.shape == (2, traj.shape[1] * 3)
            torch.testing.assert_close(t1 @ matrix.T + offset, traj.reshape(2, -1), rtol=1e-12, atol=1e-12)


def test_block_structure_and_basis():
    """H is the per-DoF basis repeated block-diagonally; parameter d (N + 1) + j moves only DoF d."""
    mp = ProDMP(num_dof=2, duration=1.0, num_steps=5, num_basis=3)
    pos, _ = mp.basis()
    matrix, _ = mp.linear_map(torch.zeros(1, 2, dtype=F64), torch.zeros(1, 2, dtype=F64))
    blocks = matrix.reshape(6, 2, 2, 4)  # (time, DoF, DoF', basis)
    torch.testing.assert_close(blocks[:, 0, 0], pos, rtol=0, atol=0)
    torch.testing.assert_close(blocks[:, 1, 1], pos, rtol=0, atol=0)
    assert not blocks[:, 0, 1].any() and not blocks[:, 1, 0].any()


def test_goal_attracts_the_end():
    """With the duration many time constants long the motion settles at the goal, whatever w, y0 and v0."""
    g = gen(6)
    theta = torch.randn(3, 2 * 9, generator=g, dtype=F64) * 10
    y0, v0 = start(g, 3, 2)
    goal = theta.reshape(3, 2, 9)[..., -1]
    for relative_goal in (False, True):
        mp = ProDMP(num_dof=2, duration=10.0, num_steps=100, tau=1.0, goal_scale=0.5, relative_goal=relative_goal)
        pos, vel = mp.trajectory(theta, y0, v0)
        target = 0.5 * goal + (y0 if relative_goal else 0)
        torch.testing.assert_close(pos[:, -1], target, rtol=0, atol=1e-8)
        assert vel[:, -1].abs().max() < 1e-8


def test_velocity_is_the_derivative_of_position():
    g = gen(7)
    mp = ProDMP(num_dof=2, duration=3.0, num_steps=40, num_basis=6)
    theta = torch.randn(2, mp.num_params, generator=g, dtype=F64) * 10
    y0, v0 = start(g, 2, 2)
    times = 0.01 + torch.rand(9, generator=g, dtype=F64) * 2.98
    step = 1e-5
    plus, _ = mp.trajectory(theta, y0, v0, times + step)
    minus, _ = mp.trajectory(theta, y0, v0, times - step)
    pos, vel = mp.trajectory(theta, y0, v0, times)
    torch.testing.assert_close((plus - minus) / (2 * step), vel, rtol=0, atol=1e-7 * float(vel.abs().max()))
    # between grid points the partial interval keeps the motion continuous: off-grid times vs the step grid
    grid_pos, _ = mp.trajectory(theta, y0, v0)
    near, _ = mp.trajectory(theta, y0, v0, mp.times[1:-1] + 1e-9)
    torch.testing.assert_close(near, grid_pos[:, 1:-1], rtol=0, atol=1e-7)


# ----------------------------------------------------------------------------------------------- the Gaussian


def test_pair_marginals_match_monte_carlo():
    g = gen(8)
    mp = ProDMP(num_dof=3, duration=1.0, num_steps=20, num_basis=4, weights_scale=0.5)
    e, p, samples = 2, mp.num_params, 40_000
    mu = torch.randn(e, p, generator=g, dtype=F64)
    factor = random_factor(g, p=p)
    y0, v0 = start(g, e, 3)
    index = torch.tensor([[[1, 5], [5, 9], [17, 20]], [[0, 4], [4, 8], [12, 16]]])
    out = mp.marginals(mu, y0, v0, index, scale_tril=factor)
    assert out.mean.shape == (e, 3, 6) and out.cov.shape == out.scale_tril.shape == (e, 3, 6, 6)
    theta = mu.unsqueeze(1) + torch.randn(e, samples, p, generator=g, dtype=F64) @ factor.T
    pos, _ = mp.trajectory(theta.reshape(-1, p), y0.repeat_interleave(samples, 0), v0.repeat_interleave(samples, 0))
    draws = gather_times(pos, index.repeat_interleave(samples, 0)).reshape(e, samples, 3, 6)
    mean = draws.mean(1)
    centred = draws - mean.unsqueeze(1)
    cov = torch.einsum("eski,eskj->ekij", centred, centred) / (samples - 1)
    var = out.cov.diagonal(dim1=-2, dim2=-1)
    assert ((mean - out.mean).abs() <= 5 * (var / samples).sqrt() + 1e-12).all()
    se = ((out.cov.square() + var.unsqueeze(-1) * var.unsqueeze(-2)) / samples).sqrt()
    assert ((cov - out.cov).abs() <= 5 * se + 1e-12).all()
    # index 0 is y0 for every theta: that block of the covariance is exactly 0 and the mean exactly y0
    assert torch.equal(out.mean[1, 0, :3], y0[1]) and not out.cov[1, 0, :3].any()


def test_marginals_inputs_agree():
    """scale_tril and cov inputs, shared and per-episode Sigma, (K, m) and (E, K, m) index, and moments() agree."""
    g = gen(9)
    mp = ProDMP(num_dof=2, duration=2.0, num_steps=10, num_basis=3)
    e, p = 3, mp.num_params
    mu = torch.randn(e, p, generator=g, dtype=F64)
    factor = random_factor(g, p=p)
    y0, v0 = start(g, e, 2)
    index = torch.tensor([[2, 3], [3, 4], [9, 10]])
    ref = mp.marginals(mu, y0, v0, index, scale_tril=factor, jitter=1e-6)
    for kwargs in ({"cov": factor @ factor.T}, {"scale_tril": factor.expand(e, p, p)}, {"cov": factor @ factor.T}):
        out = mp.marginals(mu, y0, v0, index.expand(e, 3, 2), jitter=1e-6, **kwargs)
        for a, b in zip(out, ref):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    cov = ref.cov + torch.diag_embed(1e-6 * ref.cov.diagonal(dim1=-2, dim2=-1))
    torch.testing.assert_close(ref.scale_tril @ ref.scale_tril.mT, cov, rtol=1e-12, atol=1e-14)
    times = mp.times[index[1]]
    mean, full = mp.moments(mu, y0, v0, times, cov=factor @ factor.T)
    matrix, offset = mp.linear_map(y0, v0, times)
    torch.testing.assert_close(mean, mu @ matrix.T + offset, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(full, (matrix @ factor @ factor.T @ matrix.T).expand(e, 4, 4), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean, ref.mean[:, 1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(full, ref.cov[:, 1], rtol=1e-12, atol=1e-12)


def test_float32_follows_the_input_dtype():
    g = gen(10)
    mp = ProDMP(num_dof=4, duration=5.0, num_steps=100)
    mu = torch.randn(2, mp.num_params, generator=g, dtype=F64)
    factor = random_factor(g, p=mp.num_params) * 0.1
    y0, v0 = start(g, 2, 4)
    index = torch.tensor([[10, 14], [14, 18]])
    ref = mp.marginals(mu, y0, v0, index, scale_tril=factor, jitter=1e-6)
    out = mp.marginals(mu.float(), y0.float(), v0.float(), index, scale_tril=factor.float())  # jitter 1e-6
    assert all(x.dtype == torch.float32 for x in out)
    for a, b in ((out.mean, ref.mean), (out.cov, ref.cov), (out.scale_tril @ out.scale_tril.mT, ref.cov)):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-5 * float(b.abs().max()))
    pos, vel = mp.trajectory(mu.float(), y0.float(), v0.float(), torch.tensor([0.5, 2.0]))
    assert pos.dtype == vel.dtype == torch.float32


def exact_log_likelihood(value, mean, cov):
    """log N(value; mean, cov) by a float64 solve against cov itself, no jitter."""
    r = (value - mean).unsqueeze(-1)
    quad = (r.mT @ torch.linalg.solve(cov, r)).squeeze((-1, -2))
    return -0.5 * (quad + torch.linalg.slogdet(2 * math.pi * cov).logabsdet)


def test_default_jitter_keeps_the_log_likelihood():
    """TCE-like pairs (500 steps, pairs 20 steps apart, early and late) are nearly singular: their correlation
    matrices have eigenvalues down to ~1e-8, and an early time's variance is ~1e-12 of a late one's. The default
    relative jitter (1e-12 of each variance) leaves the float64 log-likelihood within 1e-3 of the exact one; a jitter
    of 1e-6 of the mean variance (the spec's example) moved it by up to 10 nats."""
    g = gen(12)
    mp = ProDMP(num_dof=3, duration=5.0, num_steps=500)
    e, p = 4, mp.num_params
    mu = torch.randn(e, p, generator=g, dtype=F64)
    factor = random_factor(g, p=p)
    y0, v0 = start(g, e, 3)
    index = torch.tensor([[1, 21], [240, 260], [480, 500]])
    theta = mu + torch.randn(e, p, generator=g, dtype=F64) @ factor.mT
    value = gather_times(mp.trajectory(theta, y0, v0)[0], index.expand(e, 3, 2))
    out = mp.marginals(mu, y0, v0, index, scale_tril=factor)
    got = torch.distributions.MultivariateNormal(out.mean, scale_tril=out.scale_tril, validate_args=False)
    torch.testing.assert_close(got.log_prob(value), exact_log_likelihood(value, out.mean, out.cov), rtol=0, atol=1e-3)


def test_index_zero_adds_a_constant():
    """At t = 0 the motion is y0 for every theta: a pair (0, k) has the likelihood of time k alone, times N(0; 0, 1)
    per DoF, and the mean there is exactly y0."""
    g = gen(13)
    mp = ProDMP(num_dof=2, duration=1.0, num_steps=10, num_basis=3)
    mu = torch.randn(2, mp.num_params, generator=g, dtype=F64)
    factor = random_factor(g, p=mp.num_params)
    y0, v0 = start(g, 2, 2)
    value = gather_times(mp.trajectory(mu + 0.1, y0, v0)[0], torch.tensor([[[0, 6]], [[0, 6]]]))
    pair = mp.marginals(mu, y0, v0, torch.tensor([[0, 6]]), scale_tril=factor)
    alone = mp.marginals(mu, y0, v0, torch.tensor([[6]]), scale_tril=factor)
    assert torch.equal(pair.mean[:, 0, :2], y0) and torch.equal(value[:, 0, :2], y0)
    log_pair = torch.distributions.MultivariateNormal(pair.mean, scale_tril=pair.scale_tril).log_prob(value)
    log_alone = torch.distributions.MultivariateNormal(alone.mean, scale_tril=alone.scale_tril).log_prob(value[..., 2:])
    torch.testing.assert_close(log_pair, log_alone - math.log(2 * math.pi), rtol=0, atol=1e-12)


def test_gradcheck_pair_log_likelihood():
    g = gen(11)
    mp = ProDMP(num_dof=2, duration=1.0, num_steps=8, num_basis=2)
    e, p = 2, mp.num_params
    mu = torch.randn(e, p, generator=g, dtype=F64, requires_grad=True)
    factor = random_factor(g, p=p).requires_grad_()
    y0, v0 = start(g, e, 2)
    index = torch.tensor([[[1, 3], [3, 5]], [[0, 2], [6, 8]]])
    with torch.no_grad():
        theta = mu + torch.randn(e, p, generator=g, dtype=F64) @ factor.T
        value = gather_times(mp.trajectory(theta, y0, v0)[0], index)

    def log_likelihood(mu, factor):
        out = mp.marginals(mu, y0, v0, index, scale_tril=factor)
        dist = torch.distributions.MultivariateNormal(out.mean, scale_tril=out.scale_tril, validate_args=False)
        return dist.log_prob(value)

    assert torch.autograd.gradcheck(log_likelihood, (mu, factor))
    log_likelihood(mu, factor).sum().backward()
    assert torch.isfinite(mu.grad).all() and torch.isfinite(factor.grad).all()


# ----------------------------------------------------------------------------------------------- bad input

MP = {"num_dof": 2, "duration": 1.0, "num_steps": 10}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_dof": 0}, "num_dof"),
        ({"duration": -1.0}, "duration"),
        ({"duration": float("nan")}, "duration"),
        ({"num_steps": 2.5}, "num_steps"),
        ({"num_basis": 0}, "num_basis"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha_x": -3.0}, "alpha_x"),
        ({"tau": 0.0}, "tau"),
        ({"tau": 1e-3}, "tau"),
        ({"duration": 1e-200}, r"duration must lie in \[1e-06, 1e\+06\] seconds, got 1e-200"),
        ({"duration": 1e200}, r"duration must lie in \[1e-06, 1e\+06\] seconds, got 1e\+200"),
        ({"tau": 1e200}, r"tau must lie in \[1e-06, 1e\+06\] seconds"),
        ({"basis_bandwidth": 0.0}, "basis_bandwidth"),
        ({"auto_scale": 1}, "auto_scale"),
        ({"weights_scale": True}, "weights_scale"),
        ({"goal_scale": float("inf")}, "goal_scale"),
        ({"relative_goal": 1}, "relative_goal"),
        ({"resolution": 0}, "resolution"),
    ],
)
def test_bad_hyper_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProDMP(**{**MP, **kwargs})


def _call(method: str, **change):
    mp = ProDMP(**MP, num_basis=2)
    args = {
        "theta": torch.zeros(3, 6, dtype=F64),
        "mu": torch.zeros(3, 6, dtype=F64),
        "y0": torch.zeros(3, 2, dtype=F64),
        "v0": torch.zeros(3, 2, dtype=F64),
        "scale_tril": torch.eye(6, dtype=F64),
        "index": torch.tensor([[1, 2]]),
        "times": torch.tensor([0.5], dtype=F64),
    }
    args.update(change)
    if method == "trajectory":
        return mp.trajectory(args["theta"], args["y0"], args["v0"], args["times"])
    if method == "moments":
        return mp.moments(args["mu"], args["y0"], args["v0"], args["times"], scale_tril=args["scale_tril"])
    extra = {k: args[k] for k in ("cov", "jitter") if k in args}
    return mp.marginals(args["mu"], args["y0"], args["v0"], args["index"], scale_tril=args["scale_tril"], **extra)


@pytest.mark.parametrize(
    ("method", "change", "match"),
    [
        ("trajectory", {"theta": torch.zeros(3, 5, dtype=F64)}, r"theta has shape \(3, 5\) but \(E, 6\)"),
        ("trajectory", {"theta": torch.full((3, 6), math.nan, dtype=F64)}, "theta contains NaN"),
        ("trajectory", {"theta": torch.zeros(3, 6, dtype=torch.long)}, "theta must be a floating"),
        ("trajectory", {"theta": [[0.0] * 6] * 3}, "theta must be a torch.Tensor"),
        ("trajectory", {"y0": torch.zeros(2, 2, dtype=F64)}, r"y0 has shape \(2, 2\) but \(3, 2\)"),
        ("trajectory", {"v0": torch.zeros(3, 3, dtype=F64)}, "v0 has shape"),
        ("trajectory", {"v0": torch.full((3, 2), math.inf, dtype=F64)}, "v0 contains NaN or inf"),
        ("trajectory", {"times": torch.tensor([1.5], dtype=F64)}, r"times must lie in \[0, duration"),
        ("trajectory", {"times": torch.tensor([-0.1], dtype=F64)}, r"times must lie in \[0, duration"),
        ("trajectory", {"times": torch.tensor([[0.5]], dtype=F64)}, "times must be a 1-D"),
        ("trajectory", {"times": torch.tensor([math.nan], dtype=F64)}, "times must be a 1-D"),
        ("moments", {"mu": torch.zeros(6, dtype=F64)}, "mu has shape"),
        ("moments", {"scale_tril": torch.eye(5, dtype=F64)}, "scale_tril has shape"),
        ("moments", {"scale_tril": torch.eye(6, dtype=F64).expand(2, 6, 6)}, "scale_tril has shape"),
        ("marginals", {"cov": torch.eye(6, dtype=F64)}, "exactly one of scale_tril"),
        ("marginals", {"index": torch.tensor([[1, 11]])}, r"index holds step indices outside \[0, num_steps=10\]"),
        ("marginals", {"index": torch.tensor([[1.0, 2.0]])}, "index must be an integer"),
        ("marginals", {"index": torch.tensor([1, 2])}, r"index must be \(E, K, m\)"),
        ("marginals", {"cov": -torch.eye(6, dtype=F64), "scale_tril": None}, "not positive definite"),
        ("marginals", {"jitter": 0.0}, "jitter"),
    ],
)
def test_bad_input_names_the_argument(method, change, match):
    with pytest.raises(ValueError, match=match):
        _call(method, **change)


def test_gather_times_layout_and_bad_index():
    values = torch.arange(2 * 4 * 3, dtype=F64).reshape(2, 4, 3)  # (E, T + 1, D)
    index = torch.tensor([[[3, 1]], [[0, 2]]])
    out = gather_times(values, index)
    assert out.shape == (2, 1, 6)
    assert torch.equal(out[0, 0], torch.cat([values[0, 3], values[0, 1]]))
    assert torch.equal(out[1, 0], torch.cat([values[1, 0], values[1, 2]]))
    with pytest.raises(ValueError, match=r"index must hold integer step indices in \[0, 3\]"):
        gather_times(values, index + 1)
    with pytest.raises(ValueError, match=r"values must be \(E, T \+ 1, D\)"):
        gather_times(values[0], index)
