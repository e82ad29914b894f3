"""Keep the numbers of ``troll tce study`` folders beyond the machine: save finished cells to an archive, restore.

    python -m troll.tce.archive save studies/tce-authors docs/data/tce-authors
    python -m troll.tce.archive restore docs/data/tce-authors studies/tce-authors

``save`` writes every finished cell of every study below the first folder (its config.json, summary.json and the
metrics keys the report and the pace diagnosis read: evaluations, rollout return, entropy and its bound, the
projection's share and proposed steps, the critic's fit); ``restore`` writes them back as finished cells, so that
``troll tce study --resume`` keeps them and runs only the rest, and writes each study's report over its finished
cells (so ``python -m troll.tce.results`` reads the archive's numbers without running anything). A cell is
restored only if today's presets give it the config it ran with; the others are listed and rerun. ``make
tce-authors`` does both, so its study continues on a new machine from what was committed. The format and the rules:
:mod:`troll.study.archive`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from troll.episodic.config import RESUMABLE_FIELDS
from troll.study import Study, archive
from troll.tce import study as study_lib

# the report's curves, and what benchmarks/tce_exploration.py --runs reads to say why a run is slow
DIAGNOSIS_KEYS = ("proj/mean_dist_before/mean", "proj/cov_dist_before/mean", "policy/entropy_bound",
                  "critic/explained_var_before", "policy/chol_diag_min", "eval/success_any")  # fmt: skip
KEYS = ("iteration", "env_steps", *(c.key for c in study_lib.CURVES), study_lib.HEIGHT_CURVE.key, *DIAGNOSIS_KEYS)


def expected(spec_json: dict, folder: Path) -> dict[str, dict]:
    """Each cell of the study (``<arm>/seed<k>``) -> the config.json ``troll tce train`` would write for it today."""
    spec = study_lib.StudySpec.from_json(spec_json)
    return {
        cell.folder.relative_to(folder).as_posix(): study_lib.written_config(cell)
        for cell in study_lib.plan(spec, folder)
    }


def study_of(folder: Path) -> Study:
    spec = study_lib.load_spec(folder)
    return Study(folder, study_lib.frontend(spec), spec.grid, spec.to_json(), study_lib.plan(spec, folder))


ARCHIVE = archive.StudyArchive(
    command=study_lib.COMMAND,
    run_command=study_lib.RUN_COMMAND,
    keys=KEYS,
    expected=expected,
    runtime=RESUMABLE_FIELDS,
    study_of=study_of,
    prog="python -m troll.tce.archive",
    doc=__doc__,
    study_command="troll tce study",
)
save, restore, main = ARCHIVE.save, ARCHIVE.restore, ARCHIVE.main


if __name__ == "__main__":
    sys.exit(main())
