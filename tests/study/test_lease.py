"""The cell lease (troll.study.lease): one owner, a live owner kept, a dead one taken over, never two at once.

Owners in other processes are real processes (a holder script that takes the lease and beats it); "another host" is
a lease file whose host field names another machine (its process cannot be looked up: only its heartbeat counts).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from troll.study import lease as lease_lib

HOLDER = """
import sys, time
from troll.study import lease
held = lease.Lease(sys.argv[1], beat_s=0.05, stale_s=5.0)
held.acquire()
print(held.attempt, flush=True)
while True:
    held.beat()
    time.sleep(0.02)
"""


def holder(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def test_acquire_beat_release(tmp_path):
    cell = tmp_path / "tce" / "seed0"
    lease = lease_lib.Lease(cell, beat_s=0.01, stale_s=1.0)
    lease.acquire()
    assert lease_lib.read_holder(lease.path).attempt == lease.attempt
    assert lease.beat_file.read_text() == "1\n"
    time.sleep(0.02)
    assert lease.beat() and lease.beat_file.read_text() == "2\n"
    lease.release()
    assert sorted(p.name for p in cell.parent.iterdir()) == []
    slow = lease_lib.Lease(cell, beat_s=60.0)
    slow.acquire()
    assert slow.beat() and slow.beat_file.read_text() == "1\n"  # within beat_s: no file touched
    assert slow.beat(force=True) and slow.beat_file.read_text() == "2\n"
    slow.release()


def test_a_live_owner_elsewhere_keeps_the_cell_and_a_dead_one_loses_it(tmp_path):
    cell = tmp_path / "seed0"
    proc, attempt = holder(cell)
    try:
        with pytest.raises(lease_lib.Busy, match="is in use"):
            lease_lib.Lease(cell, beat_s=0.05, stale_s=5.0).acquire()  # its process runs here: at once
        assert lease_lib.probably_live(cell).attempt == attempt
    finally:
        proc.kill()
        proc.wait()
    assert lease_lib.probably_live(cell) is None  # its process is gone: free without waiting
    started = time.monotonic()
    lease = lease_lib.Lease(cell, beat_s=0.05, stale_s=5.0)
    lease.acquire()
    assert time.monotonic() - started < 2.0
    assert lease_lib.read_holder(lease.path).attempt == lease.attempt
    assert not (tmp_path / f"seed0.beat-{attempt}").exists()  # the dead owner's heartbeat went with it


def _foreign_lease(cell, attempt=7):
    """A lease of an attempt on another host, with its heartbeat file."""
    path = lease_lib.lease_path(cell)
    path.write_text(json.dumps({"attempt": attempt, "host": "node-elsewhere", "boot": "x", "pid": 1, "start": "1"}))
    beat = path.with_name(f"{cell.name}.beat-{attempt}")
    beat.write_text("1\n")
    return beat


def test_another_hosts_owner_is_judged_by_its_heartbeat_alone(tmp_path):
    cell = tmp_path / "seed0"
    beat = _foreign_lease(cell)
    stop = threading.Event()

    def beating():  # the owner on the other host, alive
        n = 1
        while not stop.is_set():
            n += 1
            beat.write_text(f"{n}\n")
            time.sleep(0.05)

    thread = threading.Thread(target=beating)
    thread.start()
    try:
        with pytest.raises(lease_lib.Busy, match="node-elsewhere"):
            lease_lib.Lease(cell, beat_s=0.1, stale_s=1.5).acquire()
    finally:
        stop.set()
        thread.join()
    # its heartbeat stopped: taken over after stale_s of watching, not before
    started = time.monotonic()
    lease = lease_lib.Lease(cell, beat_s=0.1, stale_s=0.6)
    lease.acquire()
    assert 0.6 <= time.monotonic() - started < 3.0
    assert lease_lib.read_holder(lease.path).attempt == lease.attempt


def test_an_owner_that_was_taken_over_learns_it_at_its_next_beat(tmp_path):
    cell = tmp_path / "seed0"
    old = lease_lib.Lease(cell, beat_s=0.01, stale_s=0.3)
    old.acquire()
    # it stops beating (a stopped process, a partitioned node): another host's attempt takes over once stale
    data = json.loads(old.path.read_text())
    old.path.write_text(json.dumps({**data, "host": "node-elsewhere"}))  # as seen from here: another host's
    new = lease_lib.Lease(cell, beat_s=0.01, stale_s=0.3)
    new.acquire()
    assert not old.beat()  # the old owner must stop its cell
    old.release()  # gives back nothing it does not own
    assert lease_lib.read_holder(new.path).attempt == new.attempt
    new.release()


def test_contenders_for_a_stale_lease_never_both_win(tmp_path):
    """Four processes race for the stale lease of a dead owner on another host: exactly one owns it at a time, and
    every one that won saw no other owner during its tenure."""
    cell = tmp_path / "seed0"
    _foreign_lease(cell)
    race = """
import sys, time
from troll.study import lease
mine = lease.Lease(sys.argv[1], beat_s=0.02, stale_s=0.3)
try:
    mine.acquire()
except lease.Busy:
    print("busy"); sys.exit(0)
ok = True
for _ in range(10):
    ok = ok and mine.beat(force=True)
    time.sleep(0.03)
print("won" if ok else "lost")
mine.release()
"""
    procs = [subprocess.Popen([sys.executable, "-c", race, str(cell)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]  # fmt: skip
    outcomes = [p.communicate(timeout=120)[0].strip() for p in procs]
    # whoever won held it throughout ("lost" would mean a second owner broke in); the others saw a live owner
    assert "lost" not in outcomes, outcomes
    assert outcomes.count("won") >= 1 and set(outcomes) <= {"won", "busy"}, outcomes
