"""``troll tce render``: the frames show each MuJoCo task's scene (not a blank image) and change as it moves, a run
(TCE or PPO) renders end to end into GIF and MP4 (``tce train --video`` and ``troll tce render``), a study links its
cells' videos and asks every cell for one, and a machine without offscreen OpenGL gets an error naming the packages
before anything is written.

Tiny on purpose: 48 x 64 pixels, a handful of frames per episode.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

from troll.cli import main  # noqa: E402
from troll.tce import render  # noqa: E402

render.use_offscreen_gl()
SIZE = {"width": 64, "height": 48}


def _blank_checks(frames: list[np.ndarray]) -> None:
    """A scene: several colours (pixel std), most pixels off the most common colour (the sky or the floor is not
    everything), and the last frame differs from the first (the robot moved)."""
    assert frames and all(f.shape == (48, 64, 3) and f.dtype == np.uint8 for f in frames)
    for f in frames:
        assert f.std() > 10, f.std()
        flat = f.reshape(-1, 3)
        _, counts = np.unique(flat, axis=0, return_counts=True)
        assert counts.max() / len(flat) < 0.9
    # measured: a mean change of 0.54 (Reacher's small arm, 64 x 48) to 19 levels; an unchanged scene gives 0
    assert np.abs(frames[-1].astype(int) - frames[0].astype(int)).mean() > 0.25


def _hold_then_move(runner, seed: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    _, pos0, _ = runner.reset(0, seed)
    horizon = runner.spec.horizon
    pos = np.repeat(pos0[None], horizon + 1, axis=0)
    pos[horizon // 4 :] += shift
    return pos, np.zeros_like(pos)


@pytest.mark.parametrize("task", ["hopper", "reacher", "metaworld", "box-pushing"])
def test_frames_show_the_scene_of_every_mujoco_task(task):
    if task == "hopper":
        from troll.episodic.envs.hopper_jump import HopperJumpConfig
        from troll.episodic.envs.hopper_jump_sim import HopperJumpRunner

        runner, shift = HopperJumpRunner(HopperJumpConfig()), -0.8
    elif task == "reacher":
        from troll.episodic.envs.reacher import ReacherConfig, ReacherRunner

        runner, shift = ReacherRunner(ReacherConfig()), 1.0
    elif task == "box-pushing":
        from troll.episodic.envs.box_pushing import BoxPushingConfig, BoxPushingRunner

        runner, shift = BoxPushingRunner(BoxPushingConfig()), 0.3
    else:
        from troll.episodic.envs.metaworld import MetaWorldConfig, MetaWorldRunner

        runner, shift = MetaWorldRunner(MetaWorldConfig(task="reach-v3")), 0.1
    try:
        pos, vel = _hold_then_move(runner, 3, shift)
        frames, final = render.episode_frames(runner, 0, 3, pos, vel, every=runner.spec.horizon // 3, **SIZE)
        assert len(frames) == 4 and "return" in final
        _blank_checks(frames)
        assert not hasattr(runner.sim, "step") or "step_and_grab" not in repr(runner.sim.__dict__.get("step"))
    finally:
        runner.close()


def test_box_pushing_videos_frame_the_table_not_the_cage():
    """The free camera of box pushing's ``VIEW``: its green goal marker covers 37 pixels of a 160 x 120 frame of
    seed 3 (measured), against 5 from the camera that frames all bodies (the cage, 5.5 m away)."""
    from troll.episodic.envs.box_pushing import BoxPushingConfig, BoxPushingRunner

    runner = BoxPushingRunner(BoxPushingConfig())
    try:
        _, pos0, _ = runner.reset(0, 3)
        pos = np.repeat(pos0[None], runner.spec.horizon + 1, axis=0)
        frames, _ = render.episode_frames(runner, 0, 3, pos, np.zeros_like(pos), every=runner.spec.horizon,
                                          width=160, height=120)  # fmt: skip
    finally:
        runner.close()
    f = frames[0].astype(int)
    green = (f[..., 1] > 120) & (f[..., 0] < 100) & (f[..., 2] < 100)
    assert green.sum() >= 20, green.sum()


@pytest.fixture(scope="module")
def hopper_run(tmp_path_factory):
    """One TCE iteration of 2 episodes on fancy/hopper-jump."""
    from troll.episodic.config import TCEConfig
    from troll.tce.run import train

    out = tmp_path_factory.mktemp("render") / "run"
    config = TCEConfig.preset("fancy/hopper-jump", total_env_steps=500, episodes=2, eval_episodes=2, workers=0,
                              policy_hidden=(8,), critic_hidden=(8,), policy_epochs=1, critic_epochs=1)  # fmt: skip
    train(config, out, progress=False, plot=False)  # what `troll tce train` runs, without matplotlib's import
    return out


def test_train_video_renders_the_run_at_its_end(hopper_run, tmp_path, monkeypatch, capsys):
    """``tce train --video`` hands the finished run to the renderer (stubbed here: rendering is tested below); a
    finished run resumed with --video renders the video it lacks."""
    calls = []

    def fake(out, *, path, **sizes):
        calls.append((out, path, sizes))
        return {"path": str(out / render.VIDEO_FILE), "episodes": 3, "frames": 1, "fps": 31.25}

    monkeypatch.setattr(render, "render_run", fake)
    assert main(["tce", "train", "--out", str(hopper_run), "--resume", "--video"]) == 0
    assert calls == [(hopper_run, None, {"overwrite": False, "episodes": 3, "width": 320, "height": 240, "fps": 30})]
    assert f"wrote {hopper_run / render.VIDEO_FILE}: 3 evaluation episode(s)" in capsys.readouterr().out
    calls.clear()
    ppo = tmp_path / "p"
    assert main(["tce", "train", "--env", "gym/reacher", "--algo", "ppo", "--out", str(ppo), "--steps", "64",
                 "--ppo-n-steps", "64", "--ppo-batch-size", "32", "--ppo-n-epochs", "1", "--eval-episodes", "1",
                 "--no-progress", "--video"]) == 0  # fmt: skip
    assert calls == [(ppo, None, {"overwrite": False, "episodes": 3, "width": 320, "height": 240, "fps": 30})]


def _two_hopper_episodes_as_gif(run: Path, gif: Path, capsys) -> None:
    """``troll tce render`` of two hopper episodes into a GIF at 5 fps, read back: 22 frames, each a scene."""
    assert main(["tce", "render", str(run), "--out", str(gif), "--episodes", "2", "--width", "64",
                 "--height", "48", "--fps", "5"]) == 0  # fmt: skip
    assert "2 evaluation episode(s), 22 frames at 5 fps" in capsys.readouterr().out
    frames = _gif_frames(gif)
    assert len(frames) == 2 * (1 + 250 // 25)  # the start, then every 25th step of 8 ms: 5 frames per second
    _blank_checks(frames)


def test_a_run_renders_end_to_end(hopper_run, tmp_path, capsys):
    _two_hopper_episodes_as_gif(hopper_run, tmp_path / "hopper.gif", capsys)


@pytest.mark.parametrize("env", ["fancy/box-pushing-dense", "gym/reacher"])
def test_runs_of_other_tasks_render_their_evaluation_episodes(env, tmp_path, capsys):
    """One TCE iteration on box pushing, and on Reacher trained on EnvPool (which has no renderer: the video is
    drawn on its Python simulator), rendered by ``troll tce render``: the frames show the scene, and on box pushing
    the rendered episodes are the run's evaluation episodes (the same return; Reacher's two simulators draw their
    episodes from different generators)."""
    from troll.episodic.config import TCEConfig
    from troll.tce.run import train

    out = tmp_path / "run"
    horizon, options = (100, {}) if env.startswith("fancy") else (50, {"backend": "envpool"})
    config = TCEConfig.preset(env, total_env_steps=2 * horizon, episodes=2, eval_episodes=2, workers=0,
                              policy_hidden=(8,), critic_hidden=(8,), policy_epochs=1, critic_epochs=1,
                              env_options=options)  # fmt: skip
    train(config, out, progress=False, plot=False)
    done = render.render_run(out, path=tmp_path / "v.gif", episodes=2, **SIZE)
    frames = _gif_frames(tmp_path / "v.gif")
    assert len(frames) == done["frames"] > 2
    _blank_checks(frames)
    if env.startswith("fancy"):  # the run's metrics sum float32 rewards (100 of about 4: 1e-5 apart); another
        last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]  # episode: > 1
        assert np.mean([f["return"] for f in done["final"]]) == pytest.approx(last["eval/return"], abs=1e-4)


def _gif_frames(gif: Path) -> list[np.ndarray]:
    from PIL import Image

    with Image.open(gif) as image:
        frames = []
        for i in range(image.n_frames):
            image.seek(i)
            frames.append(np.array(image.convert("RGB")))
    return frames


def test_a_run_renders_to_mp4(hopper_run, tmp_path, capsys):
    """The MP4 writer (imageio-ffmpeg), read back: every frame there, each still a scene after H.264's losses."""
    import imageio.v2 as imageio

    mp4 = tmp_path / "hopper.mp4"
    assert main(["tce", "render", str(hopper_run), "--out", str(mp4), "--episodes", "1", "--width", "64",
                 "--height", "48", "--fps", "5"]) == 0  # fmt: skip
    assert "1 evaluation episode(s), 11 frames at 5 fps" in capsys.readouterr().out
    frames = [np.asarray(f)[..., :3] for f in imageio.mimread(mp4)]
    assert len(frames) == 1 + 250 // 25
    _blank_checks(frames)
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary name was renamed


