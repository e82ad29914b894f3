"""A run's cgroup on this machine: its limits written, a wrapped process inside it, and its removal."""

from __future__ import annotations

import os
import subprocess

from troll.sandbox import Limits
from troll.sandbox.cgroups import RunCgroup, _join, detect, wrap


def test_paths_within_a_hierarchy_mounted_at_a_sub_cgroup():
    assert _join(("/sys/fs/cgroup/memory", "/"), "/a/b") == "/sys/fs/cgroup/memory/a/b"
    assert _join(("/sys/fs/cgroup/memory", "/docker/x"), "/docker/x/y") == "/sys/fs/cgroup/memory/y"


def test_a_run_s_cgroup_has_its_limits_holds_its_processes_and_goes():
    setup = detect()
    assert setup.mode in ("cgroup-v1", "cgroup-v2"), setup.reason
    group = RunCgroup(setup, f"troll-test.{os.getpid()}", Limits(run_memory=123 << 20, processes=10))
    try:
        if setup.mode == "cgroup-v1":
            memory = os.path.join(group.dirs["memory"], "memory.limit_in_bytes")
            pids = os.path.join(group.dirs["pids"], "pids.max")
        else:
            memory, pids = (os.path.join(group.dirs[""], name) for name in ("memory.max", "pids.max"))
        assert int(open(memory).read()) == 123 << 20
        assert int(open(pids).read()) == 18  # 10 and the sandbox's own 8
        out = subprocess.run(wrap(["/bin/cat", "/proc/self/cgroup"], group), capture_output=True, text=True, env={})
        assert out.returncode == 0, out.stderr
        assert sum(f"troll-test.{os.getpid()}" in line for line in out.stdout.splitlines()) == len(group.dirs)
    finally:
        group.remove()
    assert not any(os.path.exists(path) for path in group.dirs.values())
