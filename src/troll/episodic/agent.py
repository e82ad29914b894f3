"""The TCE agent, and BBRL in the same code (docs/tce.md, "What TCE is").

One iteration:
1. rollout: reset E episodes (contexts c), sample theta ~ N(mu(c), L L^T), build each desired trajectory with the
   ProDMP, let the env track it (every step's state, reward, done comes back);
2. critic: ``critic_epochs`` of Adam on the MSE to the targets (TCE: GAE lambda-returns of the step critic
   V(s_t, t/T, c); BBRL: the episode returns R for the context critic V(c));
3. advantages (TCE: one per segment pair, segments.py; BBRL: A = R - V(c) per episode), normalised over the batch,
   from the critic just fitted, or with ``values_before_fit`` (the authors') from its values at sampling time;
4. policy: ``policy_epochs`` of Adam on troll.gaussian's ``trpl_loss`` (scored by ``log_prob``)
       loss = -mean(exp(log p^ - log p_old) A) + trust_region_coeff * mean(d(pi~, sg(pi^)))
   where pi~ = net(c), pi^ its KL projection onto the trust region around the old (pre-update, detached) policy,
   log p the pair log-likelihoods of the sampled trajectories (TCE) or the log-likelihood of theta (BBRL), both
   under pi^ (after entropy control, when scheduled). No clipping.

How this departs from the paper's description, and why: the policy net runs in float64 (it sees E contexts, and
the pair likelihoods need float64 anyway); the critic's targets are standardised by running statistics with its
outputs preserved (Meta-World returns reach thousands; 50 full-batch steps an iteration cannot track that scale
otherwise); the context normaliser is updated with each batch's contexts before sampling (they are known at
reset), then frozen through the update, so the sampling policy and the trust region's old policy are the same
function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from troll.episodic.config import TCEConfig
from troll.episodic.critic import Critic, alive_mask, fit_critic, gae, step_inputs
from troll.episodic.envs.base import Episodes, EpisodeStart
from troll.episodic.policy import ContextPolicy, check_context
from troll.episodic.prodmp import ProDMP, gather_times
from troll.episodic.segments import normalize, pair_log_prob_fn, segment_advantages, segment_index
from troll.gaussian import EntropySchedule, Gaussian, trpl_loss
from troll.gaussian.distances import cov_distance, mean_distance

EVAL_STREAM = 0x7E57  # the evaluation's reset seed is drawn from (seed, EVAL_STREAM): fixed through a run


def reset_seed(seed: int, stream: int) -> int:
    """A 31-bit env reset seed from (run seed, stream): iteration i uses stream i, evaluations EVAL_STREAM."""
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0] & 0x7FFFFFFF)


@dataclass
class Rollout:
    """One batch. start: the reset (context (E, C), pos (E, D), vel (E, D)); theta (E, P) float64 the sampled
    parameters; pos, vel (E, T + 1, D) float64 the desired trajectories; episodes: what the env returned."""

    start: EpisodeStart
    theta: torch.Tensor
    pos: torch.Tensor
    vel: torch.Tensor
    episodes: Episodes


def _movement_primitive(cfg: TCEConfig, *, dof: int, duration: float, horizon: int) -> ProDMP:
    """The run's ProDMP: D = ``dof`` over the episode's ``duration`` seconds in T = ``horizon`` steps."""
    return ProDMP(
        num_dof=dof,
        duration=duration,
        num_steps=horizon,
        num_basis=cfg.num_basis,
        alpha=cfg.dmp_alpha,
        alpha_x=cfg.dmp_alpha_x,
        weights_scale=cfg.weights_scale,
        goal_scale=cfg.goal_scale,
        relative_goal=cfg.relative_goal,
        tau=cfg.tau,
        basis_bandwidth=cfg.basis_bandwidth,
        auto_scale=cfg.auto_scale_basis,
    )


def _networks(cfg: TCEConfig, context_dim: int, num_params: int, critic_in: int) -> tuple[ContextPolicy, Critic]:
    """The policy (C -> P) and the critic (``critic_in`` inputs), initialised from the run's seed without touching
    the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        policy = ContextPolicy(
            context_dim,
            num_params,
            hidden=cfg.policy_hidden,
            activation=cfg.activation,
            init_std=cfg.init_std,
            min_std=cfg.min_std,
            covariance=cfg.covariance,
            normalize=cfg.normalize_context,
        )
        critic = Critic(
            critic_in,
            hidden=cfg.critic_hidden,
            activation=cfg.critic_activation,
            normalize_inputs=cfg.normalize_observations,
            normalize_values=cfg.normalize_values,
        )
    return policy, critic


