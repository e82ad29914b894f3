"""``troll tce status FOLDER``: where the ``troll tce study`` studies at or below a folder stand, read from their
folders while they run or after they stopped (nothing is written; :mod:`troll.study.status` has the states).

    studies/tce-box/box-pushing-sparse: fancy/box-pushing-sparse, tce,bbrl x seeds 0,1,2, 10.00M env steps a cell
      tce/seed0   finished      10.00M of 10.00M     5.4 h  success 0.092 at 10.00M
      ...
      tce/seed2   running        0.60M of 10.00M  17.6 min  success 0.000 at 0.57M
      bbrl/seed2  not started
      4 finished, 1 running, 1 not started; 40.60M of 60.00M env steps (67 %)
      left: about 6.9 h of run time, one cell at a time, at each cell's rate so far

Env steps are in millions when a cell's budget is a million or more. A study that cannot be read (a damaged
config.json, an algorithm this version does not know) gets a line saying why, and the others are still shown.
"""

from __future__ import annotations

import json
from pathlib import Path

from troll.episodic import study
from troll.runs.files import CONFIG_FILE, UsageError
from troll.study import status
from troll.study.report import JSON_FILE as STUDY_JSON_FILE

EVAL_KEY = "eval/return"  # every evaluation row has it (success_rate is None on tasks without a success rule)
TIME_KEY = "time/iteration"  # seconds of a row's iteration, in every row of TCE's, BBRL's and PPO's metrics


def _recorded(out: Path) -> dict[tuple, str]:
    """The status of each cell as the study last recorded it in study.json: (value, algo, seed) -> status."""
    try:
        cells = json.loads((out / STUDY_JSON_FILE).read_text())["cells"]
        return {(c["value"], c["algo"], c["seed"]): str(c["status"]) for c in cells}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _kept(cell, rows: list[dict]) -> list[dict]:
    """The rows a resume keeps (the rest it runs again): TCE's and BBRL's up to the iteration of the newest checkpoint
    (troll.episodic.run keeps a line per iteration), PPO's up to its env steps (troll.episodic.ppo); none without a
    checkpoint."""
    from troll.episodic import ppo, run

    if found := run.checkpoints(cell.folder):
        return [row for row in rows if (status.number(row.get("iteration")) or 0) <= found[-1][0]]
    if found := ppo.checkpoints(cell.folder):
        return [row for row in rows if row["env_steps"] <= found[-1][0]]
    return []


def _budget(cell) -> float:
    """The env steps the cell's own config.json asks for, else the planned config's."""
    try:
        saved = json.loads((cell.folder / CONFIG_FILE).read_text())["config"]["total_env_steps"]
    except (OSError, ValueError, KeyError, TypeError):
        saved = None
    return status.number(saved) or float(cell.options["config"].total_env_steps)


def _evaluation(row: dict, steps) -> str:
    """The last evaluation's headline: its success rate where the task has one, else its return; hopper jump's
    max height too; ``steps`` formats its env steps."""
    success, value = status.number(row.get("eval/success_rate")), status.number(row.get(EVAL_KEY))
    text = f"success {success:.3f}" if success is not None else f"return {value:.2f}" if value is not None else ""
    if status.number(row.get("eval/max_height")) is not None:
        text += f", max height {row['eval/max_height']:.3f} m"
    return f"{text} at {steps(row['env_steps'])}" if text else ""


def _duration(seconds: float) -> str:
    """2.5 h, 12.0 min, or 40 s."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _formatter(budgets: list[float]):
    """Env steps as 10.00M when a budget is a million or more, else as 1,600."""
    if max(budgets, default=0) >= 1e6:
        return lambda steps: f"{steps / 1e6:.2f}M"
    return lambda steps: f"{steps:,.0f}"


def study_text(out: Path) -> str:
    """The status of one study folder: a line per cell, then the counts, the env steps run and an estimate of the
    time left."""
    try:
        head = json.loads((out / CONFIG_FILE).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{out / CONFIG_FILE} is not JSON ({err})") from None
    if not isinstance(head, dict) or not isinstance(head.get("spec"), dict):
        raise ValueError(f"{out / CONFIG_FILE} holds no study spec")
    spec = study.StudySpec.from_json(head["spec"])
    cells = study.plan(spec, out)
    can_resume, recorded = study.frontend(spec).can_resume, _recorded(out)
    keys = {"x_key": "env_steps", "time_key": TIME_KEY, "eval_key": EVAL_KEY, "kept": _kept}
    asked = [_budget(cell) for cell in cells]  # each cell's config.json, read once
    found = [status.cell_status(cell, can_resume=can_resume, budget=budget, **keys,
                                recorded=recorded.get((cell.value, cell.arm, cell.seed)))
             for cell, budget in zip(cells, asked)]  # fmt: skip
    if not found:
        raise ValueError("its spec plans no cell (no algorithm or no seed)")
    steps = _formatter([s.budget for s in found])
    budgets = " or ".join(steps(b) for b in sorted(set(asked)))
    sweep = f", {spec.grid.sweep_flag}={','.join(map(str, spec.sweep_values))}" if spec.sweep_key else ""
    seeds = ",".join(str(seed) for seed in spec.seeds)
    lines = [f"{out}: {spec.env}, {','.join(spec.algos)} x seeds {seeds}{sweep}, {budgets} env steps a cell"]
    width = max(len(s.cell.folder.relative_to(out).as_posix()) for s in found)
    for s in found:
        line = f"  {s.cell.folder.relative_to(out).as_posix():<{width}}  {s.state:<11}"
        if s.state not in ("not started", "unreadable"):
            line += f"  {steps(s.done):>7} of {steps(s.budget)}  {_duration(s.seconds):>8}"
            line += f"  {_evaluation(s.evaluation, steps)}" if s.evaluation else ""
        lines.append(line.rstrip() + (f" ({s.note})" if s.note else ""))
    done = sum(s.budget if s.state == "finished" else min(s.done, s.budget) for s in found)
    total = sum(s.budget for s in found)
    share = 100 if done >= total else min(int(100 * done / total), 99)  # "100 %" only when it is all done
    lines.append(f"  {status.counts(found)}; {steps(done)} of {steps(total)} env steps ({share} %)")
    left, unknown = status.seconds_left(found)
    if done < total:
        parts = [f"about {_duration(left)} of run time, one cell at a time, at each cell's rate so far"]
        parts = parts if left > 0 or not unknown else []
        parts += [f"the cells of {', '.join(unknown)}, which have no rate yet"] if unknown else []
        lines.append(f"  left: {', and '.join(parts)}")
    return "\n".join(lines)


def status_text(folder: Path) -> tuple[str, bool]:
    """The status of every ``troll tce study`` at or below ``folder``, and whether each could be read (a study that
    cannot gets a line saying why). UsageError when ``folder`` holds none."""
    folder = Path(folder)
    if not folder.exists():
        raise UsageError(f"{folder} does not exist; give a study's --out or a folder holding studies.")
    found = status.find_studies(folder, study.COMMAND)
    if not found:
        raise UsageError(f"{folder} holds no 'troll tce study' (no config.json of one at or below it): give a "
                         "study's --out, or a folder above it.")  # fmt: skip
    texts, ok = [], True
    for out in found:
        try:
            texts.append(study_text(out))
        except Exception as err:  # noqa: BLE001 -- one damaged study must not hide the others
            texts.append(f"{out}: cannot be read as a study: {err or type(err).__name__}")
            ok = False
    return "\n\n".join(texts), ok
