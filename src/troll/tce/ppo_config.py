"""The settings of a PPO run (:class:`PPOConfig`), torch-free: ``troll tce train``'s parser makes the ``--ppo-<field>``
flags from the metadata of its fields (:func:`troll.episodic.config.flag`: their value names and help), as it makes
TCE's from :class:`~troll.episodic.config.TCEConfig`'s. The run itself is :mod:`troll.tce.ppo`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from troll.episodic.config import SIZE_LIMITS, TCEConfig, flag
from troll.episodic.envs.registry import ppo_envs
from troll.episodic.presets import PRESETS, env_family
from troll.runs.numbers import FieldError, check_int, check_real, check_seed, is_int

# the episodic envs' T (Reacher-v5's time limit, Meta-World's path length, fancy_gym's box-pushing and hopper-jump
# episodes)
HORIZON = {"gym": 50, "metaworld": 500, "box-pushing": 100, "hopper": 250}


@dataclass(frozen=True)
class PPOConfig:
    """A PPO run (:mod:`troll.tce.ppo`). The SB3 fields keep SB3's names and defaults; ``net_arch`` is the width of the
    policy's and the value's hidden layers. ``eval_every_steps`` / ``eval_episodes`` / ``total_env_steps`` default
    to TCE's preset for the env (:meth:`preset`); ``checkpoint_every`` counts rollouts."""

    algo: str = "ppo"
    env: str = "gym/reacher"
    total_env_steps: int = 400_000
    eval_every_steps: int = 8000
    eval_episodes: int = 32
    seed: int = 0
    threads: int = 1
    checkpoint_every: int = 10
    learning_rate: float = field(default=3e-4, metadata=flag("X", "PPO: Adam step size (SB3 default: 3e-4)"))
    n_steps: int = field(default=2048, metadata=flag("N", "PPO: env steps per rollout (SB3 default: 2048)"))
    batch_size: int = field(default=64, metadata=flag("N", "PPO: minibatch size (SB3 default: 64)"))
    n_epochs: int = field(default=10, metadata=flag("N", "PPO: epochs per rollout (SB3 default: 10)"))
    gamma: float = field(default=0.99, metadata=flag("X", "PPO: discount (SB3 default: 0.99)"))
    gae_lambda: float = field(default=0.95, metadata=flag("X", "PPO: GAE lambda (SB3 default: 0.95)"))
    clip_range: float = field(default=0.2, metadata=flag("X", "PPO: clip range (SB3 default: 0.2)"))
    ent_coef: float = field(default=0.0, metadata=flag("X", "PPO: entropy bonus weight (SB3 default: 0)"))
    vf_coef: float = field(default=0.5, metadata=flag("X", "PPO: value loss weight (SB3 default: 0.5)"))
    max_grad_norm: float = field(default=0.5, metadata=flag("X", "PPO: gradient norm clip (SB3 default: 0.5)"))
    net_arch: tuple[int, ...] = field(
        default=(64, 64),
        metadata=flag("WIDTHS", "PPO: hidden widths of the policy and of the value MLP (SB3 default: 64,64)"),
    )

    def __post_init__(self):
        if isinstance(self.net_arch, list):
            object.__setattr__(self, "net_arch", tuple(self.net_arch))
        if self.algo != "ppo":
            raise FieldError(f"algo must be 'ppo' for a PPOConfig, got {self.algo!r}.", "algo")
        family = env_family(self.env)  # unknown names raise with a close match
        if family == "toy":
            raise ValueError(
                f"env {self.env!r} has no step-based interface (the toy task simulates whole trajectories in torch): "
                f"PPO runs on {ppo_envs()} only; use --algo tce or bbrl there."
            )
        ints = ("total_env_steps", "eval_every_steps", "eval_episodes", "threads", "checkpoint_every", "n_steps")
        for name in (*ints, "batch_size", "n_epochs"):
            check_int(name, getattr(self, name), low=1, high=SIZE_LIMITS.get(name, 10**12))
        check_seed("seed", self.seed)
        # an Adam step above 1 (and 1e300 overflows), a loss weight above 1e6 swamps the rest in float32
        for name, low, high in (("learning_rate", 0, 1), ("clip_range", 0, None), ("gamma", 0, 1),
                                ("gae_lambda", 0, 1), ("max_grad_norm", 0, None)):  # fmt: skip
            default = getattr(PPOConfig, name)
            check_real(name, getattr(self, name), low=low, high=high, hint=f"SB3's default is {default}")
        for name in ("ent_coef", "vf_coef"):
            check_real(name, getattr(self, name), low=0, low_open=False, high=1e6)
        if not all(is_int(h) and 1 <= h <= SIZE_LIMITS["width"] for h in self.net_arch):
            raise FieldError(
                f"net_arch must be layer widths >= 1, got {self.net_arch!r}; SB3's default is (64, 64).", "net_arch"
            )

    @property
    def horizon(self) -> int:
        return HORIZON[env_family(self.env)]

    @classmethod
    def preset(cls, env: str, *, eval_every: int | None = None, episodes: int | None = None, **overrides) -> PPOConfig:
        """SB3's defaults, with the budget, evaluation episodes and evaluation env steps of TCE's preset for ``env``:
        evaluations every ``eval_every x episodes x T`` env steps (TCE iterations of ``episodes`` episodes)."""
        family = env_family(env)
        if family == "toy":
            cls(env=env)  # the error that says why
        preset = {**dataclasses.asdict(TCEConfig()), **PRESETS[family]}
        eval_every = preset["eval_every"] if eval_every is None else eval_every
        episodes = preset["episodes"] if episodes is None else episodes
        for name, value in (("eval_every", eval_every), ("episodes", episodes)):  # 0 is an error, not the preset
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FieldError(f"{name} must be an integer >= 1, got {value!r}.", name)
        every = eval_every * episodes * HORIZON[family]
        base = dict(total_env_steps=preset["total_env_steps"], eval_every_steps=every,
                    eval_episodes=preset["eval_episodes"])  # fmt: skip
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown PPOConfig field(s) {', '.join(unknown)}.")
        return cls(**{**base, "env": env, **overrides})

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["net_arch"] = list(out["net_arch"])
        return out

    @classmethod
    def from_dict(cls, data: dict) -> PPOConfig:
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown PPOConfig field(s) {', '.join(unknown)}.")
        return cls(**data)
