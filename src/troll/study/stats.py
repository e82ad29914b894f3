"""The few statistics a study reports: mean, standard error over seeds, and a paired t-interval.

Pure Python on lists of floats, no numpy or scipy. With n seeds:

- mean ``m = sum(x) / n``;
- standard error of the mean ``se = s / sqrt(n)`` with the sample standard deviation
  ``s = sqrt(sum((x - m)^2) / (n - 1))`` (None for n < 2: one seed says nothing about the spread);
- a paired comparison of two losses takes, per seed, ``d = a - b`` (same seed: same data, same initial model,
  same held-out items) and reports ``mean(d) +- t * se(d)`` with ``t`` the 0.975 quantile of Student's t with
  n - 1 degrees of freedom: a 95% confidence interval for the mean difference, assuming the differences are
  roughly normal. With 3 seeds t = 4.303, so an interval excludes 0 only for a large, consistent difference;
- an unpaired comparison (two groups whose seeds share nothing, e.g. one algorithm on two simulators that draw
  different episodes) takes Welch's interval: ``mean(a) - mean(b) +- t * sqrt(se_a^2 + se_b^2)`` with the
  Welch-Satterthwaite degrees of freedom ``(se_a^2 + se_b^2)^2 / (se_a^4 / (n_a - 1) + se_b^4 / (n_b - 1))``,
  rounded down (a wider, conservative interval).
"""

from __future__ import annotations

import math

# Student's t, 0.975 quantile, for 1..30 degrees of freedom (standard tables, 4 decimals).
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975 = 1.959963984540054  # standard normal 0.975 quantile


def mean(values: list[float]) -> float | None:
    """Arithmetic mean; None for an empty list."""
    return sum(values) / len(values) if values else None


def std_error(values: list[float]) -> float | None:
    """Standard error of the mean, ``sqrt(sum((x - m)^2) / (n - 1)) / sqrt(n)``; None for fewer than 2 values."""
    n = len(values)
    if n < 2:
        return None
    m = sum(values) / n
    return math.sqrt(sum((x - m) ** 2 for x in values) / (n - 1) / n)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` >= 1 degrees of freedom (two-sided 95% intervals).

    A table for df <= 30; above, the Cornish-Fisher expansion in 1/df around the normal quantile z
    (Abramowitz & Stegun 26.7.5, three terms), within 1e-4 of the exact value there.
    """
    if not (isinstance(df, int) and df >= 1):
        raise ValueError(f"df must be a whole number >= 1, got {df!r}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def summarize(values: list[float | None]) -> dict:
    """{"mean", "se", "n"} over the values that are not None."""
    kept = [v for v in values if v is not None]
    return {"mean": mean(kept), "se": std_error(kept), "n": len(kept)}


def paired(a: dict, b: dict) -> dict:
    """Paired differences ``a[k] - b[k]`` over the keys (seeds) where both are not None, with the mean, its
    standard error and the 95% t-interval ``[mean - t975(n-1) se, mean + t975(n-1) se]`` (None for n < 2)."""
    keys = sorted(k for k in a if k in b and a[k] is not None and b[k] is not None)
    diffs = {k: a[k] - b[k] for k in keys}
    values = list(diffs.values())
    m, se = mean(values), std_error(values)
    ci = None if se is None else [m - t975(len(values) - 1) * se, m + t975(len(values) - 1) * se]
    return {"diffs": diffs, "mean": m, "se": se, "ci95": ci, "n": len(values)}


def welch(a: list[float | None], b: list[float | None]) -> dict:
    """Unpaired difference ``mean(a) - mean(b)`` over the values that are not None, with its standard error, the
    Welch-Satterthwaite degrees of freedom (rounded down, at least 1) and the 95% interval (module docstring);
    se, df and ci95 are None when either group has fewer than 2 values."""
    a, b = [v for v in a if v is not None], [v for v in b if v is not None]
    ma, mb = mean(a), mean(b)
    out = {"mean": None if ma is None or mb is None else ma - mb, "se": None, "df": None, "ci95": None}
    out |= {"n_a": len(a), "n_b": len(b)}
    sa, sb = std_error(a), std_error(b)
    if sa is None or sb is None:
        return out
    var = sa**2 + sb**2
    if var == 0.0:  # both groups constant: the difference is exact
        return out | {"se": 0.0, "df": len(a) + len(b) - 2, "ci95": [out["mean"], out["mean"]]}
    df = max(1, math.floor(var**2 / (sa**4 / (len(a) - 1) + sb**4 / (len(b) - 1))))
    half = t975(df) * math.sqrt(var)
    return out | {"se": math.sqrt(var), "df": df, "ci95": [out["mean"] - half, out["mean"] + half]}
