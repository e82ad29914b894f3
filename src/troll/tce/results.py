"""The report of ``make tce-results``: every ``troll tce study`` of a folder in one table and three figures.

    python -m troll.tce.results studies/tce-20260101-120000          # writes <folder>/report/

Reads the study.json of each study folder below the given folder (``troll tce study`` writes it: per algorithm the
mean and standard error over seeds of each number, the paired TCE - baseline differences with 95% t-intervals, the
mean curves with their standard errors) and writes, for docs/tce.md:

- ``tce_results.md``: success by task (after the last step and at any step per algorithm, TCE - BBRL paired, and
  on how many tasks TCE is at or above BBRL); the full table (per task and algorithm: success rate, return and final
  distance at the budget, best and mean-over-the-run success, as mean ± standard error over seeds) and the paired
  differences TCE - BBRL and TCE - PPO (mean, 95% interval, n);
- ``tce_success.png``, ``tce_return.png``, ``tce_distance.png``: the evaluated success rate, return and final
  distance against environment steps, one panel per task, one line per algorithm with a ± 1 standard-error band;
- ``tce_results.json``: what the table holds.

With ``--compare A B`` it compares one algorithm (``--algo``, default tce) across two studies whose seeds share
nothing (the same task on the two simulators, ``make tce-backends``) and prints, per number, each study's mean ±
standard error, the difference A - B and Welch's 95% interval (troll.study.stats.welch):

    python -m troll.tce.results --compare studies/tce-backends/reach-v3-{envpool,python}

Nothing here imports torch; matplotlib is imported to draw. A swept study gives one task per swept value.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from troll.runs.files import CONFIG_FILE, TCE_STUDY, write_json
from troll.study import stats

STUDY_JSON = "study.json"
COMMAND = TCE_STUDY
COLORS = {"tce": "C0", "bbrl": "C1", "ppo": "C2", "bbrl-cov": "C3"}
FAMILY_ORDER = ("toy/", "gym/", "metaworld/")
FIGURES = (
    ("tce_success.png", "eval/success_rate", "success rate", (-0.02, 1.02)),
    ("tce_return.png", "eval/return", "return", None),
    ("tce_distance.png", "eval/distance", "final distance", None),
    ("tce_max_height.png", "eval/max_height", "max height (m)", None),  # hopper jump's measure; drawn when logged
)
COLUMNS = (
    ("success", "success at the budget"),
    ("success_any", "success at any step, at the budget"),
    ("best_success", "best success"),
    ("success_auc", "mean success over the run"),
    ("return", "return at the budget"),
    ("distance", "final distance at the budget"),
    ("steps_to_success", "env steps to success >= 0.8"),
)
HEIGHT_COLUMN = ("max_height", "max height at the budget (m)")  # a column of the table when a study logs it


def find_studies(folder: Path) -> list[tuple[str, dict]]:
    """(task label, study.json content) of every finished ``tce study`` below ``folder``, toy / gym / Meta-World
    first, then by name; one entry per swept value."""
    found = []
    for config in sorted(Path(folder).rglob(CONFIG_FILE)):
        study = config.parent
        try:
            head = json.loads(config.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not (isinstance(head, dict) and head.get("command") == COMMAND and (study / STUDY_JSON).is_file()):
            continue
        data = json.loads((study / STUDY_JSON).read_text())
        spec = data["spec"]
        for value in sorted({a["value"] for a in data["aggregates"]}, key=str):
            label = spec["env"] + ("" if value is None else f" ({spec['sweep_key'].replace('_', '-')}={value})")
            found.append((label, _only(data, value)))
    labels = [
        label for label, _ in found
    ]  # one task at two budgets (push-v3 at 2M and 10M): the budget tells them apart
    found = [(f"{label}, {_steps(d)} steps" if labels.count(label) > 1 else label, d) for label, d in found]
    family = {f: i for i, f in enumerate(FAMILY_ORDER)}
    return sorted(found, key=lambda t: (min((family[f] for f in family if t[0].startswith(f)), default=9), t[0]))


def _steps(data: dict) -> str:
    steps = data.get("spec", {}).get("steps")
    return "preset" if steps is None else f"{steps / 1e6:g}M" if steps >= 1e6 else f"{steps:,}"


def _only(data: dict, value) -> dict:
    keep = ("aggregates", "paired", "curves")
    return {**data, **{k: [e for e in data[k] if e["value"] == value] for k in keep}}


def _pm(entry: dict | None, spec: str = ".3f") -> str:
    if not entry or entry.get("mean") is None:
        return "-"
    se = entry.get("se")
    return format(entry["mean"], spec) + ("" if se is None else " ± " + format(se, spec))


def table(studies: list[tuple[str, dict]]) -> str:
    """The markdown of tce_results.md: the headline table, then the paired differences."""
    height = any((a.get("max_height") or {}).get("n") for _, data in studies for a in data["aggregates"])
    columns = COLUMNS[:-1] + ((HEIGHT_COLUMN,) if height else ()) + COLUMNS[-1:]
    head = "| task | algorithm | seeds | env steps | " + " | ".join(label for _, label in columns) + " |\n"
    lines = [head, "|---" * (4 + len(columns)) + "|\n"]
    for task, data in studies:
        for a in data["aggregates"]:
            steps = a.get("env_steps", {}).get("mean")
            cols = [task, a["algo"], str(len(a["seeds"])), "-" if steps is None else f"{steps:,.0f}"]
            cols += [_pm(a.get(key)) for key, _ in columns if key != "steps_to_success"]
            reached = a.get("steps_to_success") or {}  # the mean over the seeds that got there, and how many did
            cols.append(_pm(reached, ",.0f") + (f" ({reached['n']} of {len(a['seeds'])})" if reached.get("n") else ""))
            lines.append("| " + " | ".join(cols) + " |\n")
    text = "## At the budget: mean ± standard error over seeds\n\n" + "".join(lines)
    text += "\n## Paired: TCE minus baseline, same seed (95% t-interval)\n\n"
    text += "| task | comparison | metric | mean difference | 95% interval | n |\n|---|---|---|---|---|---|\n"
    labels = dict(COLUMNS + (HEIGHT_COLUMN,))
    for task, data in studies:
        for p in data["paired"]:
            if not p["n"]:  # a metric the task does not report (success at any step off Meta-World)
                continue
            ci = "-" if p["ci95"] is None else f"[{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"
            mean = "-" if p["mean"] is None else f"{p['mean']:+.3f}"
            metric = labels.get(p["metric"], p["metric"])
            text += f"| {task} | {p['algo']} - {p['baseline']} | {metric} | {mean} | {ci} | {p['n']} |\n"
    return text


ALGO_ORDER = ("tce", "bbrl", "bbrl-cov", "ppo")


def by_task(studies: list[tuple[str, dict]], baseline: str = "bbrl") -> str:
    """The markdown of the per-task summary that heads tce_results.md: per task and algorithm the success rate after
    the last step and at any step (mean ± standard error, seeds), TCE - ``baseline`` paired, and on how many tasks
    TCE's mean success at the budget is at or above the baseline's."""
    algos = [a for a in ALGO_ORDER if any(x["algo"] == a for _, d in studies for x in d["aggregates"])]
    if not algos:
        return ""
    text = ("## Success by task: after the last step / at any step (mean ± standard error, seeds)\n\n| task | "
            + " | ".join(algos) + f" | TCE - {baseline}, after the last step: mean [95% interval] (n) |\n"
            + "|---" * (len(algos) + 2) + "|\n")  # fmt: skip
    counts: dict[str, list[int]] = {}  # budget -> [tasks compared, TCE at or above, ties, ties at 0]
    for task, data in studies:
        agg = {a["algo"]: a for a in data["aggregates"]}
        cols = [task]
        for algo in algos:
            a = agg.get(algo)
            if a is None or not (a.get("success") or {}).get("n"):
                cols.append("-")
                continue
            any_step = a.get("success_any") or {}
            cols.append(_pm(a["success"], ".2f") + " / " + (_pm(any_step, ".2f") if any_step.get("n") else "-")
                        + f" ({a['success']['n']})")  # fmt: skip
        (pair,) = [p for p in data["paired"] if p.get("baseline") == baseline and p["metric"] == "success"] or [None]
        if pair is None or not pair["n"]:
            cols.append("-")
        else:
            ci = "" if pair["ci95"] is None else f" [{pair['ci95'][0]:+.2f}, {pair['ci95'][1]:+.2f}]"
            cols.append(f"{pair['mean']:+.2f}{ci} ({pair['n']})")
        if "tce" in agg and baseline in agg and agg["tce"]["success"]["n"] and agg[baseline]["success"]["n"]:
            ours, theirs = agg["tce"]["success"]["mean"], agg[baseline]["success"]["mean"]
            c = counts.setdefault(_steps(data), [0, 0, 0, 0])
            for i, hit in enumerate((True, ours >= theirs, ours == theirs, ours == theirs == 0)):
                c[i] += hit
        text += "| " + " | ".join(cols) + " |\n"
    for budget, (compared, at_or_above, ties, zero) in counts.items():
        text += (f"\nAt {budget} env steps, TCE's mean success after the last step is at or above {baseline}'s on "
                 f"{at_or_above} of {compared} tasks ({ties} of them ties, {zero} at 0 for both).\n")  # fmt: skip
    return text + "\n"


def figure(studies: list[tuple[str, dict]], key: str, ylabel: str, ylim, path: Path) -> bool:
    """One panel per task with the curve ``key`` of every algorithm (mean ± standard error); False if none."""
    panels = [(task, [c for c in data["curves"] if c["key"] == key and c["env_steps"]]) for task, data in studies]
    panels = [(task, curves) for task, curves in panels if curves]
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.ravel()[len(panels) :]:
        ax.set_visible(False)
    for ax, (task, curves) in zip(axes.ravel(), panels):
        for c in curves:
            x, m = c["env_steps"], c["mean"]
            lo = [v - (s or 0.0) for v, s in zip(m, c["se"])]
            hi = [v + (s or 0.0) for v, s in zip(m, c["se"])]
            color = COLORS.get(c["algo"])
            ax.plot(x, m, color=color, label=f"{c['algo']} (n={max(c['n'])})", marker="o" if len(x) < 12 else None,
                    ms=3)  # fmt: skip
            ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("environment steps")
        ax.set_ylabel(ylabel)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    title = f"{ylabel} of the evaluation against environment steps (mean ± standard error over seeds)"
    fig.suptitle(textwrap.fill(title, 55 * cols), fontsize=10)  # one panel is narrow: the title wraps
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(folder: Path, out: Path | None = None) -> list[Path]:
    """Write the table, the figures and tce_results.json into ``out`` (default ``<folder>/report``)."""
    studies = find_studies(folder)
    if not studies:
        raise SystemExit(f"{folder}: no finished 'troll tce study' (config.json + study.json) below it.")
    out = Path(out or Path(folder) / "report")
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "tce_results.md", out / "tce_results.json"]
    (out / "tce_results.md").write_text(by_task(studies) + table(studies))
    write_json(out / "tce_results.json", [{"task": t, "aggregates": d["aggregates"], "paired": d["paired"]}
                                          for t, d in studies])  # fmt: skip
    for name, key, ylabel, ylim in FIGURES:
        if figure(studies, key, ylabel, ylim, out / name):
            written.append(out / name)
    return written


def per_seed(study: Path, algo: str) -> dict[str, list]:
    """Each number of COLUMNS over the finished cells of ``algo`` in the study folder (one value per seed)."""
    path = Path(study) / STUDY_JSON
    if not path.is_file():
        raise SystemExit(f"{study}: no study.json (a finished 'troll tce study' folder is needed).")
    cells = [c for c in json.loads(path.read_text())["cells"] if c.get("algo") == algo and c.get("metrics")]
    if not cells:
        raise SystemExit(f"{study}: no finished cell of --algo {algo}.")
    return {key: [c["metrics"].get(key) for c in cells] for key, _ in COLUMNS}


def compare(a: Path, b: Path, algo: str = "tce") -> str:
    """The markdown table of ``--compare``: per number, A and B (mean ± se, n), A - B and Welch's 95% interval."""
    va, vb = per_seed(a, algo), per_seed(b, algo)
    text = f"{algo}: A = {a}, B = {b} (mean ± standard error over seeds; Welch's 95% interval, unpaired)\n\n"
    text += "| number | A | B | A - B | 95% interval | df |\n|---|---|---|---|---|---|\n"
    for key, label in COLUMNS:
        sa, sb = stats.summarize(va[key]), stats.summarize(vb[key])
        if not (sa["n"] and sb["n"]):
            continue
        w = stats.welch(va[key], vb[key])
        ci = "-" if w["ci95"] is None else f"[{w['ci95'][0]:+.3f}, {w['ci95'][1]:+.3f}]"
        cols = [label, f"{_pm(sa)} (n={sa['n']})", f"{_pm(sb)} (n={sb['n']})", f"{w['mean']:+.3f}", ci]
        text += "| " + " | ".join(cols + ["-" if w["df"] is None else str(w["df"])]) + " |\n"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m troll.tce.results", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", help="a folder holding troll tce study folders")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: <folder>/report)")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"), help="two study folders to compare")
    parser.add_argument("--algo", default="tce", help="the algorithm --compare compares (default: tce)")
    args = parser.parse_args(argv)
    if (args.folder is None) == (args.compare is None):
        parser.error("give a folder of studies, or --compare A B (not both)")
    if args.compare:
        print(compare(*args.compare, algo=args.algo), end="")
        return 0
    for path in write_report(args.folder, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
