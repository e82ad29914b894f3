"""ProDMP: the probabilistic dynamic movement primitive TCE puts its Gaussian on (docs/tce.md, "ProDMP").

Li, Celik, ..., Neumann, "ProDMP: A Unified Perspective on Dynamic and Probabilistic Movement Primitives",
RA-L 2023. Every degree of freedom follows the critically damped DMP (beta = alpha / 4)

    tau^2 y'' = alpha (beta (g - y) - tau y') + f(x),     x(t) = exp(-alpha_x t / tau),
    f(x) = x sum_i psi_i(x) w_i,                         psi_i = phi_i / sum_j phi_j  (normalised Gaussians in x)

i.e. ``y'' + (alpha / tau) y' + lam^2 y = r(t) = (alpha beta g + f(x(t))) / tau^2`` with ``lam = -alpha / (2 tau)``.
The homogeneous solutions are ``y1 = e^(lam t)``, ``y2 = t e^(lam t)`` (Wronskian ``e^(2 lam t)``), and variation
of parameters gives the motion with ``y(0) = y0``, ``y'(0) = v0``::

    y(t)   = y0 a(t) + v0 b(t) + y_p(t),     a = (1 - lam t) e^(lam t),  b = t e^(lam t)   (c1 = y0, c2 = v0 - lam y0)
    y_p(t) = y2(t) I1(t) - y1(t) I2(t) = int_0^t (t - s) e^(lam (t - s)) r(s) ds
    y_p'(t) = y2'(t) I1(t) - y1'(t) I2(t)        (the terms from differentiating I1, I2 cancel: y_p(0) = y_p'(0) = 0)
    I1(t) = int_0^t e^(-lam s) r(s) ds,          I2(t) = int_0^t s e^(-lam s) r(s) ds

``y_p`` is linear in ``(w, g)``. The goal column is closed form, ``G(t) = 1 - a(t)``, ``G'(t) = lam^2 t e^(lam t)``
(the step response). The weight columns come from ``r = x psi_i / tau^2``: I1 and I2 are sums, in float64, of
5-point Gauss-Legendre integrals over the intervals of a fine grid that refines the env's step grid (so every env
step time is a grid point); a time between grid points adds the Gauss-Legendre integral from its left grid point.
The rule is exact for polynomials of degree 9 on each interval, so at the default resolution the quadrature error
is below float64 rounding: a single weight column is within 1e-12 of its own peak of an adaptive float64 integration
(scipy's quad at rtol 1e-13; ``test_prodmp.py::test_weight_column_matches_an_independent_float64_integral``).

Basis: N centres equally spaced in time over [0, tau], ``c_i = x(t_i)``, and ``phi_i(x) = exp(-h_i (x - c_i)^2)``
with ``h_i = (b / 2) / (c_{i+1} - c_i)^2`` for the bandwidth factor b (the last centre reuses the previous gap):
with b = 2 (the default) neighbours overlap at ``e^-1``; TCE's Meta-World setting is b = 5 with tau = 5 s of a
6.25 s episode. Since ``x`` is exponential in time the bumps are close to equally wide in time. Normalising is a
softmax over i. ``auto_scale`` divides every column (the N weights and the goal) by its peak |value| over the
fine grid of [0, duration], so one unit of any parameter moves the motion by at most its scale.

Shapes: E episodes, D DoF, N basis functions, P = D (N + 1) parameters, n times, T env steps (step times
``t_k = k dt``, ``k = 0..T``, ``dt = duration / T``), K groups of m times (TCE: m = 2, pairs).
Conventions the agent builds on:
- ``theta`` (E, P) stacks one block ``[w_1 .. w_N, g]`` per DoF: ``theta[e, d (N + 1) + j]`` is weight ``j + 1``
  of DoF ``d`` for ``j < N`` and its goal for ``j = N``. The motion uses ``w = weights_scale * theta_w`` and
  ``g = goal_scale * theta_g`` (``+ y0`` with ``relative_goal``).
- Values at several times are stacked time-major: flat index ``i D + d`` is DoF ``d`` at the i-th time (rows of H,
  entries of xi, the group means and covariances).
- The motion starts at t0 = 0 with the episode's ``y0``, ``v0`` (E, D); times lie in [0, duration].
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from troll._checks import check_int, check_number, check_tensor

# exp(-lam t) = exp(alpha t / (2 tau)) is stored for t up to the duration; float64 holds it up to e^709.
_MAX_EXPONENT = 300.0
# Relative jitter of the pair covariances before the Cholesky (Marginals.scale_tril). Float64 rounds their
# correlations to ~1e-16; TCE's pairs have correlation eigenvalues down to ~1e-8, so 1e-12 moves a log-likelihood by
# ~1e-4 at most (1e-6 moved it by up to 10 nats). Float32 cannot hold such a matrix at all; 1e-6 only keeps it PD.
_JITTER_F64, _JITTER_F32 = 1e-12, 1e-6
# Times this far (relative to the duration) outside [0, duration] are rounding of k * dt, and are clamped.
_TIME_RTOL = 1e-6
# Seconds a duration or tau may take: beyond, alpha / tau or its square leave float64 (an OverflowError otherwise).
_SECONDS = (1e-6, 1e6)
# 5-point Gauss-Legendre rule on [-1, 1] (nodes, weights), in closed form.
_A, _B = math.sqrt(5 - 2 * math.sqrt(10 / 7)) / 3, math.sqrt(5 + 2 * math.sqrt(10 / 7)) / 3
_WA, _WB = (322 + 13 * math.sqrt(70)) / 900, (322 - 13 * math.sqrt(70)) / 900
_GL_NODES = (-_B, -_A, 0.0, _A, _B)
_GL_WEIGHTS = (_WB, _WA, 128 / 225, _WA, _WB)


class LinearMap(NamedTuple):
    """``values = matrix @ theta + offset`` at n times (:meth:`ProDMP.linear_map`).

    matrix: (n D, P)  H; row ``i D + d`` is DoF d at the i-th time. The same for every episode.
    offset: (E, n D)  xi, the part fixed by the episode's ``y0``, ``v0`` (and the goal offset ``y0``).
    """

    matrix: torch.Tensor
    offset: torch.Tensor


class Marginals(NamedTuple):
    """The Gaussian of the positions at K groups of m times per episode (:meth:`ProDMP.marginals`).

    mean:       (E, K, m D)       H_k mu + xi_k, entry ``a D + d`` is DoF d at the a-th time of group k.
    cov:        (E, K, m D, m D)  H_k Sigma H_k^T, exact (no jitter).
    scale_tril: (E, K, m D, m D)  Cholesky factor of ``cov + jitter diag(cov)``, except that an entry of exactly
                                  zero variance (a time at index 0, where every theta gives y0) gets variance 1.

    The jitter is relative to each variance, not to their mean: an early time's variance can be ~1e-12 of a later one's,
    and a jitter scaled by their mean would swamp them. A zero-variance entry has its mean exactly equal to the
    value (both are y0), so it adds the constant -log(2 pi) / 2 to every log-likelihood and nothing to a ratio.
    """

    mean: torch.Tensor
    cov: torch.Tensor
    scale_tril: torch.Tensor


def _regularised_cholesky(cov: torch.Tensor, jitter: float) -> torch.Tensor:
    """Cholesky factor (..., M, M) of ``cov + diag(jitter cov_ii + [cov_ii == 0])`` (:class:`Marginals`)."""
    diag = cov.diagonal(dim1=-2, dim2=-1)
    extra = torch.where(diag == 0, 1.0, jitter * diag)
    scale, info = torch.linalg.cholesky_ex(cov + torch.diag_embed(extra))
    if bool((info != 0).any()):
        raise ValueError(
            "the covariance of a group of times is not positive definite even with the jitter. In float32 this is "
            "rounding (pair covariances are nearly singular): compute in float64. Otherwise raise jitter "
            f"(now {jitter:g}) or check the covariance (symmetric positive semi-definite)."
        )
    return scale


def _check_values(name: str, x, shape: tuple, hint: str = "") -> None:
    """A floating tensor of ``shape`` (an entry ``"E"`` matches any size) with finite values."""
    check_tensor(name, x)
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}; pass {name}.double().")
    if x.dim() != len(shape) or any(want != "E" and have != want for have, want in zip(x.shape, shape)):
        want = "(" + ", ".join(map(str, shape)) + ")"
        raise ValueError(f"{name} has shape {tuple(x.shape)} but {want} is expected{hint}.")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf; pass finite values (check the network or the env state).")


def _check_seconds(name: str, value, hint: str) -> None:
    """A number of seconds in :data:`_SECONDS`; ValueError naming the argument and the range otherwise."""
    check_number(name, value, hint=hint)
    low, high = _SECONDS
    if not low <= value <= high:
        raise ValueError(f"{name} must lie in [{low:g}, {high:g}] seconds, got {value!r}{hint}.")


def gather_times(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Stack ``values`` (E, T + 1, D) at step indices ``index`` (E, K, m) into (E, K, m D), time-major.

    Entry ``[e, k, a D + d]`` is ``values[e, index[e, k, a], d]``: the layout of :attr:`Marginals.mean`, so the
    desired positions of a rollout at TCE's pairs are ``gather_times(pos, index)`` with ``pos`` from
    :meth:`ProDMP.trajectory`.
    """
    check_tensor("values", values)
    check_tensor("index", index)
    if values.dim() != 3 or index.dim() != 3 or index.shape[0] != values.shape[0]:
        raise ValueError(
            f"values must be (E, T + 1, D) and index (E, K, m) with the same E, got {tuple(values.shape)} and "
            f"{tuple(index.shape)}."
        )
    if (
        index.is_floating_point()
        or index.dtype == torch.bool
        or (index.numel() and (int(index.min()) < 0 or int(index.max()) >= values.shape[1]))
    ):
        raise ValueError(f"index must hold integer step indices in [0, {values.shape[1] - 1}] (rows of values).")
    e, k, m = index.shape
    flat = index.reshape(e, k * m, 1).expand(-1, -1, values.shape[-1])
    return torch.gather(values, 1, flat).reshape(e, k, m * values.shape[-1])


