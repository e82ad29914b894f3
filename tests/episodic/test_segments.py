"""TCE's segments and critic targets: the pair likelihoods against an independent float64 computation and Monte
Carlo, the segment indices, the segment advantages and GAE against hand-computed cases (docs/tce.md)."""

from __future__ import annotations

import math

import pytest
import torch

from troll.episodic.critic import alive_mask, explained_variance, gae, step_inputs
from troll.episodic.prodmp import ProDMP, gather_times
from troll.episodic.segments import normalize, pair_log_prob, segment_advantages, segment_index
from troll.gaussian import Gaussian

F64 = torch.float64


def setting(seed: int = 0, *, dof: int = 2, num_basis: int = 4, episodes: int = 3, horizon: int = 40):
    """A ProDMP, a Gaussian over theta with a random full covariance, and random starts."""
    g = torch.Generator().manual_seed(seed)
    dmp = ProDMP(num_dof=dof, duration=horizon * 0.02, num_steps=horizon, num_basis=num_basis, weights_scale=30.0)
    p = dmp.num_params
    mean = torch.randn(episodes, p, generator=g, dtype=F64)
    chol = torch.tril(torch.randn(p, p, generator=g, dtype=F64) * 0.3, -1) + torch.diag(
        0.5 + torch.rand(p, generator=g, dtype=F64)
    )
    y0 = torch.randn(episodes, dof, generator=g, dtype=F64)
    v0 = torch.randn(episodes, dof, generator=g, dtype=F64)
    return dmp, Gaussian.from_chol(mean, chol), y0, v0, g


def linear_map_by_hand(dmp: ProDMP, y0, v0, times: list[int]):
    """H (n D, P) and xi (E, n D) at step indices ``times`` from ProDMP.trajectory alone (linearity in theta):
    xi = y(theta = 0), column j = y(e_j) - y(0). Independent of ProDMP.marginals' contraction."""
    e, p = y0.shape[0], dmp.num_params
    zero, _ = dmp.trajectory(torch.zeros(e, p, dtype=F64), y0, v0)
    xi = zero[:, times].reshape(e, -1)
    cols = []
    for j in range(p):
        unit = torch.zeros(1, p, dtype=F64)
        unit[0, j] = 1.0
        y, _ = dmp.trajectory(unit, y0[:1], v0[:1])
        cols.append((y - zero[:1])[0, times].reshape(-1))
    return torch.stack(cols, -1), xi


def test_pair_log_prob_matches_multivariate_normal_on_h_sigma_ht():
    dmp, policy, y0, v0, g = setting(0)
    index = torch.tensor([[[3, 8], [8, 13], [20, 40]]] * 3)  # no index 0: every pair covariance is full rank
    values = torch.randn(3, 3, 4, generator=g, dtype=F64)
    got = pair_log_prob(dmp, policy, y0, v0, index, values)
    sigma = policy.covariance()
    for e in range(3):
        for k in range(3):
            h, xi = linear_map_by_hand(dmp, y0[e : e + 1], v0[e : e + 1], index[e, k].tolist())
            mvn = torch.distributions.MultivariateNormal(h @ policy.mean[e] + xi[0], h @ sigma @ h.T)
            assert float(got[e, k]) == pytest.approx(float(mvn.log_prob(values[e, k])), rel=1e-7, abs=1e-6)


