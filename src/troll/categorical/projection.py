"""The per-token KL trust-region projection (docs/method.md, "The projection" and "The gradient").

For one row with new log-probs ``a`` (gradient wanted) and old log-probs ``b`` (constant)::

    pi = argmin_p KL(p || softmax(a))   s.t.   KL(p || softmax(b)) <= eps

If ``KL(softmax(a) || softmax(b)) <= eps`` the row is returned unchanged (eta = 0). Otherwise the solution is the
geometric interpolation ``log pi = z - logsumexp(z)`` with ``z = (a + eta b) / (1 + eta)``. We parameterise it by
``s = 1 / (1 + eta)`` in (0, 1], so ``z = s a + (1 - s) b``, and solve ``KL(pi_s || pi_old) = eps`` by Newton's
method on ``v = log s`` with a bisection safeguard. ``d KL / d v = Var_pi[c]`` with ``c = log pi - b``, and
``log KL`` is nearly linear in ``v`` once the projection is strong, so Newton on ``log KL - log eps`` converges in
a few steps. The bracket is ``v`` in [-60, 0], i.e. eta up to ~1e26: no row is ever too peaked to reach the bound.

The gradient through the projection is the closed form derived in docs/method.md, O(categories) per row::

    h = g - pi * sum(g);   dL/da = s * [h - (h . c) * pi * (c - KL) / Var]      (eta > 0)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from troll._checks import check_logits, check_positive, check_shape
from troll._threads import one_thread
from troll.rootfind import solve_log_step

# kl_after above kl_bound * (1 + this) marks a row as infeasible. A row that meets the bound ends within ~1e-7 of
# it (fp64 solve, fp32 output aimed FP32_MARGIN inside, kl_after recomputed from the rounded output), so anything
# more than 1e-6 above is a row the bound could not be met on. (1e-3 once let such rows through unreported.)
INFEASIBLE_RTOL = 1e-6
FP32_MARGIN = 2e-7  # fp32 / bf16 output: the fp64 solve aims at kl_bound - this * sqrt(kl_bound)
NEG_INF = float("-inf")


class Projection(NamedTuple):
    """Result of :func:`project` (leading dims ``...`` are the caller's rows).

    logp:      (..., C) projected log-probs ``log pi``; equal to ``log_softmax(new)`` where the row is inside.
    eta:       (...)    the step size eta* >= 0 (0 where the row is inside the trust region).
    kl_before: (...)    KL(pi~ || pi_old) before projection.
    kl_after:  (...)    KL(pi || pi_old) after projection (<= kl_bound up to the solver tolerance).
    """

    logp: torch.Tensor
    eta: torch.Tensor
    kl_before: torch.Tensor
    kl_after: torch.Tensor


def interpolate(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``log_softmax(s a + (1 - s) b)`` for s in (0, 1), treating -inf on either side as 'no mass'.

    a, b: (N, C) log-probs; s: (N,). A category that one policy excludes stays excluded, and the
    0 * (-inf) that plain arithmetic would give never appears.
    """
    valid = (a > NEG_INF) & (b > NEG_INF)
    s = s.unsqueeze(-1)
    z = torch.where(valid, s * a + (1 - s) * b, NEG_INF)
    return z - torch.logsumexp(z, dim=-1, keepdim=True)


def kl_stats(logp: torch.Tensor, b: torch.Tensor):
    """For pi = exp(logp): ``pi``, ``c = log pi - b`` (0 where pi = 0), ``KL(pi || exp b)`` and ``Var_pi[c]``."""
    pi = logp.exp()
    c = torch.where(pi > 0, logp - b, 0.0)
    kl = (pi * c).sum(-1)
    var = (pi * (c - kl.unsqueeze(-1)).square()).sum(-1)
    return pi, c, kl, var


def kl_divergence(p_logp: torch.Tensor, q_logp: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim from log-probs; +inf where p has mass that q lacks, 0 * log 0 = 0."""
    p = p_logp.exp()
    diff = torch.where(p > 0, p_logp - q_logp, 0.0)
    return (p * diff).sum(-1)


def solve_step(a: torch.Tensor, b: torch.Tensor, kl_bound: float, *, rtol: float | None = None) -> torch.Tensor:
    """Solve ``KL(pi_s || pi_old) = kl_bound`` for s = 1 / (1 + eta) on rows that violate the bound.

    a, b: (N, C) normalised log-probs, all rows with KL(exp a || exp b) > kl_bound. Returns s: (N,) in (0, 1).
    The root is approached from a target ``kl_bound * (1 - rtol / 2)`` and accepted within ``rtol / 2``, so a
    converged row ends in [kl_bound * (1 - rtol), kl_bound]: inside the region, never just outside it.
    ``d KL / d log s = Var_pi[c]`` (docs/method.md) is the slope :func:`troll.rootfind.solve_log_step` needs.
    """
    if rtol is None:
        rtol = 1e-9 if a.dtype == torch.float64 else 1e-5

    def stats(v, rows):
        _, _, kl, var = kl_stats(interpolate(a[rows], b[rows], v.exp()), b[rows])
        return kl, var

    target = kl_bound * (1 - rtol / 2)
    v, _ = solve_log_step(stats, a.shape[0], target, rtol / 2 * kl_bound, dtype=a.dtype, device=a.device)
    return v.exp()


class _ProjectFn(torch.autograd.Function):
    """log pi from normalised log-probs ``a`` given the solved s; closed-form backward w.r.t. ``a`` only."""

    @staticmethod
    def forward(a, b, s, active):
        logp = a.clone()
        if bool(active.any()):
            logp[active] = interpolate(a[active], b[active], s[active])
        return logp

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, b, s, active = inputs
        ctx.save_for_backward(output, b, s, active)

    @staticmethod
    def backward(ctx, g):
        with one_thread():
            return _project_backward(g, *ctx.saved_tensors)


def _project_backward(g, logp, b, s, active):
    """The closed-form backward of :class:`_ProjectFn` (docs/method.md, "The gradient")."""
    pi, c, kl, var = kl_stats(logp, b)
    h = g - pi * g.sum(-1, keepdim=True)  # log-softmax backward
    hc = (h * c).sum(-1)
    # d eta/d a = pi (c - KL) / Var; Var > 0 on every active row that is not degenerate.
    # Rows with s = 1 are not on the bound (inactive, or only restricted to the old support): no eta term.
    bound = active & (s < 1)
    coef = torch.where(bound & (var > 0), hc / var, 0.0).unsqueeze(-1)
    grad = s.unsqueeze(-1) * (h - coef * pi * (c - kl.unsqueeze(-1)))
    # Off the bound the map is log_softmax alone; select, as c = +inf on a row whose supports do not meet.
    grad = torch.where(bound.unsqueeze(-1), grad, h)
    # Where pi = 0 (a token either policy excludes) log pi does not depend on a.
    return torch.where(pi > 0, grad, 0.0), None, None, None


def project_log_probs(a: torch.Tensor, b: torch.Tensor, kl_bound: float) -> Projection:
    """Project rows of normalised log-probs ``a`` (N, C) towards ``b`` (N, C); -inf marks excluded categories.

    This is the shared core of :func:`project` and the sparse projection. Gradient flows to ``a`` only.
    """
    with one_thread():
        return _project_log_probs(a, b, kl_bound)


def _project_log_probs(a: torch.Tensor, b: torch.Tensor, kl_bound: float) -> Projection:
    with torch.no_grad():
        kl_before = kl_divergence(a.detach(), b)
        # A row whose new and old supports do not meet has no point on the path (KL = inf for every pi the new
        # policy allows): it is left unchanged, kl_after = inf, and reported as infeasible.
        meets = ((a.detach() > NEG_INF) & (b > NEG_INF)).any(-1)
        active = (kl_before > kl_bound) & meets
        s = torch.ones_like(kl_before)
        if bool(active.any()):
            s[active] = _solve_active(a.detach()[active], b[active], kl_bound)
    logp = _ProjectFn.apply(a, b.detach(), s, active)
    with torch.no_grad():
        kl_after = torch.where(active, kl_divergence(logp.detach(), b), kl_before)
        eta = torch.where(s < 1, 1 / s - 1, 0.0)
    return Projection(logp, eta, kl_before, kl_after)


def _solve_active(a: torch.Tensor, b: torch.Tensor, kl_bound: float) -> torch.Tensor:
    """s for rows outside the region. Where the new policy has mass that the old one lacks, KL jumps from inf at
    s = 1 to its value on the old support just below: if that already meets the bound, the projection is the new
    policy restricted to the old support (s = 1, eta = 0) and no root exists to solve for."""
    s = torch.ones(a.shape[0], dtype=a.dtype, device=a.device)
    need = kl_divergence(interpolate(a, b, s), b) > kl_bound
    if bool(need.any()):
        s[need] = solve_step(a[need], b[need], kl_bound)
    return s


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """bf16 / fp16 inputs are computed in fp32; fp32 and fp64 keep their precision."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def project(new_logits: torch.Tensor, old_logits: torch.Tensor, kl_bound: float) -> Projection:
    """Dense KL trust-region projection over the last dimension, any leading dimensions.

    Args:
        new_logits: (..., V) current policy logits (divided by the temperature); gradient flows through.
        old_logits: (..., V) old policy logits, same shape; treated as a constant.
        kl_bound:   eps > 0, the bound on KL(pi || pi_old) per row.

    Returns:
        :class:`Projection` with ``logp`` (..., V) in fp32 (fp64 for fp64 input) and per-row ``eta``,
        ``kl_before``, ``kl_after`` of shape (...), in the same dtype.

    The solve runs in fp64 whatever the input dtype (fp32 KL is exact only to ~1e-7 absolute, which breaks small
    bounds); ``logp`` is cast back afterwards. A row whose bound cannot be met (the new policy bans tokens that hold
    more than 1 - exp(-kl_bound) of the old mass) keeps ``kl_after > kl_bound``: see :func:`infeasible`.
    """
    check_positive("kl_bound", kl_bound)
    check_logits("new_logits", new_logits)
    check_logits("old_logits", old_logits)
    check_shape("old_logits", old_logits, tuple(new_logits.shape), " (the shape of new_logits)")
    dtype = compute_dtype(new_logits.dtype)
    lead, vocab = new_logits.shape[:-1], new_logits.shape[-1]
    a = torch.log_softmax(new_logits.double().reshape(-1, vocab), dim=-1)
    b = torch.log_softmax(old_logits.detach().double().reshape(-1, vocab), dim=-1)
    out = project_log_probs(a, b, _output_bound(kl_bound, dtype))
    logp = out.logp.to(dtype).reshape(*lead, vocab)
    with torch.no_grad():  # the KL the caller's rounded log-probs reach (renormalised: fp32 sums to 1 +- 1e-7)
        rounded = torch.log_softmax(logp.detach().double().reshape(-1, vocab), -1)
        kl_after = torch.where(out.eta > 0, kl_divergence(rounded, b), out.kl_after)
    return Projection(logp, *(t.to(dtype).reshape(lead) for t in (out.eta, out.kl_before, kl_after)))


def _output_bound(kl_bound: float, dtype: torch.dtype) -> float:
    """The bound the fp64 solve aims at. Rounding log pi to fp32 (relative error ~6e-8) moves the KL to first order
    by sum_i pi_i d_i (c_i - KL) <= |d| sqrt(Var_pi[c]) ~ 1e-7 sqrt(2 KL), so fp32 output aims that much inside."""
    if dtype == torch.float64:
        return kl_bound
    # Below ~4e-14 the margin would exceed the bound itself; fp32 cannot hold such a bound anyway, and a row that
    # ends above it is reported by infeasible().
    return max(kl_bound - FP32_MARGIN * math.sqrt(kl_bound), kl_bound / 2)


def infeasible(kl_after: torch.Tensor, kl_bound: float, rtol: float = INFEASIBLE_RTOL) -> torch.Tensor:
    """(...) bool: rows whose bound could not be met, ``kl_after > kl_bound * (1 + rtol)``; pass ``proj.kl_after``.

    No policy that gives zero mass to the tokens the new policy bans can be within ``kl_bound`` of the old one when
    those tokens hold more than 1 - exp(-kl_bound) of the old mass; such rows are projected to the end of the
    interpolation path (eta ~1e26, the old policy restricted to the new one's support: the least KL any such
    policy reaches) and must be reported by the caller, never counted as within the bound. A NaN KL counts as
    infeasible."""
    check_positive("kl_bound", kl_bound)
    return ~(kl_after <= kl_bound * (1 + rtol))
