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

from typing import NamedTuple

import torch

from troll._checks import check_choice, check_number
from troll.gaussian.distances import DISTANCES, factor_distance, factor_distance_grad, mean_distance, x_minus_log1p
from troll.gaussian.policy import Gaussian, check_gaussian, check_pair, whiten, whiten_t
from troll.rootfind import solve_log_step

RTOL = 1e-12  # KL solve: a projected row ends in [bound (1 - RTOL), bound] (before rounding to the output dtype)
U32 = 2.0**-24  # float32 unit roundoff: rounding moves a value by at most this much of itself
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
    check_number("mean_bound", mean_bound, hint="; TCE uses mean_bound=0.005 to 0.1")
    check_number("cov_bound", cov_bound, hint="; TCE uses cov_bound=0.0005 to 0.02")
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
    old = old.detach()
    mean, omega, mean_before, mean_after = project_mean(new.mean, old, bound=mean_bound, distance=distance)
    factor, eta, cov_before, cov_after = project_cov(new, old, bound=cov_bound, distance=distance)
    policy = Gaussian(mean, factor, new.kind)
    return GaussianProjection(policy, mean_before, mean_after, cov_before, cov_after, omega, eta)


def project_mean(mean: torch.Tensor, old: Gaussian, *, bound: float, distance: str):
    """The mean projection, closed form: mu^ = mu_o + r (mu - mu_o), r = sqrt(bound / d) on rows with d > bound.

    mean: (B, D) with gradient; old: the constant old policy. Returns (mu^ (B, D), omega (B,), before, after).
    Scaling mu - mu_o by r scales the (quadratic) distance by r^2, so d(mu^) = bound: ``after`` is d r^2 in float64
    and is recomputed from the returned mean in float32.
    """
    dtype, old64 = mean.dtype, old.to(torch.float64)
    diff = mean.double() - old64.mean
    z = whiten(old64, diff)  # (B, D), with gradient
    half = 0.5 if distance == "kl" else 1.0
    d = half * (z * z).sum(-1)
    before = d.detach()
    active = before > bound
    if not bool(active.any()):
        return mean, torch.zeros_like(before, dtype=dtype), before.to(dtype), before.to(dtype)
    target = torch.full_like(before, bound)
    rounded = dtype != torch.float64
    if rounded:  # only the projected rows need the margin and the recomputed distance
        idx = active.nonzero().squeeze(-1)
        sub = rows_of(old64, idx)
        with torch.no_grad():  # d d / d y = 2 half Sigma_o^-1 (y - mu_o) at y = mu_o + r0 (mu - mu_o) on the bound
            r0 = (bound / before[idx]).sqrt().unsqueeze(-1)
            grad = 2 * half * r0 * whiten_t(sub, z.detach()[idx])
            target[idx] = rounded_target(sub.mean + r0 * diff.detach()[idx], grad, bound)
    r = torch.where(active, (target / torch.where(active, d, target)).sqrt(), 1.0)
    out = torch.where(active.unsqueeze(-1), (old64.mean + r.unsqueeze(-1) * diff).to(dtype), mean)
    with torch.no_grad():
        if rounded:
            after = before.index_put((idx,), mean_distance(out[idx].double(), sub, distance=distance))
        else:
            after = before * r.detach() ** 2
    return out, (1 / r - 1).to(dtype), before.to(dtype), after.to(dtype)


def rows_of(policy: Gaussian, idx: torch.Tensor) -> Gaussian:
    """The states ``idx`` of ``policy`` (a global factor is shared, not indexed)."""
    factor = policy.factor if policy.is_global else policy.factor[idx]
    return Gaussian(policy.mean[idx], factor, policy.kind)


