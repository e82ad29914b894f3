"""``troll tce render``: a video of a run's policy on its evaluation episodes, drawn by MuJoCo's offscreen renderer.

What is shown: the run's newest checkpoint, its mean trajectory (no sampling, as the evaluations run it) on the
first ``episodes`` episodes of the evaluation set (the reset seed every evaluation of the run uses), one after the
other, each tracked by the env's own controller; for a PPO run, its saved policy's mean action at every step in its
step env (:mod:`troll.episodic.envs.step`, whose ``physics`` is drawn) on the same episode seeds, as its evaluations
play them. Every MuJoCo task renders: the runner that plays an episode in
this process exposes its simulator as ``runner.sim`` (a gymnasium MuJoCo env: ``model``, ``data``, ``step``) or as
``runner.env`` (whose unwrapped env is taken), and a frame is taken after every k-th call of ``sim.step``, or of
``runner.step_hook`` that a runner stepping MuJoCo itself calls after each step (hopper jump's); k = round(1 / (fps
dt)), fps = 30 by default: real time. Simulators without one are refused: the toy task (torch code), and EnvPool (no
renderer), so gym/* and metaworld/* render on their Python simulators (gymnasium's Reacher-v5, the metaworld
package: the reference the EnvPool port is checked against).

Offscreen OpenGL: EGL by default (``MUJOCO_GL=egl``: Debian's libegl1, libegl-mesa0, libgl1, libopengl0 and
libgl1-mesa-dri, which `make` installs; Mesa draws on the CPU without a display), or OSMesa (``MUJOCO_GL=osmesa``,
libosmesa6). Without a working one, :class:`RenderError` names the packages before any episode runs. Files: GIF
(Pillow) or MP4 (imageio with the ffmpeg binary of the imageio-ffmpeg wheel), chosen by the file's suffix.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import warnings
from pathlib import Path

import numpy as np

from troll.runs.files import VIDEO_FILE

FORMATS = (".gif", ".mp4")
# named cameras, the first the model has is used (hopper: the side view that follows the torso; Meta-World: the
# view from above the table, its only upright whole view); otherwise a free camera on the bodies (FrameGrabber)
CAMERAS = ("track", "topview")
# the shadow map's side in pixels: MuJoCo's default 4096 costs Mesa's CPU renderer 0.18 s a frame, 1024 0.12 s
SHADOW_SIZE = 1024
GL_PACKAGES = ("MUJOCO_GL=egl needs Debian's libegl1, libegl-mesa0 and Mesa's drivers, MUJOCO_GL=osmesa needs "
               "libosmesa6 (apt-get install libegl1 libegl-mesa0 libgl1 libopengl0 libgl1-mesa-dri; `make` installs "
               "them)")  # fmt: skip


class RenderError(RuntimeError):
    """Offscreen rendering is unavailable here, or the env has no MuJoCo simulator in this process to draw."""


def use_offscreen_gl() -> None:
    """MUJOCO_GL=egl unless the user chose one: it must be set before mujoco is imported (which then imports its
    EGL module: without libEGL that import fails, and :func:`check_gl` reports it)."""
    os.environ.setdefault("MUJOCO_GL", "egl")


def check_gl() -> None:
    """Draw one frame of an empty scene; RenderError naming the GL packages if that fails.

    The probe builds the GL context, MuJoCo's render context and the scene itself (MuJoCo's public API:
    GLContext, MjrContext, mjr_render, mjr_readPixels) rather than through ``mujoco.Renderer``: a Renderer whose
    constructor fails is left half-built, and its destructor then prints an unrelated AttributeError
    (``_mjr_context``) after the real error. A GL context whose constructor fails (EGL without a device) is
    half-built too: its destructor's error is dropped while the probe runs (``sys.unraisablehook``). The GL backend's
    warnings (GLFW's) become part of the message, which names the backend mujoco loaded."""
    use_offscreen_gl()
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                _draw_one_frame()
                return
            except Exception as err:  # whatever the GL backend raises (ImportError, RuntimeError, EGL / GLFW errors)
                error = f"{type(err).__name__}: {str(err).rstrip('. ')}"
            gc.collect()  # a half-built context in a reference cycle: its destructor runs now, not after the hook
    finally:
        sys.unraisablehook = hook
    said = "; ".join(dict.fromkeys(str(w.message).rstrip(". ") for w in caught))
    loaded = getattr(sys.modules.get("mujoco"), "GLContext", None)
    backend = f", backend {loaded.__module__}" if loaded is not None else ""
    raise RenderError(f"offscreen rendering is unavailable with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}{backend}: "
                      f"{error}{f' ({said})' if said else ''}. {GL_PACKAGES}.") from None  # fmt: skip


def _draw_one_frame() -> None:
    """One 8 x 8 frame of a one-geom scene, every context freed before returning or raising."""
    import mujoco

    model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom size='1'/></worldbody></mujoco>")
    data = mujoco.MjData(model)
    if getattr(mujoco, "GLContext", None) is None:
        raise RenderError("MuJoCo has no GL context (MUJOCO_GL disables it)")
    gl = mujoco.GLContext(8, 8)
    render = None
    try:
        gl.make_current()
        render = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, render)
        scene = mujoco.MjvScene(model, maxgeom=10)
        mujoco.mjv_updateScene(model, data, mujoco.MjvOption(), None, mujoco.MjvCamera(), mujoco.mjtCatBit.mjCAT_ALL,
                               scene)  # fmt: skip
        viewport = mujoco.MjrRect(0, 0, 8, 8)
        mujoco.mjr_render(viewport, scene, render)
        mujoco.mjr_readPixels(np.empty((8, 8, 3), np.uint8), None, viewport, render)
    finally:
        if render is not None:
            render.free()
        gl.free()


