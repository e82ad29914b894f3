"""The local backend: bubblewrap (``bwrap``, the sandbox Flatpak uses) around an isolated Python interpreter.

What a run sees and may do:

- a root of its own: read-only ``/usr`` (with the ``/bin``, ``/lib``, ``/lib64`` links), read-only the interpreter's
  executable, its standard library and its shared library, private writable ``/tmp`` and ``/dev/shm`` (tmpfs of
  ``Limits.tmp_size`` each), a fresh ``/proc`` and a minimal ``/dev``; nothing else of the host (no ``/etc``, no
  home, no checkout; every ``site-packages`` and ``dist-packages`` under what is bound is covered by an empty
  read-only tmpfs);
- a cgroup of its own (``cgroups.py``) where the machine allows one: one memory limit for the whole run, a pids
  limit, an equal CPU weight; the mode (``mode``: "cgroup-v2", "cgroup-v1" or "rlimits") is chosen when the sandbox
  is built, and ``require_cgroup=True`` refuses to build one without a cgroup;
- new PID, network (loopback only, its own), IPC, UTS and cgroup namespaces, a new session, a cleared environment,
  ``python -I -S``; it dies with its parent (``--die-with-parent``) and the whole process group is killed at the
  wall-clock limit;
- as root: the program runs as an unused uid of its own per run (``setpriv``, inside bwrap, with every capability
  dropped and ``no_new_privs``), because the kernel does not enforce RLIMIT_NPROC for uid 0; the uids are unique on
  the machine (``uids.py``) and a uid is reused only once every process of its last run has been reaped; not as
  root: in a new user namespace (``--unshare-all``), which needs unprivileged user namespaces;
- a seccomp filter (``seccomp.py``) refusing new user namespaces, the kernel keyrings, ptrace, pidfds and
  cross-process memory access, and without a cgroup SysV shared memory and memfd.

The rlimits themselves are set by the program's first statements, before any untrusted code (``_harness.py``).
"""

from __future__ import annotations

import functools
import glob
import itertools
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from contextlib import contextmanager
from pathlib import Path

from troll.sandbox import cgroups, seccomp
from troll.sandbox.backend import Limits, RunResult, Sandbox, SandboxError, SandboxUnavailable, Watch, run_capped
from troll.sandbox.uids import FIRST, UidPool, reclaim

INSTALL_HINT = "install bubblewrap: `apt-get update && apt-get install -y bubblewrap` (as root)"
USERNS_HINT = (
    "bubblewrap needs unprivileged user namespaces when not run as root: `sysctl -w kernel.unprivileged_userns_clone=1`"
    " (Debian), `sysctl -w user.max_user_namespaces=15000`, or on Ubuntu 24.04 "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (as root), or run as root"
)
_SELF_TEST = (
    "import os, sys; seccomp = 'Seccomp:\\t2' in open('/proc/self/status').read(); "
    "sys.stdout.write('sandbox-ok %d %d %d %d' % (os.getuid(), len(os.environ), seccomp, os.getpid()))"
)


def interpreter_paths() -> tuple[str, list[str]]:
    """The running interpreter's real executable and the host paths it needs at run time (executable, standard
    library, shared libpython), resolved from ``sys.executable`` and ``sys.base_prefix`` (a venv's python is a
    link to its base install, whose site-packages are left out)."""
    exe = os.path.realpath(sys.executable)
    paths = [exe]
    base = {"base": sys.base_prefix, "installed_base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib"):
        paths.append(os.path.realpath(sysconfig.get_path(key, vars=base)))
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
        if libdir and soname and os.path.exists(os.path.join(libdir, soname)):
            paths.append(os.path.realpath(os.path.join(libdir, soname)))
    return exe, sorted(set(paths))


def package_dirs(binds: list[str]) -> list[str]:
    """The installed-package folders a run would otherwise see: ``site-packages`` and ``dist-packages`` in the bound
    standard libraries and in every Python under ``/usr``."""
    found = set()
    for path in binds:
        found.update(p for p in (os.path.join(path, "site-packages"), os.path.join(path, "dist-packages")))
    for pattern in (
        "/usr/lib/python3*/*-packages",
        "/usr/local/lib/python3*/*-packages",
        "/usr/lib64/python3*/*-packages",
    ):
        found.update(glob.glob(pattern))
    return sorted(p for p in found if os.path.isdir(p) and not os.path.islink(p))


