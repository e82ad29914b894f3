"""Running mean and variance of inputs (contexts, critic observations), frozen while an update runs (docs/tce.md).

The statistics are merged batch by batch (Chan et al.'s parallel form of Welford's update) in float64 and live in
buffers, so they are part of a module's ``state_dict`` (checkpoints, resume). The agent updates them once per
iteration, with the batch it is about to train on, and never inside the epochs: each update sees one fixed input
transformation, so the old and the new policy of the trust region are functions of the same inputs.
"""

from __future__ import annotations

import torch
from torch import nn

EPS_VAR = 1e-8  # variance floor: an input constant so far (a padding entry) maps to 0, not to inf
CLIP = 10.0  # normalised inputs are clipped to [-CLIP, CLIP]: an outlier cannot saturate the network's first layer


class RunningNorm(nn.Module):
    """x -> clip((x - mean) / sqrt(var + 1e-8), -10, 10) per feature, with running statistics of what ``update`` saw.

    dim: the feature count F; inputs are (..., F). Before the first ``update`` the map is the identity (no clip).
    """

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge the statistics of ``x`` (..., F) into the running ones."""
        x = x.detach().reshape(-1, self.mean.numel()).double()
        n = x.shape[0]
        if n == 0:
            return
        mean, var = x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        if self.count == 0:
            self.mean.copy_(mean)
            self.var.copy_(var)
        else:
            m2 = self.var * self.count + var * n + delta.square() * self.count * n / total
            self.mean.add_(delta * n / total)
            self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., F) -> (..., F) in x's dtype."""
        if self.count == 0:
            return x
        std = (self.var + EPS_VAR).sqrt()
        return ((x - self.mean.to(x.dtype)) / std.to(x.dtype)).clamp(-CLIP, CLIP)


class ValueScale(nn.Module):
    """Running mean and std of a scalar target (the critic's values), to train the critic on standardised targets.

    ``update`` returns the old and new (mean, std) so that the caller can rescale its output layer and keep every
    prediction unchanged (PopArt's "preserving outputs", van Hasselt et al. 2016), which :class:`~troll.episodic.
    critic.Critic` does.
    """

    def __init__(self):
        super().__init__()
        self.stats = RunningNorm(1)

    @property
    def mean(self) -> torch.Tensor:
        return self.stats.mean[0] if self.stats.count > 0 else torch.zeros((), dtype=torch.float64)

    @property
    def std(self) -> torch.Tensor:
        return (self.stats.var[0] + EPS_VAR).sqrt() if self.stats.count > 0 else torch.ones((), dtype=torch.float64)

    @torch.no_grad()
    def update(self, targets: torch.Tensor) -> tuple[tuple[float, float], tuple[float, float]]:
        """Merge ``targets`` (any shape); returns ((old mean, old std), (new mean, new std))."""
        old = (float(self.mean), float(self.std))
        self.stats.update(targets.reshape(-1, 1))
        return old, (float(self.mean), float(self.std))
