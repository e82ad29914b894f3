"""A control group per run: one memory limit for everything the run holds, a process limit, an equal CPU weight,
and a teardown that kills it and waits until it is empty.

The modes (:func:`detect`, the ``mode`` of a :class:`~troll.sandbox.BubblewrapSandbox`):

- ``cgroup-v2``: the unified hierarchy with the memory and pids controllers, where this process's own cgroup lets
  it make children with them (delegated, e.g. systemd's ``Delegate=yes``), or as root under the hierarchy's root;
- ``cgroup-v1``: as root, the v1 ``memory`` and ``pids`` hierarchies (and ``cpu`` and ``cpuacct`` where mounted),
  each run a child of this process's own cgroup in each (so a run stays inside the limits of whoever started the
  scorer);
- ``rlimits``: no cgroup can be made (e.g. an unprivileged container without delegation); a run is bounded by its
  per-process limits only, and the seccomp filter refuses the shared memory they do not count.

A run enters its cgroup through a small ``/bin/sh`` wrapper (:func:`wrap`) that writes its own pid to each
``cgroup.procs`` and then executes bubblewrap, so every process of the run starts inside (no ``preexec_fn``, which
is not safe with the scorer's threads).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field

from troll.sandbox.backend import Limits, SandboxError

V1 = ("memory", "pids", "cpu", "cpuacct")  # the controllers used; cpu and cpuacct only where mounted
WRAPPER = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done; exec "$@"'
PREFIX = "troll-sandbox."  # a root run's cgroup is PREFIX + its uid
EXTRA_PROCESSES = 8  # pids the cgroup allows besides Limits.processes: the wrapper, bwrap and its init, setpriv


@dataclass(frozen=True)
class Setup:
    """Where runs' cgroups go: ``mode``, the parent directory of each (v1: per controller, v2: one under ""), and
    for ``rlimits`` the reason no cgroup could be used."""

    mode: str
    parents: dict[str, str] = field(default_factory=dict)
    reason: str = ""


def _mounts() -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """The v1 hierarchies (controller -> (mount point, root within the hierarchy)) and the v2 one, if mounted."""
    v1, v2 = {}, None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(rest) < 3 or len(fields) < 5:
                continue
            if rest[0] == "cgroup2":
                v2 = (fields[4], fields[3])
            elif rest[0] == "cgroup":
                for option in rest[2].split(","):
                    if option in V1:
                        v1[option] = (fields[4], fields[3])
    return v1, v2


def _own() -> dict[str, str]:
    """This process's cgroup path in each hierarchy: controller -> path, "" -> the v2 path."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    return own


def _join(mount: tuple[str, str], path: str) -> str:
    point, root = mount
    rel = path[len(root) :] if root != "/" and path.startswith(root) else path
    return os.path.join(point, rel.lstrip("/"))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def stolen() -> dict[str, int]:
    """CPU name -> the ns the host has taken from this machine's CPU while it had work (``steal`` in
    ``/proc/stat``; a virtual machine's CPU stolen by its hypervisor): time a run on that CPU lacked that is neither
    its CPU time nor a wait in the run queue, where the kernel accounts it apart (paravirtual steal accounting;
    without it stolen time counts as CPU time). Empty where ``/proc/stat`` cannot be read; a line that does not
    parse is left out."""
    ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    try:
        lines = _read("/proc/stat").splitlines()
    except OSError:
        return {}
    steal = {}
    for line in lines:
        fields = line.split()
        if len(fields) > 8 and fields[0].startswith("cpu") and fields[0] != "cpu" and fields[8].isdigit():
            steal[fields[0]] = int(fields[8]) * ns
    return steal


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _probe(parents: dict[str, str]) -> None:
    """Make and remove a child in each parent: raises OSError where that is not allowed."""
    made = []
    try:
        for parent in dict.fromkeys(parents.values()):
            path = os.path.join(parent, f"troll-probe.{os.getpid()}")
            os.mkdir(path)
            made.append(path)
    finally:
        for path in made:
            os.rmdir(path)