@pytest.fixture(scope="module")
def ppo_hopper_run(tmp_path_factory):
    """PPO on fancy/hopper-jump: one rollout of 250 env steps (one episode), evaluated on 2 episodes at its end."""
    pytest.importorskip("stable_baselines3")
    from troll.tce.ppo import PPOConfig, train

    out = tmp_path_factory.mktemp("render") / "ppo"
    config = PPOConfig(env="fancy/hopper-jump", total_env_steps=250, eval_every_steps=250, eval_episodes=2,
                       n_steps=250, batch_size=50, n_epochs=1, net_arch=(8,))  # fmt: skip
    train(config, out, progress=False, plot=False)
    return out


def test_a_ppo_run_renders_its_evaluation_episodes(ppo_hopper_run, tmp_path, capsys):
    """``troll tce render`` on a PPO run: its saved policy's mean action on the run's evaluation episodes, drawn as
    a TCE run's are (the frames show the scene); the episodes are the run's last evaluation's (the same return)."""
    _two_hopper_episodes_as_gif(ppo_hopper_run, tmp_path / "ppo.gif", capsys)
    done = render.render_run(ppo_hopper_run, path=tmp_path / "ppo.mp4", episodes=2, **SIZE)
    assert (tmp_path / "ppo.mp4").stat().st_size > 0 and done["frames"] == 2 * (1 + 250 // 4)
    last = [json.loads(line) for line in (ppo_hopper_run / "metrics.jsonl").read_text().splitlines()][-1]
    assert np.mean([f["return"] for f in done["final"]]) == pytest.approx(last["eval/return"], abs=1e-9)
    assert np.mean([f["max_height"] for f in done["final"]]) == pytest.approx(last["eval/max_height"], abs=1e-9)


def test_a_runs_video_is_its_own_file(hopper_run, tmp_path):
    """The video rendered into a run folder (its default name) is the run's: ``--overwrite`` may replace the run,
    where a file the run did not write would be refused."""
    import shutil

    from troll import runs

    out = tmp_path / "run"
    shutil.copytree(hopper_run, out)
    runs.begin(out, "tce train")  # the manifest of the current layout, as a resumed run records it
    runs.release(out)
    render.render_run(out, episodes=1, width=32, height=32, fps=2)
    assert (out / render.VIDEO_FILE).is_file() and runs.foreign(out, "tce train") == []
    assert runs.check_folder(out, "tce train", resume=False, overwrite=True) == "replace"


def test_a_ppo_run_without_stable_baselines3_is_refused_by_name(ppo_hopper_run, tmp_path, monkeypatch, capsys):
    import importlib.util

    from troll.tce import ppo

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(ppo.importlib.util, "find_spec", lambda n, *a: None if n == "stable_baselines3" else
                        find_spec(n, *a))  # fmt: skip
    monkeypatch.setattr(render, "check_gl", lambda: pytest.fail("refused before the GL check"))
    assert main(["tce", "render", str(ppo_hopper_run), "--out", str(tmp_path / "v.gif")]) == 2
    assert "--algo ppo needs stable-baselines3, which is not installed" in capsys.readouterr().err
    assert not (tmp_path / "v.gif").exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [(["--out", "x.avi"], "must end in .gif or .mp4"), (["--episodes", "0"], "--episodes must be an integer")],
)
def test_bad_render_requests_are_refused(hopper_run, argv, words, capsys):
    assert main(["tce", "render", str(hopper_run), *argv]) == 2
    assert words in capsys.readouterr().err


