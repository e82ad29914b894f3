"""The options of ``troll tce train`` and ``troll tce study``: flag tables, value parsing, and the run config they give.

Torch-free at import (the command line's parser is built from these tables without loading torch): TCE's flags are
made from the metadata of :class:`~troll.episodic.config.TCEConfig`'s fields (their help and value names; the config
module imports no torch), PPO's from :class:`~troll.tce.ppo_config.PPOConfig`'s, and their values arrive as text;
:func:`build_config` converts them with the types of the TCEConfig / PPOConfig fields and
builds the config, turning every error into a :class:`troll.study.UsageError` that names the flag and the fix.
``tests/tce/test_cli.py`` checks that the tables cover every field of both configs.

Which options reach which algorithm: every TCEConfig field is an option of tce and bbrl; ppo takes its own
(``--ppo-<field>``, SB3's names) and, of TCE's, those that set the budget and the evaluation (:data:`SHARED`), so
that PPO is evaluated at the env steps and on the episodes a TCE run of the same flags uses.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math

from troll.episodic.config import TCEConfig
from troll.runs.files import UsageError
from troll.tce.ppo_config import PPOConfig

ALGOS = ("tce", "bbrl", "bbrl-cov", "ppo")
TOY_ENVS = ("toy/viapoint", "toy/viapoint-sparse")
GYM_ENVS = ("gym/reacher", "gym/reacher-sparse")
HOPPER_ENVS = ("fancy/hopper-jump",)  # no success rule: runs report the max height (eval/max_height)
BOX_ENVS = ("fancy/box-pushing-dense", "fancy/box-pushing-sparse")
# TCEConfig fields with a flag of their own (the rest are --<field> from TCE_FLAGS)
OWN_FLAGS = {"algo": "--algo", "env": "--env", "seed": "--seed", "total_env_steps": "--steps",
             "threads": "--threads", "workers": "--workers"}  # fmt: skip
# TCE fields that a PPO run takes too: its budget and evaluation follow TCE's (ppo.PPOConfig.preset)
SHARED = ("episodes", "eval_every", "eval_episodes", "checkpoint_every")

# (TCEConfig field, metavar, help) of every field with a flag of the --<field> form: made from the fields' metadata
# (troll.episodic.config.flag), so that a new setting needs no edit here; the default of each comes from
# TCEConfig.preset(env) (docs/tce.md, "Config and presets")
TCE_FLAGS: tuple[tuple[str, str, str], ...] = tuple(
    (f.name, f.metadata["metavar"], f.metadata["help"]) for f in dataclasses.fields(TCEConfig) if "help" in f.metadata
)
# (PPOConfig field, metavar, help) of the SB3 settings, flags --ppo-<field>: made from the fields' metadata too, with
# SB3's defaults
PPO_FLAGS: tuple[tuple[str, str, str], ...] = tuple(
    (f.name, f.metadata["metavar"], f.metadata["help"]) for f in dataclasses.fields(PPOConfig) if "help" in f.metadata
)
PPO_NAMES = frozenset(name for name, _, _ in PPO_FLAGS)
# PPOConfig fields set from the flags above or from TCE's (not flags of their own)
PPO_DERIVED = ("algo", "env", "seed", "threads", "total_env_steps", "eval_every_steps", "eval_episodes",
               "checkpoint_every")  # fmt: skip


def flag(name: str) -> str:
    """The flag of a TCE field (``mean_bound`` -> ``--mean-bound``) or of a PPO one (``ppo_n_steps``)."""
    return OWN_FLAGS.get(name) or "--" + name.replace("_", "-")


def int_flag(args, name: str, low: int, default: int | None = None) -> int | None:
    """The whole-number flag ``--<name>`` of the command line (its text parsed), >= ``low``; ``default`` when absent."""
    if not hasattr(args, name):
        return default
    option = flag(name)
    value = parse_value(name, getattr(args, name), int, option)
    if value < low:
        raise UsageError(f"{option} must be an integer >= {low}, got {value}.")
    return value


def check_algo(name: str, option: str = "--algo") -> str:
    if name not in ALGOS:
        close = difflib.get_close_matches(name, ALGOS, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"{option}: unknown algorithm {name!r}.{hint} Choose one of {', '.join(ALGOS)}.")
    return name


def check_env(name: str, algo: str | None = None) -> str:
    """A known env name (with a close match otherwise), or a user's (``module:function``, a registered name or an
    entry point: envs/registry.py); ppo needs a step interface (troll's envs but the toy task)."""
    from troll.episodic.envs.registry import ENV_NAMES, METAWORLD_TASKS, check_name, ppo_envs

    if name not in ENV_NAMES and _user_env(name, check_name):
        if algo == "ppo":
            raise UsageError(f"--algo ppo steps troll's own envs only ({ppo_envs()}); run tce or bbrl on {name}.")
        return name
    if name not in ENV_NAMES:
        close = difflib.get_close_matches(name, ENV_NAMES, n=2, cutoff=0.6)
        close = close or difflib.get_close_matches(f"metaworld/{name}", ENV_NAMES, n=1, cutoff=0.6)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise UsageError(
            f"--env: unknown environment {name!r}.{hint} Known: "
            f"{', '.join(TOY_ENVS + GYM_ENVS + HOPPER_ENVS + BOX_ENVS)}, and "
            f"metaworld/<task> for the 50 Meta-World v3 tasks: {', '.join(METAWORLD_TASKS)}."
        )
    if algo == "ppo" and name in TOY_ENVS:
        raise UsageError(
            f"--algo ppo needs a step-based env, and {name} has none (the toy task simulates whole trajectories in "
            f"torch); troll's PPO steps {ppo_envs()} only: run ppo there, or tce / bbrl here."
        )
    return name


def _user_env(name: str, check_name) -> bool:
    try:
        return bool(check_name(name))
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------- values


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        value = float(text)  # 1e6, 2.5e5
        if not (math.isfinite(value) and value.is_integer()):
            raise ValueError(text) from None
        return int(value)


def _parse_widths(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    return tuple(_parse_int(p) for p in text.split(","))


def _parse_json(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(text)
    return value


class OptionalFloat(float):
    """The kind of a float field whose default is None (``tau``): 'none' on the command line."""


def _parse_optional_float(text: str) -> float | None:
    return None if text.strip().lower() == "none" else float(text)


_PARSERS = {OptionalFloat: (_parse_optional_float, "a number or none"),
            bool: (_parse_bool, "true or false"), int: (_parse_int, "an integer"), float: (float, "a number"),
            tuple: (_parse_widths, "comma-separated widths, e.g. 128,128"), dict: (_parse_json, "a JSON object"),
            str: (str, "a name")}  # fmt: skip


def kinds() -> dict[str, type]:
    """Field name -> Python type of its value, for every TCE field and every ``ppo_``-prefixed PPO field."""
    import dataclasses

    default = TCEConfig()
    out = {f.name: OptionalFloat if getattr(default, f.name) is None else type(getattr(default, f.name))
           for f in dataclasses.fields(TCEConfig)}  # fmt: skip
    ppo = PPOConfig()
    out |= {f"ppo_{name}": type(getattr(ppo, name)) for name, _, _ in PPO_FLAGS}
    return out


def parse_value(name: str, text: str, kind: type, option: str | None = None):
    """The value of field ``name`` from its text; UsageError naming the flag and the expected form."""
    parse, expected = _PARSERS[kind]
    try:
        return parse(text)
    except (ValueError, json.JSONDecodeError):
        option = option or flag(name)
        raise UsageError(f"{option} {text!r}: expected {expected}.") from None


def format_value(value) -> str:
    """The command-line text of a field value (inverse of :func:`parse_value`)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) or "none"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


# ---------------------------------------------------------------------------------------------- configs


def applies(name: str, algo: str) -> bool:
    """Whether the option ``name`` (a TCE field, or ``ppo_<field>``) is used by ``algo``."""
    if name.startswith("ppo_"):
        return algo == "ppo"
    return algo != "ppo" or name in SHARED or name in ("seed", "threads", "total_env_steps")


def build_config(algo: str, env: str, *, seed: int, steps: int | None, options: dict, threads: int, workers: int):
    """The TCEConfig (tce, bbrl) or PPOConfig (ppo) of a run: the preset for ``env``, then ``options`` (field ->
    value, TCE fields and ``ppo_<field>``; each must apply to ``algo``). UsageError naming the flag otherwise."""
    for name in options:
        if not applies(name, algo):
            who = "ppo" if name.startswith("ppo_") else "tce and bbrl"
            raise UsageError(f"{flag(name)} is an option of {who}, not of --algo {algo}; drop it.")
    budget = {} if steps is None else {"total_env_steps": steps}
    try:
        if algo == "ppo":
            own = {k[4:]: v for k, v in options.items() if k.startswith("ppo_")}
            shared = {k: v for k, v in options.items() if k in ("eval_episodes", "checkpoint_every")}
            return PPOConfig.preset(env, eval_every=options.get("eval_every"), episodes=options.get("episodes"),
                                    seed=seed, threads=threads, **budget, **shared, **own)  # fmt: skip

        config = TCEConfig.preset(env, algo=algo, seed=seed, threads=threads, workers=workers, **budget, **options)
    except ValueError as err:
        raise UsageError(_with_flag(err, algo)) from None
    return with_env_options(config)


def config_from_file(path):
    """``--options FILE``: the config a study wrote for its cell (:mod:`troll.study.options`): a TCEConfig's fields,
    or a PPOConfig's when its ``algo`` is "ppo"; each field checked, then the config's own checks and the env's
    options. UsageError naming the file and the field otherwise."""
    from troll.study import options as cell_options

    data, source = cell_options.load(path), cell_options.source(path)
    kind = PPOConfig if data.get("algo") == "ppo" else TCEConfig
    values = cell_options.check(data, kind, source)
    algo = check_algo(values.get("algo", kind.algo), f"{source}: field 'algo'")
    check_env(values.get("env", kind.env), algo)
    try:
        config = kind(**values)
    except ValueError as err:
        name = getattr(err, "field", None)
        raise UsageError(f"{source}: " + (f"field {name!r}: {err}" if name else str(err))) from None
    return config if algo == "ppo" else with_env_options(config)


def resumed_config(saved: dict):
    """The config a run resumes with, from the "config" entry of its config.json: the TCEConfig or PPOConfig it
    holds (fields added since take their defaults), and a TCE run on an env that has since gained an EnvPool backend
    recorded on the Python package, which it ran on. ValueError when this version cannot read it."""
    import dataclasses

    from troll.episodic.envs.registry import has_backends

    if saved.get("algo") == "ppo":
        return PPOConfig.from_dict(saved)
    config = TCEConfig.from_dict(saved)
    if has_backends(config.env) and "backend" not in config.env_options:
        config = dataclasses.replace(config, env_options={**config.env_options, "backend": "python"})
    return config


def with_env_options(config):
    """``config`` with its env options checked (type, range, finite: envs/registry.check_options) and the backend
    recorded, so that a resumed run keeps its simulator; UsageError naming --env-options (and --backend, which
    sets the option of that name, when the error is about it) otherwise. Also the sizes that need the env's horizon
    (``--critic-minibatches``), so that a study refuses a cell when it plans it."""
    import dataclasses

    from troll.episodic.config import check_critic_batches
    from troll.episodic.envs.registry import check_options, horizon

    try:
        checked = check_options(config.env, config.env_options)
    except ValueError as err:
        given = "--env-options / --backend" if getattr(err, "field", None) == "backend" else "--env-options"
        raise UsageError(f"{given}: {err}") from None
    try:
        check_critic_batches(config, horizon(config.env, checked))
    except ValueError as err:
        raise UsageError(str(err)) from None
    return dataclasses.replace(config, env_options=checked)


def _with_flag(err: ValueError, algo: str) -> str:
    """The message of a config's error, led by the flag of the field it names (:class:`troll.runs.numbers.FieldError`:
    ``mean_bound`` -> ``--mean-bound: ...``; a PPOConfig field ``gamma`` -> ``--ppo-gamma: ...``); unchanged when the
    error names no field, or the env (whose messages name it themselves)."""
    name = getattr(err, "field", None)
    if algo == "ppo" and name is not None:
        name = {"eval_every_steps": "eval_every"}.get(name, f"ppo_{name}" if name in PPO_NAMES else name)
    if name is None or name == "env" or name not in kinds():
        return str(err)
    return f"{flag(name)}: {err}"