class FrameGrabber:
    """Frames of one MuJoCo simulator ``sim`` (``model``, ``data``) at ``width`` x ``height``, from its first
    named camera of :data:`CAMERAS`; else from the free camera the simulator names as ``VIEW`` (lookat, distance,
    elevation, azimuth), for a scene whose bodies' spread is not where the task happens (box pushing's cage); else
    a free camera looking 60 degrees down at the bodies' centre from 2.5 times their spread (at least 0.5 m;
    MuJoCo's default frames the whole floor, where Reacher is a speck)."""

    def __init__(self, sim, *, width: int, height: int):
        import mujoco

        self.sim = sim
        quality = sim.model.vis.quality
        shadows, quality.shadowsize = quality.shadowsize, min(quality.shadowsize, SHADOW_SIZE)
        try:
            self.renderer = mujoco.Renderer(sim.model, height, width)
        finally:
            quality.shadowsize = shadows
        names = [sim.model.camera(i).name for i in range(sim.model.ncam)]
        self.camera = next((c for c in CAMERAS if c in names), None)
        if self.camera is None:
            self.camera = mujoco.MjvCamera()
            if getattr(sim, "VIEW", None) is not None:
                lookat, self.camera.distance, self.camera.elevation, self.camera.azimuth = sim.VIEW
                self.camera.lookat[:] = lookat
            else:
                bodies = np.asarray(sim.data.xpos[1:]) if sim.model.nbody > 1 else np.zeros((1, 3))
                self.camera.lookat[:] = bodies.mean(0)
                self.camera.distance = max(0.5, 2.5 * float(np.ptp(bodies, axis=0).max()))
                self.camera.elevation, self.camera.azimuth = -60.0, 90.0

    def grab(self) -> np.ndarray:
        """(height, width, 3) uint8 of the simulator's current state."""
        self.renderer.update_scene(self.sim.data, camera=self.camera)
        return self.renderer.render().copy()

    def close(self) -> None:
        self.renderer.close()


