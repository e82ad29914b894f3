"""End-to-end check that troll.gaussian trains: step-based PPO with the TRPL projection instead of clipping, on a
gymnasium MuJoCo task, against stable-baselines3's PPO on the same budget.

TRPL-PPO (``--algo trpl``) is cleanrl-style PPO with these departures from the canonical algorithm:
- no ratio clipping: each minibatch step projects the Gaussian policy onto the KL trust region around the rollout
  policy (troll.gaussian.trpl_loss: surrogate on the projection + alpha * regression to it);
- the covariance is one global (state-independent) diagonal std, or with ``--cov chol`` one global Cholesky factor,
  projected once per minibatch; no entropy bonus; no KL early stopping.
Everything else follows SB3's PPO defaults so that the comparison is about the trust region: 2048 steps a rollout,
10 epochs of minibatches of 64, Adam 3e-4, gamma 0.99, GAE lambda 0.95, advantages normalised per minibatch,
value loss weight 0.5, gradient norm clip 0.5, two 64-unit tanh layers for the policy and the value function.
``--algo sb3`` runs stable_baselines3.PPO("MlpPolicy") with its defaults.

Both record every finished training episode (its return, the env steps so far). Writes, in a results folder it
creates fresh (default benchmarks/results/gaussian_ppo-<time>): episodes.csv, summary.json (per algorithm and seed
the mean return of the last 10 episodes, the first step at which the 10-episode mean reached --threshold, the wall
time) and returns.png.

    python benchmarks/gaussian_ppo.py --algo trpl sb3 --seeds 0 1 2 --steps 60000        # InvertedPendulum-v5
    python benchmarks/gaussian_ppo.py --algo trpl --env Reacher-v5 --threshold -10 --steps 200000
    python benchmarks/gaussian_ppo.py --quick --algo trpl sb3     # smoke run: seed 0, 2048 steps

Needs gymnasium >= 1.1, mujoco and (for --algo sb3) stable-baselines3; matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from datetime import datetime
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import troll.gaussian as tg

RESULTS = Path(__file__).parent / "results"
WINDOW = 10  # episodes in the moving mean that summaries and the plot use


def mlp(inp: int, out: int, *, last_std: float) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(inp, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out))
    for layer in net[::2]:
        nn.init.orthogonal_(layer.weight, gain=2**0.5 if layer is not net[-1] else last_std)
        nn.init.zeros_(layer.bias)
    return net


class Agent(nn.Module):
    """Gaussian policy with a global covariance (diagonal std or Cholesky factor) and a value function."""

    def __init__(self, obs_dim: int, act_dim: int, cov: str):
        super().__init__()
        self.mean_net, self.value_net = mlp(obs_dim, act_dim, last_std=0.01), mlp(obs_dim, 1, last_std=1.0)
        self.cov = cov
        self.log_std = nn.Parameter(torch.zeros(act_dim))
        self.off_diag = nn.Parameter(torch.zeros(act_dim, act_dim)) if cov == "chol" else None

    def policy(self, obs: torch.Tensor) -> tg.Gaussian:
        mean = self.mean_net(obs)
        if self.cov == "diag":
            return tg.Gaussian.from_std(mean, self.log_std.exp())
        return tg.Gaussian.from_chol(mean, self.off_diag.tril(-1) + torch.diag(self.log_std.exp()))

    def sample(self, policy: tg.Gaussian) -> torch.Tensor:
        eps = torch.randn_like(policy.mean)
        return policy.mean + (eps * policy.factor if policy.kind == "diag" else eps @ policy.factor.mT)


def gae(rewards, values, dones, last_value, *, gamma: float, lam: float):
    """Generalised advantage estimates and returns over one rollout; dones[t] marks that s_{t+1} starts anew."""
    adv = torch.zeros_like(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        next_value = last_value if t == len(rewards) - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * nonterminal - values[t]
        running = delta + gamma * lam * nonterminal * running
        adv[t] = running
    return adv, adv + values


def train_trpl(env_id: str, seed: int, steps: int, args) -> list[tuple[int, float]]:
    """TRPL-PPO for ``steps`` env steps; returns (env steps so far, return) per finished episode."""
    torch.manual_seed(seed)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    low, high = env.action_space.low, env.action_space.high
    agent = Agent(obs_dim, act_dim, args.cov)
    opt = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)
    n = args.rollout
    buf = {k: torch.zeros(n, d) for k, d in (("obs", obs_dim), ("act", act_dim), ("mean", act_dim))}
    buf |= {k: torch.zeros(n) for k in ("logp", "rew", "done", "val")}
    episodes, step = [], 0
    obs, _ = env.reset(seed=seed)
    while step < steps:
        with torch.no_grad():
            old_factor = agent.policy(torch.zeros(1, obs_dim)).factor.detach().clone()
        for t in range(n):
            o = torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)
            with torch.no_grad():
                pol = agent.policy(o)
                act = agent.sample(pol)
                buf["logp"][t], buf["val"][t] = pol.log_prob(act)[0], agent.value_net(o)[0, 0]
            buf["obs"][t], buf["act"][t], buf["mean"][t] = o[0], act[0], pol.mean[0]
            obs, rew, term, trunc, info = env.step(np.clip(act[0].numpy(), low, high))
            step += 1
            if trunc and not term:  # a time limit is not a terminal state: bootstrap through it (as SB3 does)
                with torch.no_grad():
                    rew += args.gamma * agent.value_net(torch.as_tensor(obs, dtype=torch.float32)).item()
            buf["rew"][t], buf["done"][t] = rew, float(term or trunc)
            if term or trunc:
                episodes.append((step, float(info["episode"]["r"])))
                obs, _ = env.reset()
        with torch.no_grad():
            last = agent.value_net(torch.as_tensor(obs, dtype=torch.float32)).item()
        adv, ret = gae(buf["rew"], buf["val"], buf["done"], last, gamma=args.gamma, lam=args.gae_lambda)
        update(agent, opt, buf, adv, ret, old_factor, args)
    env.close()
    return episodes


def update(agent, opt, buf, adv, ret, old_factor, args) -> dict:
    """10 epochs of minibatch steps of the TRPL loss + value loss; the trust region is around the rollout policy."""
    n = len(adv)
    metrics = {}
    for _ in range(args.epochs):
        for idx in torch.randperm(n).split(args.minibatch):
            a = adv[idx]
            a = (a - a.mean()) / (a.std() + 1e-8)
            old = tg.Gaussian(buf["mean"][idx], old_factor, "diag" if args.cov == "diag" else "chol")
            out = tg.trpl_loss(
                agent.policy(buf["obs"][idx]),
                old,
                buf["act"][idx],
                a,
                mean_bound=args.mean_bound,
                cov_bound=args.cov_bound,
                alpha=args.alpha,
                old_log_prob=buf["logp"][idx],
            )
            value_loss = (agent.value_net(buf["obs"][idx]).squeeze(-1) - ret[idx]).square().mean()
            opt.zero_grad()
            (out.loss + 0.5 * value_loss).backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            opt.step()
            metrics = out.metrics
    return metrics


def train_sb3(env_id: str, seed: int, steps: int, args) -> list[tuple[int, float]]:
    """stable-baselines3 PPO with its defaults; records each finished episode through a callback."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor

    episodes = []

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    episodes.append((self.num_timesteps, float(info["episode"]["r"])))
            return True

    model = PPO("MlpPolicy", Monitor(gym.make(env_id)), seed=seed, device="cpu", verbose=0)
    model.learn(total_timesteps=steps, callback=Record())
    return episodes


