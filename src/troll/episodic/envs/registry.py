"""``make_env``: every episodic environment by name, checked before anything is built.

Names: ``toy/viapoint``, ``toy/viapoint-sparse``, ``gym/reacher``, ``gym/reacher-sparse`` and
``metaworld/<task>`` for the 50 Meta-World v3 tasks (``metaworld/reach-v3``, ``metaworld/push-v3``,
``metaworld/pick-place-v3``, ...). The MuJoCo environments need gymnasium, mujoco (and metaworld); they are
imported only inside the worker processes that build them, and their absence is reported here first.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
from functools import partial

from troll.episodic.envs.base import EpisodicEnv

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
ENV_NAMES = TOY + GYM + METAWORLD


def _unknown(name: str) -> ValueError:
    close = difflib.get_close_matches(name, ENV_NAMES, n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(
        f"unknown episodic environment {name!r}.{hint} Known: {', '.join(TOY + GYM)}, and metaworld/<task> for the "
        f"50 Meta-World v3 tasks: {', '.join(METAWORLD_TASKS)}."
    )


def _require(name: str, modules: tuple[str, ...]) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"{name} needs {', '.join(missing)}: pip install troll[episodic] (gymnasium>=1.1, mujoco==3.3.0, "
            "metaworld==3.1.1, packaging)"
        )


def _check_options(name: str, target, options: dict) -> None:
    """ValueError for an option ``target`` (a class) does not take; make_env's own arguments are not options."""
    taken = [p for p in inspect.signature(target).parameters if p not in ("num_episodes", "sparse", "task", "seed")]
    unknown = sorted(set(options) - set(taken))
    if unknown:
        raise ValueError(f"{name}: unknown option(s) {', '.join(unknown)}; this env takes {', '.join(taken)}")


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

    workers: processes the MuJoCo envs split their episodes over (0: run them in this process); the toy env is
             vectorised in-process and ignores it.
    seed: what a built environment draws once (Meta-World: MT1's 50 task variations); each reset(seed) draws the
          episodes' variations.
    start_method: multiprocessing start method of the workers (default forkserver; see workers.py).
    options: the env's own settings: toy ViaPointEnv's keyword arguments; gym/reacher's ReacherConfig (kp, kd,
             success_radius); metaworld's MetaWorldConfig (gain, gripper).
    Raises ValueError for an unknown name (with the known ones and a close match) or bad options, ImportError for
    a missing simulator package, before any process starts.
    """
    if name not in ENV_NAMES:
        raise _unknown(name)
    if not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"{name}: num_episodes must be a positive integer, got {num_episodes!r}")
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"{name}: workers must be an integer >= 0 (0 runs in this process), got {workers!r}")
    if name in TOY:
        from troll.episodic.envs.toy import ViaPointEnv

        _check_options(name, ViaPointEnv, options)
        return ViaPointEnv(num_episodes=num_episodes, sparse=name.endswith("-sparse"), **options)

    from troll.episodic.envs.workers import PooledEnv

    if name in GYM:
        from troll.episodic.envs.reacher import ReacherConfig, ReacherRunner

        _check_options(name, ReacherConfig, options)
        _require(name, ("gymnasium", "mujoco"))
        factory = partial(ReacherRunner, ReacherConfig(sparse=name.endswith("-sparse"), **options))
        preload = ("gymnasium", "mujoco")
    else:
        from troll.episodic.envs.metaworld import MetaWorldConfig, MetaWorldRunner

        _check_options(name, MetaWorldConfig, options)
        _require(name, ("gymnasium", "mujoco", "metaworld", "packaging"))
        factory = partial(MetaWorldRunner, MetaWorldConfig(task=name.split("/", 1)[1], seed=seed, **options))
        preload = ("gymnasium", "mujoco", "metaworld")
    return PooledEnv(
        factory, name=name, num_episodes=num_episodes, workers=workers, start_method=start_method, preload=preload
    )
