"""TCE's policy: context c -> N(mu(c), L L^T) over the ProDMP parameters theta (docs/tce.md, "What TCE is").

Shapes: E episodes (contexts), C context entries, P = D (N + 1) parameters (D DoF, N basis functions + goal).
The mean is an MLP of the (normalised) context; the covariance is ONE global full covariance, Sigma = L L^T with

    L = diag(softplus(d) + min_std) + strictly-lower(F)           d (P,), F (P, P) free parameters

(docs/tce.md, "What TCE is"), so the policy is a :class:`troll.gaussian.Gaussian` of kind "chol" with a (P, P) factor:
projected once per update, not once per context. ``covariance="diag"`` (the authors' BBRL) keeps only the diagonal,
std = softplus(d) + min_std, a Gaussian of kind "diag" with a global (P,) std. The network runs in float64: it is
tiny (E contexts, not T steps), and the segment likelihoods and the KL projection are float64 anyway (prodmp.py's
note: float32 pair covariances are off by nats).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from troll.episodic.normalize import RunningNorm
from troll.gaussian import Gaussian

ACTIVATION = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU, "leaky_relu": nn.LeakyReLU}
OUTPUT_GAIN = 0.01  # last layer scaled down: the initial mean is ~0 for every context (theta ~ 0: stay at y0)


def mlp(inputs: int, hidden: tuple[int, ...], outputs: int, activation: str, *, out_gain: float = 1.0) -> nn.Sequential:
    """inputs -> hidden... -> outputs, orthogonal init (gain sqrt 2 for hidden layers, ``out_gain`` for the last)."""
    layers, width = [], inputs
    for h in hidden:
        linear = nn.Linear(width, h)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear, ACTIVATION[activation]()]
        width = h
    last = nn.Linear(width, outputs)
    nn.init.orthogonal_(last.weight, out_gain)
    nn.init.zeros_(last.bias)
    return nn.Sequential(*layers, last)


def inverse_softplus(y: float) -> float:
    """x with softplus(x) = y > 0."""
    return y + math.log(-math.expm1(-y))


class ContextPolicy(nn.Module):
    """c (E, C) -> Gaussian(mean (E, P), chol (P, P)) in float64.

    Args:
        context_dim: C.   num_params: P.   hidden: MLP widths (TCE: (128, 128)).   activation: a key of ACTIVATION.
        init_std:    the initial std of every theta entry (L starts as init_std * I).
        min_std:     floor of L's diagonal (softplus(d) + min_std > min_std).
        covariance:  "full" (L lower triangular) or "diag" (a diagonal std; no off-diagonal parameters).
        normalize:   standardise the context by running statistics (:class:`RunningNorm`), updated by the agent
                     before it samples a batch and frozen while it trains on it.
    """

    def __init__(
        self,
        context_dim: int,
        num_params: int,
        *,
        hidden: tuple[int, ...] = (128, 128),
        activation: str = "tanh",
        init_std: float = 1.0,
        min_std: float = 1e-4,
        covariance: str = "full",
        normalize: bool = True,
    ):
        super().__init__()
        if not init_std > min_std > 0:
            raise ValueError(f"need init_std > min_std > 0, got init_std={init_std}, min_std={min_std}.")
        if covariance not in ("full", "diag"):
            raise ValueError(f"covariance must be 'full' or 'diag', got {covariance!r}.")
        self.context_dim, self.num_params, self.min_std = context_dim, num_params, float(min_std)
        self.covariance = covariance
        self.norm = RunningNorm(context_dim) if normalize else None
        self.mean_net = mlp(context_dim, hidden, num_params, activation, out_gain=OUTPUT_GAIN)
        raw = inverse_softplus(init_std - min_std)
        self.chol_diag = nn.Parameter(torch.full((num_params,), raw))
        if covariance == "full":  # only the strict lower triangle is used
            self.chol_lower = nn.Parameter(torch.zeros(num_params, num_params))
        self.double()

    def std(self) -> torch.Tensor:
        """The diagonal of L (P,): softplus(d) + min_std > 0."""
        return nn.functional.softplus(self.chol_diag) + self.min_std

    def cholesky(self) -> torch.Tensor:
        """L (P, P): lower triangular (diagonal with ``covariance="diag"``), diagonal softplus(d) + min_std > 0."""
        diag = torch.diag(self.std())
        return diag if self.covariance == "diag" else torch.tril(self.chol_lower, -1) + diag

    def forward(self, context: torch.Tensor) -> Gaussian:
        """N(mu(c), L L^T): mean (E, P), global factor (P, P) (std (P,) for "diag"), float64; gradients to both."""
        check_context(context, self.context_dim)
        c = context.to(torch.float64)
        if self.norm is not None:
            c = self.norm(c)
        if self.covariance == "diag":
            return Gaussian.from_std(self.mean_net(c), self.std())
        return Gaussian.from_chol(self.mean_net(c), self.cholesky())

    @torch.no_grad()
    def update_normalizer(self, context: torch.Tensor) -> None:
        """Merge a batch of contexts (E, C) into the running statistics (no-op without normalisation)."""
        check_context(context, self.context_dim)
        if self.norm is not None:
            self.norm.update(context)


def check_context(context, context_dim: int) -> None:
    """A finite floating (E, C) tensor with C = ``context_dim``; ValueError naming the fix otherwise."""
    if not torch.is_tensor(context):
        raise ValueError(f"context must be a torch.Tensor (E, C), got {type(context).__name__}.")
    if context.dim() != 2 or context.shape[0] < 1 or context.shape[1] != context_dim:
        raise ValueError(
            f"context has shape {tuple(context.shape)} but this policy takes (E, C={context_dim}): it was built for an "
            "environment with another context; build the agent from the env it runs on (TCEAgent.for_env)."
        )
    if not context.is_floating_point():
        raise ValueError(f"context must be a floating-point tensor, got dtype {context.dtype}.")
    if not bool(torch.isfinite(context).all()):
        raise ValueError("context contains NaN or inf; check the environment's reset observation.")
