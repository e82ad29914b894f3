"""The KL covariance projection (docs/gaussian.md, "KL"): rows of Cholesky factors or stds, in float64.

In the frame whitened by the old factor, the new precision is C = L_o^T Sigma^-1 L_o = A^T A with A = L^-1 L_o
((N, D) = var_o / var for diagonal factors), and the projected one C_s = s C + (1 - s) I. With lam the eigenvalues of
C, t_i = s (lam_i - 1) and y_i = -t_i / (1 + t_i):

    d(s) = 1/2 sum_i [y_i - log1p(y_i)],       dd/dlog s = 1/2 sum_i y_i^2

so one eigendecomposition per row turns the root-find d(s) = bound into O(D) work per Newton step: batched on
troll.rootfind.solve_log_step, or for a single row (a global covariance) on its float form
troll.rootfind.solve_log_step_scalar (``solve_single``): the same bracketed Newton steps without a tensor operation
per step. The projected factor is L_o P, P P^T = C_s^-1;
for full factors it comes from :class:`KLFactor`, whose backward is the analytic gradient through C, implicit in s.
Shapes: N rows, D dims.
"""

from __future__ import annotations

import math

import torch

from troll.gaussian.distances import (
    SERIES_BELOW,
    factor_distance,
    kl_from_relative_factor,
    psi,
    x_minus_log1p_series,
)
from troll.gaussian.policy import check_range
from troll.rootfind import solve_log_step, solve_log_step_scalar

MAX_RATIO = 1e100  # KL: new std / old std along any direction within [1 / MAX_RATIO, MAX_RATIO] (C within its square)
RTOL = 1e-12  # a projected row ends in [bound (1 - RTOL), bound] (before rounding to the output dtype)
U32 = 2.0**-24  # float32 unit roundoff: rounding moves a value by at most this much of itself


def project_kl_rows(kind: str, rows: torch.Tensor, x: torch.Tensor, f_o: torch.Tensor, *, bound: float, rounded: bool):
    """Rows of the KL projection whose KL to the old covariance exceeds ``bound``.

    rows: the new factors (N, D) or (N, D, D) in their dtype, with the gradient; x: the same in float64; f_o: the old
    ones (float64). ``rounded``: the result goes to float32, so aim inside by what that rounding can do
    (``rounding_margin``). Returns (factor rows in rows' dtype, s, after): both with the gradient (s: the implicit
    one), and after = d(s) per row, or None when ``rounded`` (the caller then measures the rounded factor).
    """
    with torch.no_grad():
        a, c = whitened_precision(kind, x.detach(), f_o)
        if kind != "diag":
            check_ratio(c, matrix=True)  # before eigvalsh, which fails on inf
        lam = c if kind == "diag" else torch.linalg.eigvalsh(c)
        check_ratio(lam)
        s = kl_step(lam, bound)
        after, slope = kl_terms(lam - 1, s)
        if rounded:  # aim inside by what rounding the factor at s can do, then move there (a warm start from s)
            target = (bound - 2 * rounding_margin(kind, c, f_o, s)).clamp(min=bound / 2, max=bound * (1 - 2 * RTOL))
            s = kl_step(lam, target, start=(s, after, slope))
    if kind == "diag":  # elementwise: autograd through log C (recomputed with the gradient) and the implicit s
        log_c = 2 * (f_o.log() - rows.double().log())
        s, t = implicit_step_diag(log_c, s)
        return (f_o * (1 + t).rsqrt()).to(rows.dtype), s, None if rounded else after
    with torch.no_grad():
        p = inverse_cholesky(interpolated_precision(c, s))
        c.diagonal(dim1=-2, dim2=-1).sub_(1)  # C - I, in place: C is not needed any more
    y, s = KLFactor.apply(rows, x.detach(), a, c, f_o, s, p)
    return y, s, None if rounded else after


