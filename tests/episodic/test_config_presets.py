"""The authors' Meta-World setup, piece by piece against hand computations (docs/tce.md "Config and
presets"): the preset's values, the entropy schedule at iteration t and the entropy after the projection, advantages
from the values recorded at sampling time, the learning-rate decay, one segment offset per iteration, and BBRL's
diagonal covariance. Synthetic Meta-World-sized batches (no simulator) come from the golden test's builder."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from troll.episodic.agent import TCEAgent, discounted_returns
from troll.episodic.config import TCEConfig
from troll.episodic.critic import alive_mask, step_inputs
from troll.episodic.presets import ALGO_PRESETS, METAWORLD_ENV, PRESETS
from troll.episodic.segments import segment_advantages, segment_index
from troll.gaussian import Gaussian, control_entropy
from troll.tce import flags as opts

from .test_agent_golden import BASE, FAITHFUL, synthetic_batch

# what the toy and gym presets keep of the settings they were tuned with, where the authors' setup differs
NOT_THE_AUTHORS = dict(
    tau=None, basis_bandwidth=2.0, auto_scale_basis=False, offset_per_iteration=False, covariance="full",
    lr_final=1.0, values_before_fit=False, entropy_reference="initial", env_options={},
)  # fmt: skip


def agent_for(total_iterations: int = 10, **fields) -> TCEAgent:
    cfg = TCEConfig(**{**BASE, **FAITHFUL, **fields})
    return TCEAgent(cfg, context_dim=39, state_dim=39, dof=4, horizon=500, dt=0.0125, total_iterations=total_iterations)


def test_metaworld_preset_is_the_authors_setup():
    cfg = TCEConfig.preset("metaworld/push-v3")
    assert (
        cfg.env_options
        == METAWORLD_ENV
        == {
            "controller": "mocap",
            "gain": 100.0,
            "gripper_start": "fingers",
            "context": "full",
        }
    )
    assert (cfg.tau, cfg.basis_bandwidth, cfg.auto_scale_basis) == (5.0, 5.0, True)
    assert (cfg.weights_scale, cfg.goal_scale, cfg.relative_goal) == (0.1, 0.1, True)
    assert (cfg.activation, cfg.init_std, cfg.min_std, cfg.lr_final) == ("relu", 1.0, 1e-5, 0.01)
    assert (cfg.entropy_schedule, cfg.entropy_reference, cfg.entropy_target) == ("linear", "zero", 0.0)
    assert cfg.values_before_fit and cfg.offset_per_iteration and cfg.covariance == "full"
    assert (cfg.mean_bound, cfg.cov_bound, cfg.trust_region_coeff, cfg.episodes) == (0.005, 0.0005, 1.0, 16)
    cfg.env_options["gain"] = 1.0  # a config's options are its own copy, not the preset's
    assert TCEConfig.preset("metaworld/push-v3").env_options["gain"] == 100.0


def test_bbrl_presets_and_the_other_families_keep_their_numbers():
    bbrl = TCEConfig.preset("metaworld/push-v3", algo="bbrl")
    assert (bbrl.covariance, bbrl.num_basis, bbrl.policy_hidden, bbrl.critic_hidden) == ("diag", 4, (32, 32), (32, 32))
    assert (bbrl.policy_epochs, bbrl.critic_epochs, bbrl.trust_region_coeff) == (100, 100, 10.0)
    assert (bbrl.entropy_schedule, bbrl.lr_final) == ("none", 1.0)  # the authors' BBRL has neither; TCE has both
    assert TCEConfig.preset("metaworld/push-v3").entropy_schedule == "linear"
    cov = TCEConfig.preset("metaworld/push-v3", algo="bbrl-cov")
    assert cov.covariance == "full" and cov.num_basis == 4 and cov.trust_region_coeff == 10.0
    assert bbrl.tau == cov.tau == 5.0  # the same env and ProDMP as TCE
    for family in ("toy", "gym"):
        env = {"toy": "toy/viapoint", "gym": "gym/reacher"}[family]
        for algo in ("tce", "bbrl-cov"):  # bbrl-cov is the old full-covariance bbrl
            cfg = TCEConfig.preset(env, algo=algo)
            assert {k: getattr(cfg, k) for k in NOT_THE_AUTHORS} == NOT_THE_AUTHORS
            assert (cfg.activation, cfg.entropy_schedule, cfg.min_std) == ("tanh", "none", 1e-4)
        assert ALGO_PRESETS[(family, "bbrl")] == {"covariance": "diag"}
    # TCEConfig() is the recommended setup: the authors' on Meta-World, but for that env's tau and options
    authors = TCEConfig.preset("metaworld/reach-v3")
    assert dataclasses.replace(TCEConfig(), tau=5.0, env_options=METAWORLD_ENV) == authors
    assert set(PRESETS["metaworld"]) - {"tau", "env_options"} <= {
        "episodes",
        "eval_episodes",
        "eval_every",
        "total_env_steps",
        "relative_goal",
        "entropy_target",
        "mean_bound",
        "cov_bound",
    }  # at their defaults
    with pytest.raises(ValueError, match="bbrl-cov' is BBRL with the full covariance"):
        TCEConfig.preset("toy/viapoint", algo="bbrl-cov", covariance="diag")
    with pytest.raises(ValueError, match="lr_final must lie in"):
        TCEConfig(lr_final=1.5)
    with pytest.raises(ValueError, match="tau must be > 0"):
        TCEConfig(tau=-1.0)


def test_cli_builds_each_algorithm_from_its_preset():
    def build(algo):
        return opts.build_config(algo, "metaworld/reach-v3", seed=0, steps=None, options={}, threads=1, workers=0)

    assert build("bbrl").covariance == "diag" and build("bbrl-cov").covariance == "full"
    assert build("tce").values_before_fit and opts.kinds()["tau"] is opts.OptionalFloat


def test_entropy_schedule_value_and_the_projection_after_it():
    """beta_t = H0 (1 - t / T) to a target of 0 nats, H0 = P/2 (1 + log 2 pi) + sum log std_i (by hand); a policy
    below beta_t comes out of the control with H = beta_t exactly."""
    agent = agent_for(total_iterations=40, init_std=1.3, critic_epochs=1)
    p = agent.dmp.num_params
    std = agent.policy.std().detach()  # init_std up to the float32 rounding of its raw parameter
    assert float((std - 1.3).abs().max()) < 1e-7
    h0 = p / 2 * (1 + math.log(2 * math.pi)) + float(std.log().sum())
    for t in (0, 1, 17, 40, 55):
        assert abs(agent.entropy_schedule.bound(t) - h0 * (1 - min(t, 40) / 40)) < 1e-12 * h0
    gauss = Gaussian.from_chol(torch.zeros(2, p, dtype=torch.float64), 0.3 * torch.eye(p, dtype=torch.float64))
    beta = agent.entropy_schedule.bound(17)
    assert float(gauss.entropy()) < beta
    assert abs(float(control_entropy(gauss, beta).entropy()) - beta) < 1e-12 * abs(beta)
    # in an update: the network's entropy below beta_t; the projected policy the loss scores sits at beta_t
    agent.iteration = 17
    with torch.no_grad():
        agent.policy.chol_diag.fill_(math.log(math.expm1(0.3)))
    metrics = agent.update(synthetic_batch(agent, 5))
    assert metrics["policy/entropy_bound"] == beta
    assert abs(metrics["proj/entropy/mean"] - beta) < 1e-9 * abs(beta)


@pytest.mark.parametrize("algo", ["tce", "bbrl"])
def test_advantages_use_the_values_recorded_at_sampling_time(algo):
    """adv/raw_mean from the critic before this iteration's fit (by hand), not from the fitted one."""
    extra = dict(critic_epochs=20, critic_lr=3e-2) | ({"covariance": "diag"} if algo == "bbrl" else {})
    expect = {}
    for before in (True, False):
        agent = agent_for(algo=algo, values_before_fit=before, **extra)
        batch = synthetic_batch(agent, 11)
        ep, ctx = batch.episodes, batch.start.context
        alive = alive_mask(ep.dones)
        with torch.no_grad():
            if algo == "tce":
                values = agent.critic(step_inputs(ep.states, ctx, agent.horizon))
                g = torch.Generator().set_state(agent.generator.get_state())  # the index the update will draw
                index = segment_index(4, 500, 24, shared=True, generator=g)
                adv = segment_advantages(ep.rewards, values, alive, index)
            else:
                adv = discounted_returns(ep.rewards, alive, 1.0) - agent.critic(ctx).double()
        metrics = agent.update(batch)
        expect[before] = (float(adv.mean()), metrics["adv/raw_mean"])
    got, want = expect[True][1], expect[True][0]
    assert abs(got - want) < 1e-9 * max(1.0, abs(want))
    assert abs(expect[False][1] - want) > 1e-3 * max(1.0, abs(want))  # the fitted critic gives other advantages


