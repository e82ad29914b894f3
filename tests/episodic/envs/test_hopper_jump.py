"""fancy/hopper-jump against fancy_gym 0.3.0's own recordings, its reward terms on constructed states, its options
and assets, and a search that jumps above the start.

The recordings (tests/episodic/envs/data/hopper_jump_golden.npz, made by tests/support/record_hopper_jump.py under
fancy_gym 0.3.0, mujoco 2.3.3 and gymnasium 0.29.1) are compared with TOL = 1e-9: on mujoco 3.3.0 the largest difference
measured is 2e-12 (observations, over 250 steps of three action sequences and three tracked ProDMP trajectories;
9e-14 on the recorded jump), while a controller one step off in time (tracking the desired point of time t dt instead
of (t + 1) dt) moves the observations by 0.58 to 5.4 on the three tracked trajectories.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

from troll.episodic.envs import hopper_jump as hj  # noqa: E402
from troll.episodic.envs import make_env, registry  # noqa: E402

GOLDEN = Path(__file__).with_name("data") / "hopper_jump_golden.npz"
TOL = 1e-9
JUMP_INFO_KEYS = ("height", "x_pos", "max_height", "goal", "goal_dist", "height_rew", "healthy_reward", "healthy",
                  "contact_dist")  # fmt: skip


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(GOLDEN))


@pytest.fixture(scope="module")
def sim():
    from troll.episodic.envs.hopper_jump_sim import HopperJumpEnv

    env = HopperJumpEnv()
    yield env
    env.close()


@pytest.fixture(scope="module")
def runner():
    from troll.episodic.envs.hopper_jump_sim import HopperJumpRunner

    run = HopperJumpRunner(hj.HopperJumpConfig())
    yield run
    run.close()


def test_reset_observations_match_fancy_gym(golden, sim):
    obs = np.array([sim.reset(seed=s)[0] for s in range(10)])
    np.testing.assert_allclose(obs, golden["reset_obs"], rtol=0, atol=TOL)
    # the documented start: z = 1.5, joint angles in their ranges, at rest, goal x in [0.3, 1.35]
    assert np.all(obs[:, 1] == 1.5) and np.all(obs[:, 6:12] == 0)
    assert np.all((obs[:, 3] <= 0) & (obs[:, 3] >= -0.5) & (obs[:, 5] >= 0) & (obs[:, 5] <= 0.785))
    assert np.all((obs[:, 15] >= 0.3) & (obs[:, 15] <= 1.35))


@pytest.mark.parametrize("k", [0, 1, 2])
def test_steps_match_fancy_gym(golden, sim, k):
    """Observations, rewards and every info entry of a fixed action sequence, step by step."""
    obs, _ = sim.reset(seed=int(golden["step_seeds"][k]))
    got = {"obs": [obs], "rewards": [], **{key: [] for key in ("height", "max_height", "goal_dist", "contact_dist",
                                                                 "healthy_reward", "x_pos")}}  # fmt: skip
    for action in golden["step_actions"][k]:
        obs, reward, terminated, truncated, info = sim.step(action)
        assert not terminated and not truncated
        got["obs"].append(obs)
        got["rewards"].append(reward)
        for key in got:
            if key in info:
                got[key].append(np.array(info[key], dtype=np.float64))
    np.testing.assert_allclose(np.array(got["obs"]), golden["step_obs"][k], rtol=0, atol=TOL)
    np.testing.assert_allclose(np.array(got["rewards"]), golden["step_rewards"][k], rtol=0, atol=TOL)
    for key in ("height", "max_height", "goal_dist", "contact_dist", "healthy_reward", "x_pos"):
        np.testing.assert_allclose(np.array(got[key]), golden[f"step_info_{key}"][k], rtol=0, atol=TOL, err_msg=key)
    # sparse: every step but the last pays the control cost alone
    np.testing.assert_allclose(golden["step_rewards"][k][:-1], -hj.control_cost(golden["step_actions"][k][:-1]),
                               rtol=0, atol=1e-15)  # fmt: skip


def test_a_recorded_jump_matches_fancy_gym(golden, sim, runner):
    """fancy_gym's PD actions on three phases of joint targets, replayed: observations, rewards and every info entry
    step by step, through the peak above the start and the first landing after it. The runner, tracking the same
    targets, sends the recorded actions. The largest difference measured on mujoco 3.3.0 is 9e-14, although the contacts
    amplify a change a hundredfold (actions moved by 1e-9 move the observations by up to 1e-7)."""
    obs, _ = sim.reset(seed=int(golden["jump_seed"]))
    got = {"obs": [obs], "rewards": [], **{key: [] for key in JUMP_INFO_KEYS}}
    for action in golden["jump_actions"]:
        obs, reward, terminated, truncated, info = sim.step(action)
        assert not terminated and not truncated
        got["obs"].append(obs)
        got["rewards"].append(reward)
        for key in JUMP_INFO_KEYS:
            got[key].append(np.array(info[key], dtype=np.float64))
    np.testing.assert_allclose(np.array(got["obs"]), golden["jump_obs"], rtol=0, atol=TOL)
    np.testing.assert_allclose(np.array(got["rewards"]), golden["jump_rewards"], rtol=0, atol=TOL)
    for key in JUMP_INFO_KEYS:
        np.testing.assert_allclose(np.array(got[key]), golden[f"jump_info_{key}"], rtol=0, atol=TOL, err_msg=key)
    pos = golden["jump_pos"]
    result = runner.run(0, int(golden["jump_seed"]), pos, np.zeros_like(pos))
    actions = hj.pd_action(runner.config, pos[1:], 0.0, result.states[:-1, 3:6], result.states[:-1, 9:12])
    np.testing.assert_allclose(actions, golden["jump_actions"], rtol=0, atol=TOL)
    np.testing.assert_allclose(result.states, golden["jump_obs"], rtol=0, atol=TOL)
    np.testing.assert_allclose(result.rewards, golden["jump_rewards"], rtol=0, atol=TOL)
    last = {key: golden[f"jump_info_{key}"][-1] for key in ("max_height", "goal_dist", "contact_dist", "healthy")}
    assert result.final == pytest.approx({"max_height": last["max_height"], "distance": last["goal_dist"],
                                          "landing_distance": last["contact_dist"], "healthy": last["healthy"],
                                          "return": golden["jump_rewards"].sum()}, abs=TOL)  # fmt: skip


def test_recordings_cover_a_jump_and_its_landing(golden):
    """The fixed action sequences and the tracked trajectories land (d_land set) but peak at their first step, under the
    1.5 m start. The recorded jump climbs above the start and lands after its peak: its first landing, the max-height
    term and the distance at that landing are fancy_gym's numbers of a real jump, in its last reward."""
    assert np.all(golden["step_info_contact_dist"][:, -1] > 0)
    np.testing.assert_array_equal(golden["step_info_max_height"][:, -1], golden["step_info_height"][:, 0])
    assert np.all(golden["track_obs"][:, :, 1].argmax(1) == 0)  # the states after each step: first step highest
    assert np.all(golden["step_info_max_height"] < hj.START_Z) and np.all(golden["track_obs"][:, :, 1] < hj.START_Z)
    height, landing = golden["jump_info_height"], golden["jump_info_contact_dist"]
    land, peak = int(np.argmax(landing > 0)), int(height.argmax())
    assert landing[-1] > 0 and height[peak] > hj.START_Z + 0.1 and 0 < peak < land < hj.HORIZON - 1
    assert np.all(landing[:land] == 0) and np.all(landing[land:] == landing[land])  # measured once, at the landing
    info = {key: golden[f"jump_info_{key}"][-1] for key in ("max_height", "goal_dist", "contact_dist", "healthy")}
    want = -hj.control_cost(golden["jump_actions"][-1]) + hj.final_reward(
        info["max_height"], info["goal_dist"], info["contact_dist"], bool(info["healthy"]))  # fmt: skip
    assert info["max_height"] == height[peak] and golden["jump_rewards"][-1] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_tracking_matches_fancy_gyms_pd_controller(golden, runner, k):
    """fancy_gym's ProDMP wrapper's desired trajectory (sample j at time (j + 1) dt) through our runner: the same
    clipped actions, observations and rewards."""
    seed = int(golden["track_seeds"][k])
    _, q0, qd0 = runner.reset(0, seed)
    pos = np.concatenate([q0[None], golden["track_pos"][k]])
    vel = np.concatenate([qd0[None], golden["track_vel"][k]])
    result = runner.run(0, seed, pos, vel)
    np.testing.assert_allclose(result.states[1:], golden["track_obs"][k], rtol=0, atol=TOL)
    np.testing.assert_allclose(result.rewards, golden["track_rewards"][k], rtol=0, atol=TOL)
    q, qd = result.states[:-1, 3:6], result.states[:-1, 9:12]  # qvel is clipped in the observation: |qd| < 10 here
    assert np.abs(result.states[:, 6:12]).max() < 10
    actions = hj.pd_action(hj.HopperJumpConfig(), pos[1:], vel[1:], q, qd)
    np.testing.assert_allclose(actions, golden["track_actions"][k], rtol=0, atol=TOL)
    assert result.final["max_height"] == pytest.approx(np.max(golden["track_obs"][k][:, 1]), abs=0.01)