class BubblewrapSandbox(Sandbox):
    """The bwrap backend. Building it checks that a sandbox works (a self-test run) and raises
    :class:`SandboxUnavailable`, naming the fix, when none does: nothing is ever run without it.

    ``bwrap`` and ``setpriv`` are the binaries' paths; ``uid_base`` where the search for a free block of uids
    starts when root (``uids.py``: blocks are locked machine-wide, so no two sandboxes, in one process or several,
    share a uid); ``require_cgroup=True`` raises :class:`SandboxUnavailable` unless every run gets a cgroup
    (``mode`` is then "cgroup-v2" or "cgroup-v1", never "rlimits"); ``check=False`` skips the self-test (tests
    of the argument list only)."""

    def __init__(
        self,
        *,
        bwrap: str | None = None,
        setpriv: str = "/usr/bin/setpriv",
        uid_base: int | None = None,
        require_cgroup: bool = False,
        check: bool = True,
    ):
        self.bwrap = bwrap or shutil.which("bwrap") or "/usr/bin/bwrap"
        self.setpriv = setpriv
        self.as_root = os.geteuid() == 0
        self.python, self._binds = interpreter_paths()
        self._hidden = package_dirs(self._binds)
        self._cgroups = cgroups.detect()
        self.mode = self._cgroups.mode
        if require_cgroup and self.mode == "rlimits":
            raise SandboxUnavailable(
                f"require_cgroup=True but no cgroup can be made for a run: {self._cgroups.reason}; run the scorer as "
                "root, or in a cgroup v2 subtree delegated to it with the memory and pids controllers "
                "(systemd: `systemd-run --user -p Delegate=yes --scope ...`)"
            )
        self._uids = UidPool(FIRST if uid_base is None else uid_base) if self.as_root else None
        if self._uids is not None and self.mode != "rlimits":  # the cgroups of runs of scorers that were killed
            stale = cgroups.left_behind(self._cgroups)
            reclaim(stale, lambda uid: cgroups.remove_dirs(stale[uid], self.mode == "cgroup-v2"))
        self._names = itertools.count()
        # as root, the dropped uid could create user namespaces (and mount a tmpfs of half the RAM) without it
        self._filter = seccomp.program(block_shared_memory=self.mode == "rlimits")
        if check:
            self.self_test()

    @property
    def uids(self) -> list[range]:
        """The uid ranges this sandbox holds (empty when not root)."""
        return self._uids.uids if self._uids is not None else []

    def self_test(self) -> None:
        """Run a trivial program in the sandbox; raise :class:`SandboxUnavailable` (with the fix) if it fails."""
        if not (os.path.isfile(self.bwrap) and os.access(self.bwrap, os.X_OK)):
            raise SandboxUnavailable(f"bubblewrap not found at {self.bwrap}: {INSTALL_HINT}")
        if self.as_root and not os.access(self.setpriv, os.X_OK):
            raise SandboxUnavailable(
                f"setpriv not found at {self.setpriv}; running as root, each run drops to its own uid with it "
                "(RLIMIT_NPROC does not hold for uid 0): `apt-get install -y util-linux`"
            )
        try:
            result = self.run(_SELF_TEST, b"", Limits(wall=30.0, cpu=10))
        except SandboxError as err:
            raise SandboxUnavailable(f"bubblewrap could not start: {err}; {INSTALL_HINT}") from err
        words = result.stdout.decode(errors="replace").split()
        if result.returncode != 0 or len(words) != 5 or words[0] != "sandbox-ok":
            detail = result.stderr.decode(errors="replace").strip()[-500:]
            fix = INSTALL_HINT if self.as_root else USERNS_HINT
            raise SandboxUnavailable(f"the bubblewrap sandbox does not work here ({detail or 'no output'}): {fix}")
        if self.as_root and words[1] == "0":
            raise SandboxUnavailable("the sandboxed program still ran as uid 0; refusing to run untrusted code")
        if self._filter is not None and words[3] != "1":
            raise SandboxUnavailable(
                f"the seccomp filter did not apply in the sandbox ({self.bwrap}); refusing to run untrusted code"
            )
        if self._filter is not None and int(words[4]) not in seccomp.PROTECTED:
            raise SandboxUnavailable(
                f"the sandboxed program is pid {words[4]} in its namespace, not one the seccomp filter guards "
                f"{seccomp.PROTECTED} ({self.bwrap} starts it differently); refusing to run untrusted code"
            )

    def argv(self, program: str, limits: Limits, uid: int | None, seccomp_fd: int | None = None) -> list[str]:
        """The full command line of one run (``uid``: the uid to drop to, when root; ``seccomp_fd``: a descriptor
        bwrap reads the seccomp filter from, see ``seccomp.py``)."""
        args = [self.bwrap]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        if self.as_root:  # a user namespace would leave no other uid to drop to: unshare the rest one by one
            args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            args += ["--unshare-all", "--unshare-user", "--disable-userns"]  # a user namespace, and no nested one
        args += ["--die-with-parent", "--new-session", "--clearenv", "--setenv", "LC_ALL", "C.UTF-8"]
        args += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink(f"/{name}"):
                args += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
            elif os.path.isdir(f"/{name}"):
                args += ["--ro-bind", f"/{name}", f"/{name}"]
        made = {"/", "/usr", "/tmp", "/proc", "/dev"}
        for path in self._binds:
            if path.startswith("/usr/"):
                continue
            parent = Path(path).parent
            for d in [*reversed(parent.parents), parent]:  # explicit 0755 folders: bwrap's own are 0700
                if str(d) not in made:
                    made.add(str(d))
                    args += ["--perms", "0755", "--dir", str(d)]
            args += ["--ro-bind", path, path]
        for path in self._hidden:  # the host's installed packages: an empty read-only folder in their place
            args += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
        args += ["--perms", "1777", "--size", str(limits.tmp_size), "--tmpfs", "/tmp"]  # writable by the slot's uid
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--perms", "1777", "--size", str(limits.tmp_size), "--tmpfs", "/dev/shm"]  # multiprocessing's
        args += ["--remount-ro", "/", "--chdir", "/tmp"]  # the root tmpfs: in a user namespace it would be writable
        if self.as_root:
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", self.setpriv]
            args += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
            args += ["--no-new-privs"]
        else:
            args += ["--"]
        return [*args, self.python, "-I", "-S", "-c", program]

    def run(self, program: str, stdin: bytes, limits: Limits, watch: Watch | None = None) -> RunResult:
        uid = self._uids.take() if self._uids is not None else None
        cgroup = None
        try:
            if self.mode != "rlimits":
                own = uid if uid is not None else f"{os.getpid()}.{next(self._names)}"
                name = f"{cgroups.PREFIX}{own}"
                cgroup = cgroups.RunCgroup(self._cgroups, name, limits)
                if watch is not None:
                    watch.attach(cgroup)
            # bwrap itself gets an empty environment too: its own, as the sandbox's pid 1, is readable in /proc/1/
            # environ from inside when it runs as the same user (not as root)
            with _filter_pipe(self._filter) as fd:
                argv = cgroups.wrap(self.argv(program, limits, uid, fd), cgroup)
                stop = functools.partial(_stop, cgroup=cgroup)
                return run_capped(
                    argv, stdin, wall=limits.wall, cap=limits.output, env={}, pass_fds=_fds(fd), watch=watch, stop=stop
                )
        except OSError as err:
            raise SandboxError(f"could not start {self.bwrap}: {err}") from err
        finally:
            if cgroup is not None:
                cgroup.remove()  # raises SandboxError if it will not empty: the uid is then never reused
            if uid is not None:
                self._uids.give_back(uid)