def test_an_existing_out_is_replaced_only_with_overwrite(hopper_run, tmp_path, monkeypatch, capsys):
    """A file given as --out that exists (or a link) is the user's: refused (exit 2, untouched) unless --overwrite;
    the run's own RUN/video.mp4 is redrawn without it, named or not; a path below a file is refused up front."""

    def draw(config, checkpoint, path, **sizes):
        path.write_bytes(b"new video")
        return {"path": path, "episodes": sizes["episodes"], "frames": 1, "fps": sizes["fps"], "final": []}

    monkeypatch.setattr(render, "check_gl", lambda: None)
    monkeypatch.setattr(render, "_render", lambda *a, **k: pytest.fail("drew over an existing --out"))
    mine = tmp_path / "mine.mp4"
    mine.write_bytes(b"the user's video")
    assert main(["tce", "render", str(hopper_run), "--out", str(mine)]) == 2
    assert f"--out {mine} exists: pass --overwrite to replace it" in capsys.readouterr().err
    assert mine.read_bytes() == b"the user's video"
    (tmp_path / "folder.mp4").mkdir()
    assert main(["tce", "render", str(hopper_run), "--out", str(tmp_path / "folder.mp4"), "--overwrite"]) == 2
    assert "folder.mp4 is a folder: give a file name ending in .gif or .mp4" in capsys.readouterr().err

    link = tmp_path / "link.mp4"
    link.symlink_to(tmp_path / "gone.mp4")  # a dangling link is a file name taken too
    assert main(["tce", "render", str(hopper_run), "--out", str(link)]) == 2
    assert "exists: pass --overwrite" in capsys.readouterr().err and link.is_symlink()
    # a path below a file cannot be written: refused before any episode, as is a run that is not there (first)
    assert main(["tce", "render", str(hopper_run), "--out", str(mine / "v.mp4"), "--overwrite"]) == 2
    assert f"the video's folder {mine} exists and is not a folder" in capsys.readouterr().err
    assert main(["tce", "render", str(tmp_path / "no-run"), "--out", str(mine)]) == 2
    assert "holds no run of 'troll tce train'" in capsys.readouterr().err

    monkeypatch.setattr(render, "_render", draw)
    assert main(["tce", "render", str(hopper_run), "--out", str(mine), "--overwrite"]) == 0
    assert mine.read_bytes() == b"new video"
    run = shutil.copytree(hopper_run, tmp_path / "run")
    (run / render.VIDEO_FILE).write_bytes(b"an older rendering")
    assert main(["tce", "render", str(run)]) == 0
    assert (run / render.VIDEO_FILE).read_bytes() == b"new video"
    (run / render.VIDEO_FILE).write_bytes(b"an older rendering")  # named: still the run's own video
    assert main(["tce", "render", str(run), "--out", str(run / render.VIDEO_FILE)]) == 0
    assert (run / render.VIDEO_FILE).read_bytes() == b"new video"