def test_fast_runner_matches_the_gymnasium_subclass_step_for_step(runner, sim):
    """The runner's loop (MuJoCo stepped directly, rewards computed after the episode) against HopperJumpEnv.step
    with the PD action, on a jump with a landing: the same observations, rewards and final metrics."""
    pos, vel = _phases(np.array([70.0, 25.0, -1.5, -1.5, 0.5, 0.3, 0.3, -0.6, -0.5, -0.5, 0.0]))
    result = runner.run(0, 11, pos, vel)
    obs, _ = sim.reset(seed=11)
    states, rewards = [obs], []
    for t in range(hj.HORIZON):
        action = hj.pd_action(runner.config, pos[t + 1], vel[t + 1], sim.data.qpos[3:6], sim.data.qvel[3:6])
        obs, reward, _, _, info = sim.step(action)
        states.append(obs)
        rewards.append(reward)
    np.testing.assert_allclose(result.states, np.array(states), rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.rewards, np.array(rewards), rtol=0, atol=1e-12)
    assert info["contact_dist"] > 0 and result.final["landing_distance"] == pytest.approx(info["contact_dist"])
    assert result.final["max_height"] == info["max_height"] and result.final["distance"] == info["goal_dist"]
    assert result.final["healthy"] == float(info["healthy"])