def project_cov(new: Gaussian, old: Gaussian, *, bound: float, distance: str):
    """The covariance projection of ``new`` towards the constant ``old`` (same kind; see :func:`project`).

    Returns (factor, eta, before, after): the projected factor in ``new.factor``'s shape and dtype, and per-row
    eta and distances, (B,) or () for a global covariance (projected once: it is a single row here).
    """
    kind, dtype = new.kind, new.factor.dtype
    single = new.is_global
    rows = new.factor.unsqueeze(0) if single else new.factor  # (N, D) or (N, D, D), N = B or 1
    f_o = (old.factor.unsqueeze(0) if single else old.factor).double()
    x = rows.double()
    c = factor_distance(kind, x, f_o, distance=distance)  # (N,), with gradient
    before = c.detach()
    active = before > bound
    out, eta, after = rows, torch.zeros_like(c), before
    if bool(active.any()):
        every = bool(active.all())  # e.g. the global covariance: no rows to pick
        idx = None if every else active.nonzero().squeeze(-1)
        xa, fa, ca = (x, f_o, c) if every else (x[idx], f_o[idx], c[idx])
        rounded = dtype != torch.float64
        if distance == "kl":
            projected, s = project_kl_rows(kind, xa, fa, bound=bound, rounded=rounded)
        else:
            projected, s = project_linear_rows(kind, distance, xa, fa, ca, bound=bound, rounded=rounded)
        projected = projected.to(dtype)
        with torch.no_grad():
            after_a = factor_distance(kind, projected.detach().double(), fa, distance=distance)
        if every:
            out, eta, after = projected, 1 / s - 1, after_a
        else:
            out, eta = rows.index_put((idx,), projected), eta.index_put((idx,), 1 / s - 1)
            after = before.index_put((idx,), after_a)
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
    Returns (factor rows, s), both with gradient.
    """
    target = torch.full_like(c, bound)
    if rounded:
        with torch.no_grad():
            at_bound = interpolate_linear(kind, distance, x.detach(), f_o, (bound / c.detach()).sqrt())
            grad = factor_distance_grad(kind, at_bound, f_o, distance=distance)
            target = rounded_target(at_bound, grad, bound)
    s = (target / c).sqrt()
    return interpolate_linear(kind, distance, x, f_o, s), s


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


# ---------------------------------------------------------------------------------------- kl: root-find


def project_kl_rows(kind, x, f_o, *, bound, rounded):
    """Rows of the KL projection whose KL to the old covariance exceeds ``bound``; float64.

    In the frame whitened by the old factor, the new precision is C = L_o^T Sigma^-1 L_o ((N, D) for diagonal
    factors: var_o / var) and the projected one C_s = s C + (1 - s) I. With lam the eigenvalues of C,
    d(s) = 1/2 sum_i [mu_i - 1 - log mu_i], mu_i = 1 / (1 + s (lam_i - 1)): one eigendecomposition per row, then a
    root-find on O(D) work per step. Returns (factor rows, s), both with gradient (s: the implicit one).
    """
    c = whitened_precision(kind, x, f_o)
    with torch.no_grad():
        lam = c.detach() if kind == "diag" else torch.linalg.eigvalsh(c.detach())
        target = torch.full(lam.shape[:1], bound, dtype=lam.dtype, device=lam.device)
        s = kl_step(lam, target)
        if rounded:  # aim inside by what rounding the factor at s can do, then move there (a warm start from s)
            at_bound, grad = kl_factor_and_gradient(kind, c.detach(), f_o, s)
            s = kl_step(lam, rounded_target(at_bound, grad, bound), start=s)
    if kind == "diag":
        s = implicit_step_diag(c, s)
        return interpolate_kl(kind, c, f_o, s), s
    return interpolate_kl_implicit(c, f_o, s)


def kl_factor_and_gradient(kind, c, f_o, s):
    """The projected factor y at s and d KL_cov(y, old) / d y (no gradient), for the float32 rounding margin.

    For full factors y = L_o P, so L_o^-1 y = P and the gradient Sigma_o^-1 y - diag(1 / y_ii) needs one triangular
    solve, L_o^-T P, instead of the two of factor_distance_grad."""
    if kind == "diag":
        y = interpolate_kl(kind, c, f_o, s)
        return y, factor_distance_grad(kind, y, f_o, distance="kl")
    eye = torch.eye(c.shape[-1], dtype=c.dtype, device=c.device)
    s3 = s.reshape(-1, 1, 1)
    p = inverse_cholesky(s3 * c + (1 - s3) * eye)
    y = f_o @ p
    grad = torch.linalg.solve_triangular(f_o.mT, p, upper=True) - torch.diag_embed(1 / y.diagonal(dim1=-2, dim2=-1))
    return y, grad


def whitened_precision(kind, x, f_o):
    """C = L_o^T Sigma^-1 L_o = A^T A with A = L^-1 L_o; (N, D) = var_o / var for diagonal factors."""
    if kind == "diag":
        ratio = f_o / x
        return ratio * ratio
    a = torch.linalg.solve_triangular(x, f_o, upper=False)
    return a.mT @ a


def kl_step(lam: torch.Tensor, target: torch.Tensor, *, start: torch.Tensor | None = None) -> torch.Tensor:
    """s in (0, 1) with d(s) = target per row, from the eigenvalues lam (N, D) of C; target (N,). No gradient.

    With t_i = s (lam_i - 1) and y_i = -t_i / (1 + t_i) = mu_i - 1:
        d(s)     = 1/2 sum_i [y_i - log1p(y_i)]
        dd/dlogs = 1/2 sum_i y_i^2          (docs/gaussian.md, "The KL covariance projection")
    Solved on v = log s by troll.rootfind, on d / target (so one relative tolerance serves every row). ``start``:
    a previous solution with d(start) > target, searched below (two Newton steps instead of a fresh solve).
    """
    lam_m1 = lam - 1
    base = torch.zeros_like(target) if start is None else start.log()

    def stats(v, rows):
        t = (v + base[rows]).exp().unsqueeze(-1) * lam_m1[rows]
        y = -t / (1 + t)
        scale = 2 * target[rows]
        return x_minus_log1p(y).sum(-1) / scale, (y * y).sum(-1) / scale

    if start is None:  # d ~ s^2 / 4 sum (lam - 1)^2 for small s: a first guess (the median row's, one float)
        guess = (4 * target / (lam_m1 * lam_m1).sum(-1)).log() / 2
        v0 = min(float(guess.median()), -1e-3)
    else:
        v0 = 0.0
    v, _ = solve_log_step(stats, lam.shape[0], 1 - RTOL / 2, RTOL / 2, dtype=lam.dtype, device=lam.device, v0=v0)
    return (v + base).exp()


def implicit_step_diag(c, s):
    """s with its value unchanged and the implicit gradient ds/dC = -(df/dC) / (df/ds), f(s, C) = d(s, C) - target,
    for diagonal C (N, D). With k = 1 / (1 + s (C - 1)) elementwise (docs/gaussian.md, "The gradient through eta"):

        df/dC = s^2 / 2 k^2 (C - 1),   df/ds = s / 2 sum (k (C - 1))^2 > 0.

    Written as s - (f_lin - sg(f_lin)) / sg(df/ds) with f_lin = <sg(df/dC), C>: value s, gradient the implicit one.
    """
    with torch.no_grad():
        cd, s_ = c.detach(), s.unsqueeze(-1)
        k = 1 / (1 + s_ * (cd - 1))
        kc = k * (cd - 1)
        grad_c = s_ * s_ / 2 * k * kc
        df_ds = s / 2 * (kc * kc).sum(-1)
    f_lin = (grad_c * c).sum(-1)
    return s - (f_lin - f_lin.detach()) / df_ds


def interpolate_kl_implicit(c, f_o, s):
    """L^ = L_o P, P P^T = K = C_s^-1, for full C (N, D, D), with the implicit gradient of s. Returns (L^, s).

    P is computed once, with the gradient through C at fixed s; the dependence through s is added linearly, as
    P + sg(dP/ds) (s_imp - s) with s_imp = s - (<G, C> - sg(<G, C>)) / sg(df/ds) (value s, gradient ds/dC). All
    no-grad terms come from X = P^-1 (dK/ds) P^-T = -P^T (C - I) P (dK/ds = -K (C - I) K, K = P P^T):

        dP/ds = P Phi(X)   (the Cholesky differential; Phi: lower triangle, diagonal halved)
        G = df/dC = s^2 / 2 K (C - I) K = -s^2 / 2 P X P^T,   df/ds = s / 2 |K (C - I)|_F^2 = s / 2 |X|_F^2
    """
    eye = torch.eye(c.shape[-1], dtype=c.dtype, device=c.device)
    s3 = s.reshape(-1, 1, 1)
    p = inverse_cholesky(s3 * c + (1 - s3) * eye)
    with torch.no_grad():
        pd = p.detach()
        x = -pd.mT @ (c.detach() - eye) @ pd
        grad_c = -(s3 * s3 / 2) * (pd @ x @ pd.mT)
        df_ds = s / 2 * (x * x).sum((-2, -1))
        dp_ds = pd @ (x.tril(-1) + torch.diag_embed(x.diagonal(dim1=-2, dim2=-1) / 2))
    f_lin = (grad_c * c).sum((-2, -1))
    s_imp = s - (f_lin - f_lin.detach()) / df_ds
    return f_o @ (p + dp_ds * (s_imp - s).reshape(-1, 1, 1)), s_imp


def interpolate_kl(kind, c, f_o, s):
    """The factor of Sigma^ = (s Sigma^-1 + (1 - s) Sigma_o^-1)^-1 = L_o C_s^-1 L_o^T: L_o P with P P^T = C_s^-1."""
    if kind == "diag":
        return f_o * (1 + s.unsqueeze(-1) * (c - 1)).rsqrt()
    eye = torch.eye(c.shape[-1], dtype=c.dtype, device=c.device)
    s = s.reshape(-1, 1, 1)
    return f_o @ inverse_cholesky(s * c + (1 - s) * eye)


def inverse_cholesky(c: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor P of c^-1 (P P^T = c^-1) for SPD c (..., D, D), without forming c^-1.

    With J the reversal permutation: chol(J c J) = Z gives c = U U^T with U = J Z J upper triangular, so
    c^-1 = U^-T U^-1 and P = U^-T = J Z^-T J (lower, positive diagonal). One Cholesky and one triangular inverse.
    """
    z = torch.linalg.cholesky(c.flip(-2, -1))
    eye = torch.eye(c.shape[-1], dtype=c.dtype, device=c.device).expand_as(z)
    return torch.linalg.solve_triangular(z, eye, upper=False).mT.flip(-2, -1)
