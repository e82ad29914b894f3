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

from pathlib import Path

from troll.study import status
from troll.tce import study

EVAL_KEY = "eval/return"  # every evaluation row has it (success_rate is None on tasks without a success rule)
TIME_KEY = "time/iteration"  # seconds of a row's iteration, in every row of TCE's, BBRL's and PPO's metrics


def _kept(cell, rows: list[dict]) -> list[dict]:
    """The rows a resume keeps (the rest it runs again): TCE's and BBRL's up to the iteration of the newest checkpoint
    (troll.tce.run keeps a line per iteration), PPO's up to its env steps (troll.tce.ppo); none without a
    checkpoint."""
    from troll.tce import ppo, run

    if found := run.checkpoints(cell.folder):
        return [row for row in rows if (status.number(row.get("iteration")) or 0) <= found[-1][0]]
    if found := ppo.checkpoints(cell.folder):
        return [row for row in rows if row["env_steps"] <= found[-1][0]]
    return []


def _budget(cell) -> float:
    """The env steps the cell's own config.json asks for, else the planned config's."""
    return status.saved_number(cell, "config", "total_env_steps") or float(cell.options["config"].total_env_steps)


def _evaluation(row: dict, steps) -> str:
    """The last evaluation's headline: its success rate where the task has one, else its return; hopper jump's
    max height too; ``steps`` formats its env steps."""
    success, value = status.number(row.get("eval/success_rate")), status.number(row.get(EVAL_KEY))
    text = f"success {success:.3f}" if success is not None else f"return {value:.2f}" if value is not None else ""
    if status.number(row.get("eval/max_height")) is not None:
        text += f", max height {row['eval/max_height']:.3f} m"
    return f"{text} at {steps(row['env_steps'])}" if text else ""


def study_text(out: Path) -> str:
    """The status of one study folder: a line per cell, then the counts, the env steps run and an estimate of the
    time left."""
    spec = status.saved_spec(out, study.StudySpec.from_json)
    keys = {"x_key": "env_steps", "time_key": TIME_KEY, "eval_key": EVAL_KEY, "kept": _kept,
            "summary_seconds": "seconds", "can_resume": study.frontend(spec).can_resume}  # fmt: skip
    return status.study_report(out, spec.grid, study.plan(spec, out), what=spec.env, unit="env steps", budget=_budget,
                               evaluation=_evaluation, arm="algo", **keys)  # fmt: skip


def status_text(folder: Path) -> tuple[str, bool]:
    """The status of every ``troll tce study`` at or below ``folder``, and whether each could be read (a study that
    cannot gets a line saying why). UsageError when ``folder`` holds none."""
    return status.status_report(folder, study.COMMAND, "troll tce study", study_text)