# ------------------------------------------------------------------------------------------------ reward terms


def test_control_cost_and_pd_action():
    assert hj.control_cost(np.array([1.0, -2.0, 0.5])) == pytest.approx(1e-3 * 5.25, abs=1e-15)
    config = hj.HopperJumpConfig(kp=1.0, kd=0.1)
    a = hj.pd_action(config, np.array([0.5, -3.0, 0.2]), np.array([1.0, 0.0, 0.0]), np.zeros(3), np.zeros(3))
    np.testing.assert_array_equal(a, [0.6, -1.0, 0.2])  # 0.5 + 0.1, clipped at -1, 0.2


def test_final_reward_terms():
    # 10 * 1.6 - 3 * 0.2 - 2 * 0.3 + 2 = 16.8
    assert hj.final_reward(1.6, 0.2, 0.3, True) == pytest.approx(16.8, abs=1e-12)
    assert hj.final_reward(1.6, 0.2, 0.3, False) == pytest.approx(14.8, abs=1e-12)
    assert hj.final_reward(1.6, 0.2, None, True) == pytest.approx(16.0 - 0.6 - 10.0 + 2.0, abs=1e-12)
    # each term alone
    assert hj.final_reward(0.0, 0.0, 0.0, False) == 0.0
    assert hj.final_reward(1.0, 0.0, 0.0, False) == 10.0
    assert hj.final_reward(0.0, 1.0, 0.0, False) == -3.0
    assert hj.final_reward(0.0, 0.0, 1.0, False) == -2.0


def test_healthy_boundaries():
    qpos, qvel = np.array([0.0, 0.51, 3.0, -1.0, -1.0, 0.0]), np.zeros(6)
    assert hj.is_healthy(qpos, qvel)  # any pitch
    assert not hj.is_healthy(qpos * [1, 0.5 / 0.51, 1, 1, 1, 1], qvel)  # z = 0.5 is not above 0.5
    assert not hj.is_healthy(qpos, np.array([0, 0, 0, 100.0, 0, 0]))
    assert hj.is_healthy(qpos, np.array([99.9, 0, 0, 0, 0, 0]))
    assert hj.is_healthy(np.array([500.0, 0.6, 0, 0, 0, 0]), qvel)  # x is not part of the test


def test_contact_phase_is_the_first_landing():
    phase = hj.ContactPhase()
    steps = [False, False, True, True, False, False, True, False, True]
    firsts = [phase.update(c) for c in steps]
    assert firsts == [False] * 6 + [True, False, False]  # touch (2), leave (4), land (6), then never again
    phase = hj.ContactPhase()
    assert not any(phase.update(c) for c in [True, True, True])  # never leaves: no landing