def _v2_parent(mount: tuple[str, str], own: str) -> str | None:
    """A v2 directory whose children get the memory and pids controllers: this process's own cgroup when it already
    delegates them (or lets them be enabled), else as root the hierarchy's root; None when neither works."""
    candidates = [_join(mount, own)] + ([mount[0]] if os.geteuid() == 0 else [])
    for parent in candidates:
        try:
            if not {"memory", "pids"} <= set(_read(os.path.join(parent, "cgroup.controllers")).split()):
                continue
            enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
            if not {"memory", "pids"} <= enabled:
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
            if "cpu" not in enabled and "cpu" in _read(os.path.join(parent, "cgroup.controllers")).split():
                try:
                    _write(os.path.join(parent, "cgroup.subtree_control"), "+cpu")
                except OSError:
                    pass  # the weight is optional
            _probe({"": parent})
            return parent
        except OSError:
            continue
    return None


def detect() -> Setup:
    """The best mode this process can use (module docstring)."""
    try:
        v1, v2 = _mounts()
        own = _own()
    except OSError as err:
        return Setup("rlimits", reason=f"cannot read this process's cgroups ({err})")
    if v2 is not None and "" in own:
        parent = _v2_parent(v2, own[""])
        if parent:
            return Setup("cgroup-v2", {"": parent})
    if os.geteuid() == 0 and {"memory", "pids"} <= set(v1):
        parents = {name: _join(mount, own.get(name, "/")) for name, mount in v1.items()}
        try:
            _probe(parents)
            return Setup("cgroup-v1", parents)
        except OSError as err:
            return Setup("rlimits", reason=f"cannot make a cgroup under {sorted(parents.values())} ({err})")
    why = "the memory and pids controllers are neither delegated to this process in cgroup v2 nor, as root, in v1"
    return Setup("rlimits", reason=why)