def test_without_offscreen_gl_the_error_names_the_packages(hopper_run, tmp_path, monkeypatch, capsys):
    """MUJOCO_GL=glfw without a display (a fresh process: MuJoCo reads it at import) stands for a machine without
    EGL or OSMesa; the command turns the error into exit status 1 before any episode runs."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env |= {"MUJOCO_GL": "glfw", "PYTHONPATH": os.pathsep.join(sys.path)}
    code = "from troll.tce.render import check_gl; check_gl()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "RenderError" in done.stderr, done.stderr
    assert "MUJOCO_GL='glfw'" in done.stderr and "libegl1" in done.stderr and "libosmesa6" in done.stderr
    # the probe leaves no half-built mujoco.Renderer whose destructor reports an unrelated error
    assert "Exception ignored" not in done.stderr and "_mjr_context" not in done.stderr, done.stderr

    def no_gl():
        raise render.RenderError("offscreen rendering is unavailable: libegl1")

    monkeypatch.setattr(render, "check_gl", no_gl)
    monkeypatch.setattr(render, "_render", lambda *a, **k: pytest.fail("an episode ran without GL"))
    assert main(["tce", "render", str(hopper_run), "--out", str(tmp_path / "v.gif")]) == 1
    assert "libegl1" in capsys.readouterr().err and not (tmp_path / "v.gif").exists()


@pytest.mark.parametrize(
    ("gl", "words"),
    [
        (
            {"MUJOCO_GL": "egl", "MUJOCO_EGL_DEVICE_ID": "99"},
            "backend mujoco.egl: RuntimeError: The MUJOCO_EGL_DEVICE_ID",
        ),
        ({"MUJOCO_GL": "disable"}, "RenderError: MuJoCo has no GL context (MUJOCO_GL disables it)"),
    ],
    ids=["egl-without-its-device", "gl-disabled"],
)
def test_a_failing_gl_backend_gives_one_clear_error(gl, words):
    """An EGL context whose constructor fails (a device that does not exist) is half-built like the Renderer above:
    its destructor's AttributeError (``_context``) is not printed after the real error. MUJOCO_GL=disable leaves
    mujoco without a GLContext at all: the message says so, not an AttributeError of the mujoco module."""
    env = {**os.environ, **gl, "PYTHONPATH": os.pathsep.join(sys.path)}
    code = "from troll.tce.render import check_gl; check_gl()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and words in done.stderr, done.stderr
    assert "libegl1" in done.stderr and ".." not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr and "AttributeError" not in done.stderr, done.stderr


def _without_gl() -> dict:
    """The environment of a process on a machine without offscreen OpenGL: MUJOCO_GL=glfw and no display."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    return env | {"MUJOCO_GL": "glfw", "PYTHONPATH": os.pathsep.join(sys.path)}