def test_sparse_reward_of_a_constructed_episode(sim):
    """A whole episode from a state we set: the last reward is -cost + the final terms of the env's own state."""
    sim.reset(seed=3)
    total = []
    for _ in range(hj.HORIZON):
        obs, reward, _, _, info = sim.step(np.zeros(3))
        total.append(reward)
    assert np.all(np.array(total[:-1]) == 0.0)
    want = hj.final_reward(info["max_height"], info["goal_dist"], info["contact_dist"] or None, info["healthy"])
    assert total[-1] == pytest.approx(want, abs=1e-12)
    assert info["goal_dist"] == pytest.approx(np.linalg.norm(obs[12:15]), abs=1e-12)


# ------------------------------------------------------------------------------------------------ registry, assets


def test_registry_builds_it_with_the_documented_sizes():
    assert "fancy/hopper-jump" in registry.ENV_NAMES
    assert registry.horizon("fancy/hopper-jump") == hj.HORIZON
    with make_env("fancy/hopper-jump", num_episodes=2, workers=0) as env:
        assert (env.dof, env.horizon, env.dt, env.context_dim, env.state_dim) == (3, 250, 0.008, 4, 16)
        start = env.reset(seed=0)
        assert start.context.shape == (2, 4) and start.pos.shape == (2, 3)
        pos = start.pos[:, None].expand(2, 251, 3).contiguous()
        episodes = env.run(pos, pos * 0)
        assert episodes.success is None and episodes.states.shape == (2, 251, 16)
        assert set(episodes.final) >= {"max_height", "distance", "landing_distance", "return"}
    with make_env("fancy/hopper-jump", num_episodes=1, workers=0, context="full") as env:
        assert env.context_dim == 16


@pytest.mark.parametrize(
    "options, words",
    [({"kp": -1.0}, "'kp'"), ({"kd": float("nan")}, "'kd'"), ({"context": "all"}, "'context'"),
     ({"gain": 1.0}, "unknown option 'gain'"),
     ({"backend": "envpool"}, r"one backend, 'python': troll's own Python env \(hopper_jump_sim\.py\) steps MuJoCo")],
)  # fmt: skip
def test_options_are_checked(options, words):
    with pytest.raises(ValueError, match=words):
        make_env("fancy/hopper-jump", num_episodes=1, workers=0, **options)


@pytest.mark.parametrize("options", [{"kp": -1.0}, {"kd": 11.0}, {"context": "mask"}, {"kp": float("nan")}])
def test_config_built_directly_is_checked(options):
    with pytest.raises(ValueError, match=f"fancy/hopper-jump: option '{next(iter(options))}' must be"):
        hj.HopperJumpConfig(**options)


def test_missing_asset_names_the_install_step(monkeypatch):
    real = hj.importlib.util.find_spec
    monkeypatch.setattr(hj.importlib.util, "find_spec", lambda name: None if name == "fancy_gym" else real(name))
    with pytest.raises(hj.AssetError, match=r"pip install --no-deps fancy-gym==0\.3\.0"):
        hj.model_path()
    with pytest.raises(ImportError, match="fancy-gym"):
        make_env("fancy/hopper-jump", num_episodes=1, workers=0)