def _check_settings(
    *,
    num_dof,
    duration,
    num_steps,
    num_basis,
    alpha,
    alpha_x,
    tau,
    weights_scale,
    goal_scale,
    relative_goal,
    basis_bandwidth,
    auto_scale,
    resolution,
) -> None:
    """ValueError naming the argument of :class:`ProDMP` that is out of range (``tau``: already defaulted)."""
    check_int("num_dof", num_dof, hint="; e.g. 4 for Meta-World (xyz + gripper)")
    _check_seconds("duration", duration, "; pass the episode length in seconds, num_steps * dt")
    check_int("num_steps", num_steps, hint="; pass the number of env steps of an episode, e.g. 500")
    check_int("num_basis", num_basis, hint="; TCE uses num_basis=8")
    check_number("alpha", alpha, hint="; TCE uses alpha=10")
    check_number("alpha_x", alpha_x, hint="; TCE uses alpha_x=3")
    _check_seconds("tau", tau, "; pass tau=None to use the duration")
    check_number("weights_scale", weights_scale, hint="; TCE uses 0.1 - 1")
    check_number("goal_scale", goal_scale, hint="; TCE uses 0.1 - 1")
    check_number("basis_bandwidth", basis_bandwidth, hint="; 2 (neighbours overlap at e^-1), TCE Meta-World 5")
    if not isinstance(auto_scale, bool):
        raise ValueError(f"auto_scale must be True or False, got {auto_scale!r}.")
    if not isinstance(relative_goal, bool):
        raise ValueError(f"relative_goal must be True or False, got {relative_goal!r}.")
    check_int("resolution", resolution, hint="; the default 10_000 keeps the quadrature error below 1e-12")
    if alpha * duration / (2 * tau) > _MAX_EXPONENT or alpha_x * duration / tau > _MAX_EXPONENT:
        raise ValueError(
            f"tau={tau!r} is too small for duration={duration!r}: exp(alpha duration / (2 tau)) would overflow; "
            f"use tau >= {max(alpha / 2, alpha_x) * duration / _MAX_EXPONENT:.3g} (TCE uses tau = duration)."
        )


