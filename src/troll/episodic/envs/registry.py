"""``make_env``: every episodic environment by name, checked before anything is built.

Names: ``toy/viapoint``, ``toy/viapoint-sparse``, ``gym/reacher``, ``gym/reacher-sparse``,
``metaworld/<task>`` for the 50 Meta-World v3 tasks (``metaworld/reach-v3``, ``metaworld/push-v3``,
``metaworld/pick-place-v3``, ...), ``fancy/hopper-jump`` (fancy_gym 0.3.0's sparse hopper jump),
``fancy/box-pushing-dense`` and ``fancy/box-pushing-sparse`` (box_pushing.py). The MuJoCo environments need gymnasium,
mujoco (and metaworld; box pushing and hopper jump need the fancy-gym wheel's assets); they are imported only inside
the worker processes that build them (EnvPool's in this process), and their absence is reported here first. ``gym/*``
and ``metaworld/*`` run on one of two simulators (option ``backend``: EnvPool's C++ port or the Python package;
:func:`default_backend`).

Your own environment (docs/tce.md, "Your own environment"): a function ``factory(num_episodes, seed=0, **options)``
that returns an :class:`~troll.episodic.envs.base.EpisodicEnv`, found by the name ``module:function`` (imported when
an env is built), by :func:`register` in this process, or by an entry point of the group :data:`ENTRY_POINTS` in a
package's metadata (``[project.entry-points."troll.episodic.envs"]``, ``"mine/reach" = "mypkg.envs:make"``), which is
how ``troll tce train --env mine/reach`` finds it in a fresh process.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the interface imports torch; the names here are checked without it
    from troll.episodic.envs.base import EpisodicEnv
from troll.runs.numbers import FieldError

TOY = ("toy/viapoint", "toy/viapoint-sparse")
GYM = ("gym/reacher", "gym/reacher-sparse")
# metaworld 3.1.1's ALL_V3_ENVIRONMENTS (a test checks the list against the installed package)
METAWORLD_TASKS = (
    "assembly-v3 basketball-v3 bin-picking-v3 box-close-v3 button-press-topdown-v3 button-press-topdown-wall-v3 "
    "button-press-v3 button-press-wall-v3 coffee-button-v3 coffee-pull-v3 coffee-push-v3 dial-turn-v3 disassemble-v3 "
    "door-close-v3 door-lock-v3 door-open-v3 door-unlock-v3 hand-insert-v3 drawer-close-v3 drawer-open-v3 "
    "faucet-open-v3 faucet-close-v3 hammer-v3 handle-press-side-v3 handle-press-v3 handle-pull-side-v3 "
    "handle-pull-v3 lever-pull-v3 pick-place-wall-v3 pick-out-of-hole-v3 pick-place-v3 plate-slide-v3 "
    "plate-slide-side-v3 plate-slide-back-v3 plate-slide-back-side-v3 peg-insert-side-v3 peg-unplug-side-v3 "
    "soccer-v3 stick-push-v3 stick-pull-v3 push-v3 push-wall-v3 push-back-v3 reach-v3 reach-wall-v3 shelf-place-v3 "
    "sweep-into-v3 sweep-v3 window-open-v3 window-close-v3"
).split()
METAWORLD = tuple(f"metaworld/{task}" for task in METAWORLD_TASKS)
HOPPER = ("fancy/hopper-jump",)  # fancy_gym 0.3.0's sparse hopper jump (hopper_jump.py)
BOX_PUSHING = ("fancy/box-pushing-dense", "fancy/box-pushing-sparse")  # box_pushing.NAMES (a test checks)
ENV_NAMES = TOY + GYM + METAWORLD + HOPPER + BOX_PUSHING


def ppo_envs() -> str:
    """The envs troll's PPO steps, as messages name them: every env but the toy task (a batched torch simulation of
    whole trajectories, with no step interface), Meta-World's 50 as one entry."""
    return ", ".join(n for n in ENV_NAMES if n not in TOY + METAWORLD) + " and metaworld/<task>"


