"""What a TCE run folder reports at its end: summary.json's numbers and plots.png (docs/tce.md, "How to run").

Both are computed from the metrics.jsonl rows alone (one a line per iteration, ``env_steps`` the x-axis), so a
resumed run reports over all its iterations, and a study can recompute them from the file. matplotlib is optional:
without it no plot is drawn (:func:`plot_run` returns False).
"""

from __future__ import annotations

import math
from pathlib import Path

SUCCESS_THRESHOLD = 0.8  # summary's "env_steps_to_success": the first evaluation at or above this success rate


def _last(rows: list[dict], key: str):
    for row in reversed(rows):
        if row.get(key) is not None:
            return row[key]
    return None


def summarise(rows: list[dict], config: dict, *, iterations: int) -> dict:
    """summary.json: the last evaluation (``success_rate``, ``return``, ``distance``: the mean trajectory on the
    evaluation contexts), the best evaluated success rate, the env steps of the first evaluation at or above
    :data:`SUCCESS_THRESHOLD` (None if none), the last rollout's return, and the seconds spent."""
    evals = [r for r in rows if r.get("eval/return") is not None]
    successes = [r["eval/success_rate"] for r in evals if r.get("eval/success_rate") is not None]
    reached = [r["env_steps"] for r in evals if (r.get("eval/success_rate") or 0.0) >= SUCCESS_THRESHOLD]
    seconds = sum(r.get("time/iteration", 0.0) for r in rows)
    return {
        "algo": config["algo"],
        "env": config["env"],
        "seed": config["seed"],
        "iterations": len(rows),
        "planned_iterations": iterations,
        "env_steps": rows[-1]["env_steps"] if rows else 0,
        "success_rate": _last(evals, "eval/success_rate"),
        "success_any": _last(evals, "eval/success_any"),
        "return": _last(evals, "eval/return"),
        "distance": _last(evals, "eval/distance"),
        "max_height": _last(evals, "eval/max_height"),
        "best_success_rate": max(successes) if successes else None,
        "env_steps_to_success": reached[0] if reached else None,
        "success_threshold": SUCCESS_THRESHOLD,
        "rollout_return": _last(rows, "rollout/return"),
        "rollout_success_rate": _last(rows, "rollout/success_rate"),
        "seconds": seconds,
        "seconds_per_iteration": seconds / len(rows) if rows else None,
    }


def _series(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [(r["env_steps"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(rows: list[dict], path: Path, *, title: str, mean_bound: float, cov_bound: float) -> bool:
    """plots.png: success rate, return, entropy and the projection (distances before it, relative to the bounds,
    and the share of epochs it was active) against env steps; for a PPO run (:mod:`troll.tce.ppo`) the entropy
    of its action distribution and, in place of the projection, its approximate KL and clipped share. False when
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    mean_traj = "eval (mean trajectory)"
    panels = (
        (axes[0, 0], "success rate", [("eval/success_rate", mean_traj), ("rollout/success_rate", "rollout")]),
        (axes[0, 1], "return", [("eval/return", mean_traj), ("rollout/return", "rollout")]),
        (axes[1, 0], "entropy of the policy (nats)", [("policy/entropy", "entropy"),
                                                       ("policy/action_entropy", "per-step action entropy")]),
    )  # fmt: skip
    for ax, name, keys in panels:
        for key, label in keys:
            x, y = _series(rows, key)
            if x:
                ax.plot(x, y, marker="o" if key.startswith("eval/") else None, ms=3, label=label)
        ax.set_title(name)
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
        if len(keys) > 1 and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if any("proj/active_epochs" in r for r in rows):
        _projection_panel(axes[1, 1], rows, mean_bound, cov_bound)
    else:
        _ppo_panel(axes[1, 1], rows)
    fig.suptitle(title)
    # fixed margins: a layout engine (tight / constrained) measures every tick label and doubled the time
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.91, hspace=0.38, wspace=0.2)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return True


def _projection_panel(ax, rows: list[dict], mean_bound: float, cov_bound: float) -> None:
    for key, bound, label in (
        ("proj/mean_dist_before/mean", mean_bound, "mean part / mean_bound"),
        ("proj/cov_dist_before/mean", cov_bound, "cov part / cov_bound"),
    ):
        x, y = _series(rows, key)
        if x:
            ax.plot(x, [max(v / bound, 1e-6) for v in y], label=label)
    x, y = _series(rows, "proj/active_epochs")
    if x:
        ax.plot(x, [max(v, 1e-6) for v in y], ls="--", label="share of epochs projected")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_title("projection (last policy epoch, before projecting)")
    ax.set_xlabel("environment steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _ppo_panel(ax, rows: list[dict]) -> None:
    for key, label in (("train/approx_kl", "approximate KL(old || new)"), ("train/clip_fraction", "clipped share")):
        x, y = _series(rows, key)
        if x:
            ax.plot(x, y, label=label)
    ax.set_title("PPO update (last epoch)")
    ax.set_xlabel("environment steps")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
