"""The verl suite's end-to-end runs (test_verl_e2e.py) start in the background as soon as the tests are collected.

Most of their two minutes is process start-up on one core at a time, so they overlap the verl tests before them; their
tests wait for them. Nothing starts when test_verl_e2e.py is not among the selected tests. Whatever is still running
when the session ends is killed.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path


def pytest_collection_finish(session):
    wanted = any(item.path.name == "test_verl_e2e.py" for item in session.items)
    if not wanted or importlib.util.find_spec("verl") is None:  # without verl the module skips itself
        return
    from _verl_e2e import Runs

    runs = Runs(Path(tempfile.mkdtemp(prefix="troll-verl-e2e-")))
    runs.start()
    session.config._troll_verl_e2e = runs


def pytest_sessionfinish(session):
    runs = getattr(session.config, "_troll_verl_e2e", None)
    if runs is not None:
        runs.kill()
        shutil.rmtree(runs.root, ignore_errors=True)
