"""The TCE agent on the toy task: the policy's Gaussian, the critic's statistics, one update's properties (the
surrogate falls, every projected distance stays within its bound, the projection acts), BBRL, and bad batches."""

from __future__ import annotations

import copy

import pytest
import torch

from troll.episodic.agent import TCEAgent, reset_seed
from troll.episodic.config import TCEConfig
from troll.episodic.critic import Critic
from troll.episodic.envs import make_env
from troll.episodic.normalize import RunningNorm
from troll.episodic.policy import ContextPolicy

RTOL = 1e-6  # a projected distance may exceed its bound by this much, relative (float64 rounding)


def small(**overrides) -> TCEConfig:
    base = dict(episodes=8, policy_hidden=(32, 32), critic_hidden=(32, 32), policy_epochs=8, critic_epochs=8)
    return TCEConfig.preset("toy/viapoint", **{**base, **overrides})


def test_policy_gaussian_shapes_and_global_covariance():
    policy = ContextPolicy(4, 18, hidden=(16,), init_std=0.7, min_std=1e-3)
    context = torch.randn(5, 4)
    gauss = policy(context)
    assert gauss.kind == "chol" and gauss.mean.shape == (5, 18) and gauss.factor.shape == (18, 18)
    assert gauss.is_global and gauss.mean.dtype == torch.float64
    torch.testing.assert_close(gauss.factor, 0.7 * torch.eye(18, dtype=torch.float64))
    assert gauss.mean.abs().max() < 0.1  # the last layer starts small: theta ~ 0, stay at y0
    with torch.no_grad():
        policy.chol_lower.copy_(torch.randn(18, 18))
        policy.chol_diag.fill_(-50.0)  # softplus -> 0: the floor min_std holds the diagonal
    chol = policy(context).factor
    assert torch.equal(chol, torch.tril(chol)) and (chol.diagonal() >= 1e-3).all()
    cov = policy(context).covariance()
    assert cov.shape == (18, 18) and torch.linalg.eigvalsh(cov).min() > 0
    # gradients reach the mean network and both parts of the factor
    gauss = policy(context)
    (gauss.mean.sum() + gauss.factor.sum()).backward()
    assert policy.chol_diag.grad is not None and policy.chol_lower.grad.tril(-1).abs().sum() > 0
    assert policy.chol_lower.grad.triu().abs().sum() == 0  # the upper triangle is not a parameter in effect


def test_policy_refuses_a_context_that_does_not_match():
    policy = ContextPolicy(4, 6, hidden=(8,))
    with pytest.raises(ValueError, match=r"context has shape \(3, 5\).*C=4"):
        policy(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="NaN or inf"):
        policy(torch.tensor([[0.0, float("nan"), 0.0, 0.0]]))
    with pytest.raises(ValueError, match="torch.Tensor"):
        policy([[0.0] * 4])


def test_running_norm_matches_full_batch_statistics_and_value_scale_preserves_outputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 5.0, 0.1]) + 2
    norm = RunningNorm(3)
    for part in x.split([7, 100, 193]):
        norm.update(part)
    torch.testing.assert_close(norm.mean, x.mean(0))
    torch.testing.assert_close(norm.var, x.var(0, unbiased=False))
    critic = Critic(3, hidden=(8,), normalize_inputs=False)
    inputs = torch.randn(50, 3, generator=g)
    before = critic(inputs)
    critic.update_statistics(inputs, 1000 + 300 * torch.randn(50, generator=g, dtype=torch.float64))
    torch.testing.assert_close(critic(inputs), before, rtol=1e-4, atol=1e-3)  # PopArt: outputs preserved
    assert abs(float(critic.scale.mean) - 1000) < 150


@pytest.fixture(scope="module")
def toy_env():
    env = make_env("toy/viapoint", num_episodes=8)
    yield env
    env.close()


def run_updates(config: TCEConfig, env, iterations: int) -> tuple[TCEAgent, list[dict]]:
    agent = TCEAgent.for_env(config, env, total_iterations=iterations)
    rows = []
    for it in range(iterations):
        rows.append(agent.update(agent.rollout(env, reset_seed(config.seed, it))))
    return agent, rows


