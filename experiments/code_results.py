"""docs/results.md, "Code": TROLL against the paper's clip baseline at the code recipe, from `make code-results`.

    python experiments/code_results.py studies/code-results

Reads ``<folder>/recipe``, a ``troll study`` of the losses ``troll`` and ``clip`` on the same seeds, and the
``troll eval-code --task humaneval`` results in ``<folder>/humaneval/`` (``base.json`` for the model before training,
``<loss>-seed<k>.json`` after each run). Prints, as markdown:

1. greedy held-out accuracy at each evaluated step, mean over seeds, per loss;
2. each loss's gain over the base model (after - before) by seed, mean and 95% t-interval;
3. troll - clip paired by seed at each evaluated step (matched steps) and at the end;
4. training speed: per seed, the first evaluated step at which troll reaches clip's final accuracy on that seed,
   and at which each loss is 0.1 above the base model;
5. HumanEval pass@1 before and after each run, and troll - clip paired;
6. a family held out of training: ``<folder>/except-string``, a study of clip trained on the other four families,
   its held-out accuracy (those four) before and after, and greedy pass@1 on string items
   (``<folder>/heldout-family/base.json`` before, ``<loss>-seed<k>.json`` after).

Intervals: mean +- t(0.975, n - 1) x standard error over seeds (:mod:`troll.study.stats`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from troll.runs.files import read_jsonl
from troll.study import stats

LOSSES = ("troll", "clip")
GAIN = 0.1  # the gain over the base model whose first step the speed table gives (7 of 64 items)


def accuracy_by_step(cell: Path) -> dict[int, float]:
    """A cell's greedy held-out accuracy at each evaluated step (step 0: the base model)."""
    rows = read_jsonl(cell / "metrics.jsonl") if (cell / "metrics.jsonl").is_file() else []
    return {r["step"]: r["heldout/accuracy"] for r in rows if r.get("heldout/accuracy") is not None}


def load(folder: Path) -> dict[str, dict[int, dict[int, float]]]:
    """loss -> seed -> step -> accuracy, over the finished cells (those with a summary.json)."""
    study = folder / "recipe"
    out: dict[str, dict[int, dict[int, float]]] = {loss: {} for loss in LOSSES}
    for loss in LOSSES:
        for cell in sorted((study / loss).glob("seed*")):
            if (cell / "summary.json").is_file():
                out[loss][int(cell.name[len("seed") :])] = accuracy_by_step(cell)
    return out


def _interval(summary: dict) -> str:
    m, se, n = summary["mean"], summary["se"], summary["n"]
    if m is None:
        return "- | - | 0"
    m = round(m, 9) + 0.0  # a mean of differences that cancel prints +0.000, not -0.000
    if se is None:
        return f"{m:+.3f} | - | {n}"
    half = stats.t975(n - 1) * se
    return f"{m:+.3f} | [{m - half:+.3f}, {m + half:+.3f}] | {n}"


def curves_table(acc) -> str:
    steps = sorted({s for loss in LOSSES for curve in acc[loss].values() for s in curve})
    head = "| loss | seeds | " + " | ".join(f"step {s}" for s in steps) + " |\n"
    head += "|---|---|" + "---|" * len(steps) + "\n"
    lines = []
    for loss in LOSSES:
        cells = [loss, str(len(acc[loss]))]
        for s in steps:
            m = stats.mean([c[s] for c in acc[loss].values() if s in c])
            cells.append("-" if m is None else f"{m:.3f}")
        lines.append("| " + " | ".join(cells) + " |\n")
    return head + "".join(lines)


def gain(curve: dict[int, float]) -> float | None:
    """Accuracy at the last evaluation minus at step 0 (None without both)."""
    return curve[max(curve)] - curve[0] if 0 in curve and len(curve) > 1 else None


