"""The EnvPool backends (metaworld/*, and gym/* where they share the rule), the env options and the pieces both
Meta-World backends share: task ids, seeding (independent of threads, repeatable, a second run of one reset), the
mocap controller against the Python env's own mocap, the finger start, the context options, honest final
distances, non-finite detection, every bad option refused with its name before anything is built, and a run folder
from before a backend existed resuming on the Python package. Reacher's own checks: test_reacher_envpool.py."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from troll.episodic.envs import NonFiniteError, make_env
from troll.episodic.envs.registry import METAWORLD_TASKS, check_options, default_backend

pytest.importorskip("envpool")
pytest.importorskip("metaworld")


def test_task_ids_cover_all_50_tasks():
    import envpool

    from troll.episodic.envs.envpool_backend import task_id

    ids = {task_id(t) for t in METAWORLD_TASKS}
    assert len(ids) == 50 and ids <= set(envpool.list_all_envs())
    assert task_id("button-press-topdown-wall-v3") == "MetaWorld/ButtonPressTopdownWall-v3"


def test_envpool_seeding_threads_and_repeats():
    with (
        make_env("metaworld/push-v3", num_episodes=3, workers=2) as two,
        make_env("metaworld/push-v3", num_episodes=3, workers=0) as one,
    ):
        assert type(one).__name__ == "EnvPoolMetaWorld" and one.context_dim == 4
        a, b, c = two.reset(5), one.reset(5), one.reset(6)
        assert torch.equal(a.context, b.context) and not torch.equal(a.context, c.context)
        assert len(set(a.context[:, 0].tolist())) == 3  # each episode its own variation
        one.reset(5)
        pos = torch.cat(
            [a.pos[:, None, :3] + torch.linspace(0, 0.1, 501)[None, :, None], -a.pos[:, None, 3:].expand(-1, 501, 1)], 2
        )
        vel = torch.zeros_like(pos)
        ra, rb = two.run(pos, vel), one.run(pos, vel)
        rb2 = one.run(pos, vel)  # a second run of the same reset rebuilds the same episodes
    for r in (rb, rb2):
        assert torch.equal(ra.states, r.states) and torch.equal(ra.rewards, r.rewards)
        assert torch.equal(ra.success, r.success) and ra.final.keys() == r.final.keys()


def test_mocap_controller_integrates_the_python_envs_mocap():
    """controller="mocap" integrates Meta-World's mocap target exactly, clipping at the task's bounds included."""
    from troll.episodic.envs.metaworld import MetaWorldConfig, MetaWorldRunner

    runner = MetaWorldRunner(MetaWorldConfig("push-v3", controller="mocap", gain=100.0))
    try:
        ctx, pos0, _ = runner.reset(0, 11)
        assert np.allclose(runner.sim.data.mocap_pos[0], runner.sim.hand_init_pos)
        # down through the table (z clipped at mocap_low 0.05) and sideways
        end = pos0 + np.array([0.15, 0.1, -0.4, 0.0])
        s = np.clip(np.arange(501) / 300, 0, 1)[:, None]
        runner.run(0, 11, pos0 + s * (end - pos0), np.zeros((501, 4)))
        np.testing.assert_allclose(runner.controller.mocap[0], runner.sim.data.mocap_pos[0], atol=1e-9)
        assert runner.controller.mocap[0, 2] == pytest.approx(runner.sim.mocap_low[2])
    finally:
        runner.close()


def test_finger_start_and_context_options():
    from troll.episodic.envs.control import FINGER_START
    from troll.episodic.envs.metaworld import MetaWorldConfig, MetaWorldRunner

    for task in ("reach-v3", "door-open-v3"):
        runner = MetaWorldRunner(MetaWorldConfig(task, gripper_start="fingers", context="full"))
        try:
            ctx, pos, _ = runner.reset(0, 3)
            joint = runner.sim.data.qpos[runner.sim.model.joint("r_close").qposadr[0]]
            assert joint == pytest.approx(FINGER_START, abs=1e-6) and pos[3] == FINGER_START
            assert ctx.shape == (39,) and runner.spec.context_dim == 39
        finally:
            runner.close()
    with make_env("metaworld/reach-v3", num_episodes=2, workers=0, context="full", gripper_start="fingers") as env:
        start = env.reset(0)
        assert start.context.shape == (2, 39) and torch.all(start.pos[:, 3] == FINGER_START)


def test_no_distance_where_metaworld_hard_codes_zero():
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    from troll.episodic.envs.metaworld import NO_DISTANCE

    zero = {t for t, cls in ALL_V3_ENVIRONMENTS.items() if '"obj_to_target": 0,' in inspect.getsource(cls)}
    assert zero == NO_DISTANCE
    for backend in ("envpool", "python"):
        with make_env("metaworld/door-open-v3", num_episodes=1, workers=0, backend=backend) as env:
            start = env.reset(0)
            hold = start.pos[:, None].expand(-1, 501, -1).contiguous()
            ep = env.run(hold, torch.zeros_like(hold))
        assert "distance" not in ep.final and {"return", "success_any"} <= ep.final.keys()


@pytest.mark.parametrize("name", ["metaworld/reach-v3", "gym/reacher"])
def test_envpool_non_finite_names_episode_and_step(monkeypatch, name):
    with make_env(name, num_episodes=2, workers=0, backend="envpool") as env:
        start = env.reset(0)
        real = env._env.step
        calls = []

        def step(action):
            obs, r, te, tr, info = real(action)
            calls.append(1)
            if len(calls) == 7:
                obs = obs.copy()
                obs[1, 5] = np.nan
            return obs, r, te, tr, info

        monkeypatch.setattr(env._env, "step", step)
        hold = start.pos[:, None].expand(-1, env.horizon + 1, -1).contiguous()
        with pytest.raises(NonFiniteError, match=rf"{name}: non-finite observation at step 7 of episode 1"):
            env.run(hold, torch.zeros_like(hold))


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("toy/viapoint", {"dt": "abc"}, "option 'dt' must be a finite number"),
        ("gym/reacher", {"kp": None}, "option 'kp' must be a finite number"),
        ("toy/viapoint", {"max_accel": 1e300}, "option 'max_accel' must be a finite number in"),
        ("toy/viapoint", {"kd": float("nan")}, "option 'kd'"),
        ("toy/viapoint", {"horizon": 2.5}, "option 'horizon' must be an integer"),
        ("metaworld/push-v3", {"gain": True}, "option 'gain'"),
        ("metaworld/push-v3", {"controller": "joint"}, "option 'controller' must be 'hand' or 'mocap'"),
        ("metaworld/push-v3", {"context": "all"}, "option 'context' must be 'varying' or 'full'"),
        ("metaworld/push-v3", {"gripper_start": "open"}, "option 'gripper_start'"),
        ("metaworld/push-v3", {"backend": "mujoco"}, "option 'backend' must be 'envpool' or 'python'"),
        ("toy/viapoint", {"backend": "envpool"}, "backend 'envpool' is available for gym/\\* and metaworld/\\* only"),
        ("gym/reacher", {"backend": "mujoco"}, "option 'backend' must be 'envpool' or 'python'"),
        ("gym/reacher", {"gain": 3.0}, "unknown option 'gain'"),
    ],
)
def test_bad_options_are_refused_with_their_name(name, options, match):
    with pytest.raises(ValueError, match=match):
        check_options(name, options)
    with pytest.raises(ValueError, match=match):
        make_env(name, num_episodes=1, workers=0, **options)


def test_backend_defaults_and_missing_envpool(monkeypatch):
    import importlib.util

    assert check_options("metaworld/push-v3", {})["backend"] == "envpool"
    assert check_options("metaworld/door-open-v3", {})["backend"] == "python"  # differs beyond noise: docs/tce.md
    assert check_options("gym/reacher", {})["backend"] == default_backend("gym/reacher-sparse") == "envpool"
    assert check_options("gym/reacher-sparse", {"backend": "python"})["backend"] == "python"
    assert "backend" not in check_options("toy/viapoint", {})
    with pytest.raises(ValueError, match="Did you mean 'metaworld/push-v3'"):
        check_options("metaworld/psh-v3", {})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "envpool" else real(n, *a))
    with pytest.raises(ImportError, match=r"needs envpool: .*--backend python runs the metaworld package instead"):
        make_env("metaworld/push-v3", num_episodes=1)
    with pytest.raises(ImportError, match=r"needs envpool: .*--backend python runs gymnasium's Reacher-v5 instead"):
        make_env("gym/reacher", num_episodes=1, backend="envpool")


@pytest.mark.parametrize("command", ["train", "study"])
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "toy/viapoint", "--env-options", '{"dt": "abc"}'], "--env-options: toy/viapoint: option 'dt'"),
        (["--env", "toy/viapoint", "--env-options", '{"kp": null}'], "option 'kp' must be a finite number"),
        (["--env", "toy/viapoint", "--env-options", '{"max_accel": 1e300}'], "option 'max_accel'"),
        (["--env", "toy/viapoint", "--env-options", '{"kd": NaN}'], "option 'kd'"),
        (["--env", "toy/viapoint", "--backend", "envpool"], "--backend: toy/viapoint: backend 'envpool' is available"),
        (["--env", "gym/reacher", "--env-options", '{"backend": "gymnasium"}'], "--backend: gym/reacher: option"),
        # a backend given beside a bad option: the error names the flag of the bad one only
        (["--env", "gym/reacher", "--backend", "python", "--env-options", '{"kp": null}'], "error: --env-options: gym"),
        (["--env", "metaworld/push-v3", "--env-options", '{"gain": 1e300}'], "option 'gain'"),
        (["--env", "metaworld/push-v3", "--env-options", '{"context": 3}'], "option 'context'"),
    ],
)
def test_cli_refuses_bad_env_options_before_writing(tmp_path, capsys, command, argv, message):
    from troll.cli import main

    out = tmp_path / "run"
    code = main(["tce", command, "--out", str(out), "--steps", "64", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not out.exists()


def test_cli_records_the_backend_in_the_config():
    from troll.tce import flags as opts

    def backend(env, **env_options):
        config = opts.build_config("tce", env, seed=0, steps=None, options={"env_options": env_options}, threads=1,
                                   workers=1)  # fmt: skip
        return config.env_options.get("backend")

    assert backend("metaworld/push-v3") == "envpool" and backend("metaworld/push-v3", backend="python") == "python"
    assert backend("metaworld/door-open-v3") == "python" and backend("toy/viapoint") is None
    assert backend("gym/reacher") == default_backend("gym/reacher")
    assert backend("gym/reacher-sparse", backend="envpool") == "envpool"


@pytest.mark.parametrize("env", ["metaworld/reach-v3", "gym/reacher"])
def test_a_run_from_before_the_backend_resumes_on_python(env):
    """A run folder's config without "backend" (written before the env had an EnvPool backend) continues on the
    Python package, whatever the default now is; asking for EnvPool on resume is refused as a change."""
    import argparse

    from troll.episodic.config import TCEConfig
    from troll.runs.files import UsageError
    from troll.tce.cli import train_config

    old = TCEConfig.preset(env).to_dict()
    old["env_options"] = {k: v for k, v in old["env_options"].items() if k != "backend"}
    assert train_config(argparse.Namespace(), old).env_options["backend"] == "python"
    with pytest.raises(UsageError, match="--env-options"):
        train_config(argparse.Namespace(backend="envpool"), old)


@pytest.mark.parametrize("backend", ["envpool", "python"])
def test_the_authors_options_reach_the_goal(backend):
    """The preset's env options (mocap, gain 100, fingers, full context) track a minimum-jerk move to 3 cm above
    reach-v3's goal within 3 cm (the hand lags the mocap by a few steps) and solve it, on both backends."""
    options = {"controller": "mocap", "gain": 100.0, "gripper_start": "fingers", "context": "full"}
    with make_env("metaworld/reach-v3", num_episodes=2, workers=0, backend=backend, **options) as env:
        start = env.reset(0)
        end = torch.cat([start.context[:, 36:39] + torch.tensor([0.0, 0.0, 0.03]), start.pos[:, 3:]], 1)
        k = (torch.arange(501) / 300).clamp(max=1)[None, :, None]
        pos = start.pos[:, None] + (end - start.pos)[:, None] * (10 * k**3 - 15 * k**4 + 6 * k**5)
        ep = env.run(pos, torch.zeros_like(pos))
    assert env.context_dim == 39 and ep.success.all() and (ep.final["distance"] < 0.03).all()
    assert (ep.states[:, 1:, :3] - pos[:, 1:, :3]).norm(dim=-1).max() < 0.03