@pytest.mark.parametrize("algo", ["tce", "ppo"])
def test_train_without_the_asset_fails_before_writing(monkeypatch, tmp_path, capsys, algo):
    from troll.cli import main

    real = hj.importlib.util.find_spec
    monkeypatch.setattr(hj.importlib.util, "find_spec", lambda name: None if name == "fancy_gym" else real(name))
    out = tmp_path / "run"
    code = main(["tce", "train", "--env", "fancy/hopper-jump", "--algo", algo, "--workers", "0", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists(), err
    assert "pip install --no-deps fancy-gym==0.3.0" in err, err


def test_damaged_asset_names_the_install_step(monkeypatch, tmp_path):
    package = tmp_path / "fancy_gym"
    (package / Path(hj.ASSET).parent).mkdir(parents=True)
    (package / hj.ASSET).write_text(hj.model_path().read_text().replace('"0.8 0.6 0.4 1"', '"1 0 0 1"'))
    spec = type("Spec", (), {"submodule_search_locations": [str(package)]})()
    monkeypatch.setattr(hj.importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(hj.AssetError, match="not fancy-gym 0.3.0's hopper-jump model.*--force-reinstall"):
        hj.model_path()
    (package / hj.ASSET).unlink()
    with pytest.raises(hj.AssetError, match="is missing"):
        hj.model_path()


# ------------------------------------------------------------------------------------------------ a jump


def test_a_search_over_pd_targets_jumps_above_the_start(runner):
    """Cross-entropy search (with the elites kept) over three phases of constant PD targets and two switch times:
    the torso climbs above its 1.5 m start, which standing or falling never does (max height 1.4999 from rest)."""
    rest = runner.run(0, 0, *_phases(np.r_[50, 50, np.zeros(9)]))
    assert rest.final["max_height"] < 1.5
    rng = np.random.default_rng(0)
    mean, std = np.r_[40, 30, np.zeros(9)], np.r_[20, 15, np.full(9, 1.5)]
    best, best_params = 0.0, None
    for _ in range(3):
        params = mean + std * rng.standard_normal((12, 11))
        if best_params is not None:
            params[0] = best_params
        heights = np.array([runner.run(0, 0, *_phases(p)).final["max_height"] for p in params])
        elite = params[np.argsort(heights)[-4:]]
        mean, std = elite.mean(0), elite.std(0) + 0.05
        if heights.max() > best:
            best, best_params = heights.max(), params[heights.argmax()]
    assert best > 1.6, best


def _phases(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Desired (T + 1, 3) positions: p[2:5] until step p[0], p[5:8] for |p[1]| more steps, then p[8:11]; zero
    desired velocity."""
    s1 = int(np.clip(p[0], 1, 200))
    s2 = int(np.clip(s1 + abs(p[1]), s1, hj.HORIZON + 1))
    pos = np.empty((hj.HORIZON + 1, 3))
    pos[:s1], pos[s1:s2], pos[s2:] = p[2:5], p[5:8], p[8:11]
    return pos, np.zeros_like(pos)


# ------------------------------------------------------------------------------------------------ presets


def test_presets_are_the_authors_hopper_config():
    """TCE_RL's mprl/config/hopper_jump/tcp/entire (shared.yaml + horeka.yaml), as docs/tce-tasks.md lists it, with
    its departures."""
    from troll.episodic.config import TCEConfig

    tce = TCEConfig.preset("fancy/hopper-jump")
    authors = {"episodes": 64, "eval_episodes": 64, "eval_every": 25, "num_basis": 3, "tau": 0.8, "dmp_alpha": 10.0,
               "dmp_alpha_x": 3.0, "basis_bandwidth": 3.0, "auto_scale_basis": True, "relative_goal": False,
               "weights_scale": 1.0, "goal_scale": 1.0, "policy_hidden": (128, 128), "critic_hidden": (128, 128),
               "min_std": 1e-4, "policy_lr": 1e-4, "critic_lr": 1e-4, "lr_final": 0.01, "policy_epochs": 50,
               "critic_epochs": 50, "critic_minibatches": 1, "gae_lambda": 0.95, "gamma": 1.0, "num_segments": 24,
               "mean_bound": 0.1, "cov_bound": 0.02, "trust_region_coeff": 1.0, "entropy_schedule": "none",
               "covariance": "full", "total_env_steps": 10_000_000}  # fmt: skip
    assert {k: getattr(tce, k) for k in authors} == authors
    # the one departure in the networks (docs/tce-tasks.md): the authors' leaky ReLU, ReLU here
    assert (tce.activation, tce.critic_activation) == ("relu", "relu")
    bbrl = TCEConfig.preset("fancy/hopper-jump", algo="bbrl")
    assert (bbrl.covariance, bbrl.policy_lr, bbrl.critic_lr, bbrl.lr_final, bbrl.trust_region_coeff) == (
        "diag", 3e-4, 3e-4, 1.0, 10.0)  # fmt: skip
    assert (bbrl.num_basis, bbrl.tau, bbrl.mean_bound, bbrl.cov_bound) == (3, 0.8, 0.1, 0.02)
    assert TCEConfig.preset("fancy/hopper-jump", algo="bbrl-cov").covariance == "full"


# ------------------------------------------------------------------------------------------------ PPO's step env


def test_step_env_replays_the_episodic_episode(runner):
    """PPO's step env (the simulator's own action, no PD controller) fed the actions the episodic env's PD controller
    sent on a jump with a landing: the same 250 steps (never terminated, truncated at the last), observations,
    rewards and final metrics, and the episodic env's final metrics in the last step's info."""
    from troll.episodic.envs.step import make_step_task

    actions = []
    runner.step_hook = lambda: actions.append(np.clip(runner.sim.data.ctrl, -1.0, 1.0).copy())  # what MuJoCo applied
    try:
        result = runner.run(0, 11, *_phases(np.array([70.0, 25.0, -1.5, -1.5, 0.5, 0.3, 0.3, -0.6, -0.5, -0.5, 0.0])))
    finally:
        runner.step_hook = None
    task = make_step_task("fancy/hopper-jump", seed=0)
    try:
        assert task.horizon == hj.HORIZON and task.dt == hj.DT
        assert task.observation_space.shape == (16,) and task.action_space.shape == (3,)
        assert (task.action_space.low == -1).all() and (task.action_space.high == 1).all()
        obs, info = task.reset(options={"episode_seed": 11})
        states, rewards, ends = [obs], [], []
        for action in actions:
            obs, reward, terminated, truncated, info = task.step(action)
            states.append(obs)
            rewards.append(reward)
            ends.append((terminated, truncated))
    finally:
        task.close()
    assert len(actions) == hj.HORIZON and ends == [(False, False)] * (hj.HORIZON - 1) + [(False, True)]
    np.testing.assert_allclose(np.array(states), result.states, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.array(rewards), result.rewards, rtol=0, atol=1e-12)
    final = {k: info[k] for k in ("max_height", "distance", "landing_distance", "healthy")}
    assert set(info) == {*final, "episode_return"} and final["landing_distance"] > 0
    assert final == pytest.approx({k: result.final[k] for k in final}, abs=1e-12)
    assert info["episode_return"] == pytest.approx(result.final["return"], abs=1e-9)


def test_ppo_trains_end_to_end(tmp_path, capsys):
    """``troll tce train --algo ppo`` on hopper jump: 500 env steps (two rollouts of one 250-step episode), evaluated
    on 2 episodes after each; the run folder of a PPO run, and the metrics TCE's hopper runs report, all finite."""
    pytest.importorskip("stable_baselines3")
    import json
    import math

    from troll.cli import main
    from troll.runs.files import read_jsonl

    out = tmp_path / "ppo"
    argv = ["tce", "train", "--env", "fancy/hopper-jump", "--algo", "ppo", "--out", str(out), "--steps", "500",
            "--ppo-n-steps", "250", "--ppo-batch-size", "50", "--ppo-n-epochs", "1", "--eval-episodes", "2",
            "--eval-every", "1", "--episodes", "1", "--no-progress"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("500 env steps: eval ")]
    assert len(lines) == 1 and "distance" in lines[0] and "max_height" in lines[0] and "success" not in lines[0]
    assert {p.name for p in out.iterdir()} == {".troll-run.json", "config.json", "metrics.jsonl", "summary.json",
                                               "plots.png", "checkpoint-500.zip"}  # fmt: skip
    config = json.loads((out / "config.json").read_text())["config"]
    assert (config["algo"], config["env"], config["eval_every_steps"]) == ("ppo", "fancy/hopper-jump", 250)
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["env_steps"] for r in rows] == [250, 500]
    for row in rows:
        assert {"eval/return", "eval/distance", "eval/max_height", "rollout/return", "rollout/max_height"} <= set(row)
        assert "eval/success_rate" not in row and "rollout/success_rate" not in row  # no success rule
        assert row["rollout/episodes"] == 1 and 0 < row["eval/max_height"] < 3
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_height"] == rows[-1]["eval/max_height"] and summary["success_rate"] is None
    assert summary["return"] == rows[-1]["eval/return"] and summary["env_steps"] == 500


def test_every_algorithm_runs_here_and_a_study_defaults_to_all_of_them():
    from argparse import Namespace

    from troll.tce import flags as opts
    from troll.tce import study
    from troll.tce.ppo import PPOConfig

    for algo in opts.ALGOS:
        assert opts.check_env("fancy/hopper-jump", algo) == "fancy/hopper-jump"
    assert study._fresh_spec(Namespace(), {}, "fancy/hopper-jump").algos == list(opts.ALGOS)
    # PPO's budget and evaluations follow the hopper preset's: 10M env steps, 64 episodes every 25 x 64 x 250 steps
    ppo = PPOConfig.preset("fancy/hopper-jump")
    assert (ppo.total_env_steps, ppo.eval_episodes, ppo.eval_every_steps) == (10_000_000, 64, 400_000)
    assert ppo.horizon == hj.HORIZON == registry.horizon("fancy/hopper-jump")
