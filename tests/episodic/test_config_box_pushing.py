"""The box-pushing presets against the TCE authors' configs (TCE_RL, mprl/config/box_push_random_init/*/entire/:
shared.yaml and horeka.yaml, the paper's runs), and PPO's step interface on the task."""

import numpy as np
import pytest

from troll.episodic.config import TCEConfig
from troll.episodic.presets import env_family
from troll.runs.protocol import differences
from troll.tce.flags import build_config

DENSE, SPARSE = "fancy/box-pushing-dense", "fancy/box-pushing-sparse"


def test_tce_preset_is_the_authors():
    cfg = TCEConfig.preset(DENSE)
    assert env_family(DENSE) == env_family(SPARSE) == "box-pushing"
    # horeka.yaml: 38 environments x 4 episodes (dense) or 2 (sparse); evaluation every 25 iterations on 38 x 4
    assert (cfg.episodes, cfg.eval_episodes, cfg.eval_every) == (152, 152, 25)
    # mp: prodmp, 7 DoF, tau 2, alpha_phase 3, 8 basis, bandwidth 3, alpha 10, absolute goal, auto-scaled, 0.3 / 0.3
    mp = (cfg.tau, cfg.dmp_alpha_x, cfg.num_basis, cfg.basis_bandwidth, cfg.dmp_alpha, cfg.relative_goal)
    assert mp == (2.0, 3.0, 8, 3.0, 10.0, False)
    assert (cfg.auto_scale_basis, cfg.weights_scale, cfg.goal_scale) == (True, 0.3, 0.3)
    # policy 2 x 128 and critic 2 x 256, leaky ReLU, min_std 1e-4; rates 3e-4 / 1e-3 scheduled; 50 / 50 epochs
    assert (cfg.policy_hidden, cfg.critic_hidden, cfg.activation, cfg.critic_activation) == (
        (128, 128), (256, 256), "leaky_relu", "leaky_relu")  # fmt: skip
    assert (cfg.min_std, cfg.policy_lr, cfg.critic_lr, cfg.lr_final) == (1e-4, 3e-4, 1e-3, 0.01)
    assert (cfg.policy_epochs, cfg.critic_epochs, cfg.critic_minibatches, cfg.num_segments) == (50, 50, 1, 24)
    # projection: KL 0.05 / 0.0005, regression weight 1, linear entropy schedule to 0
    assert (cfg.distance, cfg.mean_bound, cfg.cov_bound, cfg.trust_region_coeff) == ("kl", 0.05, 0.0005, 1.0)
    assert (cfg.entropy_schedule, cfg.entropy_reference, cfg.entropy_target) == ("linear", "zero", 0.0)
    assert (cfg.gae_lambda, cfg.gamma, cfg.total_env_steps) == (0.95, 1.0, 10_000_000)
    sparse = TCEConfig.preset(SPARSE)
    assert (sparse.episodes, sparse.policy_lr) == (76, 1e-4)  # horeka.yaml's list: sparse with 2 episodes, 1e-4
    assert differences(sparse, cfg, resumable=("env",)) == {"episodes": (76, 152), "policy_lr": (1e-4, 3e-4)}


def test_bbrl_preset_is_the_authors():
    for env, episodes in ((DENSE, 152), (SPARSE, 76)):
        cfg = TCEConfig.preset(env, algo="bbrl")
        assert (cfg.covariance, cfg.episodes, cfg.policy_lr, cfg.critic_lr, cfg.lr_final) == (
            "diag", episodes, 3e-4, 3e-4, 1.0)  # fmt: skip
        assert (cfg.policy_epochs, cfg.critic_epochs, cfg.mean_bound, cfg.cov_bound) == (20, 10, 0.05, 0.001)
        assert (cfg.trust_region_coeff, cfg.entropy_schedule, cfg.num_basis, cfg.basis_bandwidth) == (
            10.0, "none", 8, 3.0)  # fmt: skip
        # the rest (ProDMP, networks, min_std, evaluation, budget) is TCE's, as in the authors' BBRL config
        differs = {"covariance", "policy_epochs", "critic_epochs", "critic_lr", "lr_final", "cov_bound",
                   "trust_region_coeff", "entropy_schedule"} | ({"policy_lr"} if env == SPARSE else set())  # fmt: skip
        assert set(differences(cfg, TCEConfig.preset(env), resumable=("env", "algo"))) == differs
    assert TCEConfig.preset(DENSE, algo="bbrl-cov").covariance == "full"


