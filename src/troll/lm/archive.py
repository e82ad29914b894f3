"""Keep the numbers of ``troll study`` folders beyond the machine: save finished cells to an archive, restore.

    python -m troll.lm.archive save studies/code-recipe docs/data/code-results
    python -m troll.lm.archive restore docs/data/code-results studies/code-recipe

``save`` writes every finished cell of every study below the first folder (its config.json, summary.json and the
metrics keys the report reads: held-out accuracy, reward, entropy, the KL reached and after projection, the clipped
share, sample lengths); ``restore`` writes them back as finished cells, so that ``troll study --resume`` keeps them
and runs only the rest, and writes each study's report over its finished cells. A cell is restored only if today's
code gives it the options it ran with (its folder, threads and when it saved or evaluated aside); the others are
listed and rerun. ``make code-results`` does both. The format and the rules: :mod:`troll.study.archive`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from troll.lm import study as study_lib
from troll.lm.options import ADDED_OPTIONS, RESUMABLE_FIELDS
from troll.study import Study, archive

RUN_COMMAND = "train"
# how a cell ran, not what it computed: its folder, torch threads, and the resumable fields
RUNTIME = (*RESUMABLE_FIELDS, "out")
KEYS = ("step", *(c.key for c in study_lib.CURVES), "troll/kl_before/max", "heldout/score", "heldout/cut",
        "heldout/prose_first", "completions/mean_length", "completions/clipped_ratio", "frac_reward_zero_std",
        "step_time")  # fmt: skip


def expected(spec_json: dict, folder: Path) -> dict[str, dict]:
    """Each cell of the study (``<loss>/seed<k>``) -> the config.json ``troll train`` would write for it today."""
    spec = study_lib.StudySpec.from_json(spec_json)
    return {
        cell.folder.relative_to(folder).as_posix(): json.loads(
            json.dumps({"command": RUN_COMMAND, "options": cell.options.to_json()})
        )
        for cell in study_lib.plan(spec, folder)
    }


def upgrade(config: dict) -> dict:
    """A run's or study's config.json with the options added since it was written (:data:`ADDED_OPTIONS`) at the
    value it ran with."""
    config = dict(config)
    if isinstance(config.get("options"), dict):
        config["options"] = ADDED_OPTIONS | config["options"]
    if isinstance(config.get("spec"), dict) and isinstance(config["spec"].get("base"), dict):
        config["spec"] = {**config["spec"], "base": ADDED_OPTIONS | config["spec"]["base"]}
    return config


def study_of(folder: Path) -> Study:
    spec = study_lib.load_spec(folder)
    engine = study_lib.frontend(threads=spec.base.threads)
    return Study(folder, engine, spec.grid, spec.to_json(), study_lib.plan(spec, folder))


ARCHIVE = archive.StudyArchive(
    command=study_lib.COMMAND,
    run_command=RUN_COMMAND,
    keys=KEYS,
    expected=expected,
    runtime=RUNTIME,
    study_of=study_of,
    prog="python -m troll.lm.archive",
    doc=__doc__,
    study_command="troll study",
    upgrade=upgrade,
)
save, restore, main = ARCHIVE.save, ARCHIVE.restore, ARCHIVE.main


if __name__ == "__main__":
    sys.exit(main())