def episode_frames(runner, episode: int, seed: int, pos: np.ndarray, vel: np.ndarray, *, every: int,
                   width: int, height: int) -> tuple[list[np.ndarray], dict]:  # fmt: skip
    """Play one episode with ``runner.run`` and grab a frame after the reset and after every ``every``-th step;
    returns (frames, the episode's final metrics)."""
    sim = getattr(runner, "sim", None) or getattr(getattr(runner, "env", None), "unwrapped", None)
    if sim is None or not hasattr(sim, "model") or not hasattr(sim, "data"):
        raise RenderError(f"{runner.spec.name}: its runner exposes no MuJoCo simulator (runner.sim, or runner.env's "
                          "unwrapped env, with model and data)")  # fmt: skip
    grabber, frames, count = FrameGrabber(sim, width=width, height=height), [], 0
    step = sim.step

    def step_and_grab(action):
        nonlocal count
        if count == 0:
            frames.append(grabber.grab())  # the start, after run()'s reset
        out = step(action)
        count += 1
        if count % every == 0:
            frames.append(grabber.grab())
        return out

    hooked = hasattr(runner, "step_hook")  # a runner that steps MuJoCo itself calls it after each step
    if hooked:
        runner.step_hook = lambda: step_and_grab(None)
        step = lambda action: None  # noqa: E731 -- the runner has stepped already
    else:
        sim.step = step_and_grab  # an instance attribute: the runner's next sim.step calls it
    try:
        result = runner.run(episode, seed, pos, vel)
    finally:
        if hooked:
            runner.step_hook = None
        else:
            del sim.step
        grabber.close()
    return frames, result.final


def write_video(path: Path, frames: list[np.ndarray], fps: float) -> None:
    """GIF (Pillow) or MP4 (imageio-ffmpeg) by ``path``'s suffix, written to a temporary name, then renamed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")
    try:
        if path.suffix == ".gif":
            from PIL import Image

            images = [Image.fromarray(f) for f in frames]
            images[0].save(tmp, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
        else:
            try:
                import imageio.v2 as imageio
            except ImportError as err:
                raise RenderError(f"MP4 needs imageio and imageio-ffmpeg: pip install troll[episodic] ({err}); or "
                                  "write a .gif") from None  # fmt: skip
            imageio.mimwrite(tmp, frames, fps=fps, macro_block_size=8)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _check_video_path(path: Path, *, own: bool, overwrite: bool) -> None:
    """UsageError unless ``path`` can take the video: not a folder, in a folder that exists or can be made and is
    writable, and not an existing file (a link too) unless it is the run's ``own`` video or ``overwrite`` is given."""
    from troll.runs.files import UsageError, check_out_path

    if path.is_dir():
        raise UsageError(f"--out {path} is a folder: give a file name ending in {' or '.join(FORMATS)}.")
    check_out_path(path.parent, "the video's folder")
    if not (own or overwrite) and (path.exists() or path.is_symlink()):
        raise UsageError(f"--out {path} exists: pass --overwrite to replace it, or give another file name.")