def gains_table(acc) -> str:
    head = "| loss | gain over the base model, by seed | mean | 95% interval | n |\n|---|---|---|---|---|\n"
    lines = []
    for loss in LOSSES:
        gains = {seed: gain(curve) for seed, curve in sorted(acc[loss].items())}
        per_seed = ", ".join(f"{s}: {g:+.3f}" for s, g in gains.items() if g is not None) or "-"
        lines.append(f"| {loss} | {per_seed} | {_interval(stats.summarize(list(gains.values())))} |\n")
    return head + "".join(lines)


def paired_table(acc) -> str:
    """troll - clip by seed at each step both evaluated, and at the end."""
    troll, clip = acc["troll"], acc["clip"]
    steps = sorted({s for c in troll.values() for s in c} & {s for c in clip.values() for s in c} - {0})
    head = "| step | troll - clip, by seed | mean | 95% interval | n |\n|---|---|---|---|---|\n"
    lines = []
    for s in steps:
        d = stats.paired({k: c.get(s) for k, c in troll.items()}, {k: c.get(s) for k, c in clip.items()})
        per_seed = ", ".join(f"{k}: {v:+.3f}" for k, v in d["diffs"].items()) or "-"
        lines.append(f"| {s} | {per_seed} | {_interval(d)} |\n")
    return head + "".join(lines)


def steps_to_reach(troll: dict[int, float], target: float) -> int | None:
    """The first evaluated step after 0 at which ``troll`` is at least ``target`` (None when it never is)."""
    return next((s for s in sorted(troll) if s > 0 and troll[s] >= target), None)


def speed_table(acc) -> str:
    """Per seed: the first step at which troll reaches clip's final accuracy, and the first step at which each
    loss is :data:`GAIN` above the base model."""
    head = (f"| seed | clip's final | its step | troll reaches it at step | base + {GAIN:.2f} reached at step: troll "
            "| clip |\n|---|---|---|---|---|---|\n")  # fmt: skip
    lines = []
    for seed in sorted(set(acc["troll"]) & set(acc["clip"])):
        troll, clip = acc["troll"][seed], acc["clip"][seed]
        final = max(clip)
        cells = [str(seed), f"{clip[final]:.3f}", str(final), _step(steps_to_reach(troll, clip[final]))]
        cells += [_step(steps_to_reach(c, c[0] + GAIN - 1e-9)) if 0 in c else "-" for c in (troll, clip)]  # float
        lines.append("| " + " | ".join(cells) + " |\n")
    return head + "".join(lines)


def _step(step: int | None) -> str:
    return "not reached" if step is None else str(step)


def evals(folder: Path) -> dict[str, dict]:
    """The ``troll eval-code`` results in ``folder`` by file stem."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def base_first(results: dict[str, dict]) -> list[str]:
    """The names of ``results``, the base model's first, then the others in order."""
    return sorted(results, key=lambda name: (name != "base", name))


def _greedy(name: str, result: dict) -> str:
    """A table row's first cells: the model, n, greedy pass@1 and the items solved."""
    return f"| {name} | {result['n']} | {result['pass_at_1']:.3f} | {round(result['pass_at_1'] * result['n'])} |"


def pass_table(results: dict[str, dict]) -> str:
    """Greedy pass@1 of each result, the base model's first."""
    head = "| model | n | greedy pass@1 | solved |\n|---|---|---|---|\n"
    return head + "".join(_greedy(name, results[name]) + "\n" for name in base_first(results))


def humaneval_table(folder: Path) -> str:
    """pass@1 of each HumanEval result in ``folder`` (base first), and troll - clip paired by seed."""
    results = evals(folder)
    if not results:
        return "No HumanEval results.\n"
    by = {loss: {} for loss in LOSSES}
    for name, r in results.items():
        loss, _, seed = name.rpartition("-seed")
        if loss in by and seed.isdigit():
            by[loss][int(seed)] = r["pass_at_1"]
    d = stats.paired(by["troll"], by["clip"])
    per_seed = ", ".join(f"{k}: {v:+.3f}" for k, v in d["diffs"].items()) or "-"
    paired = "\n| troll - clip, by seed | mean | 95% interval | n |\n|---|---|---|---|\n"
    return pass_table(results) + paired + f"| {per_seed} | {_interval(d)} |\n"