class ProDMP:
    """Precomputed ProDMP basis for ``num_dof`` DoF over [0, duration] (module docstring: equations, layout).

    Args (keyword-only; defaults are TCE's):
        num_dof:        D, degrees of freedom (each gets its own weights and goal, all share the basis).
        duration:       length of the motion in seconds (the episode: ``num_steps * dt``).
        num_steps:      T, env steps; the step times ``k * duration / T``, k = 0..T, are :attr:`times`.
        num_basis:      N Gaussian basis functions per DoF (TCE: 8; 3 for the fast hopper).
        alpha:          stiffness alpha of the DMP (beta = alpha / 4, critically damped).
        alpha_x:        decay of the phase, ``x = exp(-alpha_x t / tau)``.
        tau:            time constant; ``None`` means ``duration``. The basis centres lie over [0, tau].
        weights_scale:  multiplies the weights in theta (TCE: 0.1 - 1).
        goal_scale:     multiplies the goals in theta.
        relative_goal:  if True the goal is ``y0 + goal_scale * theta_g`` (TCE on Meta-World).
        basis_bandwidth: b, the width factor of the basis (module docstring; 2, TCE's Meta-World 5).
        auto_scale:     divide every basis column by its peak |value| before the scales (TCE's Meta-World).
        resolution:     at least this many quadrature intervals over the duration (rounded up to a multiple of
                        ``num_steps``), 5-point Gauss-Legendre on each: at the default the error of a weight column
                        is below 1e-12 of its peak (module docstring).

    Everything is precomputed in float64 on the CPU; each method returns the dtype and device of its tensor inputs.
    """

    def __init__(
        self,
        *,
        num_dof: int,
        duration: float,
        num_steps: int,
        num_basis: int = 8,
        alpha: float = 10.0,
        alpha_x: float = 3.0,
        tau: float | None = None,
        weights_scale: float = 1.0,
        goal_scale: float = 1.0,
        relative_goal: bool = False,
        basis_bandwidth: float = 2.0,
        auto_scale: bool = False,
        resolution: int = 10_000,
    ):
        tau = duration if tau is None else tau
        _check_settings(num_dof=num_dof, duration=duration, num_steps=num_steps, num_basis=num_basis, alpha=alpha,
                        alpha_x=alpha_x, tau=tau, weights_scale=weights_scale, goal_scale=goal_scale,
                        relative_goal=relative_goal, basis_bandwidth=basis_bandwidth, auto_scale=auto_scale,
                        resolution=resolution)  # fmt: skip
        self.num_dof, self.num_basis, self.num_steps = num_dof, num_basis, num_steps
        self.num_params = num_dof * (num_basis + 1)
        self.duration, self.dt, self.tau = float(duration), duration / num_steps, float(tau)
        self.alpha, self.alpha_x, self.lam = float(alpha), float(alpha_x), -alpha / (2 * tau)
        self.weights_scale, self.goal_scale, self.relative_goal = float(weights_scale), float(goal_scale), relative_goal
        self.basis_bandwidth, self.auto_scale = float(basis_bandwidth), auto_scale
        self._scales = torch.tensor([self.weights_scale] * num_basis + [self.goal_scale], dtype=torch.float64)
        self.substeps = -(-resolution // num_steps)
        self._precompute()
        self._cache: dict = {}

    # ------------------------------------------------------------------------------------ precomputation

    def _precompute(self) -> None:
        """The quadrature grid (M + 1 nodes, ``substeps`` per env step), the basis layout, the running integrals I1 and
        I2 at the grid nodes, the auto-scale (when set), and the columns at the T + 1 step times."""
        intervals = self.num_steps * self.substeps
        self._h = self.duration / intervals
        self._grid = torch.arange(intervals + 1, dtype=torch.float64) * self._h  # (M + 1,)
        self._centres, self._widths = self._layout()
        q1, q2 = self._interval_integrals(self._grid[:-1], self._grid[1:])  # (M, N) each
        zero = torch.zeros(1, self.num_basis, dtype=torch.float64)
        self._i1 = torch.cat([zero, q1.cumsum(0)])  # (M + 1, N): I1 at the grid nodes
        self._i2 = torch.cat([zero, q2.cumsum(0)])
        if self.auto_scale:  # every column divided by its peak |value| over the episode, before the scales
            unit = self._scales.clone()
            self._scales = torch.ones_like(unit)
            peak = self._columns(self._grid, self._i1, self._i2)[0].abs().amax(0)
            self._scales = unit / peak
        steps = slice(None, None, self.substeps)
        self.times = self._grid[steps]  # (T + 1,) float64, exactly the grid nodes k * substeps
        self._step = self._columns(self.times, self._i1[steps], self._i2[steps]) + self._homogeneous(self.times)

    def _layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Centres ``c_i = x(t_i)`` (N,) for t_i equally spaced over [0, tau], and widths ``h_i`` (N,)."""
        t = torch.linspace(0.0, self.tau, self.num_basis, dtype=torch.float64)
        centres = torch.exp(-self.alpha_x * t / self.tau)
        if self.num_basis == 1:  # a single normalised basis function is 1 whatever its width
            return centres, torch.ones(1, dtype=torch.float64)
        gaps = (centres[:-1] - centres[1:]).abs()
        gaps = torch.cat([gaps, gaps[-1:]])
        return centres, gaps.pow(-2) * (self.basis_bandwidth / 2)

    def _integrand(self, t: torch.Tensor) -> torch.Tensor:
        """``e^(-lam t) x psi_i(x) / tau^2`` (n, N): I1's integrand per unit weight (I2's is t times it)."""
        x = torch.exp(-self.alpha_x * t / self.tau).unsqueeze(-1)
        psi = torch.softmax(-self._widths * (x - self._centres).square(), dim=-1)
        return torch.exp(-self.lam * t).unsqueeze(-1) * x * psi / self.tau**2

    def _interval_integrals(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gauss-Legendre integrals over [a_k, b_k] of I1's and I2's integrands, (n, N) each; a, b (n,)."""
        nodes = torch.tensor(_GL_NODES, dtype=torch.float64)
        weights = torch.tensor(_GL_WEIGHTS, dtype=torch.float64)
        half, mid = ((b - a) / 2).unsqueeze(-1), ((a + b) / 2).unsqueeze(-1)
        s = mid + half * nodes  # (n, 5)
        f = self._integrand(s.reshape(-1)).reshape(*s.shape, -1)  # (n, 5, N)
        w = (half * weights).unsqueeze(-1)
        return (w * f).sum(-2), (w * s.unsqueeze(-1) * f).sum(-2)

    def _columns(self, t: torch.Tensor, i1: torch.Tensor, i2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-DoF basis rows (n, N + 1) of positions and velocities, scales applied, from I1, I2 (n, N)."""
        lam, e = self.lam, torch.exp(self.lam * t)
        tt, ee = t.unsqueeze(-1), e.unsqueeze(-1)
        pos_w = ee * (tt * i1 - i2)  # y2 I1 - y1 I2
        vel_w = ee * ((1 + lam * tt) * i1 - lam * i2)  # y2' I1 - y1' I2
        pos_g = 1 - (1 - lam * t) * e  # G(t), the response to a unit goal from rest at 0
        vel_g = lam**2 * t * e
        pos = torch.cat([pos_w, pos_g.unsqueeze(-1)], -1) * self._scales
        vel = torch.cat([vel_w, vel_g.unsqueeze(-1)], -1) * self._scales
        return pos, vel

    def _homogeneous(self, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(a, b, a', b') (n,) each: the motion from y0, v0 alone is ``y0 a + v0 b`` (velocity ``y0 a' + v0 b'``).

        ``a = y1 - lam y2`` and ``b = y2`` are c1 = y0, c2 = v0 - lam y0 collected by y0 and v0; a relative goal
        adds ``y0 G`` with ``G = 1 - a``, so then ``a = 1``. At t = 0: a = 1, b = 0, a' = 0, b' = 1 exactly.
        """
        lam, e = self.lam, torch.exp(self.lam * t)
        a, da = (1 - lam * t) * e, -(lam**2) * t * e
        if self.relative_goal:
            a, da = torch.ones_like(t), torch.zeros_like(t)
        return a, t * e, da, (1 + lam * t) * e

    def _at(self, times: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(pos, vel, a, b, a', b') at arbitrary float64 times (n,): grid integrals plus one partial interval."""
        node = torch.clamp(torch.floor(times / self._h).long(), 0, self._grid.numel() - 2)
        q1, q2 = self._interval_integrals(self._grid[node], times)
        return self._columns(times, self._i1[node] + q1, self._i2[node] + q2) + self._homogeneous(times)

    def _rows(self, times: torch.Tensor | None, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(pos, vel, a, b, a', b') at ``times`` (None: the step times), in ``like``'s dtype and device."""
        if times is None:
            key = (like.dtype, like.device)
            if key not in self._cache:
                self._cache[key] = tuple(x.to(like) for x in self._step)
            return self._cache[key]
        return tuple(x.to(like) for x in self._at(self._check_times(times)))

    # ------------------------------------------------------------------------------------ validation

    def _check_times(self, times) -> torch.Tensor:
        check_tensor("times", times)
        if times.dim() != 1 or not times.is_floating_point() or not bool(torch.isfinite(times).all()):
            raise ValueError(
                f"times must be a 1-D floating tensor (n,) of finite seconds, got shape {tuple(times.shape)}, dtype "
                f"{times.dtype}{'' if not times.is_floating_point() else ' (or NaN/inf values)'}."
            )
        t = times.detach().to("cpu", torch.float64)
        slack = _TIME_RTOL * self.duration
        if bool(((t < -slack) | (t > self.duration + slack)).any()):
            raise ValueError(
                f"times must lie in [0, duration={self.duration:g}], got min {float(t.min()):g}, max "
                f"{float(t.max()):g}; the motion starts at t0 = 0, so pass times since the episode start."
            )
        return t.clamp(0.0, self.duration)

    def _check_start(self, y0, v0, episodes: int | None = None) -> int:
        """y0, v0 (E, D) finite; E is ``episodes`` when given (the rows of theta or mu)."""
        hint = " (E, num_dof): one start per episode" + ("" if episodes is None else f", E = {episodes} as in mu/theta")
        _check_values("y0", y0, ("E" if episodes is None else episodes, self.num_dof), hint)
        _check_values("v0", v0, tuple(y0.shape), " (the shape of y0)")
        return y0.shape[0]

    def _check_gaussian(self, mu, scale_tril, cov) -> tuple[int, torch.Tensor, bool]:
        """Returns E, the covariance input, and whether it is a factor (scale_tril) or the covariance itself."""
        p = self.num_params
        _check_values("mu", mu, ("E", p), f" (episodes, P = num_dof * (num_basis + 1) = {p})")
        e = mu.shape[0]
        if (scale_tril is None) == (cov is None):
            raise ValueError("pass exactly one of scale_tril (Sigma = L L^T) and cov (Sigma itself).")
        name, value = ("scale_tril", scale_tril) if cov is None else ("cov", cov)
        check_tensor(name, value)
        shape = (p, p) if value.dim() == 2 else (e, p, p)
        _check_values(name, value, shape, f" ((P, P) shared or (E, P, P) per episode, P = {p})")
        return e, value.to(mu), cov is None

    # ------------------------------------------------------------------------------------ public API

    def basis(self, times: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-DoF basis of positions and velocities, (n, N + 1) each in float64, scales applied.

        Row i holds the columns ``[w_1 .. w_N, g]`` at ``times[i]`` (None: the T + 1 step times). H of
        :meth:`linear_map` is this basis repeated block-diagonally over the DoF.
        """
        pos, vel, *_ = self._rows(times, self._grid)
        return pos, vel

    def linear_map(
        self, y0: torch.Tensor, v0: torch.Tensor, times: torch.Tensor | None = None, *, velocity: bool = False
    ) -> LinearMap:
        """H (n D, P) and xi (E, n D) with ``y = H theta + xi`` stacked time-major (positions, or velocities).

        ``H[i D + d, d' (N + 1) + j] = delta(d, d') basis[i, j]``; xi is ``y0 a + v0 b`` at each time. y0, v0: (E, D);
        the output has their dtype. ``velocity=True`` gives the map to the velocities instead.
        """
        e = self._check_start(y0, v0)
        pos, vel, a, b, da, db = self._rows(times, y0)
        rows, a, b = (vel, da, db) if velocity else (pos, a, b)
        eye = torch.eye(self.num_dof, dtype=y0.dtype, device=y0.device)
        matrix = torch.einsum("nj,dc->ndcj", rows, eye).reshape(-1, self.num_params)
        offset = y0.unsqueeze(1) * a[:, None] + v0.to(y0).unsqueeze(1) * b[:, None]  # (E, n, D)
        return LinearMap(matrix, offset.reshape(e, -1))

    def trajectory(
        self, theta: torch.Tensor, y0: torch.Tensor, v0: torch.Tensor, times: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions and velocities (E, n, D) of the motions of parameters ``theta`` (E, P) from ``y0``, ``v0`` (E, D).

        ``times=None`` gives the T + 1 env step times (n = T + 1), where no interpolation is involved. Differentiable
        w.r.t. theta, y0 and v0; the output has theta's dtype.
        """
        _check_values("theta", theta, ("E", self.num_params), " (episodes, P = num_dof * (num_basis + 1))")
        e = self._check_start(y0, v0, theta.shape[0])
        pos, vel, a, b, da, db = self._rows(times, theta)
        w = theta.reshape(e, self.num_dof, self.num_basis + 1)
        y0, v0 = y0.to(theta).unsqueeze(1), v0.to(theta).unsqueeze(1)
        y = torch.einsum("nj,edj->end", pos, w) + y0 * a[:, None] + v0 * b[:, None]
        dy = torch.einsum("nj,edj->end", vel, w) + y0 * da[:, None] + v0 * db[:, None]
        return y, dy

    def moments(
        self,
        mu: torch.Tensor,
        y0: torch.Tensor,
        v0: torch.Tensor,
        times: torch.Tensor | None = None,
        *,
        scale_tril: torch.Tensor | None = None,
        cov: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean (E, n D) and covariance (E, n D, n D) of the positions at ``times`` for theta ~ N(mu, Sigma).

        ``H mu + xi`` and ``H Sigma H^T``; Sigma is given by a factor ``scale_tril`` (Sigma = L L^T) or by ``cov``,
        (P, P) shared or (E, P, P). The covariance has rank <= P: for many times use :meth:`marginals` on groups.
        """
        e, sigma, factor = self._check_gaussian(mu, scale_tril, cov)
        self._check_start(y0, v0, e)
        pos, _, a, b, _, _ = self._rows(times, mu)
        mean, covariance = self._group_moments(pos[None, None], a[None, None], b[None, None], mu, y0, v0, sigma, factor)
        return mean[:, 0], covariance[:, 0]

    def marginals(
        self,
        mu: torch.Tensor,
        y0: torch.Tensor,
        v0: torch.Tensor,
        index: torch.Tensor,
        *,
        scale_tril: torch.Tensor | None = None,
        cov: torch.Tensor | None = None,
        jitter: float | None = None,
    ) -> Marginals:
        """The joint Gaussian of the positions at K groups of m step times per episode (TCE's pairs: m = 2).

        Args:
            mu:         (E, P) mean of theta.
            y0, v0:     (E, D) start of each episode's motion.
            index:      (E, K, m) or (K, m) integer step indices in [0, T] (time ``index * dt``).
            scale_tril: (P, P) or (E, P, P) factor L of Sigma = L L^T (any square factor; Cholesky for TCE), or
            cov:        (P, P) or (E, P, P) Sigma itself. Pass exactly one.
            jitter:     relative jitter: the Cholesky factor is of ``cov + jitter diag(cov)`` (see
                        :class:`Marginals`). None: 1e-12 in float64, 1e-6 otherwise. Compute in float64: pair
                        covariances are nearly singular (their correlation matrices have eigenvalues down to
                        ~1e-8 at TCE's settings), which float32 cannot resolve (docs/tce.md).

        Returns :class:`Marginals`; differentiable w.r.t. mu and the covariance input. The log-likelihood of desired
        positions ``gather_times(pos, index)`` is ``MultivariateNormal(mean, scale_tril=scale_tril).log_prob``.
        """
        e, sigma, factor = self._check_gaussian(mu, scale_tril, cov)
        self._check_start(y0, v0, e)
        index = self._check_index(index, e)
        if jitter is None:
            jitter = _JITTER_F64 if mu.dtype == torch.float64 else _JITTER_F32
        check_number("jitter", jitter, hint="; pass None for the default (1e-12 in float64, 1e-6 in float32)")
        pos, _, a, b, _, _ = self._rows(None, mu)
        mean, covariance = self._group_moments(pos[index], a[index], b[index], mu, y0, v0, sigma, factor)
        scale = _regularised_cholesky(covariance, jitter)
        return Marginals(mean, covariance, scale)

    def _check_index(self, index, episodes: int) -> torch.Tensor:
        check_tensor("index", index)
        if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
            raise ValueError(f"index must be an integer tensor of step indices, got dtype {index.dtype}; use .long().")
        if index.dim() == 2:
            index = index.unsqueeze(0).expand(episodes, -1, -1)
        if index.dim() != 3 or index.shape[0] != episodes or index.shape[-1] < 1:
            raise ValueError(f"index must be (E, K, m) or (K, m) with E = {episodes}, got shape {tuple(index.shape)}.")
        if index.numel() and (int(index.min()) < 0 or int(index.max()) > self.num_steps):
            raise ValueError(
                f"index holds step indices outside [0, num_steps={self.num_steps}]: min {int(index.min())}, max "
                f"{int(index.max())}; index k means time k * dt."
            )
        return index.long()

    def marginal_map(self, y0: torch.Tensor, v0: torch.Tensor, index: torch.Tensor):
        """:meth:`marginals` as a function of the Gaussian alone, for fixed starts y0, v0 (E, D) and ``index``
        (E, K, m): ``fn(mu, *, scale_tril=None, cov=None, jitter=None) -> Marginals`` in y0's dtype. The basis rows
        and the start terms are gathered (and the inputs checked) once, not at every call: TCE scores the same pairs
        in every policy epoch. Same numbers as :meth:`marginals`."""
        e = self._check_start(y0, v0)
        index = self._check_index(index, e)
        pos, _, a, b, _, _ = self._rows(None, y0)
        rows, start = pos[index], self._group_start(a[index], b[index], y0, v0, y0)
        default = _JITTER_F64 if y0.dtype == torch.float64 else _JITTER_F32

        def marginals(mu, *, scale_tril=None, cov=None, jitter=None) -> Marginals:
            n, sigma, factor = self._check_gaussian(mu, scale_tril, cov)
            if n != e or mu.dtype != y0.dtype:
                raise ValueError(f"mu must be ({e}, P) in {y0.dtype} (the map's y0), got {tuple(mu.shape)} {mu.dtype}.")
            jitter = default if jitter is None else jitter
            mean, covariance = self._moments(rows, start, mu, sigma, factor)
            return Marginals(mean, covariance, _regularised_cholesky(covariance, jitter))

        return marginals

    @staticmethod
    def _group_start(a, b, y0, v0, like) -> torch.Tensor:
        """``y0 a + v0 b`` (E, K, m, D) at the groups' times, from a, b (E|1, K, m), in ``like``'s dtype."""
        return y0.to(like)[:, None, None, :] * a[..., None] + v0.to(like)[:, None, None, :] * b[..., None]

    def _group_moments(self, pos, a, b, mu, y0, v0, sigma, factor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean (E, K, m D) and covariance (E, K, m D, m D) from basis rows ``pos`` (E|1, K, m, N + 1)."""
        return self._moments(pos, self._group_start(a, b, y0, v0, mu), mu, sigma, factor)

    def _moments(self, pos, start, mu, sigma, factor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_group_moments` with the start terms (E, K, m, D) given.

        ``H_k Sigma H_k^T`` is contracted over the (DoF, basis) blocks of Sigma, so H_k is never formed. A factor is
        multiplied out first (Sigma = L L^T, P^3 once): with its backward this was 1.5 - 3x faster than forming
        ``A = H_k L`` per group and ``A A^T`` (batched small matmuls are slow on the CPU).
        """
        e, d, j = mu.shape[0], self.num_dof, self.num_basis + 1
        pos = pos.expand(e, -1, -1, -1)
        k, m = pos.shape[1], pos.shape[2]
        mean = torch.einsum("ekaj,edj->ekad", pos, mu.reshape(e, d, j)) + start
        if factor:
            sigma = sigma @ sigma.mT
        batched = "e" if sigma.dim() == 3 else ""
        blocks = sigma.reshape(*sigma.shape[:-2], d, j, d, j)
        half = torch.einsum(f"ekaj,{batched}djcl->ekadcl", pos, blocks)
        covariance = torch.einsum("ekadcl,ekbl->ekadbc", half, pos).reshape(e, k, m * d, m * d)
        return mean.reshape(e, k, m * d), covariance

    def __repr__(self) -> str:
        return (
            f"ProDMP(num_dof={self.num_dof}, num_basis={self.num_basis}, duration={self.duration:g}, "
            f"num_steps={self.num_steps}, tau={self.tau:g}, alpha={self.alpha:g}, alpha_x={self.alpha_x:g}, "
            f"relative_goal={self.relative_goal}, substeps={self.substeps})"
        )
