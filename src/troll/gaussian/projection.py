"""Differentiable trust-region projections of Gaussian policies (docs/gaussian.md, "The projections").

For the new policy pi~ = N(mu, Sigma) (gradient wanted) and the old one N(mu_o, Sigma_o) (constant), the mean and
the covariance are projected separately:

    mu^    = argmin_m d_mean(m, mu)    s.t.  d_mean(m, mu_o)    <= mean_bound
    Sigma^ = argmin_S d_cov(S, Sigma)  s.t.  d_cov(S, Sigma_o)  <= cov_bound

A row inside its bound comes back unchanged (the very values of the input). On the others, with r = 1 / (1 + omega)
or s = 1 / (1 + eta):

    mean (every distance)  mu^ = mu_o + r (mu - mu_o),                r = sqrt(bound / m)
    "frobenius"            Sigma^ = Sigma_o + s (Sigma - Sigma_o),     s = sqrt(bound / |Sigma - Sigma_o|_F^2)
    "w2"                   S^ = S_o + s (S - S_o),                     s = sqrt(bound / |S - S_o|_F^2)
    "kl"                   Sigma^-1 = s Sigma^-1 + (1 - s) Sigma_o^-1, s from a float64 root-find (troll.rootfind)

Every projection runs in float64 whatever the input dtype; float32 output is aimed inside the bound by a first-order
bound on what rounding to float32 does to the distance (``rounded_target``). Shapes: B states, D action dims.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import torch

from troll._checks import check_choice, check_number
from troll.gaussian.distances import DISTANCES, factor_distance, factor_distance_grad
from troll.gaussian.kl import RTOL, U32, kl_rows, multiplier, project_kl_global, project_kl_rows
from troll.gaussian.policy import Gaussian, check_gaussian, check_pair, check_range, whiten, whiten_t

# float32 Frobenius / W2: how often a row still above its bound once rounded halves its step (project_linear_rows)
MAX_HALVINGS = 60
KINDS_FOR = {"kl": ("diag", "chol"), "frobenius": ("diag", "chol"), "w2": ("diag", "sqrt")}


class GaussianProjection(NamedTuple):
    """Result of :func:`project`. Shapes: B states; ``()`` for the covariance entries of a global covariance.

    policy:      the projected :class:`Gaussian`, same kind, shapes and dtype as ``new``; carries the gradient.
    mean_before: (B,) d_mean(mu, mu_o);  mean_after: (B,) d_mean(mu^, mu_o), from the returned (rounded) mean.
    cov_before:  (B,) or () d_cov(Sigma, Sigma_o);  cov_after: the same for the returned factor.
    omega:       (B,) the mean step, 1/r - 1 (0 where inactive); carries the gradient.
    eta:         (B,) or () the covariance step, 1/s - 1 (0 where inactive); carries the (implicit) gradient.
    """

    policy: Gaussian
    mean_before: torch.Tensor
    mean_after: torch.Tensor
    cov_before: torch.Tensor
    cov_after: torch.Tensor
    omega: torch.Tensor
    eta: torch.Tensor


def project(new: Gaussian, old: Gaussian, *, mean_bound: float, cov_bound: float, distance: str = "kl"):
    """Project ``new`` onto the trust region around ``old`` (docs/gaussian.md, "The projections").

    Args:
        new:        the current policy (mean (B, D) and a factor, see :class:`Gaussian`); gradient flows through.
        old:        the old policy, same kind, shapes and dtype; treated as a constant.
        mean_bound: eps_mu > 0, the bound on the mean part (m / 2 for "kl", m otherwise; m the Mahalanobis
                    distance under the old covariance).
        cov_bound:  eps_Sigma > 0, the bound on the covariance part.
        distance:   "kl" (kinds "diag", "chol"), "frobenius" ("diag", "chol") or "w2" ("diag", "sqrt").

    Returns:
        :class:`GaussianProjection`. A global covariance is projected once. Every projected distance is at most
        its bound: in float64 up to rounding, in float32 as measured from the returned values (docs/gaussian.md,
        "Numerics"); ``mean_after`` / ``cov_after`` report it, so a bound that rounding broke would show there.
    """
    check_bound("mean_bound", mean_bound, hint="; TCE uses mean_bound=0.005 to 0.1")
    check_bound("cov_bound", cov_bound, hint="; TCE uses cov_bound=0.0005 to 0.02")
    check_choice("distance", distance, DISTANCES)
    check_gaussian("new", new)
    check_gaussian("old", old)
    check_pair(new, old)
    if new.kind not in KINDS_FOR[distance]:
        raise ValueError(
            f"distance={distance!r} projects policies of kind {' or '.join(map(repr, KINDS_FOR[distance]))}, got "
            f"{new.kind!r}; "
            + (
                "build them with Gaussian.from_sqrt(mean, S)."
                if distance == "w2"
                else "build them with Gaussian.from_chol(mean, new.cholesky()), or use distance='w2'."
            )
        )
    # every projection runs in float64 (docs/gaussian.md, "Numerics"); old is a constant
    old64 = Gaussian(old.mean.detach().double(), old.factor.detach().double(), old.kind)
    mean, omega, mean_before, mean_after = project_mean(new.mean, old64, bound=mean_bound, distance=distance)
    factor, eta, cov_before, cov_after = project_cov(new, old64, bound=cov_bound, distance=distance)
    policy = Gaussian(mean, factor, new.kind)
    return GaussianProjection(policy, mean_before, mean_after, cov_before, cov_after, omega, eta)


def check_metrics_args(proj, mean_bound, cov_bound) -> None:
    """The arguments of :func:`troll.gaussian.projection_metrics`: a GaussianProjection, bounds as ``project``'s."""
    if not isinstance(proj, GaussianProjection):
        raise TypeError(
            f"proj must be the GaussianProjection that troll.gaussian.project returned, got {type(proj).__name__}."
        )
    check_bound("mean_bound", mean_bound, hint="; pass the bound the projection used")
    check_bound("cov_bound", cov_bound, hint="; pass the bound the projection used")