class RunCgroup:
    """The cgroup of one run, made with its limits: memory (``Limits.run_memory``, swap included), pids
    (``Limits.processes`` + a few for the sandbox's own processes), the default CPU weight (every run alike)."""

    def __init__(self, setup: Setup, name: str, limits: Limits):
        self.v2 = setup.mode == "cgroup-v2"
        self.dirs = {key: os.path.join(parent, name) for key, parent in setup.parents.items()}
        self.paths = list(dict.fromkeys(self.dirs.values()))  # each directory once: cpu and cpuacct are often one
        for path in self.paths:
            if os.path.isdir(path):  # left by a scorer that died holding the same uid: end it first
                _empty(path, self.v2, time.monotonic() + 5.0)
                os.rmdir(path)
            os.mkdir(path)
        try:
            self._limit(limits)
        except OSError as err:
            self.remove()
            raise SandboxError(f"could not set the limits of the cgroup {name}: {err}") from err

    def _limit(self, limits: Limits) -> None:
        pids = str(limits.processes + EXTRA_PROCESSES)
        if self.v2:
            path = self.dirs[""]
            _write(os.path.join(path, "memory.max"), str(limits.run_memory))
            if os.path.exists(os.path.join(path, "memory.swap.max")):
                _write(os.path.join(path, "memory.swap.max"), "0")
            _write(os.path.join(path, "pids.max"), pids)
            return
        _write(os.path.join(self.dirs["memory"], "memory.limit_in_bytes"), str(limits.run_memory))
        memsw = os.path.join(self.dirs["memory"], "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):
            _write(memsw, str(limits.run_memory))
        _write(os.path.join(self.dirs["pids"], "pids.max"), pids)

    def cpu_ticks(self) -> dict[int, int]:
        """pid -> CPU time in clock ticks (its own and its reaped children's, user and system) of each process in
        the cgroup now: unchanged between two calls when none of them ran, or ended, or started."""
        ticks = {}
        for pid in _read(self.procs_files[0]).split():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ticks[int(pid)] = sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
            except (OSError, IndexError, ValueError):
                ticks[int(pid)] = -1  # gone since the list was read: a change
        return ticks

    def usage(self) -> tuple[int, dict[int, int]] | None:
        """(CPU time of the run so far in ns, every process it ever had included; thread id -> the ns each live
        thread has waited, runnable, for a CPU), or None where the cgroup does not count the run's CPU time (v1
        without a cpuacct hierarchy) or it could not be read. The threads are the cgroup's (v1 ``tasks``, v2
        ``cgroup.threads``), their waits from ``/proc/<tid>/schedstat``; a thread without one (gone, or a kernel
        without schedstats) is left out."""
        try:
            if self.v2:
                stat = _read(os.path.join(self.dirs[""], "cpu.stat")).split()
                cpu = 1000 * int(stat[stat.index("usage_usec") + 1])
                tids = _read(os.path.join(self.dirs[""], "cgroup.threads")).split()
            elif "cpuacct" in self.dirs:
                cpu = int(_read(os.path.join(self.dirs["cpuacct"], "cpuacct.usage")))
                tids = _read(os.path.join(self.dirs["cpuacct"], "tasks")).split()
            else:
                return None
        except (OSError, ValueError, IndexError):
            return None
        waits = {}
        for tid in tids:
            try:
                waits[int(tid)] = int(_read(f"/proc/{tid}/schedstat").split()[1])
            except (OSError, IndexError, ValueError):
                continue
        return cpu, waits

    def memory_bytes(self) -> int:
        """The memory the run holds now (the memory controller's usage)."""
        if self.v2:
            return int(_read(os.path.join(self.dirs[""], "memory.current")))
        return int(_read(os.path.join(self.dirs["memory"], "memory.usage_in_bytes")))

    def cap_memory(self, limit: int) -> bool:
        """Lower the run's memory limit to ``limit`` bytes (above what it holds now); False if the kernel refused."""
        try:
            if self.v2:
                _write(os.path.join(self.dirs[""], "memory.max"), str(limit))
                return True
            _write(os.path.join(self.dirs["memory"], "memory.limit_in_bytes"), str(limit))
            memsw = os.path.join(self.dirs["memory"], "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):  # memory and swap >= memory at all times: lowered after it
                _write(memsw, str(limit))
        except OSError:
            return False
        return True

    def lower_weight(self) -> bool:
        """Give the run the smallest CPU weight (v2 cpu.weight 1, v1 cpu.shares 2, against 100 and 1024 for the
        other runs); False where this cgroup has no cpu controller."""
        return self._weight("1", "2")

    def restore_weight(self) -> None:
        """The default CPU weight again: a run being stopped needs the CPU to die (the scorer waits for that)."""
        self._weight("100", "1024")

    def _weight(self, v2: str, v1: str) -> bool:
        if self.v2:
            path, value = os.path.join(self.dirs[""], "cpu.weight"), v2
        else:
            path, value = os.path.join(self.dirs.get("cpu", "/nonexistent"), "cpu.shares"), v1
        if not os.path.exists(path):
            return False
        try:
            _write(path, value)
        except OSError:
            return False
        return True

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(path, "cgroup.procs") for path in self.paths]

    def remove(self, timeout: float = 10.0) -> None:
        """Kill every process in the cgroup, wait until it is empty, and remove it; :class:`SandboxError` if it does
        not empty within ``timeout`` seconds (its uid must then not be reused)."""
        deadline = time.monotonic() + timeout
        for path in self.paths:
            if os.path.isdir(path):
                _empty(path, self.v2, deadline)
        for path in self.paths:
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise SandboxError(f"could not remove the run's cgroup {path}: {err}") from err
                    time.sleep(0.002)


def _empty(path: str, v2: bool, deadline: float) -> None:
    """Kill every process in the cgroup ``path`` until it has none; :class:`SandboxError` past ``deadline``."""
    kill = os.path.join(path, "cgroup.kill")
    if v2 and os.path.exists(kill):
        _write(kill, "1")
    while True:
        pids = _read(os.path.join(path, "cgroup.procs")).split()
        if not pids:
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"the run's cgroup {path} did not empty: pids {pids[:8]}")
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.001)


def left_behind(setup: Setup) -> dict[int, list[str]]:
    """The cgroups named after a uid (``troll-sandbox.<uid>``) under this process's parents: uid -> directories.
    A scorer that was killed leaves its runs' cgroups (empty: the runs die with it) behind."""
    found: dict[int, list[str]] = {}
    for parent in dict.fromkeys(setup.parents.values()):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            uid = name.removeprefix(PREFIX)
            if name.startswith(PREFIX) and uid.isdigit():
                found.setdefault(int(uid), []).append(os.path.join(parent, name))
    return found


def remove_dirs(paths: list[str], v2: bool) -> None:
    """Empty and remove the cgroups ``paths`` (best effort: one that will not go is left)."""
    for path in paths:
        try:
            _empty(path, v2, time.monotonic() + 2.0)
            os.rmdir(path)
        except (OSError, SandboxError):
            continue


def wrap(argv: list[str], cgroup: RunCgroup | None) -> list[str]:
    """``argv`` started inside ``cgroup`` (unchanged without one)."""
    if cgroup is None:
        return argv
    files = cgroup.procs_files
    return ["/bin/sh", "-c", WRAPPER, "sh", str(len(files)), *files, *argv]
