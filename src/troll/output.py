"""What every loss of both wings returns: a scalar to minimise and the metrics to log.

Shared by the categorical losses (:mod:`troll.categorical.losses`, :mod:`troll.categorical.baselines`), the
Gaussian loss (:func:`troll.gaussian.trpl_loss`) and the integrations, so that neither wing imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LossOutput:
    """A loss: the scalar ``loss`` and a dict of detached scalar ``metrics`` (keys as logged, e.g. ``kl_after/max``)."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
