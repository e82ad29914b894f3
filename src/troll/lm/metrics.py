"""A run's metrics.jsonl: reading it, and the row selections that plots, comparisons and studies share.

Each line is ``{"step": N, ...}``: TRL's logs of optimiser step N with the ``troll/*`` metrics, or the
``heldout/*`` accuracy evaluated after step N (step 0: before training). Lines are appended whole
(:func:`troll.runs.files.append_jsonl`); a torn last line, left by a killed run, is not read.
"""

from __future__ import annotations

from pathlib import Path

from troll.runs.files import METRICS_FILE, read_jsonl


def read_metrics(out: Path) -> list[dict]:
    """The rows of ``out``/metrics.jsonl ([] when there is none yet)."""
    return read_jsonl(Path(out) / METRICS_FILE)


def off_policy_rows(rows: list[dict], steps_per_rollout: int) -> list[dict]:
    """The rows of steps 2..k of each rollout of k steps (all rows when k == 1: then nothing is ever off-policy).

    On the first step of a rollout the policy is the one that sampled it (KL 0, nothing projected or clipped), so
    trust-region statistics over every step would be diluted by zeros that say nothing.
    """
    if steps_per_rollout <= 1:
        return rows
    return [r for r in rows if (r.get("step", 0) - 1) % steps_per_rollout != 0]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key``, skipping rows without it (and nulls)."""
    pairs = [(r["step"], r[key]) for r in rows if r.get(key) is not None and "step" in r]
    return [p[0] for p in pairs], [p[1] for p in pairs]
