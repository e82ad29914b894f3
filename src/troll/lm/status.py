"""``troll status FOLDER``: where the ``troll study`` studies at or below a folder stand, read from their folders
while they run or after they stopped (nothing is written; :mod:`troll.study.status` has the states).

    studies/code: task code, model smollm2, troll,clip x seeds 0,1,2, 160 optimiser steps a cell
      troll/seed0  finished         160 of 160     2.1 h  held-out accuracy 0.250 at step 160
      clip/seed0   running           96 of 160     1.3 h  held-out accuracy 0.188 at step 80
      troll/seed1  stopped           80 of 160     1.0 h  held-out accuracy 0.219 at step 80
      ...
      1 finished, 1 running, 1 stopped, 3 not started; 336 of 960 optimiser steps (35 %)
      left: about 8.4 h of run time, one cell at a time, at each cell's rate so far

A cell's run time is the sum of its rows' ``step_time`` (TRL's time of an optimiser step, its generation included;
not the held-out evaluations, checkpoints or model loading), so a resumed run counts only the steps it keeps. A
stopped cell counts the metrics lines its newest complete checkpoint recorded: what ``--resume`` keeps.
"""

from __future__ import annotations

from pathlib import Path

from troll.lm import checkpoints
from troll.lm import study as lm_study
from troll.runs import protocol
from troll.runs.files import METRICS_FILE
from troll.study import status

X_KEY = "step"  # every line of a GRPO run's metrics.jsonl: the optimiser step it was logged at
EVAL_KEY = "heldout/accuracy"  # the held-out evaluations (at step 0, every --eval-every steps and at the end)
TIME_KEY = "step_time"  # TRL's seconds of the optimiser step, in its training rows


def _kept(cell, rows: list[dict]) -> list[dict]:
    """The rows a resume keeps: the metrics lines the newest complete checkpoint recorded (troll.lm.checkpoints;
    the file is cut back to them), read here without cutting anything; none without a checkpoint."""
    found = checkpoints.last_checkpoint(cell.folder)
    mark = protocol.read_mark(found) if found is not None else None
    if mark is None:  # none, or removed since it was found (a live run marked a newer one): nothing known kept
        return []
    kept, _ = status.read_rows(cell.folder / METRICS_FILE, X_KEY, lines=mark["metrics_lines"])
    return kept


def _budget(cell) -> float:
    """The optimiser steps the cell's own config.json asks for (a resumed run may raise them), else the planned
    options'."""
    return status.saved_number(cell, "options", "steps") or float(cell.options.steps)


def _evaluation(row: dict, steps) -> str:
    """The last held-out evaluation: its greedy accuracy and the step it was taken at."""
    accuracy = status.number(row.get(EVAL_KEY))
    return f"held-out accuracy {accuracy:.3f} at step {steps(row[X_KEY])}" if accuracy is not None else ""


def study_text(out: Path) -> str:
    """The status of one study folder: a line per cell, then the counts, the optimiser steps run and an estimate of
    the time left."""
    spec = status.saved_spec(out, lm_study.StudySpec.from_json)
    shared = ", ".join(f"{key} {getattr(spec.base, key)}" for key in ("task", "model") if key != spec.sweep_key)
    keys = {"x_key": X_KEY, "time_key": TIME_KEY, "eval_key": EVAL_KEY, "kept": _kept,
            "can_resume": lm_study.frontend().can_resume}  # fmt: skip
    return status.study_report(out, spec.grid, lm_study.plan(spec, out), what=shared, unit="optimiser steps",
                               budget=_budget, evaluation=_evaluation, arm="loss", **keys)  # fmt: skip


def status_text(folder: Path) -> tuple[str, bool]:
    """The status of every ``troll study`` at or below ``folder``, and whether each could be read (a study that
    cannot gets a line saying why). UsageError when ``folder`` holds none."""
    return status.status_report(folder, lm_study.COMMAND, "troll study", study_text)
