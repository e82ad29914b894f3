"""TCEConfig: the spec's defaults, the presets, JSON round trips, and errors that say how to fix the input."""

from __future__ import annotations

import dataclasses
import json

import pytest

from troll.episodic.config import DISTANCES, RESUMABLE_FIELDS, TCEConfig
from troll.episodic.presets import PRESETS, env_family
from troll.runs.protocol import differences


def test_defaults_are_the_specs():
    cfg = TCEConfig()
    assert cfg.algo == "tce" and cfg.episodes == 16 and cfg.num_basis == 8
    assert (cfg.dmp_alpha, cfg.dmp_alpha_x) == (10.0, 3.0)
    assert cfg.num_segments == 24 and cfg.random_offset  # 25 indices, 24 pairs
    assert cfg.policy_hidden == (128, 128)
    assert (cfg.critic_epochs, cfg.policy_epochs, cfg.critic_minibatches) == (50, 50, 1)
    assert (cfg.gae_lambda, cfg.gamma) == (0.95, 1.0)
    assert (cfg.mean_bound, cfg.cov_bound, cfg.trust_region_coeff) == (0.005, 0.0005, 1.0)
    assert cfg.distance == "kl"


def test_presets_per_family():
    assert env_family("toy/viapoint") == "toy" and env_family("gym/reacher-sparse") == "gym"
    assert env_family("metaworld/push-v3") == "metaworld"
    mw = TCEConfig.preset("metaworld/push-v3")
    assert mw.env == "metaworld/push-v3" and (mw.mean_bound, mw.cov_bound) == (0.005, 0.0005) and mw.relative_goal
    # the dataclass defaults are the authors' setup; the Meta-World preset adds that env's tau and options
    assert mw == TCEConfig(env="metaworld/push-v3", **PRESETS["metaworld"])
    assert TCEConfig().env_options == {} and TCEConfig().covariance == "full"
    toy = TCEConfig.preset("toy/viapoint", seed=3, algo="bbrl")
    assert toy.seed == 3 and toy.algo == "bbrl"
    for key, value in PRESETS["toy"].items():
        assert getattr(toy, key) == value
    with pytest.raises(ValueError, match="did you mean 'mean_bound'"):
        TCEConfig.preset("toy/viapoint", mean_bnd=0.1)


def test_json_round_trip():
    cfg = TCEConfig.preset("gym/reacher", policy_hidden=(64, 32), env_options={"kp": 6.0}, seed=5)
    text = cfg.to_json()
    assert json.loads(text)["policy_hidden"] == [64, 32]
    back = TCEConfig.from_json(text)
    assert back == cfg and back.policy_hidden == (64, 32)
    assert differences(cfg, back) == {}
    other = dataclasses.replace(cfg, mean_bound=0.1, workers=0)
    # workers may change on resume
    assert differences(cfg, other, resumable=RESUMABLE_FIELDS) == {"mean_bound": (cfg.mean_bound, 0.1)}
    with pytest.raises(ValueError, match="did you mean 'episodes'"):
        TCEConfig.from_dict({**cfg.to_dict(), "episode": 3})


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("mean_bound", 0.0, "mean_bound must be > 0"),
        ("mean_bound", -1.0, "Meta-World 0.005"),
        ("cov_bound", float("nan"), "cov_bound must be > 0"),
        ("cov_bound", float("inf"), "cov_bound must be > 0"),
        ("mean_bound", True, "mean_bound must be > 0"),
        ("trust_region_coeff", -0.5, "trust_region_coeff must be >= 0"),
        ("algo", "tcee", "Did you mean 'tce'"),
        ("algo", "ppo", "Choose one of 'tce', 'bbrl'"),
        ("env", "toy/viapont", "Did you mean 'toy/viapoint'"),
        ("env", "metaworld/reach-v2", "Did you mean 'metaworld/reach-v3'"),
        ("distance", "w2", "Choose one of 'kl', 'frobenius'"),
        ("episodes", 0, "episodes must be an integer >= 1"),
        ("episodes", 16.0, "episodes must be an integer >= 1"),
        ("num_segments", 0, "num_segments must be an integer >= 1"),
        ("gae_lambda", 1.5, "gae_lambda must lie in"),
        ("gamma", 0.0, "gamma must lie in"),
        ("init_std", 1e-5, "must exceed min_std"),
        ("policy_hidden", (128, 0), "policy_hidden must be a tuple"),
        ("relative_goal", "yes", "relative_goal must be True or False"),
        ("entropy_schedule", "cosine", "entropy_schedule"),
        ("entropy_rate", 1.0, "entropy_rate must lie in"),
        ("env_options", [1], "env_options must be a dict"),
    ],
)
def test_bad_values_say_how_to_fix(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        TCEConfig(**{field: value})


def test_bbrl_needs_two_episodes():
    with pytest.raises(ValueError, match="episodes must be >= 2"):
        TCEConfig(algo="bbrl", episodes=1)


def test_unknown_env_family():
    with pytest.raises(ValueError, match="unknown episodic environment 'gym/hopper'. Did you mean 'gym/reacher'"):
        TCEConfig.preset("gym/hopper")  # a name in troll's families must be one of troll's envs
    with pytest.raises(ValueError, match="unknown episodic environment 'mine'"):
        TCEConfig(env="mine")  # a user's env is family/task or module:function
    assert env_family("mine/reach") == "user" and TCEConfig.preset("mine/reach").num_basis == TCEConfig().num_basis


def test_the_distances_are_gaussians_that_project_a_cholesky_factor():
    from troll.gaussian.distances import DISTANCES as GAUSSIAN
    from troll.gaussian.projection import KINDS_FOR

    assert DISTANCES == tuple(d for d in GAUSSIAN if "chol" in KINDS_FOR[d])  # config.py reads it without torch