def check_bound(name: str, value, *, hint: str) -> None:
    """A bound is a finite number > 0 and a normal float64 (>= 2.2e-308): the solves divide by it and halve it
    (``rounded_target``), which a subnormal bound does not survive (it rounds to 0, and 1 / 0 is no step)."""
    check_number(name, value, hint=hint)
    if value < sys.float_info.min:
        raise ValueError(
            f"{name}={value!r} is a subnormal number, below the smallest normal float64 ({sys.float_info.min:.4g}), "
            f"which the projection cannot divide by; pass {name} >= {sys.float_info.min:.4g}{hint}."
        )


def project_mean(mean: torch.Tensor, old: Gaussian, *, bound: float, distance: str):
    """The mean projection, closed form: mu^ = mu_o + r (mu - mu_o), r = sqrt(bound / d) on rows with d > bound.

    mean: (B, D) with gradient; old: the constant old policy in float64. Returns (mu^ (B, D), omega (B,), before,
    after). Scaling mu - mu_o by r scales the (quadratic) distance by r^2, so d(mu^) = bound: ``after`` is d r^2 in
    float64 and is recomputed from the returned mean in float32. Only the distance is computed on every row; the
    rest on the projected rows alone. Every product with Sigma_o^-1 is a solve with the old factor (triangular, or
    through the Cholesky factor of S), never an explicit inverse (docs/gaussian.md, "Numerics").
    """
    dtype = mean.dtype
    half = 0.5 if distance == "kl" else 1.0
    with torch.no_grad():
        diff = mean - old.mean  # float64 (type promotion)
        z = whiten(old, diff)  # W_o^-1 diff, |z|^2 = diff^T Sigma_o^-1 diff
        before = half * torch.linalg.vecdot(z, z)
        check_range("new.mean", before, dtype, "its distance to old.mean (the mean part) before the projection")
        idx = (before > bound).nonzero().view(-1)
    if idx.numel() == 0:
        return mean, torch.zeros_like(before, dtype=dtype), before.to(dtype), before.to(dtype)
    with torch.no_grad():
        d, diff_a, mu_o, z_a = (t.index_select(0, idx) for t in (before, diff, old.mean, z))
        old_a = old_rows(old, idx)
        w = half * whiten_t(old_a, z_a)  # (A, D): half Sigma_o^-1 diff = (dd/dmu) / 2
        r = torch.rsqrt(d / bound)
        if dtype != torch.float64:  # aim inside by what rounding to float32 can do at the row on the bound
            y = torch.addcmul(mu_o, r.unsqueeze(-1), diff_a)  # dd/dy = 2 r w there
            margin = (2 * U32) * r * (y * w).abs_().sum(-1)
            r = torch.rsqrt(d / (bound - 2 * margin).clamp(min=bound / 2, max=bound * (1 - 2 * RTOL)))
        proj = torch.addcmul(mu_o, r.unsqueeze(-1), diff_a).to(dtype)
        if dtype != torch.float64:  # measured on the returned (rounded) rows
            za = whiten(old_a, proj.double() - mu_o)
            after = half * torch.linalg.vecdot(za, za)
        else:
            after = d * r * r
    out, r = MeanStep.apply(mean, proj, idx, diff_a, w, r, d)
    omega = torch.zeros_like(before).index_copy(0, idx, multiplier(r))
    return out, omega.to(dtype), before.to(dtype), before.index_copy(0, idx, after).to(dtype)


