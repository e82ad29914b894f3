"""study.png: the mean curves of a study with a +-1 standard-error band, one line per arm.

One panel per curve of the frontend; a swept study has one row of panels per swept value, an unswept one its panels
in rows of three. matplotlib is imported here only, when the final report is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from troll.study.frontend import Curve, Frontend
    from troll.study.grid import Grid

COLS = 3  # panels a row in an unswept study


def _axes(plt, n_curves: int, n_values: int):
    """A figure and its axes as rows (one per swept value) of ``n_curves`` panels."""
    if n_values == 1:  # unswept: the panels in a block rather than one long row
        rows = -(-n_curves // COLS)
        fig, grid = plt.subplots(rows, COLS, figsize=(5 * COLS, 3.3 * rows), squeeze=False)
        flat = list(grid.ravel())
        for ax in flat[n_curves:]:
            ax.set_visible(False)
        return fig, [flat]
    fig, grid = plt.subplots(n_values, n_curves, figsize=(4.2 * n_curves, 3.3 * n_values), squeeze=False)
    return fig, [list(row) for row in grid]


def plot_study(data: dict, path: Path, frontend: Frontend, grid: Grid, *, title: str = "") -> None:
    """Draw the curves of study.json's ``data`` into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = _axes(plt, len(frontend.curves), len(grid.values))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    curves = {(c["value"], c[frontend.arm], c["key"]): c for c in data["curves"]}
    for i, value in enumerate(grid.values):
        for j, curve in enumerate(frontend.curves):
            ax, drawn = axes[i][j], 0
            for k, arm in enumerate(grid.arms):
                c = curves.get((value, arm, curve.key))
                if not c or not c[frontend.x_key]:
                    continue
                x, color = c[frontend.x_key], colors[k % len(colors)]
                ax.plot(x, c["mean"], color=color, label=arm, marker="o" if len(x) < 12 else None, ms=3)
                lo = [m - (s or 0.0) for m, s in zip(c["mean"], c["se"])]
                hi = [m + (s or 0.0) for m, s in zip(c["mean"], c["se"])]
                ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)
                drawn += 1
            sweep = f"{grid.sweep_flag}={value}: " if grid.sweep_key else ""
            _decorate(ax, sweep + curve.title, curve, frontend, drawn)
    fig.suptitle(title + " (mean ± standard error over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _decorate(ax, title: str, curve: Curve, frontend: Frontend, drawn: int) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(frontend.x_label)
    ax.grid(alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, f"not logged by this {frontend.arm}", ha="center", va="center", transform=ax.transAxes,
                color="gray")  # fmt: skip
    else:
        ax.legend(fontsize=7)
    if curve.ylim is not None:
        ax.set_ylim(*curve.ylim)