def test_learning_rates_decay_linearly_to_their_final_share():
    agent = agent_for(total_iterations=8, policy_epochs=1, critic_epochs=1)
    assert [agent.learning_rate_factor(t) for t in (0, 4, 8, 12)] == [1.0, 0.5 + 0.5 * 0.01, 0.01, 0.01]
    for t in (0, 3):
        agent.iteration = t
        agent.update(synthetic_batch(agent, t))
        factor = (1 - t / 8) + 0.01 * t / 8
        assert agent.policy_opt.param_groups[0]["lr"] == pytest.approx(3e-4 * factor, rel=1e-15)
        assert agent.critic_opt.param_groups[0]["lr"] == pytest.approx(3e-4 * factor, rel=1e-15)
    constant = agent_for(lr_final=1.0, policy_epochs=1, critic_epochs=1)
    constant.iteration = 5
    constant.update(synthetic_batch(constant, 0))
    assert constant.policy_opt.param_groups[0]["lr"] == 3e-4


def test_one_segment_offset_per_iteration():
    g = torch.Generator().manual_seed(0)
    offsets = set()
    for _ in range(20):
        index = segment_index(16, 500, 24, shared=True, generator=g)  # interval 20, offsets 0..20
        assert bool((index == index[:1]).all())  # every episode the same
        offsets.add(int(index[0, 0, 0]))
    assert len(offsets) > 5 and max(offsets) <= 20
    per_episode = segment_index(16, 500, 24, generator=torch.Generator().manual_seed(0))
    assert len(set(per_episode[:, 0, 0].tolist())) > 1


def test_diagonal_bbrl_keeps_a_diagonal_covariance():
    agent = agent_for(algo="bbrl", covariance="diag", num_basis=4, policy_epochs=20, mean_bound=0.05, cov_bound=0.05)
    assert not hasattr(agent.policy, "chol_lower")  # no off-diagonal parameters at all
    before = agent.policy.std().detach().clone()
    for it in range(2):
        agent.iteration = it
        agent.update(synthetic_batch(agent, it))
    gauss = agent.policy(torch.zeros(3, 39, dtype=torch.float64))
    cov = gauss.covariance().detach()
    assert gauss.kind == "diag" and gauss.factor.shape == (agent.dmp.num_params,)
    assert torch.equal(cov, torch.diag(cov.diagonal()))
    assert not torch.equal(agent.policy.std().detach(), before)  # the covariance did move
