"""docs/code.md, "A family held out of training": greedy pass@1 on the left-out family over a run's steps.

    python experiments/code_family.py docs/data/code-family

Reads each run folder below the given one (a ``troll train --task code_except_<family>`` run: its config.json and
metrics.jsonl) and the ``troll eval-code --task code_<family>`` results beside them: ``<run>/<family>-step<N>.json``
for the model at step N, and ``base-<family>.json`` in the given folder for the model before training (step 0).
Prints, as markdown, one row per run and evaluated step: the run's own held-out accuracy (the four families it trains
on), greedy pass@1 on the left-out family, and how many items of each function the family asks for were solved.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from troll.runs.files import read_jsonl

PREFIX = "code_except_"


def own_accuracy(run: Path) -> dict[int, float]:
    """The run's held-out accuracy (its own families) at each evaluated step."""
    return {int(r["step"]): r["heldout/accuracy"] for r in read_jsonl(run / "metrics.jsonl") if "heldout/accuracy" in r}


def _solved(result: dict, function: str) -> str:
    cell = result.get("by_function", {}).get(function)
    return f"{round(cell['pass_at_1'] * cell['n'])}/{cell['n']}" if cell else "-"


def table(folder: Path) -> str:
    runs = sorted(p.parent for p in folder.glob("*/config.json"))
    if not runs:
        raise SystemExit(f"{folder}: no run folder (config.json) below it")
    rows, functions = [], set()
    for run in runs:
        options = json.loads((run / "config.json").read_text())["options"]
        family = options["task"][len(PREFIX) :]
        base = folder / f"base-{family}.json"
        evals = {0: json.loads(base.read_text())} if base.is_file() else {}
        for path in run.glob(f"{family}-step*.json"):
            evals[int(path.stem.rpartition("-step")[2])] = json.loads(path.read_text())
        own = own_accuracy(run)
        for step in sorted(set(evals) | set(own)):
            result = evals.get(step, {})
            functions |= set(result.get("by_function", {}))
            rows.append((run.name, options.get("beta", 0.0), family, step, own.get(step), result))
    functions = sorted(functions)
    head = "| run | --beta | step | held-out acc. (its families) | left-out family | its greedy pass@1 | "
    head += " | ".join(f"`{f}`" for f in functions) + " |\n|---|---|---|---|---|---|" + "---|" * len(functions) + "\n"
    lines = []
    for name, beta, family, step, own, result in rows:
        acc = "-" if own is None else f"{own:.3f}"
        passed = f"{result['pass_at_1']:.3f}" if result else "-"
        cells = " | ".join(_solved(result, f) for f in functions)
        lines.append(f"| {name} | {beta:g} | {step} | {acc} | {family} | {passed} | {cells} |\n")
    return head + "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder of code_except_<family> run folders and evaluations")
    print(table(parser.parse_args(argv).folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
