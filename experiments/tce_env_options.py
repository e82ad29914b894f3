"""Two restored MT10 studies side by side, seed by seed: success after the last step (at any step in brackets) of
each task's TCE, bbrl and bbrl-cov cell (docs/archive/tce-hand-study.md, "The env options against the first study":
the first MT10 study, without the authors' env options, against the study with them).

    python -m troll.tce.archive restore docs/data/tce-authors-hand /tmp/tce-authors-hand
    python -m troll.tce.archive restore docs/data/tce-authors /tmp/tce-authors
    python experiments/tce_env_options.py /tmp/tce-authors-hand /tmp/tce-authors --seed 0

Prints a markdown table; writes nothing. "-" marks a cell that has not finished.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ALGOS = ("tce", "bbrl", "bbrl-cov")


def cell(root: Path, study: str, algo: str, seed: int) -> str:
    path = root / study / algo / f"seed{seed}" / "summary.json"
    if not path.is_file():
        return "-"
    summary = json.loads(path.read_text())
    return f"{summary['success_rate']:.2f} ({summary['success_any']:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="a folder of restored studies (mt10-<task>/...)")
    parser.add_argument("after", type=Path, help="another")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    studies = sorted(p.name for p in args.after.iterdir() if p.name.startswith("mt10-"))
    print(f"| task, seed {args.seed} | " + " | ".join(f"{a}: before -> after" for a in ALGOS) + " |")
    print("|---" * (len(ALGOS) + 1) + "|")
    for study in studies:
        row = [f"{cell(args.before, study, a, args.seed)} -> {cell(args.after, study, a, args.seed)}" for a in ALGOS]
        print(f"| {study.removeprefix('mt10-')} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
