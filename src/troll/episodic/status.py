"""``troll tce status FOLDER``: where the ``troll tce study`` studies at or below a folder stand, read from their
folders while they run or after they stopped (nothing is written; :mod:`troll.study.status` has the states).

    studies/tce-box/box-pushing-sparse: fancy/box-pushing-sparse, tce,bbrl x seeds 0,1,2, 10.00M env steps a cell
      tce/seed0   finished      10.00M of 10.00M     5.4 h  success 0.092 at 10.00M
      ...
      tce/seed2   running        0.60M of 10.00M  17.6 min  success 0.000 at 0.57M
      bbrl/seed2  not started
      4 finished, 1 running, 1 not started; 40.60M of 60.00M env steps (68 %)
      left: about 6.9 h of run time, one cell at a time, at each cell's rate so far

Env steps are in millions when a cell's budget is a million or more.
"""

from __future__ import annotations

from pathlib import Path

from troll.episodic import study
from troll.study import status
from troll.study.archive import studies

EVAL_KEY = "eval/return"  # every evaluation row has it (success_rate is None on tasks without a success rule)


def _evaluation(row: dict, steps) -> str:
    """The last evaluation's headline: its success rate where the task has one, else its return; hopper jump's
    max height too; ``steps`` formats its env steps."""
    if not row:
        return ""
    success = row.get("eval/success_rate")
    text = f"success {success:.3f}" if success is not None else f"return {row[EVAL_KEY]:.2f}"
    if row.get("eval/max_height") is not None:
        text += f", max height {row['eval/max_height']:.3f} m"
    return f"{text} at {steps(row.get('env_steps', 0))}"


def _duration(seconds: float) -> str:
    """2.5 h, or 12.0 min below an hour."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _formatter(budgets: list[float]):
    """Env steps as 10.00M when a budget is a million or more, else as 1,600."""
    if max(budgets) >= 1e6:
        return lambda steps: f"{steps / 1e6:.2f}M"
    return lambda steps: f"{steps:,.0f}"


def study_text(out: Path) -> str:
    """The status of one study folder: a line per cell, then the counts, the env steps run and an estimate of the
    time left."""
    spec = study.load_spec(out)
    cells = study.plan(spec, out)
    can_resume = study.frontend(spec).can_resume
    found = [status.cell_status(cell, can_resume=can_resume, x_key="env_steps", eval_key=EVAL_KEY,
                                budget=cell.options["config"].total_env_steps) for cell in cells]  # fmt: skip
    budgets = sorted({s.budget for s in found})
    _steps = _formatter(budgets)
    budget = " or ".join(_steps(b) for b in budgets)
    seeds = ",".join(str(seed) for seed in spec.seeds)
    lines = [f"{out}: {spec.env}, {','.join(spec.algos)} x seeds {seeds}, {budget} env steps a cell"]
    width = max(len(s.cell.folder.relative_to(out).as_posix()) for s in found)
    for s in found:
        name = s.cell.folder.relative_to(out).as_posix()
        line = f"  {name:<{width}}  {s.state:<11}"
        if s.state != "not started":
            line += f"  {_steps(s.done):>7} of {_steps(s.budget)}  {_duration(s.seconds):>8}"
            line += f"  {_evaluation(s.evaluation, _steps)}" if s.evaluation else ""
        lines.append(line.rstrip() + (f" ({s.detail})" if s.detail else ""))
    done = sum(min(s.done, s.budget) if s.state != "finished" else s.budget for s in found)
    total = sum(s.budget for s in found)
    left = status.seconds_left(found)
    lines.append(f"  {status.counts(found)}; {_steps(done)} of {_steps(total)} env steps "
                 f"({100 * done / total:.0f} %)")  # fmt: skip
    if left is None:
        lines.append("  left: not known yet (an algorithm has no cell that has run)")
    elif left > 0:
        lines.append(f"  left: about {_duration(left)} of run time, one cell at a time, at each cell's rate so far")
    return "\n".join(lines)


def status_text(folder: Path) -> str:
    """The status of every ``troll tce study`` at or below ``folder`` (UsageError when there is none)."""
    from troll.runs.files import UsageError

    found = studies(Path(folder), study.COMMAND)
    if not found:
        raise UsageError(f"{folder} holds no 'troll tce study' (no config.json of one at or below it).")
    return "\n\n".join(study_text(out) for out in found)