def test_a_study_with_videos_without_offscreen_gl_writes_nothing(tmp_path):
    """``tce study --videos`` checks offscreen OpenGL before anything is written: exit 2, the packages named, no
    config.json, no cell log, no traceback of a half-built renderer."""
    out = tmp_path / "study"
    argv = ["-m", "troll.cli", "tce", "study", "--env", "gym/reacher", "--algos", "tce", "--seeds", "1", "--steps",
            "800", "--out", str(out), "--videos"]  # fmt: skip
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=_without_gl(), timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("troll tce study: error: --videos: offscreen rendering is unavailable")
    assert "libegl1" in done.stderr and "libosmesa6" in done.stderr
    assert "Traceback" not in done.stderr and "_mjr_context" not in done.stderr, done.stderr
    assert not out.exists()


def test_a_study_with_videos_on_the_toy_task_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(render, "check_gl", lambda: pytest.fail("no GL check is needed to refuse the toy task"))
    out = tmp_path / "study"
    assert main(["tce", "study", "--env", "toy/viapoint", "--out", str(out), "--videos"]) == 2
    assert "--videos renders MuJoCo tasks; toy/viapoint is torch code" in capsys.readouterr().err
    assert not out.exists()
    # the cells of a cluster render on its nodes (no GL check here), yet the toy task has nothing to render anywhere
    argv = ["tce", "study", "--env", "toy/viapoint", "--out", str(out), "--videos", "--executor", "slurm",
            "--slurm-local"]  # fmt: skip
    assert main(argv) == 2
    assert "--videos renders MuJoCo tasks; toy/viapoint is torch code" in capsys.readouterr().err
    assert not out.exists()


def test_a_study_links_its_cells_videos(tmp_path):
    from troll.study import Cell
    from troll.tce import study

    spec = study.StudySpec("fancy/hopper-jump", ["tce", "bbrl"], [0], videos=True)
    cells = [Cell(None, algo, 0, tmp_path / algo / "seed0", {"algo": algo, "seed": 0, "steps": None, "options": {}})
             for algo in ("tce", "bbrl")]  # fmt: skip
    (tmp_path / "tce" / "seed0").mkdir(parents=True)
    (tmp_path / "tce" / "seed0" / study.VIDEO_FILE).write_bytes(b"x")
    assert "[tce seed 0](tce/seed0/video.mp4)" in study._note(spec, cells)
    assert "bbrl seed 0" not in study._note(spec, cells)
    assert "--video" in study.cell_argv(cells[0], spec, resume=False)
    assert "--video" in study.cell_argv(cells[0], spec, resume=True)
    ppo = Cell(None, "ppo", 0, tmp_path / "ppo" / "seed0", {"algo": "ppo", "seed": 0, "steps": None, "options": {}})
    assert "--video" in study.cell_argv(ppo, spec, resume=False)
    assert "--video" in study.cell_argv(ppo, spec, resume=True)
    assert "--video" not in study.cell_argv(ppo, dataclasses.replace(spec, videos=False), resume=True)
    assert render.VIDEO_FILE == study.VIDEO_FILE
    assert Path(render.VIDEO_FILE).suffix in render.FORMATS
