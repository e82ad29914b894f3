"""PNG plots of a run's metrics.jsonl (one run, or several side by side for ``troll compare``).

A study's mean curves are drawn by :mod:`troll.study.plot`.
"""

from __future__ import annotations

from pathlib import Path

from troll.lm.metrics import off_policy_rows, series

# (title, [(metric key, line label)]) for each panel; clip losses log clip_ratio/* where TROLL logs troll/*.
# The panels in OFF_POLICY show only the steps after the first of each rollout: on the first, pi = pi_old by
# construction (KL 0, nothing projected or clipped), which would make every curve a saw-tooth down to zero.
PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("reward (rollout mean)", [("reward", "reward")]),
    ("held-out greedy accuracy", [("heldout/accuracy", "accuracy")]),
    (
        "KL(pi || pi_old) per token",
        [
            ("troll/kl_before/mean", "before projection, mean"),
            ("troll/kl_after/mean", "after projection, mean"),
            ("troll/kl_after/max", "after projection, max"),
        ],
    ),
    ("tokens projected / clipped", [("troll/projected_frac", "projected"), ("clip_ratio/region_mean", "clipped")]),
    ("entropy (nats / token)", [("entropy", "entropy")]),
    ("completion length (tokens)", [("completions/mean_length", "mean")]),
]
OFF_POLICY = {"KL(pi || pi_old) per token", "tokens projected / clipped"}


def _figure(n_panels: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = -(-n_panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    return plt, fig, axes.ravel()


def _finish(plt, fig, axes, used: int, path: Path, title: str) -> None:
    for ax in axes[used:]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_run(rows: list[dict], path: Path, *, steps_per_rollout: int = 1, title: str = "") -> None:
    """One figure with a panel per entry of :data:`PANELS`; a panel with no logged data says so."""
    plt, fig, axes = _figure(len(PANELS))
    for ax, (name, keys) in zip(axes, PANELS):
        drawn = 0
        panel_rows = off_policy_rows(rows, steps_per_rollout) if name in OFF_POLICY else rows
        for key, label in keys:
            x, y = series(panel_rows, key)
            if x:
                ax.plot(x, y, marker="o" if len(x) < 12 else None, ms=3, label=label)
                drawn += 1
        _decorate(ax, name, drawn, legend=len(keys) > 1)
    _finish(plt, fig, axes, len(PANELS), Path(path), title)


def plot_compare(runs: dict[str, list[dict]], path: Path, *, steps_per_rollout: int = 1, title: str = "") -> None:
    """The panels of :func:`plot_run`, one colour per run (label -> metrics rows)."""
    plt, fig, axes = _figure(len(PANELS))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, keys) in zip(axes, PANELS):
        drawn = 0
        for i, (label, rows) in enumerate(runs.items()):
            panel_rows = off_policy_rows(rows, steps_per_rollout) if name in OFF_POLICY else rows
            for j, (key, sub) in enumerate(keys):
                x, y = series(panel_rows, key)
                if x:
                    line = f"{label}: {sub}" if len(keys) > 1 else label
                    ax.plot(x, y, color=colors[i % len(colors)], ls=["-", "--", ":"][j % 3], label=line)
                    drawn += 1
        _decorate(ax, name, drawn, legend=True)
    _finish(plt, fig, axes, len(PANELS), Path(path), title)


def _decorate(ax, name: str, drawn: int, *, legend: bool) -> None:
    ax.set_title(name + (" (off-policy steps)" if name in OFF_POLICY else ""), fontsize=10)
    ax.set_xlabel("optimiser step")
    ax.grid(alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, "not logged by this loss", ha="center", va="center", transform=ax.transAxes, color="gray")
    elif legend:
        ax.legend(fontsize=7)
    if "held-out" in name:
        ax.set_ylim(-0.02, 1.02)  # an accuracy: the full range, so that a change of one item does not look large