def _entropy_schedule(cfg: TCEConfig, policy: ContextPolicy, num_params: int, total_iterations: int) -> EntropySchedule:
    """The schedule over ``total_iterations``, from the entropy h0 of the initial policy's Gaussian over its P =
    ``num_params`` parameters; its target is ``entropy_target`` nats a parameter above h0 (reference "initial") or
    above 0."""
    chol = policy.cholesky().detach()
    h0 = float(Gaussian.from_chol(torch.zeros(1, num_params, dtype=chol.dtype), chol).entropy())
    reference = h0 if cfg.entropy_reference == "initial" else 0.0
    return EntropySchedule(
        cfg.entropy_schedule,
        initial=h0,
        target=reference + cfg.entropy_target * num_params,
        total_steps=total_iterations,
        rate=cfg.entropy_rate,
    )


class TCEAgent:
    """Policy, critic, their optimisers and the sampling RNG of one TCE or BBRL run (``config.algo``).

    Build it with :meth:`for_env`. ``total_iterations`` sets the entropy schedule's length (unused without one).
    ``state_dict`` / ``load_state_dict`` hold everything a resumed run needs (networks, normalisers, Adam, RNG).
    """

    def __init__(
        self,
        config: TCEConfig,
        *,
        context_dim: int,
        state_dim: int,
        dof: int,
        horizon: int,
        dt: float,
        total_iterations: int = 1,
    ):
        cfg = self.config = config
        self.horizon, self.dof, self.state_dim = horizon, dof, state_dim
        if cfg.num_segments > horizon:
            raise ValueError(
                f"num_segments={cfg.num_segments} exceeds the env's horizon {horizon}: K pairs need K + 1 distinct "
                f"step indices; set num_segments <= {horizon}."
            )
        self.dmp = _movement_primitive(cfg, dof=dof, duration=horizon * dt, horizon=horizon)
        critic_in = context_dim if cfg.algo != "tce" else state_dim + 1 + context_dim * cfg.critic_context
        self.policy, self.critic = _networks(cfg, context_dim, self.dmp.num_params, critic_in)
        self.policy_opt = torch.optim.Adam(self.policy.parameters(), lr=cfg.policy_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.iteration, self.total_iterations = 0, max(1, total_iterations)
        self.entropy_schedule = _entropy_schedule(cfg, self.policy, self.dmp.num_params, self.total_iterations)

    @classmethod
    def for_env(cls, config: TCEConfig, env, *, total_iterations: int = 1) -> TCEAgent:
        """An agent with the env's dimensions (context C, state S, DoF D, horizon T, dt)."""
        if env.num_episodes != config.episodes:
            raise ValueError(
                f"the env runs {env.num_episodes} episodes at a time but config.episodes={config.episodes}; build it "
                "with make_env(..., num_episodes=config.episodes)."
            )
        return cls(
            config,
            context_dim=env.context_dim,
            state_dim=env.state_dim,
            dof=env.dof,
            horizon=env.horizon,
            dt=env.dt,
            total_iterations=total_iterations,
        )

    # ------------------------------------------------------------------------------------------ acting

    def trajectories(self, start: EpisodeStart, *, deterministic: bool = False, generator=None):
        """theta (E, P) and the desired (pos, vel) (E, T + 1, D), float64: sampled (from ``generator``, by default the
        run's), or the mean (deterministic)."""
        check_context(start.context, self.policy.context_dim)
        with torch.no_grad():
            policy = self.policy(start.context)
            theta = policy.mean
            if not deterministic:
                noise = torch.randn(theta.shape, generator=generator or self.generator, dtype=theta.dtype)
                factor = policy.factor
                theta = theta + (noise * factor if policy.kind == "diag" else noise @ factor.mT)
            y0, v0 = start.pos.double(), start.vel.double()
            pos, vel = self.dmp.trajectory(theta, y0, v0)
        return theta, pos, vel

    def rollout(self, env, seed: int) -> Rollout:
        """Reset E episodes with ``seed``, fold their contexts into the normaliser, sample, run."""
        start = env.reset(seed)
        self.policy.update_normalizer(start.context)
        theta, pos, vel = self.trajectories(start)
        return Rollout(start, theta, pos, vel, env.run(pos, vel))

    @torch.no_grad()
    def evaluate(self, env, seed: int) -> dict[str, float]:
        """The mean trajectory (no sampling) on the episodes of ``env.reset(seed)``: return, success, distance."""
        start = env.reset(seed)
        _, pos, vel = self.trajectories(start, deterministic=True)
        return episode_metrics(env.run(pos, vel), "eval")

    # ------------------------------------------------------------------------------------------ learning

    def update(self, batch: Rollout) -> dict[str, float]:
        """Critic epochs, then advantages, then policy epochs on one batch; returns the iteration's metrics."""
        self.check_batch(batch)
        ep, cfg = batch.episodes, self.config
        self._set_learning_rates()
        t0 = time.perf_counter()
        if cfg.algo == "tce":
            metrics, adv, log_prob = self._tce_critic(batch)
        else:
            metrics, adv, log_prob = self._bbrl_critic(batch)
        t1 = time.perf_counter()
        metrics |= self._policy_epochs(batch.start.context, adv, log_prob)
        t2 = time.perf_counter()
        self.iteration += 1
        metrics |= episode_metrics(ep, "rollout")
        metrics |= {"time/critic": t1 - t0, "time/policy": t2 - t1}
        return metrics

    def _tce_critic(self, batch: Rollout):
        """Fit V(s_t, t/T, c) to GAE targets; segment advantages (E, K) and the pair log-likelihood function."""
        ep, cfg = batch.episodes, self.config
        alive = alive_mask(ep.dones)
        inputs = step_inputs(ep.states, batch.start.context if cfg.critic_context else None, self.horizon)
        with torch.no_grad():
            values = self.critic(inputs)  # the critic of sampling time (it changes only in update)
        _, targets = gae(ep.rewards, values, alive, gamma=cfg.gamma, lam=cfg.gae_lambda)
        live = alive[:, :-1]
        x, y = inputs[:, :-1][live], targets[live]
        self.critic.update_statistics(x, y)
        metrics = fit_critic(
            self.critic,
            self.critic_opt,
            x,
            y,
            epochs=cfg.critic_epochs,
            minibatches=cfg.critic_minibatches,
            generator=self.generator,
        )
        if not cfg.values_before_fit:
            with torch.no_grad():
                values = self.critic(inputs)
        e = ep.rewards.shape[0]
        index = segment_index(
            e,
            self.horizon,
            cfg.num_segments,
            random_offset=cfg.random_offset,
            shared=cfg.offset_per_iteration,
            generator=self.generator,
        )
        adv = segment_advantages(ep.rewards, values, alive, index, gamma=cfg.gamma)
        desired = gather_times(batch.pos, index)
        log_prob = pair_log_prob_fn(self.dmp, batch.start.pos, batch.start.vel, index, desired)  # (E, K)
        return metrics, adv, log_prob

    def _bbrl_critic(self, batch: Rollout):
        """Fit V(c) to the episode returns; advantages R - V(c) (E,) and the log-likelihood of theta."""
        ep, cfg = batch.episodes, self.config
        returns = discounted_returns(ep.rewards, alive_mask(ep.dones), cfg.gamma)
        context = batch.start.context
        with torch.no_grad():
            recorded = self.critic(context).double()  # the critic of sampling time
        self.critic.update_statistics(context, returns)
        metrics = fit_critic(self.critic, self.critic_opt, context, returns, epochs=cfg.critic_epochs)
        with torch.no_grad():
            adv = returns - (recorded if cfg.values_before_fit else self.critic(context).double())
        theta = batch.theta

        def log_prob(policy: Gaussian) -> torch.Tensor:  # (E,)
            return policy.log_prob(theta)

        return metrics, adv, log_prob

    def _policy_epochs(self, context: torch.Tensor, adv: torch.Tensor, log_prob) -> dict[str, float]:
        """``policy_epochs`` full-batch Adam steps on troll.gaussian's :func:`trpl_loss` (module docstring)."""
        cfg = self.config
        metrics = {"adv/raw_mean": float(adv.mean()), "adv/raw_std": float(adv.std()) if adv.numel() > 1 else 0.0}
        adv = normalize(adv) if cfg.normalize_advantages else adv
        bound = self.entropy_schedule.bound(self.iteration)
        with torch.no_grad():
            old = self.policy(context).detach()
            old_log_prob = log_prob(old)
        active, first = 0, None
        for _ in range(cfg.policy_epochs):
            out = trpl_loss(
                self.policy(context),
                old,
                None,
                adv,
                log_prob=log_prob,
                old_log_prob=old_log_prob,
                mean_bound=cfg.mean_bound,
                cov_bound=cfg.cov_bound,
                distance=cfg.distance,
                alpha=cfg.trust_region_coeff,
                entropy_bound=bound,
            )
            m = out.metrics
            if not torch.isfinite(out.loss):
                raise FloatingPointError(
                    f"the TCE policy loss is {float(out.loss)} (surrogate {float(m['loss/pg'])}, regression "
                    f"{float(m['loss/reg'])}); the ratio ranged {float(m['ratio/min']):.3g} - "
                    f"{float(m['ratio/max']):.3g}. Lower policy_lr or the bounds."
                )
            self.policy_opt.zero_grad(set_to_none=True)
            out.loss.backward()
            self.policy_opt.step()
            first = float(m["loss/pg"]) if first is None else first
            active += bool(m["projected_frac/mean"] > 0 or m["projected_frac/cov"] > 0)
        last = {k: float(v) for k, v in m.items()}
        metrics |= {f"proj/{k}": v for k, v in last.items() if not k.startswith(("loss/", "ratio/"))}
        metrics |= self._step_metrics(context, old, first, last, adv)
        metrics["proj/active_epochs"] = active / cfg.policy_epochs
        metrics["policy/entropy_bound"] = bound
        return metrics

    def learning_rate_factor(self, iteration: int) -> float:
        """The share of the configured learning rates at ``iteration``: (1 - t / T) + lr_final t / T, from 1 at t = 0 to
        lr_final at t = T (the run's iterations); constant 1 for lr_final = 1."""
        frac = min(iteration, self.total_iterations) / self.total_iterations
        return (1.0 - frac) + frac * self.config.lr_final  # exactly 1 and lr_final at the ends

    def _set_learning_rates(self) -> None:
        if self.config.lr_final == 1.0:  # constant: leave the optimisers exactly as built
            return
        factor = self.learning_rate_factor(self.iteration)
        for opt, lr in ((self.policy_opt, self.config.policy_lr), (self.critic_opt, self.config.critic_lr)):
            for group in opt.param_groups:
                group["lr"] = lr * factor

    @torch.no_grad()
    def _step_metrics(self, context, old: Gaussian, first: float, last: dict, adv) -> dict[str, float]:
        """How far the network moved (unprojected, vs the old policy), its entropy, the loss and ratio stats
        (``last``: the last epoch's loss metrics)."""
        new = self.policy(context)
        std = new.factor if new.kind == "diag" else new.factor.diagonal()
        return {
            "loss/pg_first": first,
            **{k: last[k] for k in ("loss/pg", "loss/reg", "ratio/mean", "ratio/min", "ratio/max")},
            "adv/mean": float(adv.mean()),
            "adv/std": float(adv.std()) if adv.numel() > 1 else 0.0,
            "adv/pos_frac": float((adv > 0).double().mean()),
            "policy/entropy": float(new.entropy()),
            "policy/chol_diag_min": float(std.min()),
            "policy/chol_diag_max": float(std.max()),
            "policy/mean_dist": float(mean_distance(new.mean, old, distance=self.config.distance).mean()),
            "policy/cov_dist": float(cov_distance(new, old, distance=self.config.distance)),
            "policy/mean_abs": float(new.mean.abs().mean()),
        }

    # ------------------------------------------------------------------------------------------ checks, state

    def check_batch(self, batch: Rollout) -> None:
        """Shapes and finiteness of a batch; ValueError naming what is wrong (before any parameter moves)."""
        ep = batch.episodes
        check_context(batch.start.context, self.policy.context_dim)
        e = batch.start.context.shape[0]
        t, s = self.horizon, self.state_dim
        for name, x, shape in (
            ("states", ep.states, (e, t + 1, s)),
            ("rewards", ep.rewards, (e, t)),
            ("dones", ep.dones, (e, t)),
            ("theta", batch.theta, (e, self.dmp.num_params)),
            ("pos", batch.pos, (e, t + 1, self.dof)),
        ):
            if not torch.is_tensor(x) or tuple(x.shape) != shape:
                got = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
                raise ValueError(f"batch {name} must have shape {shape} (E, T = {t}, S = {s}), got {got}.")
            if x.dtype != torch.bool and not bool(torch.isfinite(x).all()):
                raise ValueError(
                    f"batch {name} contains NaN or inf; the environment must return finite observations and rewards "
                    "(troll's envs raise NonFiniteError at the step that produced one)."
                )

    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "policy_opt": self.policy_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "generator": self.generator.get_state(),
            "iteration": self.iteration,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.policy_opt.load_state_dict(state["policy_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.generator.set_state(state["generator"])
        self.iteration = int(state["iteration"])


def discounted_returns(rewards: torch.Tensor, alive: torch.Tensor, gamma: float) -> torch.Tensor:
    """R = sum_t gamma^t r_t over the steps before the episode ended, (E,) float64; rewards (E, T)."""
    r = torch.where(alive[:, :-1], rewards.double(), 0.0)  # r_t counts while s_t is alive
    return (r * gamma ** torch.arange(r.shape[1], dtype=r.dtype)).sum(1)


def episode_metrics(ep: Episodes, prefix: str) -> dict[str, float]:
    """Mean return, success rate after the last step and at any step (when the task has a rule), final distance and
    maximum height (when reported) of a batch."""
    out = {f"{prefix}/return": float(ep.rewards.double().sum(1).mean())}
    if ep.success is not None:
        out[f"{prefix}/success_rate"] = float(ep.success.double().mean())
    if "success_any" in ep.final:
        out[f"{prefix}/success_any"] = float(ep.final["success_any"].double().mean())
    if "distance" in ep.final:
        out[f"{prefix}/distance"] = float(ep.final["distance"].double().mean())
    if "max_height" in ep.final:  # hopper jump's own measure
        out[f"{prefix}/max_height"] = float(ep.final["max_height"].double().mean())
    return out