def summarise(episodes: list[tuple[int, float]], threshold: float, wall: float, steps: int) -> dict:
    """The mean of the last WINDOW episodes, the mean over the last fifth of the budget, the first step at which the
    WINDOW-episode mean reached ``threshold`` (None if never), and the wall time."""
    returns = [r for _, r in episodes]
    moving = [statistics.fmean(returns[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(returns))]
    reached = next((s for (s, _), m in zip(episodes, moving) if m >= threshold), None)
    late = [r for s, r in episodes if s > 0.8 * steps] or returns[-1:]
    return {
        "final_return": moving[-1] if moving else None,
        "last_fifth_mean": statistics.fmean(late) if late else None,
        "steps_to_threshold": reached,
        "wall_s": round(wall, 1),
    }


def plot(rows: list[dict], out: Path, env_id: str, threshold: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    grid = np.linspace(0, max(r["step"] for r in rows), 200)
    for algo in sorted({r["algo"] for r in rows}):
        curves = []
        for seed in sorted({r["seed"] for r in rows if r["algo"] == algo}):
            eps = [(r["step"], r["return"]) for r in rows if r["algo"] == algo and r["seed"] == seed]
            steps = np.array([s for s, _ in eps])
            ret = np.array([x for _, x in eps])
            moving = np.array([ret[max(0, i - WINDOW + 1) : i + 1].mean() for i in range(len(ret))])
            curves.append(np.interp(grid, steps, moving))  # held constant before the first episode
        curves = np.array(curves)
        label = {"trpl": "PPO + TRPL projection (troll.gaussian)", "sb3": "SB3 PPO (clip)"}.get(algo, algo)
        ax.plot(grid, curves.mean(0), label=f"{label}, {len(curves)} seeds")
        ax.fill_between(grid, curves.min(0), curves.max(0), alpha=0.2)
    ax.axhline(threshold, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="env steps", ylabel=f"return (mean of {WINDOW} episodes)", title=env_id)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algo", nargs="+", default=["trpl"], choices=["trpl", "sb3"])
    p.add_argument("--env", default="InvertedPendulum-v5")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=60_000, help="env steps per run (the budget)")
    p.add_argument("--threshold", type=float, default=950.0, help="the 'solved' return (InvertedPendulum: 1000 max)")
    p.add_argument("--cov", choices=["diag", "chol"], default="diag", help="global diagonal std or Cholesky factor")
    p.add_argument("--mean-bound", type=float, default=0.03)
    p.add_argument("--cov-bound", type=float, default=0.001)
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--rollout", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--minibatch", type=int, default=64)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="a new folder (default results/gaussian_ppo[-quick]-<time>)")
    p.add_argument("--quick", action="store_true", help="smoke run: seed 0, 2048 env steps, rollouts of 512")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.seeds, args.steps, args.rollout = [0], 2048, 512
    out = args.out or RESULTS / f"gaussian_ppo{'-quick' if args.quick else ''}-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=False)  # never write into a folder that already holds results
    (out / "config.json").write_text(json.dumps({k: str(v) for k, v in vars(args).items()}, indent=1))
    rows, summary = [], {}
    for algo in args.algo:
        for seed in args.seeds:
            t0 = time.perf_counter()
            episodes = (train_trpl if algo == "trpl" else train_sb3)(args.env, seed, args.steps, args)
            wall = time.perf_counter() - t0
            rows += [{"algo": algo, "seed": seed, "step": s, "return": r} for s, r in episodes]
            summary.setdefault(algo, {})[seed] = summarise(episodes, args.threshold, wall, args.steps)
            print(algo, seed, summary[algo][seed], flush=True)
            with open(out / "episodes.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=["algo", "seed", "step", "return"])
                w.writeheader()
                w.writerows(rows)
            (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for algo, seeds in summary.items():
        finals = [s["final_return"] for s in seeds.values()]
        print(f"{algo}: final {statistics.fmean(finals):.1f} (min {min(finals):.1f}, max {max(finals):.1f})")
    plot(rows, out / "returns.png", args.env, args.threshold)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
