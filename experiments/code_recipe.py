"""The tables of docs/code.md, "Training on code: what moves held-out accuracy": one row per `troll train` run on a
code task, its settings and its greedy held-out accuracy at each evaluation; with ``--gain``, the runs' changes of
held-out accuracy (one run a seed of one setting) with their mean and 95% t-interval; the runs' learning signal
(rollout reward, groups without signal, entropy, tokens clipped); and one row per `troll eval-code` result (greedy
pass@1 beside the sampled pass@1 and pass@4, and the format measures).

    python experiments/code_recipe.py RUN_FOLDER... [--gain] [--evals EVAL_JSON...]

A run folder needs config.json and metrics.jsonl (a run still going shows the evaluations it has logged so far);
an eval JSON is what `troll eval-code --out` wrote.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from troll.study import stats

SETTINGS = (
    "loss",
    "code_reward",
    "lr",
    "temperature",
    "prompts_per_step",
    "generations",
    "steps_per_rollout",
    "heldout",
)


def read_rows(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def run_row(folder: Path) -> dict:
    """A run's settings, its held-out greedy accuracy by step, its mean reward over the last quarter of the steps
    logged, and the last evaluation's share of cut and prose-first completions (when logged)."""
    options = json.loads((folder / "config.json").read_text())["options"]
    rows = read_rows(folder)
    evals = [r for r in rows if "heldout/accuracy" in r]
    rewards = [r["reward"] for r in rows if "reward" in r]
    tail = rewards[-max(1, len(rewards) // 4) :] if rewards else []
    last = evals[-1] if evals else {}
    return {
        "run": folder.name,
        **{k: options.get(k) for k in SETTINGS},
        "steps": f"{max((r['step'] for r in rows), default=0)}/{options.get('steps')}",
        "accuracy": {r["step"]: r["heldout/accuracy"] for r in evals},
        "reward_last_quarter": stats.mean(tail),
        # the rollouts' completions: mean length (tokens) at the first and last rollout, share cut at the limit
        "length": [r["completions/mean_length"] for r in rows if "completions/mean_length" in r],
        "rollout_cut": [r["completions/clipped_ratio"] for r in rows if "completions/clipped_ratio" in r],
        "cut": last.get("heldout/cut"),
        "prose_first": last.get("heldout/prose_first"),
        # the learning signal: the first rollout's reward and the mean over all, the share of groups whose samples
        # all scored the same (GRPO's advantage is 0 for them), the policy's entropy, the share of tokens clipped
        "reward_first": rewards[0] if rewards else None,
        "reward_mean": stats.mean(rewards),
        "no_signal": stats.mean([r["frac_reward_zero_std"] for r in rows if "frac_reward_zero_std" in r]),
        "entropy": stats.mean([r["entropy"] for r in rows if "entropy" in r]),
        "clipped": stats.mean([r["clip_ratio/region_mean"] for r in rows if "clip_ratio/region_mean" in r]),
    }


def _f(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def runs_table(rows: list[dict]) -> str:
    head = "| run | loss | reward | lr | T | prompts x samples | steps/rollout | held-out | steps | "
    head += "greedy held-out acc. by step | change | reward, last quarter | sample length, first -> last | "
    head += "samples cut, mean |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    lines = []
    for r in rows:
        acc = r["accuracy"]
        curve = ", ".join(f"{s}: {a:.3f}" for s, a in sorted(acc.items()))
        gained = change(r)
        cells = [r["run"], r["loss"], r["code_reward"] or "fraction", f"{r['lr']:g}", _f(r["temperature"], 1),
                 f"{r['prompts_per_step']} x {r['generations']}", str(r["steps_per_rollout"]), str(r["heldout"]),
                 r["steps"], curve, "-" if gained is None else f"{gained:+.3f}", _f(r["reward_last_quarter"]),
                 f"{r['length'][0]:.0f} -> {r['length'][-1]:.0f}" if r["length"] else "-",
                 _f(stats.mean(r["rollout_cut"]))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |\n")
    return head + "".join(lines)


def signal_table(rows: list[dict]) -> str:
    head = "| run | reward, first rollout / mean | groups without signal, mean | entropy, mean | "
    head += "tokens clipped, mean |\n|---|---|---|---|---|\n"
    lines = []
    for r in rows:
        cells = [r["run"], f"{_f(r['reward_first'])} / {_f(r['reward_mean'])}", _f(r["no_signal"]),
                 _f(r["entropy"]), _f(r["clipped"], 4)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |\n")
    return head + "".join(lines)


def change(row: dict) -> float | None:
    """Held-out accuracy at the last evaluation minus at the first (None with fewer than two)."""
    acc = row["accuracy"]
    return acc[max(acc)] - acc[min(acc)] if len(acc) > 1 else None


def gain_table(rows: list[dict]) -> str:
    """The runs' changes (one run a seed), their mean and its 95% t-interval (troll.study.stats)."""
    changes = [change(r) for r in rows]
    summary = stats.summarize(changes)
    m, se, n = summary["mean"], summary["se"], summary["n"]
    interval = "-" if se is None else f"[{m - stats.t975(n - 1) * se:+.3f}, {m + stats.t975(n - 1) * se:+.3f}]"
    per_run = ", ".join(f"{r['run']}: {c:+.3f}" for r, c in zip(rows, changes) if c is not None)
    head = "| runs | change of greedy held-out acc. | mean | 95% interval | n |\n|---|---|---|---|---|\n"
    return head + f"| {len(rows)} | {per_run} | {_f(m if m is None else round(m, 6))} | {interval} | {n} |\n"


def evals_table(paths: list[Path]) -> str:
    head = "| eval | model | n | greedy pass@1 | sampled pass@1 | sampled pass@4 | T | cut | prose first |\n"
    head += "|---|---|---|---|---|---|---|---|---|\n"
    lines = []
    for path in paths:
        e = json.loads(path.read_text())
        sampled = e.get("sampled") or {}
        cells = [path.stem, str(e.get("model")), str(e["n"]), _f(e["pass_at_1"]), _f(sampled.get("pass@1")),
                 _f(sampled.get("pass@4")), _f(e.get("temperature"), 1), _f(e.get("cut")),
                 _f(e.get("prose_first"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |\n")
    return head + "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders of troll train on a code task")
    parser.add_argument("--gain", action="store_true", help="the runs are seeds of one setting: their mean change")
    parser.add_argument("--evals", nargs="*", type=Path, default=[], help="JSON files of troll eval-code --out")
    args = parser.parse_args(argv)
    if args.runs:
        rows = [run_row(folder) for folder in args.runs]
        print(runs_table(rows))
        print(signal_table(rows))
        if args.gain:
            print(gain_table(rows))
    if args.evals:
        print(evals_table(args.evals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