def _unknown(name: str) -> ValueError:
    close = difflib.get_close_matches(name, [*ENV_NAMES, *_REGISTERED], n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(
        f"unknown episodic environment {name!r}.{hint} Known: {', '.join(TOY + GYM + HOPPER + BOX_PUSHING)}, "
        f"metaworld/<task> for the 50 Meta-World v3 tasks ({', '.join(METAWORLD_TASKS)}), and your own: "
        "'module:function' (a factory returning an EpisodicEnv), a name given to troll.episodic.envs.register, or "
        f"an entry point of the group {ENTRY_POINTS!r}."
    )


# ---------------------------------------------------------------------------------------------- your own envs

ENTRY_POINTS = "troll.episodic.envs"  # the entry-point group a package names its env factories in
_BUILTIN_FAMILIES = ("toy/", "gym/", "metaworld/", "fancy/")  # troll's own: a name there must be one of ENV_NAMES
_NAME = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")  # family/task
_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # module:function
_REGISTERED: dict[str, Callable[..., EpisodicEnv]] = {}


def register(name: str, factory: Callable[..., EpisodicEnv]) -> None:
    """Make ``name`` ("family/task", outside troll's families) build ``factory(num_episodes, seed=0, **options)``
    in this process: ``make_env(name, ...)``, ``TCE(name)`` and the command line then find it."""
    check_name(name)
    if name in ENV_NAMES or _SPEC.fullmatch(name):
        raise ValueError(f"register: {name!r} is not a name of your own; choose e.g. 'mine/{name.split('/')[-1]}'.")
    if not callable(factory):
        raise TypeError(f"register: the factory of {name!r} must be callable, got {type(factory).__name__}.")
    _REGISTERED[name] = factory


def check_name(name) -> str:
    """``name`` if it is spelled as an env name: one of :data:`ENV_NAMES`, "family/task" outside troll's families, or
    "module:function"; a ValueError with the known names otherwise (nothing is imported here)."""
    if not isinstance(name, str):
        raise ValueError(f"an env name must be a string, got {type(name).__name__}; e.g. 'toy/viapoint'.")
    if name in ENV_NAMES or _SPEC.fullmatch(name):
        return name
    if not _NAME.fullmatch(name) or name.startswith(_BUILTIN_FAMILIES):
        raise _unknown(name)
    return name


def user_factory(name: str) -> Callable[..., EpisodicEnv] | None:
    """The factory of a user's env ``name`` (registered, an entry point, or "module:function"), or None."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if _SPEC.fullmatch(name):
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"env {name!r}: cannot import {attr} from {module} ({err}); is it on sys.path?") from err
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        if entry.name == name:
            return entry.load()
    return None


def _make_user(name: str, num_episodes: int, seed: int, options: dict) -> EpisodicEnv:
    factory = user_factory(check_name(name))
    if factory is None:
        raise _unknown(name)
    env = factory(num_episodes, seed=seed, **options)
    from troll.episodic.envs.base import EpisodicEnv

    if not isinstance(env, EpisodicEnv):
        raise TypeError(f"env {name!r}: its factory returned a {type(env).__name__}, not an EpisodicEnv.")
    if env.num_episodes != num_episodes:
        env.close()
        raise ValueError(f"env {name!r}: its factory built {env.num_episodes} episodes, asked for {num_episodes}.")
    return env


def _require(name: str, modules: tuple[str, ...], alternative: str = "") -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"{name} needs {', '.join(missing)}: pip install troll[episodic] (gymnasium>=1.1, mujoco==3.3.0, "
            f"metaworld==3.1.1, envpool==1.2.*, packaging){'; ' + alternative if alternative else ''}"
        )


BACKENDS = ("envpool", "python")
# metaworld tasks on which the backends differ beyond noise (docs/tce.md, "Backends", all 50 tasks x 32 scripted
# episodes): the Python one by default. Behaviour (success or return): door-open, button-press-topdown-wall, dial-turn,
# door-lock, pick-out-of-hole; the reset observation's constant entries (e.g. window-close's window, entry 4: 0.21 on
# EnvPool, 0.01 in metaworld 3.1.1): the rest.
PYTHON_DEFAULT: frozenset[str] = frozenset(
    {
        "box-close-v3",
        "button-press-topdown-wall-v3",
        "dial-turn-v3",
        "disassemble-v3",
        "door-lock-v3",
        "door-open-v3",
        "door-unlock-v3",
        "handle-press-side-v3",
        "handle-press-v3",
        "handle-pull-side-v3",
        "handle-pull-v3",
        "lever-pull-v3",
        "pick-out-of-hole-v3",
        "window-close-v3",
    }
)


def has_backends(name: str) -> bool:
    """Whether ``name`` runs on a choice of simulators (option ``backend``: :data:`BACKENDS`): gym/* and
    metaworld/*; the toy env is torch code."""
    return name in GYM or name in METAWORLD


def _simulator(name: str) -> str:
    """What simulates ``name``, an env without a choice of backends (its one backend is "python")."""
    if name in TOY:
        return "the task is torch code, vectorised in this process"
    module = "hopper_jump_sim.py" if name in HOPPER else "box_pushing_sim.py"
    return f"troll's own Python env ({module}) steps MuJoCo through its Python bindings"


def default_backend(name: str) -> str:
    """The simulator ``name`` runs on when the options do not say: EnvPool for Reacher (1.6-2x the Python
    backend's batches: docs/tce.md, "Speed") and Meta-World (but :data:`PYTHON_DEFAULT`; docs/tce.md, "Backends"),
    "python" for the toy env (torch code)."""
    if name in GYM or (name in METAWORLD and name.split("/", 1)[1] not in PYTHON_DEFAULT):
        return "envpool"
    return "python"


def horizon(name: str, options: dict | None = None) -> int:
    """T, the steps of one episode of env ``name`` with ``options``, known before the env is built: the toy task's
    ``horizon`` option (100), Reacher-v5's time limit (50), Meta-World's ``max_path_length`` (500), each the constant
    its env module builds with. A test checks each against the built env. A user's env is built once to ask it."""
    if name not in ENV_NAMES:
        with _make_user(name, 1, 0, dict(options or {})) as env:
            return env.horizon
    if name in TOY:
        from troll.episodic.envs.toy import HORIZON

        return int((options or {}).get("horizon", HORIZON))
    if name in GYM:
        from troll.episodic.envs.reacher import HORIZON

        return HORIZON
    if name in HOPPER:
        from troll.episodic.envs.hopper_jump import HORIZON

        return HORIZON
    if name in BOX_PUSHING:
        from troll.episodic.envs.box_pushing_sim import HORIZON

        return HORIZON
    from troll.episodic.envs.envpool_backend import HORIZON

    return HORIZON


def option_table(name: str) -> dict:
    """The options ``name`` takes (envs/options.py), "backend" included."""
    from troll.episodic.envs.options import Option

    if name in TOY:
        from troll.episodic.envs.toy import OPTIONS
    elif name in GYM:
        from troll.episodic.envs.reacher import OPTIONS
    elif name in HOPPER:
        from troll.episodic.envs.hopper_jump import OPTIONS
    elif name in BOX_PUSHING:
        from troll.episodic.envs.box_pushing import OPTIONS
    else:
        from troll.episodic.envs.metaworld import OPTIONS
    choices = BACKENDS if has_backends(name) else ("python",)
    return {**OPTIONS, "backend": Option("choice", choices=choices, help="the simulator")}


def check_options(name: str, options: dict) -> dict:
    """The options of env ``name`` checked (type, range, finite; envs/options.py) and the backend resolved: a ValueError
    naming the option otherwise (a FieldError, the option its ``field``). Returns them with "backend" set on gym/* and
    metaworld/* (the envs with a choice, :func:`has_backends`; recorded in a run's config so that a resume keeps its
    simulator)."""
    from troll.episodic.envs import options as opts

    if name not in ENV_NAMES:  # a user's env checks its own options when it is built
        check_name(name)
        if not isinstance(options, dict):
            raise ValueError(f"{name}: the env options must be a dict, got {type(options).__name__}.")
        return dict(options)
    if isinstance(options, dict) and options.get("backend") == "envpool" and not has_backends(name):
        raise FieldError(
            f"{name}: backend 'envpool' is available for gym/* and metaworld/* only. {name} has one backend, "
            f"'python': {_simulator(name)}. Drop the option or pass backend 'python'.",
            "backend",
        )
    checked = opts.check(name, options, option_table(name))
    if has_backends(name):
        checked.setdefault("backend", default_backend(name))
    return checked


def make_env(
    name: str,
    *,
    num_episodes: int,
    workers: int = 2,
    seed: int = 0,
    start_method: str | None = None,
    **options,
) -> EpisodicEnv:
    """Build the episodic environment ``name`` for ``num_episodes`` episodes per reset/run.

    workers: processes the Python MuJoCo envs split their episodes over (0: run them in this process); EnvPool's
             threads on the envpool backend (0 counts as 1); the toy env is vectorised in-process and ignores it.
    seed: what a built environment draws once (Meta-World: MT1's 50 task variations); each reset(seed) draws the
          episodes' variations.
    start_method: multiprocessing start method of the workers (default forkserver; see workers.py).
    options: the env's own settings (:func:`option_table`, checked by :func:`check_options`): toy ViaPointEnv's
             keyword arguments; gym/reacher's ReacherConfig (kp, kd, success_radius); metaworld's MetaWorldConfig
             (controller, gain, gripper, gripper_start, context); fancy/hopper-jump's HopperJumpConfig (kp, kd,
             context); fancy/box-pushing-*'s BoxPushingConfig (random_init, context); and on gym/* and metaworld/*
             ``backend``:
             "envpool" (the default but on :data:`PYTHON_DEFAULT`: EnvPool's C++ simulators on ``workers`` threads,
             envpool_backend.py, reacher.py) or "python" (gymnasium or the metaworld package in ``workers``
             processes).
    A user's env (module docstring) is built by its factory, ``factory(num_episodes, seed=seed, **options)``.
    Raises ValueError for an unknown name (with the known ones and a close match) or bad options, ImportError for
    a missing simulator package, before any process starts.
    """
    if not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"{name}: num_episodes must be a positive integer, got {num_episodes!r}")
    if name not in ENV_NAMES:
        return _make_user(name, num_episodes, seed, options)
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"{name}: workers must be an integer >= 0 (0 runs in this process), got {workers!r}")
    options = check_options(name, options)
    backend = options.pop("backend", "python")
    if name in TOY:
        from troll.episodic.envs.toy import ViaPointEnv

        return ViaPointEnv(num_episodes=num_episodes, sparse=name.endswith("-sparse"), **options)
    if backend == "envpool":
        return _envpool_env(name, num_episodes, workers, seed, options)
    from troll.episodic.envs.workers import PooledEnv

    factory, preload = _worker_factory(name, seed, options)
    return PooledEnv(
        factory, name=name, num_episodes=num_episodes, workers=workers, start_method=start_method, preload=preload
    )


def _envpool_env(name: str, num_episodes: int, workers: int, seed: int, options: dict) -> EpisodicEnv:
    """gym/* or metaworld/* on EnvPool's C++ simulators, all episodes in this process on ``workers`` threads."""
    if name in GYM:
        from troll.episodic.envs.reacher import EnvPoolReacher, ReacherConfig

        config = ReacherConfig(sparse=name.endswith("-sparse"), **options)
        _require(name, ("envpool",), "--backend python runs gymnasium's Reacher-v5 instead")
        return EnvPoolReacher(config, num_episodes=num_episodes, threads=max(workers, 1))
    from troll.episodic.envs.envpool_backend import EnvPoolMetaWorld
    from troll.episodic.envs.metaworld import MetaWorldConfig

    config = MetaWorldConfig(task=name.split("/", 1)[1], seed=seed, **options)
    _require(name, ("envpool", "metaworld"), "--backend python runs the metaworld package instead")
    return EnvPoolMetaWorld(config, num_episodes=num_episodes, threads=max(workers, 1))


def _worker_factory(name: str, seed: int, options: dict):
    """(the factory of one worker's runner, the simulator packages its processes import first) of a Python env."""
    if name in BOX_PUSHING:
        from troll.episodic.envs.box_pushing import BoxPushingConfig, BoxPushingRunner
        from troll.episodic.envs.box_pushing_sim import read_assets

        _require(name, ("mujoco",))
        read_assets()  # missing or damaged assets: an AssetError naming the install step, before any process starts
        return partial(BoxPushingRunner, BoxPushingConfig(sparse=name.endswith("-sparse"), **options)), ("mujoco",)
    if name in GYM:
        from troll.episodic.envs.reacher import ReacherConfig, ReacherRunner

        config = ReacherConfig(sparse=name.endswith("-sparse"), **options)
        _require(name, ("gymnasium", "mujoco"))
        return partial(ReacherRunner, config), ("gymnasium", "mujoco")
    if name in HOPPER:
        return _hopper_factory(name, options)
    from troll.episodic.envs.metaworld import MetaWorldConfig, MetaWorldRunner

    config = MetaWorldConfig(task=name.split("/", 1)[1], seed=seed, **options)
    _require(name, ("gymnasium", "mujoco", "metaworld", "packaging"))
    return partial(MetaWorldRunner, config), ("gymnasium", "mujoco", "metaworld")


def _hopper_factory(name: str, options: dict):
    """The worker factory of fancy/hopper-jump, its simulator packages and the fancy-gym asset checked here first."""
    from troll.episodic.envs.hopper_jump import AssetError, HopperJumpConfig, model_path

    _require(name, ("gymnasium", "mujoco"))
    try:
        model_path()
    except AssetError as err:
        raise ImportError(str(err)) from None
    return partial(_hopper_runner, HopperJumpConfig(**options)), ("gymnasium", "mujoco")


def _hopper_runner(config):
    """The worker's runner (hopper_jump_sim.py, imported there: it needs gymnasium and mujoco)."""
    from troll.episodic.envs.hopper_jump_sim import HopperJumpRunner

    return HopperJumpRunner(config)
