"""One synthetic Meta-World-sized TCE batch, shared by the golden tests and the TCE benchmarks.

No simulator: E episodes (the agent's ``config.episodes``) of the agent's horizon, with contexts, starts, states and
rewards drawn from a fixed generator and theta sampled by the agent, as a rollout does. The golden numbers of
``tests/episodic/test_tce_golden.py`` depend on every draw here, so any change re-records them; an update's cost
does not depend on the values, so ``benchmarks/bench_tce.py`` times updates on the same batch.
"""

from __future__ import annotations

import torch

from troll.episodic.agent import Rollout, TCEAgent
from troll.episodic.envs.base import Episodes, EpisodeStart


def synthetic_batch(agent: TCEAgent, seed: int) -> Rollout:
    """A batch for ``agent`` from generator seed ``seed``; the context normaliser is updated, as a rollout does.

    Rewards are a smooth function of the desired positions (minus the distance to the first D context entries) plus
    noise, and the tracked part of each state follows the desired motion, so the critic has something to fit.
    """
    g = torch.Generator().manual_seed(seed)
    e, t, s, c = agent.config.episodes, agent.horizon, agent.state_dim, agent.policy.context_dim
    context = torch.randn(e, c, generator=g) * 0.3
    pos0 = torch.randn(e, agent.dof, generator=g) * 0.1
    start = EpisodeStart(context, pos0, torch.zeros_like(pos0))
    agent.policy.update_normalizer(start.context)
    theta, pos, vel = agent.trajectories(start)
    states = torch.randn(e, t + 1, s, generator=g) * 0.2
    states[..., : agent.dof] = pos.float()  # the tracked part of the state follows the desired motion
    goal = context[:, : agent.dof].unsqueeze(1)
    rewards = -(pos[:, 1:].float() - goal).norm(dim=-1) + 0.05 * torch.randn(e, t, generator=g)
    episodes = Episodes(states, rewards, torch.zeros(e, t, dtype=torch.bool), None, {})
    return Rollout(start, theta, pos, vel, episodes)
