"""EnvPool's Meta-World tasks are the Python package's: Meta-World's scripted policies, 32 episodes per backend, on a
subset of three tasks in the suite (a reaching task, one that grasps and carries, and the known difference) (the
full 50 x 32 check is ``make envpool-equivalence``, its output in docs/tce.md, "Backends"). Success after the last
step and at any step (Fisher's exact test) and the return (Welch's t-test) must agree within noise at the full
check's Bonferroni threshold (0.05 / 150) on every task the registry runs on EnvPool by default, and the known
difference (door-open-v3, success after the last step) must be found: the test can fail. The observation layout
(varying context entries, constant entries) must agree on all.
Cost: about 2 minutes of both cores (two processes) under load; six tasks took 4.2 minutes in a loaded fresh-clone
run, the suite's slowest test, hence three."""

from __future__ import annotations

import pytest

from troll.episodic.envs.registry import PYTHON_DEFAULT

pytest.importorskip("envpool")
pytest.importorskip("metaworld")

SUBSET = ["reach-v3", "pick-place-v3", "door-open-v3"]


def test_scripted_policies_agree_on_both_backends():
    from troll.episodic.envs.equivalence import run, table

    rows, _ = run(SUBSET, 32, jobs=2, family=50)
    shown = table(rows)
    assert all(r["layout_ok"] for r in rows), shown
    flagged = {r["task"] for r in rows if r["differs"]}
    assert flagged == PYTHON_DEFAULT & set(SUBSET), shown
    door = next(r for r in rows if r["task"] == "door-open-v3")
    assert door["differs"] == "success_last", shown