def project_kl_global(factor: torch.Tensor, f_o: torch.Tensor, *, bound: float):
    """The KL projection of one global Cholesky factor (D, D) towards the constant float64 ``f_o`` (TCE's case).

    The steps of :func:`project_kl_rows` on one row, its scalars (the distance before, the D eigenvalues, s and the
    distance after) in Python floats: a single D x D problem is dominated by the number of tensor operations, not
    their size. Returns (factor, eta, before, after) as ``project_cov``: the factor in ``factor``'s dtype, with the
    gradient, the others 0-dim.
    """
    rounded = factor.dtype != torch.float64
    with torch.no_grad():
        x = factor.double()
        before_t = kl_from_relative_factor(torch.linalg.solve_triangular(f_o, x, upper=False))
        check_range(
            "new.factor",
            before_t,
            factor.dtype,
            "its kl distance to old.factor (the covariance part) before the projection",
        )
        before = float(before_t)
        if before <= bound:
            return factor, factor.new_zeros(()), factor.new_full((), before), factor.new_full((), before)
        a, c = whitened_precision("chol", x, f_o)
        check_ratio(c, matrix=True)
        lam = torch.linalg.eigvalsh(c)
        check_ratio(lam)
        lam_m1 = [v - 1 for v in lam.tolist()]
        v, after = solve_single(lam_m1, bound)
        if rounded:  # aim inside by what rounding the factor can do, then move there (a warm start from v)
            margin = rounding_margin_full(f_o, inverse_cholesky(interpolated_precision(c, math.exp(v))))
            v, after = solve_single(lam_m1, min(max(bound - 2 * margin, bound / 2), bound * (1 - 2 * RTOL)), v0=v)
        p = inverse_cholesky(interpolated_precision(c, math.exp(v)))
        c.diagonal().sub_(1)  # C - I, in place: C is not needed any more
    y, s = KLFactor.apply(factor, x, a, c, f_o, c.new_full((), math.exp(v)), p)
    if rounded:  # the distance of the returned (rounded) factor, measured
        with torch.no_grad():
            after = float(kl_from_relative_factor(torch.linalg.solve_triangular(f_o, y.double(), upper=False)))
    return y, multiplier(s).to(factor.dtype), factor.new_full((), before), factor.new_full((), after)


def kl_rows(kind: str, fp: torch.Tensor, fq: torch.Tensor) -> torch.Tensor:
    """KL_cov of the factor rows fp from fq, (N,), float64 and without gradient: distances.factor_distance, with the
    temporaries of full factors reused in place (the rows can be thousands of D x D matrices)."""
    if kind == "diag":
        return factor_distance(kind, fp, fq, distance="kl")
    rel = torch.linalg.solve_triangular(fq, fp, upper=False)
    diag = psi(rel.diagonal(dim1=-2, dim2=-1)).sum(-1)
    strict_lower = torch.ones(rel.shape[-2:], dtype=rel.dtype, device=rel.device).tril_(-1)
    return 0.5 * (rel.mul_(strict_lower).square_().sum((-2, -1)) + diag)


class _Multiplier(torch.autograd.Function):
    """eta = 1 / s - 1 with the backward -(g / s) / s: autograd's -g / s^2 overflows once s < 1e-154 (eta > 1e154,
    inside the supported range), even where the gradient itself, e.g. that of log eta, is small."""

    @staticmethod
    def forward(ctx, s):
        ctx.save_for_backward(s)
        return s.reciprocal() - 1

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return -(g / s) / s


def multiplier(s: torch.Tensor) -> torch.Tensor:
    """The Lagrange multiplier eta = 1 / s - 1 (or omega = 1 / r - 1) of a step s in (0, 1], with a gradient that
    does not overflow (:class:`_Multiplier`)."""
    return _Multiplier.apply(s)


def check_ratio(lam: torch.Tensor, *, matrix: bool = False) -> None:
    """Refuse eigenvalues ``lam`` of the whitened precision C outside [MAX_RATIO^-2, MAX_RATIO^2] (NaN too); with
    ``matrix``, ``lam`` is C itself and only its finiteness is checked (eigvalsh fails on inf).

    C's eigenvalues are (old std / new std)^2 along the principal directions; s ~ 1 / (lam sqrt(bound)) and
    eta = 1/s - 1 must stay float64 numbers, which this range keeps with room for any bound above 1e-100
    (docs/gaussian.md, "Supported range"). Outside it the covariances are 1e100 apart in scale: a diverged
    network, not a policy update.
    """
    lo, hi = (float(v) for v in torch.aminmax(lam))
    ok = math.isfinite(lo) and math.isfinite(hi) if matrix else MAX_RATIO**-2 <= lo and hi <= MAX_RATIO**2
    if not ok:
        raise ValueError(
            "new.factor is outside the supported range of the KL projection: the new standard deviation relative to "
            f"the old one along some direction (a singular value of old.factor^-1 new.factor) lies outside "
            f'[{1 / MAX_RATIO:g}, {MAX_RATIO:g}] (docs/gaussian.md, "Supported range"). The policy has collapsed or '
            "diverged: check the network output, e.g. floor its std with softplus(x) + min_std."
        )