def test_pair_log_prob_of_sampled_trajectories_matches_monte_carlo():
    """Trajectories of theta ~ N(mu, Sigma): the pair positions' sample mean and covariance match the marginals,
    and the average log-likelihood matches minus the pair Gaussian's entropy."""
    dmp, policy, y0, v0, g = setting(1, episodes=1)
    n = 20_000
    theta = policy.mean + torch.randn(n, dmp.num_params, generator=g, dtype=F64) @ policy.factor.T
    pos, _ = dmp.trajectory(theta, y0.expand(n, -1), v0.expand(n, -1))
    index = torch.tensor([[10, 15], [30, 35]]).expand(n, -1, -1)
    values = gather_times(pos, index)  # (n, 2, 4)
    many = Gaussian.from_chol(policy.mean.expand(n, -1), policy.factor)
    logp = pair_log_prob(dmp, many, y0.expand(n, -1), v0.expand(n, -1), index, values)
    marg = dmp.marginals(policy.mean, y0, v0, index[:1], scale_tril=policy.factor)
    for k in range(2):
        x = values[:, k]
        cov = marg.cov[0, k]
        se = cov.diagonal().sqrt() / math.sqrt(n)
        assert ((x.mean(0) - marg.mean[0, k]).abs() < 5 * se).all()
        rel = (torch.cov(x.T) - cov).abs().max() / cov.abs().max()
        assert rel < 0.05
        entropy = 0.5 * torch.logdet(2 * math.pi * math.e * cov)
        assert float(logp[:, k].mean()) == pytest.approx(-float(entropy), abs=5 * float(logp[:, k].std()) / n**0.5)


def test_pair_with_index_zero_is_the_single_time_likelihood_plus_a_constant():
    dmp, policy, y0, v0, g = setting(2)
    pos, _ = dmp.trajectory(policy.mean + 0.3, y0, v0)
    pair = torch.tensor([[[0, 7]]] * 3)
    single = torch.tensor([[[7]]] * 3)
    lp_pair = pair_log_prob(dmp, policy, y0, v0, pair, gather_times(pos, pair))
    marg = dmp.marginals(policy.mean, y0, v0, single, scale_tril=policy.factor)
    mvn = torch.distributions.MultivariateNormal(marg.mean, marg.cov)
    lp_single = mvn.log_prob(gather_times(pos, single))
    constant = -0.5 * dmp.num_dof * math.log(2 * math.pi)  # the zero-variance entries at step 0, variance 1
    torch.testing.assert_close(lp_pair, lp_single + constant, rtol=1e-7, atol=1e-6)


def test_pair_log_prob_gradient_reaches_mean_and_factor():
    dmp, policy, y0, v0, g = setting(3)
    mean = policy.mean.clone().requires_grad_()
    chol = policy.factor.clone().requires_grad_()
    index = segment_index(3, 40, 8, generator=g)
    values = torch.randn(3, 8, 4, generator=g, dtype=F64)
    pair_log_prob(dmp, Gaussian.from_chol(mean, chol), y0, v0, index, values).sum().backward()
    assert torch.isfinite(mean.grad).all() and mean.grad.abs().sum() > 0
    assert torch.isfinite(chol.grad).all() and chol.grad.abs().sum() > 0


@pytest.mark.parametrize("horizon, k", [(500, 24), (100, 24), (50, 24), (24, 24), (7, 3)])
def test_segment_index_layout(horizon, k):
    g = torch.Generator().manual_seed(0)
    index = segment_index(400, horizon, k, generator=g)
    interval = horizon // k
    assert index.shape == (400, k, 2) and index.dtype == torch.int64
    assert index.min() >= 0 and index.max() <= horizon
    assert ((index[..., 1] - index[..., 0]) == interval).all()
    assert (index[:, 1:, 0] == index[:, :-1, 1]).all()  # consecutive pairs share their inner index
    offsets = index[:, 0, 0]
    assert set(offsets.tolist()) == set(range(horizon - k * interval + 1))  # every offset, so T itself is reachable
    fixed = segment_index(5, horizon, k, random_offset=False)
    assert (fixed[:, 0, 0] == 0).all()
    with pytest.raises(ValueError, match="num_segments"):
        segment_index(2, 10, 11)