def _stop(proc: subprocess.Popen, cgroup: cgroups.RunCgroup | None = None) -> None:
    """End a run and wait until nothing of it is left: SIGKILL bwrap's child (the init of the run's PID namespace,
    whose death kills every process in it) and wait for bwrap, which reaps it only once the kernel has reaped the
    whole namespace. Killing bwrap first would return before that, and the run's uid with processes still on it.
    A run whose CPU weight was lowered (it gave its slot back) gets the default again first, to die quickly."""
    if cgroup is not None:
        cgroup.restore_weight()
    for pid in _children(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(5.0)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _children(pid: int) -> list[int]:
    """The children of ``pid``: from /proc/<pid>/task/<pid>/children, or where the kernel has no such file
    (CONFIG_PROC_CHILDREN off) from every process's parent pid."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except FileNotFoundError:
        pass
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


@contextmanager
def _filter_pipe(data: bytes | None):
    """A pipe's read end holding ``data`` (a seccomp filter, far below a pipe's 64 KiB), closed on exit; None
    when there is no filter."""
    if data is None:
        yield None
        return
    read_end, write_end = os.pipe()
    try:
        try:
            os.write(write_end, data)
        finally:
            os.close(write_end)  # bwrap reads to the end of the pipe
        yield read_end
    finally:
        os.close(read_end)


def _fds(fd: int | None) -> tuple[int, ...]:
    return () if fd is None else (fd,)