def whitened_precision(kind: str, x: torch.Tensor, f_o: torch.Tensor):
    """(A, C): A = L^-1 L_o and C = A^T A = L_o^T Sigma^-1 L_o; for diagonal factors (None, var_o / var)."""
    if kind == "diag":
        ratio = f_o / x
        return None, ratio * ratio
    a = torch.linalg.solve_triangular(x, f_o, upper=False)
    return a, a.mT @ a


# ------------------------------------------------------------------------------------------------ the solve


def kl_step(lam: torch.Tensor, target, *, start=None) -> torch.Tensor:
    """s in (0, 1) with d(s) = target per row, from the eigenvalues lam (N, D) of C: (N,), no gradient.

    target: a float or (N,). Solved on v = log s, on d / target, so one relative tolerance serves every row; a row
    ends in [target (1 - RTOL), target]. The search starts at each row's :func:`upper_step`, or from ``start`` =
    (s, d(s), dd/dlog s) of a previous solution with d(s) > target: the bracket's upper end, and a first step that is
    the median row's Newton step from there. One row is solved in Python floats (``solve_single``).
    """
    n = lam.shape[0]
    target = torch.as_tensor(target, dtype=lam.dtype, device=lam.device).expand(n)
    lam_m1 = lam - 1
    if n == 1:
        v0 = None if start is None else math.log(float(start[0]))
        return lam.new_tensor([math.exp(solve_single(lam_m1[0].tolist(), float(target[0]), v0=v0)[0])])
    if start is None:
        base, v0 = upper_step(lam_m1, target).log(), 0.0
    else:
        s, d, slope = start
        base, v0 = s.log(), min(float((-(d / target).log() * d / slope).median()), 0.0)
    scale = 1 / target

    def stats(v, rows):
        every = rows.numel() == n
        d, slope = kl_terms(lam_m1 if every else lam_m1[rows], (v + base[rows]).exp())
        sc = scale if every else scale[rows]
        return d * sc, slope * sc

    v, _ = solve_log_step(stats, n, 1 - RTOL / 2, RTOL / 2, dtype=lam.dtype, device=lam.device, v0=v0)
    return (v + base).exp()