def old_rows(old: Gaussian, idx: torch.Tensor) -> Gaussian:
    """The old policy on the states ``idx`` (a global factor is kept as it is)."""
    factor = old.factor if old.is_global else old.factor.index_select(0, idx)
    return Gaussian(old.mean.index_select(0, idx), factor, old.kind)


class MeanStep(torch.autograd.Function):
    """(mu^, r): ``mean`` with its rows ``idx`` replaced by ``proj`` = mu_o + r (mu - mu_o) (A, D), in mean's dtype,
    with r = sqrt(target / d(mu)) (A,), d = half (mu - mu_o)^T Sigma_o^-1 (mu - mu_o). No-gradient inputs from the
    forward pass: diff = mu - mu_o and w = half Sigma_o^-1 diff (A, D), and d (A,), so that
    dr/dmu = dr/dd dd/dmu = (-r / (2 d)) (2 w). backward, for gradients G of mu^ and g_r of r:

        grad mu = r (G - (<G, diff> + g_r) / d w)    on the rows idx,  G on the others (bit for bit).

    (<G, diff> + g_r) / d is formed first: d can be up to 1e308 and r / d would underflow.
    """

    @staticmethod
    def forward(ctx, mean, proj, idx, diff, w, r, d):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(idx, diff, w, r, d)
        ctx.shape, ctx.dtype = mean.shape, mean.dtype
        return mean.index_copy(0, idx, proj), r.clone()

    @staticmethod
    def backward(ctx, g_out, g_r):
        idx, diff, w, r, d = ctx.saved_tensors
        if g_out is None:  # only omega's gradient
            g_out = torch.zeros(ctx.shape, dtype=ctx.dtype, device=diff.device)
        g = g_out.index_select(0, idx).double()
        dot = torch.linalg.vecdot(g, diff) if g_r is None else torch.linalg.vecdot(g, diff) + g_r
        grad = torch.addcmul(g, (dot / d).unsqueeze(-1), w, value=-1).mul_(r.unsqueeze(-1))
        return g_out.index_copy(0, idx, grad.to(g_out.dtype)), None, None, None, None, None, None


def project_cov(new: Gaussian, old: Gaussian, *, bound: float, distance: str):
    """The covariance projection of ``new`` towards the constant ``old`` (float64, same kind; see :func:`project`).

    Returns (factor, eta, before, after): the projected factor in ``new.factor``'s shape and dtype, and per-row
    eta and distances, (B,) or () for a global covariance (projected once: it is a single row here).
    """
    kind, dtype = new.kind, new.factor.dtype
    single = new.is_global
    if single and distance == "kl" and kind == "chol":
        return project_kl_global(new.factor, old.factor, bound=bound)
    rows = new.factor.unsqueeze(0) if single else new.factor  # (N, D) or (N, D, D), N = B or 1
    f_o = old.factor.unsqueeze(0) if single else old.factor
    x = rows.double()
    if distance == "kl":  # the KL solve needs no gradient of c
        with torch.no_grad():
            c = kl_rows(kind, x, f_o)  # (N,)
    else:
        c = factor_distance(kind, x, f_o, distance=distance)
    before = c.detach()
    check_range(
        "new.factor",
        before,
        dtype,
        f"its {distance} distance to old.factor (the covariance part) before the projection",
    )
    active = before > bound
    out, eta, after = rows, torch.zeros_like(before), before
    if bool(active.any()):
        every = bool(active.all())  # e.g. the global covariance: no rows to pick
        idx = None if every else active.nonzero().squeeze(-1)
        xa, fa, ca = (x, f_o, c) if every else (t.index_select(0, idx) for t in (x, f_o, c))
        rounded = dtype != torch.float64
        if distance == "kl":
            ra = rows if every else rows.index_select(0, idx)
            projected, s, after_a = project_kl_rows(kind, ra, xa, fa, bound=bound, rounded=rounded)
        else:
            projected, s, after_a = project_linear_rows(kind, distance, xa, fa, ca, bound=bound, rounded=rounded)
        projected = projected.to(dtype)
        if after_a is None:  # the distance of the returned (rounded) factor, measured
            with torch.no_grad():
                y = projected.detach().double()
                after_a = kl_rows(kind, y, fa) if distance == "kl" else factor_distance(kind, y, fa, distance=distance)
        if every:
            out, eta, after = projected, multiplier(s), after_a
        else:
            out, eta = rows.index_copy(0, idx, projected), eta.index_copy(0, idx, multiplier(s))
            after = before.index_copy(0, idx, after_a)
    if single:
        out, eta, before, after = out[0], eta[0], before[0], after[0]
    return out, eta.to(dtype), before.to(dtype), after.to(dtype)


