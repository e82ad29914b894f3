"""A run's cgroup on this machine: its limits written, a wrapped process inside it, and its removal."""

from __future__ import annotations

import os
import subprocess
import threading

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
        hierarchies = len(set(group.dirs.values()))  # cpu and cpuacct may be one
        assert sum(f"troll-test.{os.getpid()}" in line for line in out.stdout.splitlines()) == hierarchies
        cpu, waits = group.usage()  # this machine's v1 has cpuacct: the run's CPU time is counted
        assert cpu > 0 and waits == {}  # cat has ended: no thread of the run is left
    finally:
        group.remove()
    assert not any(os.path.exists(path) for path in group.dirs.values())


def test_the_v2_path_on_a_stand_in_hierarchy(tmp_path, monkeypatch):
    """This machine's controllers are bound to v1, so the v2 path runs here against a directory standing for a
    delegated v2 cgroup: it is chosen, the controllers are enabled for its children, and a run's limits, its
    memory cap and weight when it gives its slot back, and its removal go to the v2 files."""
    from troll.sandbox import cgroups

    own = tmp_path / "user.slice" / "troll"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(cgroups, "_mounts", lambda: ({}, (str(tmp_path), "/")))
    monkeypatch.setattr(cgroups, "_own", lambda: {"": "/user.slice/troll"})
    setup = detect()
    assert setup.mode == "cgroup-v2" and setup.parents == {"": str(own)}
    assert (own / "cgroup.subtree_control").read_text() == "+cpu"  # the last write; memory and pids before it
    group = RunCgroup(setup, "troll-sandbox.4242", Limits(run_memory=200 << 20, processes=10))
    path = own / "troll-sandbox.4242"
    assert group.dirs == {"": str(path)} and group.procs_files == [str(path / "cgroup.procs")]
    assert (path / "memory.max").read_text() == str(200 << 20) and (path / "pids.max").read_text() == "18"
    (path / "cpu.weight").write_text("100")  # the kernel's files of a child with the cpu controller
    (path / "memory.current").write_text(str(3 << 20))
    (path / "cgroup.threads").write_text(f"{os.getpid()}\n{threading.get_native_id()}\n")
    (path / "cpu.stat").write_text("usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n")
    cpu, waits = group.usage()  # the CPU time from cpu.stat, the waits of the threads from /proc
    assert cpu == 1_500_000 and os.getpid() in waits and all(w >= 0 for w in waits.values())
    (path / "cgroup.procs").write_text("")
    assert group.memory_bytes() == 3 << 20
    assert group.cap_memory(25 << 20) and (path / "memory.max").read_text() == str(25 << 20)
    assert group.lower_weight() and (path / "cpu.weight").read_text() == "1"
    group.restore_weight()
    assert (path / "cpu.weight").read_text() == "100"
    (path / "cgroup.kill").write_text("0")
    removed = []

    def rmdir(p):  # a real cgroup's directory goes with its kernel files in it; these are plain files
        removed.append((p, (path / "cgroup.kill").read_text()))
        for name in os.listdir(p):
            os.unlink(os.path.join(p, name))
        real_rmdir(p)

    real_rmdir = os.rmdir
    monkeypatch.setattr(cgroups.os, "rmdir", rmdir)
    group.remove()
    assert removed == [(str(path), "1")] and not path.exists()  # killed through cgroup.kill, then removed


def test_cpu_and_cpuacct_in_one_v1_hierarchy(tmp_path, monkeypatch):
    """Where v1 mounts cpu and cpuacct together (the usual "cpu,cpuacct"), a run gets one directory there, entered
    once, and its CPU time comes from cpuacct.usage."""
    from troll.sandbox import cgroups

    mounts = {name: (str(tmp_path / name), "/") for name in ("memory", "pids")}
    mounts["cpu"] = mounts["cpuacct"] = (str(tmp_path / "cpu,cpuacct"), "/")
    for point, _ in mounts.values():
        os.makedirs(point, exist_ok=True)
    monkeypatch.setattr(cgroups, "_mounts", lambda: (mounts, None))
    monkeypatch.setattr(cgroups, "_own", lambda: {})
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 0)
    setup = detect()
    assert setup.mode == "cgroup-v1" and setup.parents["cpu"] == setup.parents["cpuacct"]
    group = RunCgroup(setup, "troll-sandbox.4243", Limits())
    shared = tmp_path / "cpu,cpuacct" / "troll-sandbox.4243"
    assert group.dirs["cpu"] == group.dirs["cpuacct"] == str(shared) and len(group.procs_files) == 3
    for path in group.procs_files:
        open(path, "w").close()
    (shared / "tasks").write_text("")
    (shared / "cpuacct.usage").write_text("123456789\n")
    assert group.usage() == (123456789, {})
    real_rmdir = os.rmdir

    def rmdir(path):  # plain directories stand for cgroups here: their files go first
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        real_rmdir(path)

    monkeypatch.setattr(cgroups.os, "rmdir", rmdir)
    group.remove()
    assert not shared.exists() and not any(os.path.exists(path) for path in group.dirs.values())