def upper_step(lam_m1: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A step s_hi in (0, 1] with d(s_hi) >= target, close to the root when the projection is strong (derived).

    Each term of d is at least its quadratic part shrunk: y - log1p(y) >= t^2 / 2 for t = s (lam - 1) in (-1, 0]
    and >= t^2 / (2 (1 + t)^2) for t > 0, so d(s) >= (s / (1 + s m))^2 Q / 4 with Q = sum (lam - 1)^2 and
    m = max(lam - 1, 0). With s0 = sqrt(4 target / Q) (the small-s guess), s_hi = s0 / (1 - s0 m) makes the right
    side equal target; where s0 m >= 1 (or s_hi > 1), s_hi = 1, at which every row that is projected has d > target.
    """
    big = lam_m1.abs().amax(-1, keepdim=True)  # sum (lam - 1)^2 scaled by its largest term: no overflow
    s0 = (4 * target).sqrt() / (big.squeeze(-1) * (lam_m1 / big).square().sum(-1).sqrt())
    gap = 1 - s0 * lam_m1.amax(-1).clamp(min=0)
    return torch.where(gap > s0, s0 / gap, 1.0)


def kl_terms(lam_m1: torch.Tensor, s: torch.Tensor):
    """(d(s), dd/dlog s) per row from lam - 1 (N, D) and s (N,): 1/2 sum [y - log1p(y)] and 1/2 sum y^2.

    y - log1p(y) as in distances.x_minus_log1p, both forms evaluated and picked elementwise (no host sync; y > -1)."""
    t = s.unsqueeze(-1) * lam_m1
    y = t / (-1 - t)
    terms = torch.where(y.abs() < SERIES_BELOW, x_minus_log1p_series(y), y - torch.log1p(y))
    return 0.5 * terms.sum(-1), 0.5 * (y * y).sum(-1)


def solve_single(lam_m1: list[float], target: float, *, v0: float | None = None) -> tuple[float, float]:
    """(v, d(v)) with d(v) in [target (1 - RTOL), target], v = log s, for one row given lam - 1 as floats.

    troll.rootfind.solve_log_step_scalar, the float form of the batched solver (a global covariance is one row, and
    per-step tensor operations would cost more than its O(D) arithmetic), on d / target. Its bracket is relative, as
    in :func:`kl_step`: 60 units of log s below :func:`upper_step` (or below ``v0``, a previous solution with
    d(v0) > target), so that a root far below s = 1 is inside it (a new covariance 1e13 times inside the old one
    needs s ~ 1e-27).
    """
    if v0 is None:  # upper_step in floats, with sum (lam - 1)^2 scaled by its largest term (no overflow)
        big = max(abs(a) for a in lam_m1)
        norm = big * math.sqrt(sum((a / big) ** 2 for a in lam_m1))
        s0 = math.sqrt(4 * target) / norm
        gap = 1 - s0 * max(max(lam_m1), 0.0)
        v0 = math.log(s0 / gap) if gap > s0 else 0.0

    def stats(v: float) -> tuple[float, float]:
        d, slope = _terms(lam_m1, math.exp(v + v0))
        return d / target, slope / target

    v, _ = solve_log_step_scalar(stats, 1 - RTOL / 2, RTOL / 2, v0=0.0)
    return v + v0, _terms(lam_m1, math.exp(v + v0))[0]


def _terms(lam_m1: list[float], s: float) -> tuple[float, float]:
    """(d, dd/dlog s) of :func:`kl_terms` for one row, in floats."""
    d = slope = 0.0
    for a in lam_m1:
        t = s * a
        y = t / (-1 - t)
        d += _x_minus_log1p(y)
        slope += y * y
    return 0.5 * d, 0.5 * slope


def _x_minus_log1p(x: float) -> float:
    """distances.x_minus_log1p for one float: the series below SERIES_BELOW, the direct form above."""
    if abs(x) >= SERIES_BELOW:
        return x - math.log1p(x)
    u = x / (2 + x)
    u2 = u * u
    return u * x - 2 * u * u2 * (1 / 3 + u2 * (1 / 5 + u2 * (1 / 7 + u2 / 9)))


def rounding_margin(kind: str, c: torch.Tensor, f_o: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """U32 sum_ij |y_ij g_ij| for the projected factor y at s and g = d KL_cov(y, old) / d y: (N,). No gradient.

    Rounding y to float32 moves each entry by at most U32 |y_ij|, so the distance by at most this, to first order.
    Diagonal: y = std, g = (b - 1/b) / std_o with b = y / std_o, so y g = b^2 - 1. Full: :func:`rounding_margin_full`.
    """
    if kind == "diag":
        b = (1 + s.unsqueeze(-1) * (c - 1)).rsqrt()  # y / std_o
        return U32 * (b * b - 1).abs().sum(-1)
    return rounding_margin_full(f_o, inverse_cholesky(interpolated_precision(c, s)))


def rounding_margin_full(f_o: torch.Tensor, p: torch.Tensor):
    """:func:`rounding_margin` of full factors y = L_o P: g = Sigma_o^-1 y - diag(1 / y_ii) on the lower triangle, so
    y * g = y * h - I with h = L_o^-T P (one triangular solve). (N,) for rows, a float for one factor (D, D)."""
    yh = (f_o @ p).mul_(torch.linalg.solve_triangular(f_o.mT, p, upper=True))
    yh.diagonal(dim1=-2, dim2=-1).sub_(1)
    margin = U32 * yh.abs_().sum((-2, -1))
    return float(margin) if p.dim() == 2 else margin


# ---------------------------------------------------------------------------- the factor and its gradient
# Full factors: rows (N, D, D) with s (N,), or one global factor (D, D) with s () (no batch dimension to carry).


def interpolated_precision(c: torch.Tensor, s) -> torch.Tensor:
    """C_s = s C + (1 - s) I for C (N, D, D) and s (N,), or C (D, D) and s a float."""
    if isinstance(s, float):
        out = c * s
        out.diagonal().add_(1 - s)
        return out
    out = c * s.reshape(s.shape + (1, 1))
    out.diagonal(dim1=-2, dim2=-1).add_((1 - s).unsqueeze(-1))
    return out


def inverse_cholesky(c: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor P of c^-1 (P P^T = c^-1) for SPD c (..., D, D), without forming c^-1.

    With J the reversal permutation: chol(J c J) = Z gives c = U U^T with U = J Z J upper triangular, so
    c^-1 = U^-T U^-1 and P = U^-T = J Z^-T J (lower, positive diagonal). One Cholesky and one triangular inverse;
    the result is row-major (contiguous), as the batched products that follow want it.
    """
    z = torch.linalg.cholesky(c.flip(-2, -1))
    eye = torch.eye(c.shape[-1], dtype=c.dtype, device=c.device)
    return torch.linalg.solve_triangular(z, eye, upper=False).mT.flip(-2, -1)


class KLFactor(torch.autograd.Function):
    """(L^, s) = (L_o P, s) with P P^T = C_s^-1, differentiable in the new factor L, s implicit.

    forward(factor = L in its dtype, x = L in float64, a = A, c_m_i = C - I, f_o = L_o, s, p = P): A and C as in
    :func:`whitened_precision`, s the solved step, P at s; rows (N, D, D) with s (N,), or one factor (D, D) with
    s (). L^ comes back in factor's dtype.
    backward: with G the gradient of L^ and g_s that of s, T = L^^T G, S = sym(Phi(T)) (Phi: the lower triangle,
    diagonal halved: the Cholesky differential), X = -P^T (C - I) P and Q = A P = L^-1 L^ (derived, docs/gaussian.md
    "The gradient through eta"):

        grad C = -s P S' P^T,   S' = S - (<S, X> + g_s) / |X|_F^2  X     (s's implicit part is the X term)
        grad L = tril(-L^-T (2 A grad C) A^T) = tril(2 s L^-T Q S' Q^T)

    Four matrix products and one triangular solve; nothing is factorised again.
    """

    @staticmethod
    def forward(ctx, factor, x, a, c_m_i, f_o, s, p):
        ctx.set_materialize_grads(False)
        ctx.dtype = factor.dtype
        xm = p.mT @ c_m_i @ p  # -X
        y = f_o @ p
        ctx.save_for_backward(x, a, p, y, xm, s)
        return y.to(factor.dtype), s.clone()

    @staticmethod
    def backward(ctx, g_y, g_s):
        x, a, p, y, xm, s = ctx.saved_tensors
        shape = s.shape + (1, 1)
        if g_y is None and g_s is None:
            return None, None, None, None, None, None, None
        if g_y is None:
            two_s, dot = torch.zeros_like(xm), 0.0
        else:
            phi = _lower_(y.mT @ g_y.double(), diagonal=0.5)
            two_s = phi + phi.mT  # 2 S
            dot = (two_s * xm).sum((-2, -1))
        if g_s is not None:
            dot = dot - 2 * g_s
        beta2 = dot / (xm * xm).sum((-2, -1))  # 2 (<S, X> + g_s) / |X|^2 (xm = -X)
        core = torch.addcmul(two_s, beta2.reshape(shape), xm, value=-1).mul_(s.reshape(shape))  # 2 s S' (xm = -X)
        q = a @ p
        grad = torch.linalg.solve_triangular(x.mT, q @ core @ q.mT, upper=True)
        return _lower_(grad).to(ctx.dtype), None, None, None, None, None, None


def _lower_(t: torch.Tensor, *, diagonal: float = 1.0) -> torch.Tensor:
    """t (..., D, D) set in place to its lower triangle, the diagonal scaled by ``diagonal``; a mask product on a batch
    of small matrices (tril is slow there), tril_ on one."""
    if t.dim() == 2:
        t.tril_()
    else:
        t.mul_(torch.ones(t.shape[-2:], dtype=t.dtype, device=t.device).tril_())
    if diagonal != 1.0:
        t.diagonal(dim1=-2, dim2=-1).mul_(diagonal)
    return t


def implicit_step_diag(log_c: torch.Tensor, s: torch.Tensor):
    """(s, t): s (N,) with its value unchanged and the implicit gradient, and t = s (C - 1) (N, D), for diagonal C
    given as log C (N, D) with the gradient. With v = log s, T = s C and k = 1 / (1 + t) elementwise (derived from
    docs/gaussian.md, "The gradient through eta", with dd/dt_i = k_i^2 t_i / 2 and dt_i/dlog C_i = T_i):

        df/dlog C = k^2 t T / 2,   df/dv = sum (k t)^2 / 2 > 0,   v_imp = v - (f_lin - sg(f_lin)) / sg(df/dv)

    with f_lin = <sg(df/dlog C), log C>. Every factor is O(1) near the root whatever C is (T and t are, there), so a
    std 1e-80 against an old std of 1 (C = 1e160, s ~ 1e-161) keeps its digits; t = s expm1(log C) has no overflow.
    """
    with torch.no_grad():
        v = s.log()
        t = s.unsqueeze(-1) * torch.expm1(log_c.detach())
        k = 1 / (1 + t)
        kt = k * t
        grad = 0.5 * k * kt * (t + s.unsqueeze(-1))  # T = s C = t + s
        df_dv = 0.5 * (kt * kt).sum(-1)
    f_lin = (grad * log_c).sum(-1)
    s = (v - (f_lin - f_lin.detach()) / df_dv).exp()
    return s, s.unsqueeze(-1) * torch.expm1(log_c)
