"""Critics and their targets: TCE's step critic V(s_t, t/T) with GAE, BBRL's context critic V(c) (docs/tce.md).

Shapes: E episodes, T env steps, S state entries, C context entries, F critic inputs.

Episode ends. Every episode lasts exactly T steps (the horizon), and time t/T is an input of the critic, so the
end at T is part of the task, not a truncation of a longer one: no reward follows s_T, and V(s_T) = 0 exactly (it
is not bootstrapped from the network; with gamma = 1 a bootstrap at T would add rewards that never come). A true
termination at step t (``dones[:, t]``) ends the episode too: s_{t+1} and every later (padded) state have value
0. :func:`alive_mask` marks the states whose value is the network's, the same rule for GAE and for the segment
advantages (segments.py). With gamma = 1:

    delta_t = r_t + V(s_{t+1}) - V(s_t),     A_t = delta_t + gamma lambda A_{t+1} [s_{t+1} alive],
    target_t = A_t + V(s_t)                  (the lambda-return; fitted on alive states t < T only)
"""

from __future__ import annotations

import torch
from torch import nn

from troll.episodic.normalize import RunningNorm, ValueScale
from troll.episodic.policy import mlp


class Critic(nn.Module):
    """V(x) for inputs x (..., F): an MLP on normalised inputs whose output is in standardised value units.

    ``normalize_inputs``: running statistics of the inputs (:class:`RunningNorm`). ``normalize_values``: the
    network predicts (V - m) / s with m, s running statistics of the targets (:class:`ValueScale`); when they move,
    the last layer is rescaled so that no prediction changes. Both are updated by :meth:`update_statistics`, once
    per iteration before the critic epochs. float32: the step critic sees E (T + 1) states.
    """

    def __init__(
        self,
        input_dim: int,
        *,
        hidden: tuple[int, ...] = (128, 128),
        activation: str = "tanh",
        normalize_inputs: bool = True,
        normalize_values: bool = True,
    ):
        super().__init__()
        self.input_dim = input_dim
        self.norm = RunningNorm(input_dim) if normalize_inputs else None
        self.scale = ValueScale() if normalize_values else None
        self.net = mlp(input_dim, hidden, 1, activation, out_gain=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """V (...,) in reward units for x (..., F)."""
        return self.unscale(self.normalized(x))

    def normalized(self, x: torch.Tensor) -> torch.Tensor:
        """The network's output (...,) in standardised units (what the loss compares)."""
        x = x.float()
        if self.norm is not None:
            x = self.norm(x)
        return self.net(x).squeeze(-1)

    def unscale(self, v: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            return v
        return v * self.scale.std.float() + self.scale.mean.float()

    def rescale(self, target: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            return target.float()
        return ((target - self.scale.mean) / self.scale.std).float()

    @torch.no_grad()
    def update_statistics(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Merge a batch of inputs (N, F) and targets (N,) into the running statistics (preserving V's outputs)."""
        if self.norm is not None:
            # the input statistics move the predictions a little; that is the price of normalising the inputs
            self.norm.update(inputs)
        if self.scale is not None:
            (m0, s0), (m1, s1) = self.scale.update(targets)
            last = self.net[-1]
            last.weight.mul_(s0 / s1)
            last.bias.mul_(s0).add_(m0 - m1).div_(s1)


def step_inputs(states: torch.Tensor, context: torch.Tensor | None, horizon: int) -> torch.Tensor:
    """The step critic's inputs (E, T + 1, F): [s_t, t / T, c] with F = S + 1 (+ C when ``context`` is given).

    states (E, T + 1, S); context (E, C) or None. The context (what theta was chosen from) is appended because the
    future of s_t depends on the episode's theta, which s_t alone does not show.
    """
    e, steps, _ = states.shape
    time = (torch.arange(steps, dtype=states.dtype) / horizon).expand(e, steps).unsqueeze(-1)
    parts = [states, time]
    if context is not None:
        parts.append(context.to(states.dtype).unsqueeze(1).expand(-1, steps, -1))
    return torch.cat(parts, -1)


def alive_mask(dones: torch.Tensor) -> torch.Tensor:
    """(E, T + 1) bool: state t has a learned value (no termination before it and t < T); see the module docstring.

    dones (E, T) bool: a termination at step t makes s_{t+1} and every later state dead. s_T is always dead.
    """
    e, t = dones.shape
    ended = torch.cumsum(dones.to(torch.int64), 1) > 0  # (E, T): terminated at or before step t
    alive = torch.ones(e, t + 1, dtype=torch.bool)
    alive[:, 1:] = ~ended
    alive[:, -1] = False
    return alive


def gae(
    rewards: torch.Tensor, values: torch.Tensor, alive: torch.Tensor, *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), float64.

    rewards (E, T); values (E, T + 1) V(s_t) from the critic (any value where not alive: it is zeroed);
    alive (E, T + 1) from :func:`alive_mask`. Returns advantages (E, T) and targets A_t + V(s_t) (E, T), both 0
    at dead states:
        delta_t = r_t + gamma V(s_{t+1}) - V(s_t),     A_t = delta_t + gamma lam A_{t+1}
    with V = 0 and A = 0 at dead states (nothing is bootstrapped across an episode's end).
    """
    r = rewards.double()
    v = torch.where(alive, values.double(), 0.0)
    live = alive[:, :-1]
    delta = torch.where(live, r + gamma * v[:, 1:] - v[:, :-1], 0.0)
    adv = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = delta[:, t] + gamma * lam * torch.where(alive[:, t + 1], running, 0.0)
        adv[:, t] = running
    adv = torch.where(live, adv, 0.0)
    return adv, torch.where(live, adv + v[:, :-1], 0.0)


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - pred) / Var(target) over all entries (1: perfect, 0: as good as the mean, < 0: worse)."""
    target, pred = target.double().reshape(-1), pred.double().reshape(-1)
    var = target.var(unbiased=False)
    if not var > 0:
        return float("nan")
    return float(1 - (target - pred).var(unbiased=False) / var)


def fit_critic(
    critic: Critic,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    epochs: int,
    minibatches: int = 1,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """``epochs`` passes of Adam on the MSE (in standardised units) between V(inputs) and targets.

    inputs (N, F), targets (N,): the alive states only. ``minibatches`` > 1 splits each pass into that many random
    minibatches (1: one full-batch step per epoch, TCE's). Returns the first and last epoch's loss and the
    explained variance of the targets before and after the fit.
    """
    with torch.no_grad():
        before = critic(inputs)
        # the input normalisation is frozen through the fit and acts row by row: applied once, not every epoch
        z = inputs.float() if critic.norm is None else critic.norm(inputs.float())
    scaled = critic.rescale(targets)
    n = inputs.shape[0]
    losses = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator) if minibatches > 1 else None
        total = 0.0
        for part in range(minibatches):
            idx = slice(None) if order is None else order[part * n // minibatches : (part + 1) * n // minibatches]
            loss = (critic.net(z[idx]).squeeze(-1) - scaled[idx]).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item() / minibatches
        losses.append(total)
    with torch.no_grad():
        after = critic(inputs)
    return {
        "critic/loss_first": losses[0] if losses else float("nan"),
        "critic/loss": losses[-1] if losses else float("nan"),
        "critic/explained_var_before": explained_variance(before, targets),
        "critic/explained_var": explained_variance(after, targets),
        "critic/target_mean": float(targets.double().mean()),
        "critic/target_std": float(targets.double().std()) if n > 1 else 0.0,
    }
