"""The backend interface every sandbox implements, its limits, and the capped pipe reader the local backends share.

A backend runs one Python program (source text) on a given stdin under :class:`Limits` and returns what came out
(:class:`RunResult`); it never interprets that output. Scoring (``scoring.py``) builds the program (the harness plus
the model's code) and reads the result, so a second backend, e.g. a remote SandboxFusion server, only needs
:meth:`Sandbox.run`. A backend that cannot run anything safely raises :class:`SandboxUnavailable` when it is built;
one run that fails for a reason of the sandbox itself (not of the program) raises :class:`SandboxError`.
"""

from __future__ import annotations

import abc
import math
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20


class SandboxUnavailable(RuntimeError):
    """No working sandbox: the message names the fix. Untrusted code is never run without one (fail closed)."""


class SandboxError(RuntimeError):
    """One run failed for a reason of the sandbox (it did not start, or its harness never reported), not of the
    program; scoring turns it into ``None`` (unscorable)."""


@dataclass(frozen=True)
class Limits:
    """What one run may use. ``wall`` and ``cpu`` in seconds (CPU time is per process, enforced by RLIMIT_CPU);
    ``memory`` is the address space of each process (RLIMIT_AS), ``run_memory`` all the memory of the run at once
    (its cgroup: processes, /tmp, /dev/shm, shared memory), ``file_size`` the largest file it may write
    (RLIMIT_FSIZE), ``tmp_size`` the size of each of its private writable /tmp and /dev/shm, ``open_files``
    RLIMIT_NOFILE, ``processes`` RLIMIT_NPROC (the sandbox's own user) and the cgroup's pids, ``output`` the bytes
    read from each of stdout and stderr (the rest is discarded and the run stopped)."""

    wall: float = 10.0
    cpu: int = 10
    memory: int = GIB
    file_size: int = 16 * MIB
    tmp_size: int = 64 * MIB
    open_files: int = 64
    processes: int = 32
    output: int = MIB
    run_memory: int = GIB

    def __post_init__(self):
        names = ("wall", "cpu", "memory", "run_memory", "file_size", "tmp_size", "open_files", "processes", "output")
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")
        if not isinstance(self.cpu, int):
            raise ValueError(f"Limits.cpu must be a whole number of seconds (RLIMIT_CPU), got {self.cpu!r}")

    def rlimits(self) -> dict[str, int]:
        """The resource limits the program's process sets on itself before any untrusted code runs."""
        return {
            "RLIMIT_CPU": self.cpu,
            "RLIMIT_AS": self.memory,
            "RLIMIT_FSIZE": self.file_size,
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_CORE": 0,
        }


@dataclass(frozen=True)
class RunResult:
    """What one run gave: its stdout and stderr (each at most ``Limits.output`` bytes), the exit status (negative:
    killed by that signal), whether the wall-clock limit or the output cap stopped it, and its wall time."""

    stdout: bytes
    stderr: bytes
    returncode: int
    timed_out: bool
    truncated: bool
    seconds: float


class Sandbox(abc.ABC):
    """Runs untrusted Python: ``run(program, stdin, limits)`` executes the source ``program`` with an isolated
    interpreter (no site-packages, no environment, no network, no view of the host's files) reading ``stdin``.

    ``mode`` says what bounds a run (docs/sandbox.md): "cgroup-v2" or "cgroup-v1" (a cgroup per run), "rlimits"
    (per-process limits only), or "external" (a backend that runs elsewhere and bounds runs itself)."""

    mode: str = "external"

    @abc.abstractmethod
    def run(self, program: str, stdin: bytes, limits: Limits, watch: Watch | None = None) -> RunResult:
        """Run ``program`` to completion or until a limit stops it; raise :class:`SandboxError` if the sandbox
        itself failed. ``watch`` (if given) sees stdout as it arrives and may end the run earlier."""


class Watch(abc.ABC):
    """Follows a run's stdout as it arrives, to end the run at a deadline of its own (the scoring's per-test clock,
    kept outside the program)."""

    @abc.abstractmethod
    def feed(self, data: bytes, now: float) -> None:
        """``data`` arrived on stdout at monotonic time ``now``."""

    @abc.abstractmethod
    def deadline(self) -> float:
        """The monotonic time at which the run must be stopped (``math.inf``: none yet)."""

    poll = math.inf  # seconds between calls of :meth:`tick` while the run lasts (math.inf: no calls)

    def tick(self, now: float) -> None:  # noqa: B027 (a hook: most watches need none)
        """Called at least every :attr:`poll` seconds while the run lasts, at monotonic time ``now``."""

    def attach(self, cgroup) -> None:  # noqa: B027 (a hook: most watches need none)
        """The run's cgroup (:class:`troll.sandbox.cgroups.RunCgroup`), given before the run starts by a backend
        that makes one."""


def run_capped(
    argv: list[str],
    stdin: bytes,
    *,
    wall: float,
    cap: int,
    env: dict[str, str] | None = None,
    pass_fds=(),
    watch: Watch | None = None,
    stop=None,
) -> RunResult:
    """Run ``argv`` in a new session with the environment ``env`` (None: this process's) and the descriptors
    ``pass_fds`` besides 0-2, feed it ``stdin``, read at most ``cap`` bytes of each of stdout and stderr, and
    end it once it exits, the wall time ``wall`` or the ``watch``'s deadline passes or an output passes ``cap``:
    ``stop(proc)`` (default: SIGKILL its whole process group and reap it).

    Uses no ``preexec_fn`` (not safe with threads): scoring calls this from several threads at once."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
        pass_fds=pass_fds,
    )
    try:
        out, err, timed_out, truncated = _pump(proc, stdin, start + wall, cap, watch)
        if not (timed_out or truncated):
            try:
                proc.wait(max(0.0, start + wall - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        (stop or _kill_group)(proc)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
    return RunResult(bytes(out), bytes(err), proc.returncode, timed_out, truncated, time.monotonic() - start)


def _pump(proc: subprocess.Popen, stdin: bytes, wall: float, cap: int, watch: Watch | None) -> tuple:
    """Write ``stdin`` to the process and read its stdout and stderr until both end, the monotonic clock passes
    ``wall`` or the watch's deadline (timed out) or one passes ``cap`` bytes (truncated): (stdout, stderr,
    timed_out, truncated)."""
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    result = [out[proc.stdout.fileno()], out[proc.stderr.fileno()], False, False]
    pending = memoryview(stdin)
    with selectors.DefaultSelector() as sel:
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            if watch is not None:
                watch.tick(time.monotonic())
            left = (wall if watch is None else min(wall, watch.deadline())) - time.monotonic()
            if left <= 0:
                result[2] = True
                return tuple(result)
            for key, _ in sel.select(left if watch is None else min(left, watch.poll)):
                if key.fileobj is proc.stdin:
                    try:
                        pending = pending[os.write(key.fd, pending[: 1 << 16]) :]
                    except BrokenPipeError:  # the program stopped reading: the rest of its input is dropped
                        pending = pending[:0]
                    except BlockingIOError:
                        continue
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk, buf = os.read(key.fd, 1 << 16), out[key.fd]
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if watch is not None and key.fileobj is proc.stdout:
                    watch.feed(chunk[: max(0, cap - len(buf))], time.monotonic())
                over = len(buf) + len(chunk) > cap
                buf += chunk[: cap - len(buf)]
                if over:
                    result[3] = True
                    return tuple(result)
    return tuple(result)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group the run was started in (the sandbox's monitor; the sandbox itself dies with it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
