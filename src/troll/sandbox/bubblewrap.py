"""The local backend: bubblewrap (``bwrap``, the sandbox Flatpak uses) around an isolated Python interpreter.

What a run sees and may do:

- a root of its own: read-only ``/usr`` (with the ``/bin``, ``/lib``, ``/lib64`` links), read-only the interpreter's
  executable, its standard library and its shared library, a private writable ``/tmp`` (a tmpfs of
  ``Limits.tmp_size``), a fresh ``/proc`` and a minimal ``/dev``; nothing else of the host (no ``/etc``, no home,
  no checkout, no site-packages);
- new PID, network (loopback only, its own), IPC, UTS and cgroup namespaces, a new session, a cleared environment,
  ``python -I -S``; it dies with its parent (``--die-with-parent``) and the whole process group is killed at the
  wall-clock limit;
- as root: the program runs as an unused uid of its own per slot (``setpriv``, inside bwrap, with every capability
  dropped and ``no_new_privs``), because the kernel does not enforce RLIMIT_NPROC for uid 0; not as root: in a new
  user namespace (``--unshare-all``), which needs unprivileged user namespaces.

The rlimits themselves are set by the program's first statements, before any untrusted code (``_harness.py``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import sysconfig
import threading
from pathlib import Path

from troll.sandbox.backend import Limits, RunResult, Sandbox, SandboxError, SandboxUnavailable, run_capped

INSTALL_HINT = "install bubblewrap: `apt-get update && apt-get install -y bubblewrap` (as root)"
USERNS_HINT = (
    "bubblewrap needs unprivileged user namespaces when not run as root: `sysctl -w kernel.unprivileged_userns_clone=1`"
    " (Debian), `sysctl -w user.max_user_namespaces=15000`, or on Ubuntu 24.04 "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (as root), or run as root"
)
_SELF_TEST = "import os, sys; sys.stdout.write('sandbox-ok %d %d' % (os.getuid(), len(os.environ)))"


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


class BubblewrapSandbox(Sandbox):
    """The bwrap backend. Building it checks that a sandbox works (a self-test run) and raises
    :class:`SandboxUnavailable`, naming the fix, when none does: nothing is ever run without it.

    ``bwrap`` and ``setpriv`` are the binaries' paths; ``uid_base`` the first of the uids the slots run as when
    root (default: one of 2,000,000 + 64 k per process id, so that two trainers on one machine use different ones);
    ``check=False`` skips the self-test (tests of the argument list only)."""

    def __init__(
        self,
        *,
        bwrap: str | None = None,
        setpriv: str = "/usr/bin/setpriv",
        uid_base: int | None = None,
        check: bool = True,
    ):
        self.bwrap = bwrap or shutil.which("bwrap") or "/usr/bin/bwrap"
        self.setpriv = setpriv
        self.as_root = os.geteuid() == 0
        self.python, self._binds = interpreter_paths()
        self._uid_base = uid_base if uid_base is not None else 2_000_000 + (os.getpid() % 30_000) * 64
        self._free_uids: list[int] = []
        self._next_uid = self._uid_base
        self._lock = threading.Lock()
        if check:
            self.self_test()

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
        if result.returncode != 0 or len(words) != 3 or words[0] != "sandbox-ok":
            detail = result.stderr.decode(errors="replace").strip()[-500:]
            fix = INSTALL_HINT if self.as_root else USERNS_HINT
            raise SandboxUnavailable(f"the bubblewrap sandbox does not work here ({detail or 'no output'}): {fix}")
        if self.as_root and words[1] == "0":
            raise SandboxUnavailable("the sandboxed program still ran as uid 0; refusing to run untrusted code")

    def argv(self, program: str, limits: Limits, uid: int | None) -> list[str]:
        """The full command line of one run (``uid``: the uid to drop to, when root)."""
        args = [self.bwrap]
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
        args += ["--perms", "1777", "--size", str(limits.tmp_size), "--tmpfs", "/tmp"]  # writable by the slot's uid
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--remount-ro", "/", "--chdir", "/tmp"]  # the root tmpfs: in a user namespace it would be writable
        if self.as_root:
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", self.setpriv]
            args += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
            args += ["--no-new-privs"]
        else:
            args += ["--"]
        return [*args, self.python, "-I", "-S", "-c", program]

    def run(self, program: str, stdin: bytes, limits: Limits) -> RunResult:
        uid = self._take_uid() if self.as_root else None
        try:
            # bwrap itself gets an empty environment too: its own, as the sandbox's pid 1, is readable in /proc/1/
            # environ from inside when it runs as the same user (not as root)
            argv = self.argv(program, limits, uid)
            return run_capped(argv, stdin, wall=limits.wall, cap=limits.output, env={})
        except OSError as err:
            raise SandboxError(f"could not start {self.bwrap}: {err}") from err
        finally:
            if uid is not None:
                with self._lock:
                    self._free_uids.append(uid)

    def _take_uid(self) -> int:
        """A uid no account and no other running slot uses (each slot its own, so RLIMIT_NPROC bounds each)."""
        with self._lock:
            if self._free_uids:
                return self._free_uids.pop()
            while True:
                uid, self._next_uid = self._next_uid, self._next_uid + 1
                try:
                    pwd.getpwuid(uid)
                except KeyError:
                    return uid
