"""The former module paths that docs, scripts and users name stay importable as the very modules of the current
layout (troll._moved), and ``python -m`` still runs a moved report."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import troll
from troll._moved import MOVED, new_name

SRC = Path(troll.__file__).resolve().parent.parent


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_former_path_is_the_current_module(old):
    current = importlib.import_module(new_name(old))
    assert importlib.import_module(old) is current
    assert current.__spec__.name == new_name(old)  # the module keeps its own name and spec


def test_names_below_a_moved_package_follow_it():
    assert new_name("troll.train.tasks") == "troll.lm.tasks"
    assert new_name("troll.train.stability_map") == "troll.lm.results"  # the longer prefix wins
    assert new_name("troll.training") is None and new_name("troll.lm.run") is None
    from troll.train.options import RunOptions as Former

    from troll.lm.options import RunOptions

    assert Former is RunOptions


def test_public_names_of_the_docs_still_import():
    from troll.episodic.agent import TCEAgent

    from troll.episodic import ProDMP, TCEConfig
    from troll.episodic.tce.agent import TCEAgent as Current
    from troll.episodic.tce.config import TCEConfig as CurrentConfig

    assert TCEAgent is Current and TCEConfig is CurrentConfig and ProDMP.__module__ == "troll.episodic.tce.prodmp"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("troll.train.no_such_module")


def test_python_m_runs_a_moved_module():
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "troll.train.stability_map", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "stability map" in out.stdout
