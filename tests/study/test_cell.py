"""A cell's entry point (troll.study.cell) under a stop signal: passed on to the command, which is waited for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SRC

COMMAND = """
import pathlib, signal, sys, time
def stop(signum, frame):  # what troll tce train does: checkpoint, then exit with 128 + the signal's number
    time.sleep(0.5)
    pathlib.Path(sys.argv[1]).write_text(signal.Signals(signum).name)
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGUSR1, stop)
pathlib.Path(sys.argv[2]).write_text("ready")
time.sleep(60)
"""

ENTRY = """
import json, sys
from pathlib import Path
from troll.study.cell import CellJob, run_cell
from troll.study.grid import Cell
folder, argv = Path(sys.argv[1]), json.loads(sys.argv[2])
job = CellJob(Cell(None, "arm", 0, folder), tuple(argv), tuple(argv), can_resume=lambda cell: False)
print(json.dumps(run_cell(job)))
"""


@pytest.mark.parametrize(("signame", "code"), [("SIGTERM", 143), ("SIGUSR1", 138)])
def test_a_stop_signal_is_passed_on_to_the_command_and_waited_for(tmp_path, signame, code):
    """The entry point gets the signal (as every process of a cluster job does): its command gets it too, takes its
    time to end (its checkpoint), and the entry point reports the cell stopped, not failed, and gives its lease back."""
    script, got, ready = tmp_path / "command.py", tmp_path / "got", tmp_path / "ready"
    script.write_text(COMMAND)
    folder = tmp_path / "study" / "arm" / "seed0"
    argv = [sys.executable, str(script), str(got), str(ready)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    entry = subprocess.Popen([sys.executable, "-c", ENTRY, str(folder), json.dumps(argv)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert entry.poll() is None and time.monotonic() < deadline, entry.stderr.read()
            time.sleep(0.05)
        entry.send_signal(getattr(signal, signame))
        out, err = entry.communicate(timeout=60)
    finally:
        if entry.poll() is None:
            entry.kill()
    assert entry.returncode == 0, err
    assert got.read_text() == signame  # the command had its say before the entry point ended
    result = json.loads(out.splitlines()[-1])
    assert result == {"label": folder.as_posix(), "code": code,
                      "status": f"stopped ({signame}, exit {code}): resumes from its checkpoint"}  # fmt: skip
    assert not list(folder.parent.glob("*.lease"))
    assert Path(f"{folder}.log").read_text().startswith(f"$ {sys.executable}")