def test_segment_advantage_hand_computed():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    values = torch.tensor([[10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 99.0]])  # V(s_6) must not be used: s_T is over
    alive = alive_mask(torch.zeros(1, 6, dtype=torch.bool))
    index = torch.tensor([[[0, 2], [2, 4], [4, 6]]])
    adv = segment_advantages(rewards, values, alive, index)
    want = [1 + 2 + 12 - 10, 3 + 4 + 14 - 12, 5 + 6 + 0 - 14]
    assert adv.tolist() == [want]
    # a segment whose rewards beat the critic's prediction has a positive advantage, one that falls short negative
    assert adv[0, 0] > 0 and adv[0, 2] < 0
    # telescoping: over segments covering the whole episode, the advantages sum to R - V(s_0)
    assert float(adv.sum()) == pytest.approx(float(rewards.sum()) - 10.0)


def test_segment_advantage_with_termination_and_discount():
    # termination at step 2: s_3 and later are dead (value 0), the padded rewards after it are 0
    rewards = torch.tensor([[1.0, 2.0, 3.0, 0.0, 0.0, 0.0]])
    dones = torch.tensor([[False, False, True, True, True, True]])
    values = torch.tensor([[10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0]])
    alive = alive_mask(dones)
    assert alive.tolist() == [[True, True, True, False, False, False, False]]
    index = torch.tensor([[[1, 3], [3, 5]]])
    adv = segment_advantages(rewards, values, alive, index)
    assert adv.tolist() == [[2 + 3 + 0 - 11, 0.0]]
    gamma = 0.9
    adv = segment_advantages(rewards, values, alive_mask(torch.zeros(1, 6, dtype=torch.bool)), index, gamma=gamma)
    assert float(adv[0, 0]) == pytest.approx(2 + gamma * 3 + gamma**2 * 13 - 11)
    assert float(adv[0, 1]) == pytest.approx(0 + gamma * 0 + gamma**2 * 15 - 13)


def test_gae_hand_computed():
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.5, 1.0, 1.5, 7.0]])  # V(s_3) is not used: the episode ends at T
    alive = alive_mask(torch.zeros(1, 3, dtype=torch.bool))
    gamma, lam = 0.9, 0.8
    d2 = 3 - 1.5
    d1 = 2 + gamma * 1.5 - 1.0
    d0 = 1 + gamma * 1.0 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    adv, targets = gae(rewards, values, alive, gamma=gamma, lam=lam)
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, a2]], dtype=F64))
    torch.testing.assert_close(targets, torch.tensor([[a0 + 0.5, a1 + 1.0, a2 + 1.5]], dtype=F64))
    # gamma = lambda = 1: the targets are the returns to go
    _, targets = gae(rewards, values, alive, gamma=1.0, lam=1.0)
    assert targets.tolist() == [[6.0, 5.0, 3.0]]


def test_gae_stops_at_a_termination():
    rewards = torch.tensor([[1.0, 2.0, 0.0, 0.0]])
    dones = torch.tensor([[False, True, True, True]])
    values = torch.tensor([[1.0, 1.0, 5.0, 5.0, 5.0]])
    adv, targets = gae(rewards, values, alive_mask(dones), gamma=1.0, lam=0.95)
    # delta_1 = 2 + 0 - 1 (s_2 is dead), delta_0 = 1 + 1 - 1; A_0 = delta_0 + 0.95 delta_1
    torch.testing.assert_close(adv, torch.tensor([[1 + 0.95 * 1.0, 1.0, 0.0, 0.0]], dtype=F64))
    assert targets[0, 2:].tolist() == [0.0, 0.0]


def test_step_inputs_and_normalize():
    states = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
    context = torch.tensor([[7.0], [8.0]])
    x = step_inputs(states, context, horizon=4)
    assert x.shape == (2, 5, 5)
    assert x[0, :, 3].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert (x[1, :, 4] == 8).all()
    assert step_inputs(states, None, horizon=4).shape == (2, 5, 4)
    a = normalize(torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=F64))
    assert float(a.mean()) == pytest.approx(0, abs=1e-12) and float(a.std()) == pytest.approx(1, rel=1e-6)
    assert explained_variance(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) == 1.0
