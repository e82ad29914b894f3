"""A fast vectorised toy task in plain torch: a 2-DoF point mass must pass a via-point around mid-time and stop
at a goal (``toy/viapoint``, and ``toy/viapoint-sparse`` with all reward at the end).

Made for CI: an episodic policy over a ProDMP (2 DoF, ~5 basis functions + goal) solves it, a mean-zero or random
policy does not (the mass starts at rest at the origin, the via-point and the goal are uniform in [-1, 1]^2, so a
trajectory that does not depend on the context almost never passes within ``radius`` of both), and all E
episodes run as batched tensor ops, thousands of episodes a second. Checked with troll.episodic.prodmp (TCE's
alpha 10, alpha_x 3, weights and goal scale 1): for 1024 contexts the minimum-norm theta whose motion is at the
via-point at T/2 and at rest on the goal at T succeeds in every episode with 3, 5 or 8 basis functions; theta
is then linear in the context, with entries up to ~400. Theta ~ N(0, s^2) for s in {1, 10, 100} succeeds in none.

Dynamics (per coordinate, semi-implicit Euler at dt): a PD tracking controller with feedforward acceleration,
    u_k = clip(kp (p_d[k] - x_k) + kd (v_d[k] - v_k) + (v_d[k+1] - v_d[k]) / dt, -max_accel, max_accel)
    v_{k+1} = v_k + u_k dt,   x_{k+1} = x_k + v_{k+1} dt
Reward of step k (dense): - w(t_{k+1}) ||x_{k+1} - via||  with w a Gaussian window over time centred at half the
episode (sd 0.1 of it, weights summing to 1), plus at the last step - ||x_T - goal|| - speed_cost ||v_T||.
Sparse: 0 at every step but the last, which gets - via_distance - ||x_T - goal|| - speed_cost ||v_T||.
Success: within ``radius`` of the via-point at some step of the middle 40% of the episode (via_distance, the
minimum distance there), within ``radius`` of the goal at the end, and ||v_T|| <= max_speed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from troll.episodic.envs.base import Episodes, EpisodeStart, EpisodicEnv, check_episodes_finite
from troll.episodic.envs.options import Option

HORIZON = 100  # steps of an episode unless the option ``horizon`` says otherwise

# the options of toy/viapoint (registry.check_options): ranges where the task stays meaningful and float64-safe
OPTIONS = {
    "horizon": Option("int", 10, 10_000, help="steps per episode"),
    "dt": Option("float", 1e-4, 1.0, help="seconds per step"),
    "radius": Option("float", 1e-4, 10.0, help="success radius"),
    "max_speed": Option("float", 1e-4, 100.0, help="speed above which the speed cost starts"),
    "speed_cost": Option("float", 0.0, 1e3, help="weight of the speed cost"),
    "kp": Option("float", 0.0, 1e4, help="P gain"),
    "kd": Option("float", 0.0, 1e3, help="D gain"),
    "max_accel": Option("float", 1e-3, 1e4, help="acceleration clip"),
}


class ViaPointEnv(EpisodicEnv):
    """2-DoF point mass, via-point then goal. D = 2, T = ``horizon`` (100), dt = 0.02 s, C = 4, S = 8.

    context: (E, 4) [via_x, via_y, goal_x, goal_y].
    state:   (E, T+1, 8) [x, y, vx, vy, via_x, via_y, goal_x, goal_y] (the task is in the state so that a critic
             over states alone sees what the reward depends on).
    final:   "distance" to the goal, "speed", "via_distance" (closest approach in the middle window), "return".
    """

    def __init__(
        self,
        *,
        num_episodes: int,
        sparse: bool = False,
        horizon: int = HORIZON,
        dt: float = 0.02,
        radius: float = 0.1,
        max_speed: float = 0.25,
        speed_cost: float = 0.2,
        kp: float = 100.0,
        kd: float = 20.0,
        max_accel: float = 100.0,
    ):
        if num_episodes < 1 or horizon < 10:
            raise ValueError(f"toy/viapoint needs num_episodes >= 1 and horizon >= 10, got {num_episodes}, {horizon}")
        if dt <= 0 or radius <= 0 or max_speed <= 0:
            raise ValueError(f"toy/viapoint needs dt, radius and max_speed > 0, got {dt}, {radius}, {max_speed}")
        self.name = "toy/viapoint-sparse" if sparse else "toy/viapoint"
        self.sparse = sparse
        self.num_episodes, self.horizon, self.dt = num_episodes, horizon, dt
        self.dof, self.context_dim, self.state_dim = 2, 4, 8
        self.radius, self.max_speed, self.speed_cost = radius, max_speed, speed_cost
        self.kp, self.kd, self.max_accel = kp, kd, max_accel
        phase = torch.arange(1, horizon + 1, dtype=torch.float64) / horizon  # time of states 1..T, as a fraction
        window = torch.exp(-0.5 * ((phase - 0.5) / 0.1) ** 2)
        self._via_weight = (window / window.sum()).float()  # (T,) reward weight of state k + 1
        self._via_window = (phase - 0.5).abs() <= 0.2 + 1e-9  # (T,) where passing the via-point counts
        self._task: Tensor | None = None  # (E, 4) via-point and goal of the current episodes

    def reset(self, seed: int) -> EpisodeStart:
        """Draw a via-point and a goal uniformly in [-1, 1]^2 per episode from ``seed``; the mass starts at rest
        at the origin."""
        g = torch.Generator().manual_seed(int(seed))
        self._task = torch.rand(self.num_episodes, 4, generator=g) * 2 - 1
        zeros = torch.zeros(self.num_episodes, 2)
        return EpisodeStart(context=self._task.clone(), pos=zeros, vel=zeros.clone())

    def run(self, pos: Tensor, vel: Tensor) -> Episodes:
        """Track (E, T+1, 2) desired positions and velocities; returns all T steps of the E episodes."""
        if self._task is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before run()")
        self.check_trajectory(pos, vel)
        p_d, v_d = pos.detach().float().cpu(), vel.detach().float().cpu()
        x, v = self._rollout(p_d, v_d)  # (E, T+1, 2) each
        via, goal = self._task[:, None, :2], self._task[:, 2:]
        via_dist = (x[:, 1:] - via).norm(dim=-1)  # (E, T) distance of states 1..T
        goal_dist = (x[:, -1] - goal).norm(dim=-1)
        speed = v[:, -1].norm(dim=-1)
        closest = via_dist[:, self._via_window].min(dim=-1).values
        terminal = goal_dist + self.speed_cost * speed
        rewards = torch.zeros(self.num_episodes, self.horizon)
        if self.sparse:
            rewards[:, -1] = -(closest + terminal)
        else:
            rewards = -self._via_weight * via_dist
            rewards[:, -1] -= terminal
        task = self._task[:, None].expand(-1, self.horizon + 1, -1)
        states = torch.cat([x, v, task], dim=-1)
        check_episodes_finite(self.name, states, rewards)
        success = (closest <= self.radius) & (goal_dist <= self.radius) & (speed <= self.max_speed)
        final = {"distance": goal_dist, "speed": speed, "via_distance": closest, "return": rewards.sum(-1)}
        return Episodes(
            states=states,
            rewards=rewards,
            dones=torch.zeros(self.num_episodes, self.horizon, dtype=torch.bool),
            success=success,
            final=final,
        )

    def _rollout(self, p_d: Tensor, v_d: Tensor) -> tuple[Tensor, Tensor]:
        """PD + feedforward tracking of the double integrator from rest at the origin; (E, T+1, 2) x and v."""
        e = self.num_episodes
        x, v = torch.zeros(e, 2), torch.zeros(e, 2)
        xs, vs = [x], [v]
        accel_ff = (v_d[:, 1:] - v_d[:, :-1]) / self.dt  # (E, T, 2)
        for k in range(self.horizon):
            u = self.kp * (p_d[:, k] - x) + self.kd * (v_d[:, k] - v) + accel_ff[:, k]
            u = u.clamp(-self.max_accel, self.max_accel)
            v = v + u * self.dt
            x = x + v * self.dt
            xs.append(x)
            vs.append(v)
        return torch.stack(xs, 1), torch.stack(vs, 1)


def straight_through(start: Tensor, via: Tensor, goal: Tensor, horizon: int, dt: float) -> tuple[Tensor, Tensor]:
    """A hand-made solution: minimum-jerk start -> via over the first half, via -> goal by 90% of the episode, then
    at rest. Inputs (E, D); returns (E, T+1, D) positions and velocities at t_k = k dt. Used by tests and benchmarks.
    """
    k = torch.arange(horizon + 1, dtype=torch.float64)
    half, end = horizon // 2, int(math.floor(0.9 * horizon))
    pos = torch.empty(start.shape[0], horizon + 1, start.shape[1], dtype=torch.float64)
    vel = torch.zeros_like(pos)
    for (a, b), (k0, k1) in (((start, via), (0, half)), ((via, goal), (half, end))):
        dur = (k1 - k0) * dt
        s = ((k[k0 : k1 + 1] - k0) / (k1 - k0))[None, :, None]
        a64, b64 = a.double()[:, None], b.double()[:, None]
        pos[:, k0 : k1 + 1] = a64 + (b64 - a64) * (10 * s**3 - 15 * s**4 + 6 * s**5)
        vel[:, k0 : k1 + 1] = (b64 - a64) * (30 * s**2 - 60 * s**3 + 30 * s**4) / dur
    pos[:, end:] = goal.double()[:, None]
    return pos.float(), vel.float()
