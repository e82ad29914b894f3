"""``TCEConfig``: every number a user would tune for TCE and BBRL, in one validated dataclass.

The defaults are the recommended setup, the TCE authors' on Meta-World (docs/tce.md, "Config and presets"): 16
episodes an iteration, a ProDMP with 8 basis functions (alpha 10, alpha_x 3) of bandwidth 5, each column scaled to a
peak of 1 and then by 0.1, 25 segment indices (24 pairs) at a fixed interval with one random offset an iteration, a
2 x 128 ReLU policy (init_std 1) with one global Cholesky factor, 50 critic then 50 policy epochs of full-batch Adam
with rates decaying to 1 %, advantages from the values at sampling time (GAE lambda 0.95, gamma 1), the KL trust
region 0.005 / 0.0005 with regression weight 1, and a linear entropy schedule to 0 nats. :meth:`TCEConfig.preset`
fills in what depends on the environment family (:data:`PRESETS`: Meta-World's tau and env options; the other
families' own settings) and on the algorithm (:data:`ALGO_PRESETS`).
Every field is checked in ``__post_init__`` with a message that says how to fix it; the config round-trips through
JSON (the run folder's config.json).

    cfg = TCEConfig.preset("metaworld/reach-v3", seed=1)          # Meta-World defaults, seed 1
    cfg = TCEConfig.preset("toy/viapoint", algo="bbrl")           # the black-box baseline on the toy task
    TCEConfig.from_json(cfg.to_json()) == cfg
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field

from troll.episodic.envs.registry import check_name
from troll.episodic.presets import ALGO_PRESETS, ENV_PRESETS, PRESETS, env_family, unknown
from troll.runs.numbers import SEED_LIMIT, FieldError, check_int, check_real

# Upper limits of the numbers a config takes (checked before anything is built or written): beyond them the float32
# arithmetic of a run overflows (an Adam step of 1e300, a std of 1e300) or the sizes cannot be allocated.
NUMBER_LIMITS = {"policy_lr": 1.0, "critic_lr": 1.0, "init_std": 1e3, "min_std": 1e3, "weights_scale": 1e6,
                 "goal_scale": 1e6, "dmp_alpha": 1e6, "dmp_alpha_x": 1e6}  # fmt: skip
SIZE_LIMITS = {"episodes": 100_000, "eval_episodes": 100_000, "num_basis": 1000, "num_segments": 10_000,
               "policy_epochs": 100_000, "critic_epochs": 100_000, "critic_minibatches": 1_000_000, "threads": 1024,
               "workers": 1024, "seed": SEED_LIMIT, "total_env_steps": 10**12, "width": 100_000}  # fmt: skip

ALGOS = ("tce", "bbrl", "bbrl-cov")  # bbrl: diagonal covariance (the authors'); bbrl-cov: full (the paper's BBRL-Cov)
COVARIANCES = ("full", "diag")
ENTROPY_REFERENCES = ("initial", "zero")
# troll.gaussian's distances that project the policy's Cholesky factor (w2 needs a symmetric square root); a test
# holds this to troll.gaussian's table, which this module does not import (it is read without torch)
DISTANCES = ("kl", "frobenius")
ACTIVATIONS = ("tanh", "relu", "elu", "silu", "leaky_relu")  # leaky_relu: slope 0.01, the box-pushing configs'
ENTROPY_SCHEDULES = ("none", "linear", "exponential")
PRESET = "default: the env family's preset"  # the help's words for a value TCEConfig.preset decides


def flag(metavar: str, help: str) -> dict:
    """A field's metadata for its ``troll tce train`` flag (``--<field>``): the value's name and the help text."""
    return {"metavar": metavar, "help": help}


# Fields that say how a run executes, not what it computes: a resumed run may change them.
RESUMABLE_FIELDS = ("threads", "workers")


@dataclass(frozen=True)
class TCEConfig:
    """TCE / BBRL settings (docs/tce.md). Defaults: the authors' Meta-World setup (the recommended one, module
    docstring) but for the env's own ``tau``; :meth:`preset` fills in what depends on the env and the algorithm.

    Algorithm and budget:
        algo:            "tce" (segment-pair likelihoods, step critic), "bbrl" (one likelihood of theta and one
                         advantage R - V(c) per episode, context critic; the authors' diagonal covariance) or
                         "bbrl-cov" (BBRL with the full covariance).
        env:             an episodic env name (toy/viapoint, gym/reacher, metaworld/<task>-v3, ...).
        env_options:     keyword options of the env (make_env's ``options``, e.g. {"gain": 50.0}).
        episodes:        E, episodes per iteration (16).
        total_env_steps: budget; iterations = ceil(total_env_steps / (episodes * horizon)).
        eval_every:      evaluate the mean trajectory (no sampling) every this many iterations, and after the last.
        eval_episodes:   episodes of each evaluation (fixed contexts: the same eval seed every time).
    ProDMP (docs/tce.md, "ProDMP"): num_basis N (8), dmp_alpha (10), dmp_alpha_x (3), weights_scale, goal_scale,
        relative_goal (goal = y0 + goal_scale theta_g), tau (seconds; None: the episode's duration; the basis
        centres lie over [0, tau]), basis_bandwidth (phi_i = exp(-bandwidth/2 (x - c_i)^2 / dc_i^2); 2: neighbours
        overlap at e^-1), auto_scale_basis (every basis column divided by its peak |value| over the episode).
        P = D (N + 1) parameters.
    Segments: num_segments K pairs (24) from K + 1 indices at a fixed interval floor(T / K) with a random offset per
        episode, or one for all episodes of an iteration (``offset_per_iteration``; ``random_offset=False``: offset
        0, the first index at step 0).
    Policy: policy_hidden (2 x 128), activation, init_std (initial std of every theta entry), min_std (added to the
        softplus diagonal of the global Cholesky factor), covariance ("full": L lower triangular; "diag": a
        diagonal std), normalize_context, policy_lr, policy_epochs (50), lr_final (both learning rates decay
        linearly to lr_final x their value over the run's iterations; 1: constant).
    Critic: critic_hidden, critic_activation ("relu": tanh costs ~30x more per element on this CPU build, and the
        step critic sees E (T + 1) states), critic_lr, critic_epochs (50), critic_minibatches (1: full batch; BBRL's
        context critic always takes its E contexts as one batch), normalize_observations,
        normalize_values (targets standardised by running statistics, outputs preserved when they move),
        critic_context (append the context to the step critic's input), gae_lambda (0.95), gamma (1),
        normalize_advantages, values_before_fit (advantages from the critic's values at sampling time, before this
        iteration's fit; False: from the critic just fitted).
    Trust region: distance ("kl"), mean_bound, cov_bound, trust_region_coeff (the spec's alpha: weight of the
        regression), entropy_schedule ("none" | "linear" | "exponential"), entropy_target (the final entropy bound in
        nats per parameter, relative to entropy_reference: "initial", the initial policy's entropy (-1 lowers
        every std by e on average), or "zero", 0 nats), entropy_rate.
    Run: seed, threads (torch threads), workers (env processes), checkpoint_every (iterations).
    """

    algo: str = "tce"
    env: str = "metaworld/reach-v3"
    env_options: dict = field(
        default_factory=dict,
        metadata=flag(
            "JSON",
            "the env's own options as a JSON object, e.g. '{\"gain\": 25}': the keys given complete the env family's "
            "preset's (on Meta-World: mocap, gain 100, gripper from the fingers, full context)",
        ),
    )
    episodes: int = field(
        default=16,
        metadata=flag(
            "E",
            f"episodes per iteration ({PRESET}: 16 on Meta-World and Reacher, 64 on the toy and hopper jump, 152 "
            "on dense and 76 on sparse box pushing)",
        ),
    )
    total_env_steps: int = 2_000_000
    eval_every: int = field(
        default=10,
        metadata=flag("N", f"evaluate the mean trajectory every N iterations and after the last ({PRESET}: 10)"),
    )
    eval_episodes: int = field(
        default=16, metadata=flag("N", f"episodes of each evaluation, the same contexts every time ({PRESET})")
    )
    # ProDMP
    num_basis: int = field(default=8, metadata=flag("N", f"ProDMP basis functions per DoF ({PRESET}: 8; toy 5)"))
    dmp_alpha: float = field(default=10.0, metadata=flag("X", f"ProDMP stiffness alpha ({PRESET}: 10; toy 25)"))
    dmp_alpha_x: float = field(default=3.0, metadata=flag("X", "ProDMP phase decay alpha_x (default: 3)"))
    weights_scale: float = field(default=0.1, metadata=flag("X", f"scale of the ProDMP weights ({PRESET})"))
    goal_scale: float = field(default=0.1, metadata=flag("X", f"scale of the ProDMP goal ({PRESET})"))
    relative_goal: bool = field(
        default=True, metadata=flag("BOOL", f"goal relative to the start position ({PRESET}: true on Meta-World)")
    )
    tau: float | None = field(
        default=None,
        metadata=flag(
            "SECONDS", f"ProDMP time constant, basis centres over [0, tau]; none: the episode ({PRESET}: Meta-World 5)"
        ),
    )
    basis_bandwidth: float = field(
        default=5.0, metadata=flag("X", f"ProDMP basis width factor ({PRESET}: Meta-World 5; else 2)")
    )
    auto_scale_basis: bool = field(
        default=True,
        metadata=flag("BOOL", f"scale every ProDMP basis column to a peak of 1 ({PRESET}: true on Meta-World)"),
    )
    # segments
    num_segments: int = field(
        default=24,
        metadata=flag("K", f"segment pairs per episode, K + 1 step indices (TCE; {PRESET}: 24, Reacher/toy 10)"),
    )
    random_offset: bool = field(
        default=True, metadata=flag("BOOL", "random offset of the segment indices per episode (default: true)")
    )
    offset_per_iteration: bool = field(
        default=True,
        metadata=flag("BOOL", f"one segment offset for all episodes of an iteration ({PRESET}: Meta-World)"),
    )
    # policy
    policy_hidden: tuple[int, ...] = field(
        default=(128, 128),
        metadata=flag("WIDTHS", "policy MLP widths, e.g. 128,128; 'none' for linear (default: 128,128)"),
    )
    activation: str = field(
        default="relu",
        metadata=flag(
            "NAME",
            f"policy activation: tanh, relu, elu, silu, leaky_relu ({PRESET}: relu; tanh on the toy and Reacher, "
            "leaky_relu on box pushing)",
        ),
    )
    init_std: float = field(default=1.0, metadata=flag("X", f"initial std of every ProDMP parameter ({PRESET})"))
    min_std: float = field(
        default=1e-5, metadata=flag("X", f"floor added to the Cholesky diagonal ({PRESET}: 1e-4; Meta-World 1e-5)")
    )
    covariance: str = field(
        default="full", metadata=flag("NAME", f"policy covariance: full or diag ({PRESET}: full; diag for --algo bbrl)")
    )
    normalize_context: bool = field(
        default=True, metadata=flag("BOOL", "standardise the context by running statistics (default: true)")
    )
    policy_lr: float = field(default=3e-4, metadata=flag("X", f"policy Adam step size ({PRESET}: 3e-4; toy 1e-3)"))
    policy_epochs: int = field(
        default=50, metadata=flag("N", f"full-batch policy epochs per iteration ({PRESET}: 50; toy 10)")
    )
    lr_final: float = field(
        default=0.01,
        metadata=flag("X", f"learning rates decay linearly to this share over the run ({PRESET}: 1; Meta-World 0.01)"),
    )
    # critic
    critic_hidden: tuple[int, ...] = field(
        default=(128, 128), metadata=flag("WIDTHS", f"critic MLP widths ({PRESET}: 128,128; toy 64,64)")
    )
    critic_activation: str = field(
        default="relu", metadata=flag("NAME", f"critic activation ({PRESET}: relu; leaky_relu on box pushing)")
    )
    critic_lr: float = field(default=3e-4, metadata=flag("X", f"critic Adam step size ({PRESET}: 3e-4; toy 1e-3)"))
    critic_epochs: int = field(default=50, metadata=flag("N", f"critic epochs per iteration ({PRESET}: 50; toy 5)"))
    critic_minibatches: int = field(
        default=1, metadata=flag("N", f"critic minibatches per epoch, 1: full batch ({PRESET}: 1; toy 4)")
    )
    normalize_observations: bool = field(
        default=True, metadata=flag("BOOL", "standardise the critic's inputs (default: true)")
    )
    normalize_values: bool = field(
        default=True, metadata=flag("BOOL", "standardise the critic's targets, outputs preserved (default: true)")
    )
    critic_context: bool = field(
        default=True, metadata=flag("BOOL", "append the context to the step critic's input (default: true)")
    )
    gae_lambda: float = field(default=0.95, metadata=flag("X", "GAE lambda (default: 0.95)"))
    gamma: float = field(default=1.0, metadata=flag("X", "discount (default: 1.0)"))
    normalize_advantages: bool = field(
        default=True, metadata=flag("BOOL", "normalise the advantages over the batch (default: true)")
    )
    values_before_fit: bool = field(
        default=True,
        metadata=flag("BOOL", f"advantages from the critic at sampling time ({PRESET}: true on Meta-World)"),
    )
    # trust region
    distance: str = field(default="kl", metadata=flag("NAME", "trust-region distance: kl or frobenius (default: kl)"))
    mean_bound: float = field(
        default=0.005, metadata=flag("X", f"trust-region bound of the mean part, > 0 ({PRESET}: Meta-World 0.005)")
    )
    cov_bound: float = field(
        default=0.0005,
        metadata=flag("X", f"trust-region bound of the covariance part, > 0 ({PRESET}: Meta-World 0.0005)"),
    )
    trust_region_coeff: float = field(
        default=1.0,
        metadata=flag(
            "X",
            f"weight of the regression to the projection ({PRESET}: 1; bbrl 10 on Meta-World, hopper jump and box "
            "pushing)",
        ),
    )
    entropy_schedule: str = field(
        default="linear",
        metadata=flag(
            "NAME",
            f"entropy bound schedule: none, linear, exponential ({PRESET}: none; linear for tce on Meta-World and box "
            "pushing)",
        ),
    )
    entropy_target: float = field(
        default=0.0,
        metadata=flag("X", "final entropy bound, nats per parameter, relative to --entropy-reference (default: 0)"),
    )
    entropy_reference: str = field(
        default="zero",
        metadata=flag("NAME", f"initial (the initial entropy) or zero ({PRESET}: initial; Meta-World zero)"),
    )
    entropy_rate: float = field(
        default=0.01, metadata=flag("X", "the exponential schedule's remaining share (default: 0.01)")
    )
    # run
    seed: int = 0
    threads: int = 1
    workers: int = 2
    checkpoint_every: int = field(
        default=10, metadata=flag("N", "iterations (ppo: rollouts) between checkpoints (default: 10; toy 20)")
    )

    def __post_init__(self) -> None:
        # JSON gives lists; the dataclass keeps tuples (hashable, and equal after a round trip)
        for name in ("policy_hidden", "critic_hidden"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        self._check_choices()
        self._check_numbers()
        self._check_sizes()

    # ------------------------------------------------------------------------------------------ validation

    def _check_choices(self) -> None:
        for name, choices, example in (
            ("algo", ALGOS, "algo='tce'"),
            ("distance", DISTANCES, "distance='kl' (TCE's)"),
            ("activation", ACTIVATIONS, "activation='relu'"),
            ("critic_activation", ACTIVATIONS, "critic_activation='relu'"),
            ("entropy_schedule", ENTROPY_SCHEDULES, "entropy_schedule='linear'"),
            ("entropy_reference", ENTROPY_REFERENCES, "entropy_reference='zero'"),
            ("covariance", COVARIANCES, "covariance='full' (TCE's)"),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise FieldError(unknown(name, value, choices, example) + f" E.g. {example}.", name)
        try:
            check_name(self.env)
        except ValueError as err:
            raise FieldError(str(err), "env") from None
        if not isinstance(self.env_options, dict) or not all(isinstance(k, str) for k in self.env_options):
            raise FieldError(
                f"env_options must be a dict of keyword options, got {self.env_options!r}; e.g. {{}}.", "env_options"
            )
        for name in ("relative_goal", "random_offset", "normalize_context", "normalize_observations"):
            _check_bool(name, getattr(self, name))
        for name in ("normalize_values", "critic_context", "normalize_advantages", "auto_scale_basis"):
            _check_bool(name, getattr(self, name))
        for name in ("offset_per_iteration", "values_before_fit"):
            _check_bool(name, getattr(self, name))

    def _check_numbers(self) -> None:
        positive = {
            "mean_bound": "the mean part of the trust region; Meta-World 0.005, box pushing 0.05, hopper jump 0.1",
            "cov_bound": "the covariance part of the trust region; Meta-World 0.0005, hopper jump 0.02",
            "dmp_alpha": "the ProDMP stiffness; TCE uses 10",
            "dmp_alpha_x": "the ProDMP phase decay; TCE uses 3",
            "weights_scale": "the ProDMP weight scale; see TCEConfig.preset for per-env values",
            "goal_scale": "the ProDMP goal scale; see TCEConfig.preset for per-env values",
            "init_std": "the initial std of every theta entry; e.g. 1.0",
            "min_std": "the floor of the Cholesky diagonal; e.g. 1e-4",
            "policy_lr": "the policy's Adam step size; e.g. 3e-4",
            "critic_lr": "the critic's Adam step size; e.g. 3e-4",
            "entropy_rate": "the exponential schedule's remaining share of the entropy gap; e.g. 0.01",
            "basis_bandwidth": "the basis width factor; 2 (neighbours overlap at e^-1), the authors' Meta-World 5",
        }
        if self.tau is not None:
            _check_real("tau", self.tau, meaning="the ProDMP time constant in seconds, or None for the duration")
        _check_real("lr_final", self.lr_final, meaning="the share of the learning rates left at the end; e.g. 0.01")
        if not self.lr_final <= 1:
            raise FieldError(
                f"lr_final must lie in (0, 1], got {self.lr_final!r}; 1 keeps the rates constant.", "lr_final"
            )
        if self.algo == "bbrl-cov" and self.covariance != "full":
            raise FieldError(
                "algo='bbrl-cov' is BBRL with the full covariance; pass covariance='full', or algo='bbrl'.", "algo"
            )
        for name, meaning in positive.items():
            _check_real(name, getattr(self, name), strict=True, high=NUMBER_LIMITS.get(name), meaning=meaning)
        _check_real("trust_region_coeff", self.trust_region_coeff, strict=False, high=1e6,
                    meaning="the regression weight; 1 (beyond 1e6 it swamps the surrogate in float32)")  # fmt: skip
        _check_real("entropy_target", self.entropy_target, low=-30.0, strict=False, high=30.0,
                    meaning="nats per parameter, each std moved by e^target at most; e.g. -1.0")  # fmt: skip
        if not self.min_std < self.init_std:
            raise FieldError(
                f"init_std={self.init_std!r} must exceed min_std={self.min_std!r}: the diagonal of the Cholesky "
                "factor is softplus(x) + min_std; lower min_std (e.g. 1e-4) or raise init_std.",
                "init_std",
            )
        for name, hint in (
            ("gae_lambda", "TCE uses gae_lambda=0.95"),
            ("gamma", "TCE uses gamma=1.0 (episodes of fixed length)"),
        ):
            value = getattr(self, name)
            _check_real(name, value, strict=False, meaning=hint)
            if not value <= 1:
                raise FieldError(f"{name} must lie in [0, 1], got {value!r}; {hint}.", name)
        if self.gamma == 0:
            raise FieldError("gamma must lie in (0, 1], got 0; TCE uses gamma=1.0.", "gamma")
        if not self.entropy_rate < 1:
            raise FieldError(f"entropy_rate must lie in (0, 1), got {self.entropy_rate!r}; e.g. 0.01.", "entropy_rate")

    def _check_sizes(self) -> None:
        ints = {
            "episodes": (1, "episodes per iteration; the spec uses 16"),
            "total_env_steps": (1, "the run's budget of environment steps"),
            "eval_every": (1, "iterations between evaluations, e.g. 10"),
            "eval_episodes": (1, "episodes per evaluation, e.g. 16"),
            "num_basis": (1, "basis functions per DoF; TCE uses 8"),
            "num_segments": (1, "segment pairs per episode; TCE uses 24 (25 indices)"),
            "policy_epochs": (1, "TCE uses 50"),
            "critic_epochs": (0, "TCE uses 50 (0 keeps the critic untrained)"),
            "critic_minibatches": (1, "1 is a full batch (TCE)"),
            "seed": (0, "numpy's seed range"),
            "threads": (1, "torch threads; 1 on a shared machine"),
            "workers": (0, "env processes; 0 runs the episodes in this process"),
            "checkpoint_every": (1, "iterations between checkpoints, e.g. 10"),
        }
        for name, (low, hint) in ints.items():
            check_int(name, getattr(self, name), low=low, high=SIZE_LIMITS.get(name), hint=hint)
        for name in ("policy_hidden", "critic_hidden"):
            value = getattr(self, name)
            ok = isinstance(value, tuple) and all(isinstance(h, int) and not isinstance(h, bool) for h in value)
            if not ok or not all(1 <= h <= SIZE_LIMITS["width"] for h in value):
                raise FieldError(
                    f"{name} must be a tuple of layer widths in [1, {SIZE_LIMITS['width']}] (empty: linear), got "
                    f"{value!r}; e.g. (128, 128).",
                    name,
                )
        if self.algo != "tce" and self.episodes < 2:
            raise FieldError(
                f"episodes must be >= 2 with algo={self.algo!r}: it normalises one advantage per episode over the "
                "batch.",
                "episodes",
            )

    # ------------------------------------------------------------------------------------------ presets, JSON

    @classmethod
    def preset(cls, env: str, **overrides) -> TCEConfig:
        """The config for ``env``: its family's :data:`PRESETS`, then :data:`ALGO_PRESETS` of (family, algo), then
        :data:`ENV_PRESETS` of (env, algo), then ``overrides`` (field=value). ``env_options`` given complete the
        preset's key by key: ``{"backend": "python"}`` on metaworld/* keeps the authors' controller, gripper start and
        context."""
        family = env_family(env)
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(cls._unknown_fields(unknown))
        algo = overrides.get("algo", cls.algo)
        preset = {**PRESETS.get(family, {}), **ALGO_PRESETS.get((family, algo), {}), **ENV_PRESETS.get((env, algo), {})}
        fields = {**preset, "env": env, **overrides}
        given = overrides.get("env_options", {})
        if isinstance(given, dict):  # anything else is refused by __post_init__, with its message
            fields["env_options"] = {**preset.get("env_options", {}), **given}  # the config's own copy
        return cls(**fields)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        for name in ("policy_hidden", "critic_hidden"):
            out[name] = list(out[name])
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> TCEConfig:
        """The config of ``data`` (from :meth:`to_dict`); unknown keys are refused, missing ones take defaults."""
        if not isinstance(data, dict):
            raise ValueError(f"a TCE config must be a JSON object, got {type(data).__name__}.")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(cls._unknown_fields(unknown))
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> TCEConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def _unknown_fields(cls, names: list[str]) -> str:
        known = [f.name for f in dataclasses.fields(cls)]
        parts = []
        for name in names:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        return f"unknown TCEConfig field(s) {', '.join(parts)}; the fields are: {', '.join(known)}."


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise FieldError(f"{name} must be True or False, got {value!r}.", name)


def _check_real(name: str, value, *, strict: bool = True, low: float = 0.0, high: float | None = None,
                meaning: str = "") -> None:  # fmt: skip
    """A finite real number (not a bool) above ``low`` (``>= low`` unless ``strict``; no bound for low=-inf) and at
    most ``high`` (:func:`troll.runs.numbers.check_real`, the one check of a number)."""
    check_real(name, value, low=None if low == -math.inf else low, low_open=strict, high=high, hint=f" ({meaning})")


def check_critic_batches(config: TCEConfig, horizon: int) -> None:
    """TCE's step critic fits the E T states of an iteration in ``critic_minibatches`` parts: more parts than states
    would leave some empty (a NaN loss). BBRL's context critic takes its E contexts as one batch. ``horizon``: T,
    known before the env is built (envs/registry.horizon), so a study refuses such a cell when it plans it."""
    states = config.episodes * horizon
    if config.algo == "tce" and config.critic_minibatches > states:
        raise ValueError(
            f"critic_minibatches (--critic-minibatches) {config.critic_minibatches} exceeds the {states} critic states "
            f"of an iteration (episodes {config.episodes} x {horizon} steps): a minibatch would be empty. Use at most "
            f"{states}, or more --episodes."
        )