def render_run(out: Path, *, path: Path | None = None, episodes: int = 3, width: int = 320, height: int = 240,
               fps: int = 30, checkpoint: Path | None = None, overwrite: bool = False) -> dict:  # fmt: skip
    """Render the run in ``out`` (module docstring) into ``path`` (default <out>/video.mp4, the run's own video,
    which a new rendering replaces; another file that exists is replaced only with ``overwrite``); returns
    {"path", "frames", "episodes", "fps", "final": [per-episode final metrics]}. RenderError / UsageError for what
    cannot be rendered, before any episode runs."""
    from troll.runs.files import UsageError
    from troll.tce import ppo, run

    out = Path(out)
    path = Path(path) if path is not None else out / VIDEO_FILE
    if path.suffix not in FORMATS:
        raise UsageError(f"--out {path}: the video must end in {' or '.join(FORMATS)}.")
    for name, value, low in (("episodes", episodes, 1), ("width", width, 16), ("height", height, 16), ("fps", fps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 4096:
            raise UsageError(f"--{name} must be an integer in [{low}, 4096], got {value!r}.")
    config = ppo.saved_config(out) or run.saved_config(out)  # a PPO config first: TCE's reader refuses its fields
    if config is None:
        raise UsageError(f"{out} holds no run of 'troll tce train' (TCE, BBRL or PPO) to render.")
    _check_video_path(path, own=path.resolve() == (out / VIDEO_FILE).resolve(), overwrite=overwrite)
    if config.algo == "ppo":
        ppo.require_sb3()
    found = (ppo.checkpoints if config.algo == "ppo" else run.checkpoints)(out)
    if checkpoint is None and not found:
        every = "rollouts" if config.algo == "ppo" else "iterations"
        raise UsageError(f"{out} holds no checkpoint yet: a run writes one every {config.checkpoint_every} {every}.")
    if config.env.startswith("toy/"):
        raise RenderError(f"{config.env} is torch code, not a MuJoCo simulation: there is no scene to render.")
    check_gl()
    draw = _render_ppo if config.algo == "ppo" else _render
    return draw(config, checkpoint or found[-1][1], path, episodes=episodes, width=width, height=height, fps=fps)


def _render(config, checkpoint: Path, path: Path, *, episodes: int, width: int, height: int, fps: int) -> dict:
    from troll.episodic.agent import EVAL_STREAM, reset_seed
    from troll.episodic.algorithm import TCE
    from troll.episodic.envs import make_env
    from troll.episodic.envs.registry import has_backends

    options = dict(config.env_options)
    if has_backends(config.env):
        options["backend"] = "python"  # EnvPool has no renderer: its reference simulator
    with make_env(config.env, num_episodes=episodes, workers=0, seed=config.seed, **options) as env:
        model = TCE.load(checkpoint)
        start = env.reset(reset_seed(config.seed, EVAL_STREAM))
        _, pos, vel = model.predict(start.context, start.pos, start.vel)
        every = max(1, round(1 / (fps * env.dt)))
        frames, finals = [], []
        for i, seed in enumerate(env.seeds):
            got, final = episode_frames(env.runner, i, seed, pos[i].numpy(), vel[i].numpy(), every=every,
                                        width=width, height=height)  # fmt: skip
            frames += got
            finals.append(final)
    return _write(path, frames, finals, every * env.dt, episodes)


def _render_ppo(config, checkpoint: Path, path: Path, *, episodes: int, width: int, height: int, fps: int) -> dict:
    """A PPO run: its saved policy's mean action, step by step in its step env (:mod:`troll.episodic.envs.step`,
    the Python simulators), on the first ``episodes`` episode seeds of its evaluations."""
    from stable_baselines3 import PPO

    from troll.episodic.agent import EVAL_STREAM, reset_seed
    from troll.episodic.envs.base import episode_seeds
    from troll.tce.ppo import play, step_task

    task = step_task(config)
    model = PPO.load(checkpoint, device="cpu")
    every = max(1, round(1 / (fps * task.dt)))
    frames, finals = [], []
    try:
        for seed in episode_seeds(reset_seed(config.seed, EVAL_STREAM), episodes):
            grabber = None

            def grab(t: int) -> None:
                nonlocal grabber
                if t == 0:  # after the reset: the free camera frames the bodies where the episode starts
                    grabber = FrameGrabber(task.physics, width=width, height=height)
                if t % every == 0:
                    frames.append(grabber.grab())

            try:
                info = play(model, task, seed, on_step=grab)
            finally:
                if grabber is not None:
                    grabber.close()
            names = {"episode_return": "return", "is_success": "success"}
            finals.append({names.get(k, k): float(v) for k, v in info.items()})
    finally:
        task.close()
    return _write(path, frames, finals, every * task.dt, episodes)


def _write(path: Path, frames: list[np.ndarray], finals: list[dict], seconds: float, episodes: int) -> dict:
    """The video of ``frames`` taken every ``seconds`` of simulated time, played in real time; render_run's dict."""
    rate = 1 / seconds
    path.parent.mkdir(parents=True, exist_ok=True)
    write_video(path, frames, rate)
    return {"path": str(path), "frames": len(frames), "episodes": episodes, "fps": round(rate, 3),
            "final": [{k: (v if math.isfinite(v) else None) for k, v in f.items()} for f in finals]}  # fmt: skip