def family_table(folder: Path) -> str:
    """The run trained without the string family: its own held-out accuracy (the four families it trained on)
    before and after, and pass@1 on string items before and after."""
    runs = sorted((folder / "except-string").glob("*/seed*/summary.json"))
    results = evals(folder / "heldout-family")
    if not runs and not results:
        return "No run without a family.\n"
    head = "| run | held-out acc. (its four families), before -> after |\n|---|---|\n"
    lines = []
    for summary in runs:
        curve = accuracy_by_step(summary.parent)
        label = f"{summary.parent.parent.name}-{summary.parent.name}"
        change = f"{curve[0]:.3f} -> {curve[max(curve)]:.3f}" if 0 in curve else "-"
        lines.append(f"| {label} | {change} |\n")
    return (head + "".join(lines) + "\nString items, never trained on:\n\n" + family_pass_table(results)
            + "\nBy the function asked for (items solved greedily of those asking for it / sampled pass@1 on "
            "them):\n\n"
            + function_table(results))  # fmt: skip


def family_pass_table(results: dict[str, dict]) -> str:
    """Greedy pass@1 and, where sampled, the unbiased pass@1 and pass@4 of each result, the base model's first."""
    head = "| model | n | greedy pass@1 | solved | sampled pass@1 | sampled pass@4 |\n|---|---|---|---|---|---|\n"
    lines = []
    for name in base_first(results):
        r, sampled = results[name], results[name].get("sampled") or {}
        at = [f"{sampled[k]:.3f} (T {r['temperature']:g})" if k in sampled else "-" for k in ("pass@1", "pass@4")]
        lines.append(f"{_greedy(name, r)} {at[0]} | {at[1]} |\n")
    return head + "".join(lines)


def function_table(results: dict[str, dict]) -> str:
    """Each function the items ask for: how many items ask for it, how many each model solved greedily, and where
    sampled, its sampled pass@1 on them."""
    names = base_first(results)
    functions = sorted({f for r in results.values() for f in r.get("by_function", {})})
    if not functions:
        return "No per-function results (evaluated before troll eval-code reported them).\n"
    head = "| function | items | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names) + "\n"
    lines = []
    for f in functions:
        cells = [results[n].get("by_function", {}).get(f) for n in names]
        items = next(c["n"] for c in cells if c)
        solved = [_function_cell(c) for c in cells]
        lines.append(f"| `{f}` | {items} | " + " | ".join(solved) + " |\n")
    return head + "".join(lines)


def _function_cell(result: dict | None) -> str:
    if not result:
        return "-"
    solved = str(round(result["pass_at_1"] * result["n"]))
    return solved + (f" / {result['sampled']['pass@1']:.2f}" if "sampled" in result else "")


def report(folder: Path) -> str:
    acc = load(folder)
    parts = [
        "### Greedy held-out accuracy by step, mean over seeds\n\n" + curves_table(acc),
        "### Gain over the base model (last evaluation - step 0)\n\n" + gains_table(acc),
        "### TROLL - clip, paired by seed, at matched steps\n\n" + paired_table(acc),
        "### Training speed: the first step at a given accuracy\n\n" + speed_table(acc),
        "### HumanEval (greedy pass@1)\n\n" + humaneval_table(folder / "humaneval"),
        "### A family held out of training (string)\n\n" + family_table(folder),
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the folder of make code-results (CODE_DIR)")
    args = parser.parse_args(argv)
    if not (args.folder / "recipe" / "config.json").is_file():
        parser.error(f"{args.folder / 'recipe'} holds no study; run make code-results CODE_DIR={args.folder}")
    print(report(args.folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