def rounded_target(y: torch.Tensor, grad: torch.Tensor, bound: float) -> torch.Tensor:
    """The bound to aim at so that ``y`` (rows on the bound, float64) still meets ``bound`` once rounded to float32.

    Rounding y_i to float32 moves it by at most U32 |y_i|, so the distance moves by at most U32 sum_i |y_i g_i| to
    first order (g = d distance / d y at y). Aiming twice that inside covers the second order and the rounding of the
    recomputed distance; never below bound / 2 (a bound float32 cannot hold then shows in the distance after).
    """
    margin = U32 * (y * grad).abs().flatten(1).sum(-1)
    return (bound - 2 * margin).clamp(min=bound / 2, max=bound * (1 - 2 * RTOL))


# ------------------------------------------------------------------------------ frobenius and w2: closed form


def project_linear_rows(kind, distance, x, f_o, c, *, bound, rounded):
    """Rows of "frobenius" (interpolate Sigma) or "w2" (interpolate S) with c = d(x, f_o) > bound; float64.

    The distance is quadratic in the interpolated matrix, so s = sqrt(target / c) puts it on target exactly.
    Returns (factor rows, s, after): factor and s with the gradient; after = the distance of the float32-rounded
    factor when ``rounded`` (measured), else None.

    float32: the first-order margin of :func:`rounded_target` does not cover the second-order term when the bound is
    small next to the covariance (|dSigma|_F^2 ~ (u |Sigma|)^2 D^2 from rounding L: a Frobenius distance 6.6x its
    bound 2e-6 at eigenvalues up to 1e6, D = 44). Rows still above the bound once rounded halve their step until
    they are not (:data:`MAX_HALVINGS`): as s -> 0 the factor rounds to the old one, at distance 0.
    """
    target = torch.full_like(c, bound)
    if rounded:
        with torch.no_grad():
            at_bound = interpolate_linear(kind, distance, x.detach(), f_o, (bound / c.detach()).sqrt())
            grad = factor_distance_grad(kind, at_bound, f_o, distance=distance)
            target = rounded_target(at_bound, grad, bound)
    s = target.sqrt() / c.sqrt()  # not (target / c).sqrt(): its backward squares c, which overflows from c ~ 1e154
    if not rounded:
        return interpolate_linear(kind, distance, x, f_o, s), s, None
    with torch.no_grad():
        scale = torch.ones_like(c)
        for k in range(MAX_HALVINGS + 1):
            y = interpolate_linear(kind, distance, x.detach(), f_o, s.detach() * scale).float().double()
            after = factor_distance(kind, y, f_o, distance=distance)
            over = after > bound
            if k == MAX_HALVINGS or not bool(over.any()):
                break
            scale = torch.where(over, scale / 2, scale)
    s = s * scale
    return interpolate_linear(kind, distance, x, f_o, s), s, after


def interpolate_linear(kind, distance, x, f_o, s):
    """The factor of Sigma_o + s (Sigma - Sigma_o) ("frobenius") or S_o + s (S - S_o) ("w2"); s (N,)."""
    if kind == "diag":
        s = s.unsqueeze(-1)
        if distance == "w2":
            return f_o + s * (x - f_o)
        var_o = f_o * f_o
        return (var_o + s * (x * x - var_o)).sqrt()
    s = s.reshape(-1, 1, 1)
    if distance == "w2":
        return f_o + s * (x - f_o)
    cov_o = f_o @ f_o.mT
    return torch.linalg.cholesky(cov_o + s * (x @ x.mT - cov_o))