def test_command_line_config_and_env_options():
    cfg = build_config("tce", SPARSE, seed=1, steps=20_000, options={"env_options": {"context": "full"}}, threads=1,
                       workers=0)  # fmt: skip
    assert cfg.env_options == {"context": "full"} and cfg.total_env_steps == 20_000
    with pytest.raises(ValueError, match="context"):
        build_config("tce", SPARSE, seed=1, steps=None, options={"env_options": {"context": 3}}, threads=1, workers=0)
    ppo = build_config("ppo", DENSE, seed=0, steps=None, options={}, threads=1, workers=0)
    assert (ppo.total_env_steps, ppo.eval_every_steps, ppo.eval_episodes) == (10_000_000, 25 * 152 * 100, 152)


def test_ppo_step_task_is_the_episodic_task():
    pytest.importorskip("mujoco")
    from troll.episodic.envs.box_pushing import BoxPushingConfig, BoxPushingTask
    from troll.tce.ppo import make_step_task

    step = make_step_task(SPARSE, seed=0)
    task = BoxPushingTask(BoxPushingConfig(sparse=True))
    rng = np.random.default_rng(0)
    obs, _ = step.reset(options={"episode_seed": 11})
    np.testing.assert_array_equal(obs, task.start(11))
    total = 0.0
    for t in range(100):
        a = rng.uniform(-0.2, 0.2, 7)
        obs, reward, terminated, truncated, info = step.step(a)
        expected = task.step(a)
        np.testing.assert_array_equal(obs, expected[0])
        assert reward == expected[1] and not terminated and truncated == (t == 99)
        total += reward
    assert info["episode_return"] == pytest.approx(total) and info["distance"] == expected[2]["distance"]
    step.close()


def test_ppo_trains_end_to_end(tmp_path, capsys):
    """``troll tce train --algo ppo`` on sparse box pushing: 200 env steps (two rollouts of one episode), evaluated
    on 2 episodes after each, with the metrics a box-pushing run reports (success, distance), all finite."""
    pytest.importorskip("stable_baselines3")
    import math

    from troll.cli import main
    from troll.runs.files import read_jsonl

    out = tmp_path / "ppo"
    argv = ["tce", "train", "--env", SPARSE, "--algo", "ppo", "--out", str(out), "--steps", "200",
            "--ppo-n-steps", "100", "--ppo-batch-size", "50", "--ppo-n-epochs", "1", "--eval-episodes", "2",
            "--eval-every", "1", "--episodes", "1", "--no-progress"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["env_steps"] for r in rows] == [100, 200]
    for row in rows:
        assert {"eval/return", "eval/distance", "eval/success_rate", "rollout/success_rate"} <= set(row)
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float))
        assert 0.0 < row["eval/distance"] < 1.0 and row["eval/return"] < 0  # the box, metres from its goal


@pytest.mark.parametrize("algo", ["tce", "ppo"])
def test_missing_assets_stop_a_run_before_it_writes(tmp_path, monkeypatch, capsys, algo):
    pytest.importorskip("mujoco")
    import importlib.metadata

    from troll.cli import main

    real = importlib.metadata.distribution
    monkeypatch.setattr(importlib.metadata, "distribution",
                        lambda name: real("no-such-dist-x") if name == "fancy-gym" else real(name))  # fmt: skip
    out = tmp_path / "run"
    code = main(["tce", "train", "--env", DENSE, "--algo", algo, "--workers", "0", "--out", str(out)])
    assert code == 2 and not out.exists()
    assert "pip install --no-deps fancy-gym==0.3.0" in capsys.readouterr().err