@pytest.mark.parametrize("algo", ["tce", "bbrl"])
def test_update_lowers_the_surrogate_and_keeps_the_trust_region(toy_env, algo):
    cfg = small(algo=algo, mean_bound=0.002, cov_bound=2e-4, policy_lr=1e-3)
    agent, rows = run_updates(cfg, toy_env, 4)
    for m in rows:
        assert m["loss/pg"] < m["loss/pg_first"]  # the epochs improve the surrogate on the batch
        assert abs(m["loss/pg_first"] + m["adv/mean"]) < 1e-9  # epoch 0: ratio 1, so the surrogate is -mean(A)
        assert m["proj/mean_dist_after/max"] <= cfg.mean_bound * (1 + RTOL)
        assert m["proj/cov_dist_after/max"] <= cfg.cov_bound * (1 + RTOL)
        assert m["proj/bound_exceeded_frac"] == 0
        assert m["loss/reg"] >= 0 and m["critic/loss"] < m["critic/loss_first"]
        assert 0 < m["ratio/min"] <= m["ratio/max"]
    assert max(m["proj/active_epochs"] for m in rows) > 0  # the bounds are tight enough to act
    assert max(m["proj/projected_frac/mean"] for m in rows) > 0
    keys = {"rollout/return", "rollout/success_rate", "rollout/distance", "policy/entropy", "critic/explained_var"}
    assert keys <= set(rows[-1]) and {"time/critic", "time/policy", "adv/std", "proj/eta/max"} <= set(rows[-1])
    assert agent.iteration == 4


def test_bbrl_uses_a_context_critic_and_tce_a_step_critic(toy_env):
    tce = TCEAgent.for_env(small(), toy_env)
    bbrl = TCEAgent.for_env(small(algo="bbrl"), toy_env)
    assert tce.critic.input_dim == toy_env.state_dim + 1 + toy_env.context_dim
    assert bbrl.critic.input_dim == toy_env.context_dim
    assert tce.dmp.num_params == toy_env.dof * (small().num_basis + 1)


def test_a_bad_batch_is_refused_before_anything_moves(toy_env):
    agent = TCEAgent.for_env(small(), toy_env)
    batch = agent.rollout(toy_env, 0)
    params = copy.deepcopy(agent.policy.state_dict())
    bad = copy.deepcopy(batch)
    bad.episodes.rewards[2, 5] = float("nan")
    with pytest.raises(ValueError, match="rewards contains NaN"):
        agent.update(bad)
    bad = copy.deepcopy(batch)
    bad.episodes.states[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="states contains NaN"):
        agent.update(bad)
    bad = copy.deepcopy(batch)
    bad.start.context = batch.start.context[:, :3]
    with pytest.raises(ValueError, match="context has shape"):
        agent.update(bad)
    for key, value in agent.policy.state_dict().items():
        assert torch.equal(value, params[key]), key
    with pytest.raises(ValueError, match="num_episodes"):
        TCEAgent.for_env(small(episodes=4), toy_env)
    with pytest.raises(ValueError, match="num_segments"):
        TCEAgent.for_env(small(num_segments=101), toy_env)


def test_state_dict_round_trip_continues_identically(toy_env):
    cfg = small()
    a, _ = run_updates(cfg, toy_env, 2)
    b = TCEAgent.for_env(cfg, toy_env)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    ra = a.update(a.rollout(toy_env, 7))
    rb = b.update(b.rollout(toy_env, 7))
    assert {k: v for k, v in ra.items() if not k.startswith("time/")} == {
        k: v for k, v in rb.items() if not k.startswith("time/")
    }


def test_evaluation_runs_the_mean_trajectory(toy_env):
    agent = TCEAgent.for_env(small(), toy_env)
    start = toy_env.reset(3)
    theta, pos, _ = agent.trajectories(start, deterministic=True)
    torch.testing.assert_close(theta, agent.policy(start.context).mean.detach())
    theta2, pos2, _ = agent.trajectories(start, deterministic=True)
    assert torch.equal(pos, pos2)
    m = agent.evaluate(toy_env, 3)
    assert set(m) == {"eval/return", "eval/success_rate", "eval/distance"}
