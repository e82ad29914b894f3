"""A Gaussian policy N(mean, Sigma) batched over states (docs/gaussian.md, "The policy").

Shapes: B states, D action dimensions. ``mean`` is (B, D); ``factor`` gives the covariance, by ``kind``:

    "diag"  std (B, D), or (D,) for one global std:            Sigma = diag(std^2),  std > 0
    "chol"  L (B, D, D), or (D, D): lower triangular, diag > 0: Sigma = L L^T
    "sqrt"  S (B, D, D), or (D, D): symmetric positive definite: Sigma = S S

A factor without the state dimension is one covariance shared by every state (TCE's global Cholesky factor): the
projections treat it once, not once per state, and quantities of the covariance alone (its entropy, its distance
to the old one, eta) then have shape () instead of (B,).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from troll._checks import check_choice, check_tensor

KINDS = ("diag", "chol", "sqrt")
DTYPES = (torch.float32, torch.float64)
LOG_2PI = math.log(2 * math.pi)
SYM_RTOL = 1e-5  # a "sqrt" factor must equal its transpose to this, relative to its largest entry


@dataclass(frozen=True)
class Gaussian:
    """N(mean, Sigma) per state; see the module docstring for ``kind`` and the shapes.

    The constructor checks types and shapes only (cheap); :func:`check_gaussian` checks the values (finite,
    positive definite) and is called by :func:`troll.gaussian.project` and the losses.
    """

    mean: torch.Tensor
    factor: torch.Tensor
    kind: str = "chol"

    def __post_init__(self) -> None:
        check_structure("policy", self)

    @classmethod
    def from_std(cls, mean: torch.Tensor, std: torch.Tensor) -> Gaussian:
        """Diagonal covariance: std (B, D) per state or (D,) global."""
        return cls(mean, std, "diag")

    @classmethod
    def from_chol(cls, mean: torch.Tensor, chol: torch.Tensor) -> Gaussian:
        """Full covariance L L^T: L (B, D, D) per state or (D, D) global, lower triangular with diag > 0."""
        return cls(mean, chol, "chol")

    @classmethod
    def from_sqrt(cls, mean: torch.Tensor, sqrt: torch.Tensor) -> Gaussian:
        """Full covariance S S: S (B, D, D) per state or (D, D) global, symmetric positive definite."""
        return cls(mean, sqrt, "sqrt")

    @property
    def dim(self) -> int:
        """D, the action dimension."""
        return self.mean.shape[-1]

    @property
    def is_global(self) -> bool:
        """True when one covariance is shared by every state (``factor`` has no state dimension)."""
        return self.factor.dim() == (1 if self.kind == "diag" else 2)

    def detach(self) -> Gaussian:
        return Gaussian(self.mean.detach(), self.factor.detach(), self.kind)

    def to(self, *args, **kwargs) -> Gaussian:
        """Both tensors through ``Tensor.to`` (e.g. ``old.to(torch.float32)``)."""
        return Gaussian(self.mean.to(*args, **kwargs), self.factor.to(*args, **kwargs), self.kind)

    def covariance(self) -> torch.Tensor:
        """Sigma: (B, D, D), or (D, D) for a global covariance (a diagonal one as a full matrix)."""
        f = self.factor
        if self.kind == "diag":
            return torch.diag_embed(f * f)
        return f @ f.mT

    def cholesky(self) -> torch.Tensor:
        """The lower Cholesky factor L of Sigma, (B, D, D) or (D, D); ``factor`` itself for kind "chol"."""
        if self.kind == "diag":
            return torch.diag_embed(self.factor)
        if self.kind == "chol":
            return self.factor
        return torch.linalg.cholesky(self.factor @ self.factor)

    def log_det(self) -> torch.Tensor:
        """log det Sigma: (B,), or () for a global covariance. For kind "sqrt", 2 log det S through the Cholesky factor
        of S, not of S S (which squares S's condition number)."""
        if self.kind == "diag":
            return 2 * self.factor.log().sum(-1)
        if self.kind == "sqrt":
            return 4 * torch.linalg.cholesky(self.factor).diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return 2 * self.factor.diagonal(dim1=-2, dim2=-1).log().sum(-1)

    def entropy(self) -> torch.Tensor:
        """H = D/2 (1 + log 2 pi) + 1/2 log det Sigma: (B,), or () for a global covariance."""
        return 0.5 * self.dim * (1 + LOG_2PI) + 0.5 * self.log_det()

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log N(x; mean, Sigma) = -1/2 |W^-1 (x - mean)|^2 - 1/2 log det Sigma - D/2 log 2 pi. x: (B, D) -> (B,).

        Checks x (a finite tensor of the mean's shape, dtype and device) and the policy's values (as ``project``)."""
        check_tensor("x", x)
        check_like("x", x, "policy.mean", self.mean)
        check_gaussian("policy", self)
        if not all_finite(x.detach()):
            raise ValueError("x contains NaN or inf; check the actions (or the rollout buffer).")
        z = whiten(self, x - self.mean)
        return -0.5 * ((z * z).sum(-1) + self.log_det() + self.dim * LOG_2PI)


def whiten(policy: Gaussian, x: torch.Tensor) -> torch.Tensor:
    """W^-1 x for x (B, D), with W the policy's own factor (Sigma = W W^T): std, L, or the symmetric S; (B, D).

    |W^-1 x|^2 = x^T Sigma^-1 x. A kind "sqrt" is solved with S itself (through the Cholesky factor of S, whose
    condition number is the fourth root of Sigma's), never with cholesky(S S): that squares S's condition number and
    lost 1e-9 of the distance at a condition number of 1e8 (docs/gaussian.md, "Numerics"). A global factor is one
    solve with B right-hand sides.
    """
    if policy.kind == "diag":
        return x / policy.factor
    if policy.kind == "chol":
        return solve_lower(policy.factor, x)
    return solve_sym(policy.factor, x)


def whiten_t(policy: Gaussian, z: torch.Tensor) -> torch.Tensor:
    """W^-T z for z (B, D), so that Sigma^-1 x = whiten_t(whiten(x)); (B, D)."""
    if policy.kind == "diag":
        return z / policy.factor
    if policy.kind == "sqrt":
        return solve_sym(policy.factor, z)
    chol = policy.factor
    if chol.dim() == 2:
        return torch.linalg.solve_triangular(chol.mT, z.mT, upper=True).mT
    return torch.linalg.solve_triangular(chol.mT, z.unsqueeze(-1), upper=True).squeeze(-1)


def solve_lower(chol: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """L^-1 x for x (B, D) and L (B, D, D) per state or (D, D) global; (B, D)."""
    if chol.dim() == 2:
        return torch.linalg.solve_triangular(chol, x.mT, upper=False).mT
    return torch.linalg.solve_triangular(chol, x.unsqueeze(-1), upper=False).squeeze(-1)


def solve_sym(sqrt: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """S^-1 x for x (B, D) and a symmetric positive definite S (B, D, D) or (D, D): two triangular solves with the
    Cholesky factor of S (not of S S); (B, D)."""
    k = torch.linalg.cholesky(sqrt)
    if sqrt.dim() == 2:
        return torch.cholesky_solve(x.mT, k).mT
    return torch.cholesky_solve(x.unsqueeze(-1), k).squeeze(-1)


# ------------------------------------------------------------------------------------------------ checks


def check_structure(name: str, p: Gaussian) -> None:
    """Kind, tensor types, dtypes and shapes of one policy (no scan of the values)."""
    check_choice(f"{name}.kind", p.kind, KINDS)
    check_tensor(f"{name}.mean", p.mean)
    check_tensor(f"{name}.factor", p.factor)
    for part in ("mean", "factor"):
        t = getattr(p, part)
        if t.dtype not in DTYPES:
            raise TypeError(
                f"{name}.{part} has dtype {t.dtype}; Gaussian policies are float32 or float64: cast with .float()."
            )
    if p.mean.dtype != p.factor.dtype:
        raise TypeError(f"{name}.mean is {p.mean.dtype} but {name}.factor is {p.factor.dtype}; cast both to one dtype.")
    if p.mean.device != p.factor.device:
        raise ValueError(f"{name}.mean is on {p.mean.device} but {name}.factor on {p.factor.device}; move both.")
    if p.mean.dim() != 2 or min(p.mean.shape) < 1:
        raise ValueError(f"{name}.mean must have shape (B, D) with B >= 1 and D >= 1, got {tuple(p.mean.shape)}.")
    bsz, d = p.mean.shape
    if p.kind == "diag":
        allowed, what = [(bsz, d), (d,)], "std (B, D) or (D,)"
    else:
        allowed, what = [(bsz, d, d), (d, d)], f"{'L' if p.kind == 'chol' else 'S'} (B, D, D) or (D, D)"
    if tuple(p.factor.shape) not in allowed:
        raise ValueError(
            f"{name}.factor has shape {tuple(p.factor.shape)}, but kind={p.kind!r} with mean (B, D) = {(bsz, d)} "
            f"needs {what}."
        )


def check_gaussian(name: str, p) -> None:
    """A :class:`Gaussian` with finite values and a positive definite covariance in the form its kind promises."""
    if not isinstance(p, Gaussian):
        raise TypeError(
            f"{name} must be a troll.gaussian.Gaussian, got {type(p).__name__}; build it with "
            "Gaussian.from_chol(mean, chol), Gaussian.from_std(mean, std) or Gaussian.from_sqrt(mean, sqrt)."
        )
    check_structure(name, p)
    with torch.no_grad():
        check_values(name, p)


def check_values(name: str, p: Gaussian) -> None:
    """The value checks of :func:`check_gaussian` (no gradient), each a reduction or two."""
    for part in ("mean", "factor"):
        if not all_finite(getattr(p, part)):
            raise ValueError(f"{name}.{part} contains NaN or inf; check the network output (and its learning rate).")
    f = p.factor
    if p.kind == "diag":
        if not float(f.amin()) > 0:
            raise ValueError(
                f"{name}.factor (std) must be > 0 everywhere; parameterise it e.g. as softplus(x) + min_std."
            )
    elif p.kind == "chol":
        # triu is slow on a batch of small matrices; a mask product is not (and min-max is cheaper than any)
        upper = f.triu(1) if f.dim() == 2 else f * torch.ones(f.shape[-2:], dtype=f.dtype, device=f.device).triu(1)
        if any(float(v) != 0 for v in torch.aminmax(upper)):
            raise ValueError(f"{name}.factor (kind 'chol') must be lower triangular; pass torch.tril(factor).")
        if not float(f.diagonal(dim1=-2, dim2=-1).amin()) > 0:
            raise ValueError(
                f"{name}.factor (kind 'chol') needs a positive diagonal, or Sigma = L L^T is not positive definite; "
                "parameterise the diagonal e.g. as softplus(x) + min_std."
            )
    else:
        scale = f.abs().amax((-2, -1))
        if bool(((f - f.mT).abs().amax((-2, -1)) > SYM_RTOL * scale).any()):
            raise ValueError(f"{name}.factor (kind 'sqrt') must be symmetric; pass (S + S.mT) / 2.")
        if bool(torch.linalg.cholesky_ex(f.double()).info.ne(0).any()):
            raise ValueError(
                f"{name}.factor (kind 'sqrt') is not positive definite; the symmetric square root of a covariance "
                "has positive eigenvalues."
            )


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or inf in ``t``: one min-max reduction (NaN propagates through it), much cheaper than isfinite().all()."""
    if t.numel() == 0:
        return True
    low, high = torch.aminmax(t)
    return math.isfinite(low) and math.isfinite(high)


def check_pair(new: Gaussian, old: Gaussian) -> None:
    """``new`` and ``old`` have the same kind, shapes, dtype and device."""
    if new.kind != old.kind:
        raise ValueError(
            f"new has kind {new.kind!r} but old has kind {old.kind!r}; keep the old policy in the new one's form "
            "(a detached copy of the same network output)."
        )
    for part in ("mean", "factor"):
        a, b = getattr(new, part), getattr(old, part)
        if a.shape != b.shape:
            raise ValueError(
                f"old.{part} has shape {tuple(b.shape)} but new.{part} has {tuple(a.shape)}; they must match "
                "(the same states, and a global covariance on both sides or on neither)."
            )
        if a.dtype != b.dtype:
            raise TypeError(f"old.{part} is {b.dtype} but new.{part} is {a.dtype}; cast old with old.to({a.dtype}).")
        if a.device != b.device:
            raise ValueError(f"old.{part} is on {b.device} but new.{part} on {a.device}; move old with old.to(...).")


def check_range(name: str, dist: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Refuse a distance that its dtype cannot hold (docs/gaussian.md, "Supported range").

    Distances are reported in the input's dtype (a projection's also eta, omega ~ sqrt(distance / bound)); a distance
    above the largest finite number of that dtype (about 1.8e308 in float64, 3.4e38 in float32) or NaN is refused.
    """
    limit = torch.finfo(dtype).max
    if not bool((dist <= limit).all()):  # NaN fails the comparison too
        worst = float(dist.nan_to_num(nan=math.inf, posinf=math.inf).max())
        raise ValueError(
            f"{name} is outside the supported range: {what} is {worst:.3g}, above "
            f'{limit:.3g}, the largest {dtype} number (docs/gaussian.md, "Supported range"). Policies that far '
            "apart mean a diverged network: check its output; float32 inputs can be cast to float64."
        )


def check_like(name: str, x: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """``x`` has ``ref``'s shape (ValueError), dtype (TypeError) and device (ValueError), with the fix."""
    if x.shape != ref.shape:
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but {ref_name} has {tuple(ref.shape)}; they must match (B, D): "
            "one row per state."
        )
    if x.dtype != ref.dtype:
        raise TypeError(f"{name} is {x.dtype} but {ref_name} is {ref.dtype}; cast it with {name}.to({ref.dtype}).")
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} on {ref.device}; move it with {name}.to(...).")


def check_comparable(p_name: str, p, q_name: str, q) -> None:
    """Two valid policies (:func:`check_gaussian`) over the same states, dtype and device, with a global covariance on
    both sides or on neither; their kinds may differ (the distances compare them through their Cholesky factors)."""
    check_gaussian(p_name, p)
    check_gaussian(q_name, q)
    check_like(f"{q_name}.mean", q.mean, f"{p_name}.mean", p.mean)
    if p.is_global != q.is_global:
        which = p_name if p.is_global else q_name
        raise ValueError(
            f"{which} has one global covariance but the other policy one per state; give both the same layout "
            "(expand the global factor to (B, ...), or compare two global ones)."
        )
