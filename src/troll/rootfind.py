"""A batched, bracketed root-finder for the step size of a trust-region projection (docs/numerics.md, "The solver").

Every projection in this library that has no closed form (the categorical KL projection, the Gaussian KL
covariance projection) comes down to one scalar per row: the step size eta >= 0 of an interpolation between the
new and the old policy, chosen so that the distance to the old policy equals the bound. Both are written in
``s = 1 / (1 + eta)`` in (0, 1] and solved on ``v = log s`` in [V_MIN, 0]:

    d(v)  the distance to the old policy at step v: increasing in v, d(0) > target (the row violates the bound),
          d -> 0 as v -> -inf (the old policy itself);
    find  v with  d(v) = target.

Newton's method runs on ``log d(v) - log target``, which is nearly linear in v once the projection is strong, with
a bisection safeguard on a bracket that always holds the root: a step that leaves the bracket, or is not finite, is
replaced by the bracket's midpoint. A row that does not converge in ``max_iter`` steps returns the feasible end of
its bracket (d <= target), never an infeasible point: the caller's metrics then show how far inside it ended.

Rows are solved together, and rows that have converged drop out of later evaluations (the work shrinks as the
batch converges). A single row (the Gaussian KL projection of one global covariance) goes through
:func:`solve_log_step_scalar`, the same iteration on Python floats: there the O(D) arithmetic of one row costs less
than the dozen tensor operations a batched step takes, so the iteration is written twice, once per number type,
and nowhere else.

The bracket [v_min, 0] is relative: a caller whose root may lie far below s = 1 (a new covariance 1e13 times
inside the old one needs s ~ 1e-27) evaluates its distance at ``v + base`` with ``base`` the log of a step it
knows to lie at or above the root, so that the 60 units of the bracket start there.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

V_MIN = -60.0  # lower end of the bracket on log s: eta = exp(60) - 1 ~ 1e26, far beyond any real projection
MAX_ITER = 100

# stats(v, rows) -> (d, dd/dv), each (len(rows),): the distance at log-step v for the rows ``rows`` of the batch.
Stats = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def solve_log_step(
    stats: Stats,
    n: int,
    target: float,
    tol: float,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    v0: float = -1.0,
    v_min: float = V_MIN,
    max_iter: int = MAX_ITER,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve ``d(v) = target`` for ``v = log s`` in [v_min, 0] on ``n`` rows; returns ``(v, converged)``, (n,) each.

    stats:  ``stats(v, rows)`` gives the distance ``d`` and its derivative ``dd/dv`` at ``v`` for the rows indexed by
            the long tensor ``rows`` (d must increase in v; every row must have d(0) > target).
    target: the distance to reach; ``tol``: a row has converged when ``|d - target| <= tol``.
    v0:     the first guess (-1 is eta = e - 1, neutral; Newton takes over from there).

    A converged row ends within ``tol`` of ``target``; callers that must stay inside a bound aim ``target`` below it
    by ``tol``. A row that has not converged after ``max_iter`` steps gets the feasible end of its bracket.
    """
    lo = torch.full((n,), v_min, dtype=dtype, device=device)
    hi = torch.zeros_like(lo)
    v = torch.full_like(lo, v0)
    done = torch.zeros(n, dtype=torch.bool, device=lo.device)
    rows = torch.arange(n, device=lo.device)
    log_target = math.log(target)
    for _ in range(max_iter):
        if rows.numel() == 0:
            break
        vr, lor, hir = v[rows], lo[rows], hi[rows]
        d, slope = stats(vr, rows)
        above = d > target
        hir = torch.where(above, vr, hir)
        lor = torch.where(above, lor, vr)
        ok = (d - target).abs() <= tol
        # Newton on g(v) = log d - log target, g' = d'/d; bisect where the step leaves the bracket.
        step = vr - (d.log() - log_target) * d / slope
        bad = ~torch.isfinite(step) | (step <= lor) | (step >= hir)
        vr = torch.where(ok, vr, torch.where(bad, (lor + hir) / 2, step))
        v[rows], lo[rows], hi[rows] = vr, lor, hir
        done[rows] = ok
        rows = rows[~ok]
    # A row that did not converge keeps the feasible end of its bracket, never an infeasible point.
    return torch.where(done, v, lo), done


ScalarStats = Callable[[float], tuple[float, float]]


def solve_log_step_scalar(
    stats: ScalarStats, target: float, tol: float, *, v0: float = -1.0, v_min: float = V_MIN, max_iter: int = MAX_ITER
) -> tuple[float, bool]:
    """:func:`solve_log_step` for one row in Python floats: ``stats(v) -> (d, dd/dv)``; returns ``(v, converged)``.

    The same steps: Newton on ``log d - log target`` inside the bracket [v_min, 0], the midpoint where a step leaves
    it or is not finite, the feasible end of the bracket after ``max_iter`` steps.
    """
    lo, hi, v = v_min, 0.0, v0
    log_target = math.log(target)
    for _ in range(max_iter):
        d, slope = stats(v)
        if abs(d - target) <= tol:
            return v, True
        if d > target:
            hi = v
        else:
            lo = v
        step = v - (math.log(d) - log_target) * d / slope if d > 0 and slope > 0 else math.nan
        v = step if lo < step < hi else (lo + hi) / 2  # NaN fails the comparison: bisect
    return lo, False
