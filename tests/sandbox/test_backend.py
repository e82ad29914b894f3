"""The backend layer without bubblewrap: the capped pipe reader every local backend runs its command with (a
trusted command here), the limits' validation, and the bubblewrap command line (no run)."""

from __future__ import annotations

import errno
import os
import struct
import sys
import time

import pytest
from conftest import process_state

from troll.sandbox import BubblewrapSandbox, Limits, seccomp
from troll.sandbox.backend import run_capped


def test_input_larger_than_a_pipe_and_both_outputs():
    code = "import sys; d = sys.stdin.buffer.read(); print(len(d)); sys.stderr.write('e' * 10)"
    result = run_capped([sys.executable, "-c", code], b"x" * (1 << 20), wall=10, cap=100)
    assert (result.stdout, result.stderr, result.returncode) == (b"1048576\n", b"e" * 10, 0)
    assert not result.timed_out and not result.truncated


def test_the_output_cap_is_exact():
    exact = run_capped([sys.executable, "-c", "print('x' * 99)"], b"", wall=10, cap=100)
    assert len(exact.stdout) == 100 and not exact.truncated
    over = run_capped([sys.executable, "-c", "print('x' * 100)"], b"", wall=10, cap=100)
    assert over.stdout == b"x" * 100 and over.truncated


def test_the_wall_clock_kills_the_whole_group():
    code = "import subprocess, time; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); time.sleep(30)"
    start = time.monotonic()
    result = run_capped([sys.executable, "-c", code], b"", wall=1.0, cap=100)
    assert result.timed_out and result.returncode == -9 and time.monotonic() - start < 3
    child = int(result.stdout)
    time.sleep(0.1)
    assert process_state(child) in ("Z", ""), "the program's child outlived the run"


def test_a_program_that_ignores_its_input():
    result = run_capped([sys.executable, "-c", "pass"], b"abc" * 100_000, wall=10, cap=100)
    assert result.returncode == 0 and not result.timed_out


def test_limits_are_checked():
    with pytest.raises(ValueError, match="Limits.memory"):
        Limits(memory=0)
    with pytest.raises(ValueError, match="Limits.cpu must be a whole number"):
        Limits(cpu=1.5)
    with pytest.raises(ValueError, match="Limits.wall"):
        Limits(wall=True)


def test_the_command_line_binds_no_checkout_or_home():
    sandbox = BubblewrapSandbox(check=False)
    argv = sandbox.argv("pass", Limits(), 2_000_123)
    binds = [argv[i + 2] for i, a in enumerate(argv) if a == "--ro-bind"]
    here = os.path.dirname(os.path.abspath(__file__))
    assert not any(here.startswith(b) or b == os.path.expanduser("~") for b in binds), binds
    assert "--die-with-parent" in argv and "--clearenv" in argv and argv[-4:-1] == ["-I", "-S", "-c"]
    if os.geteuid() == 0:
        assert "--reuid=2000123" in argv and "--no-new-privs" in argv


def run_filter(code: bytes, arch: int, nr: int, arg0: int = 0, arg1: int = 0) -> int:
    """A classic-BPF interpreter for the instructions the filter uses, on one ``struct seccomp_data``."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, arg1, 0, 0, 0, 0)
    ops = [struct.unpack("=HBBI", code[i : i + 8]) for i in range(0, len(code), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = ops[pc]
        if op == seccomp.RET:
            return k
        if op == seccomp.LD_ABS:
            acc, pc = struct.unpack_from("=I", data, k)[0], pc + 1
            continue
        taken = {seccomp.JEQ: acc == k, seccomp.JGE: acc >= k, seccomp.JSET: bool(acc & k)}[op]
        pc += 1 + (jt if taken else jf)


def test_the_seccomp_filter_refuses_user_namespaces_and_keyrings():
    sandbox = BubblewrapSandbox(check=False)
    argv = sandbox.argv("pass", Limits(), 2_000_123, seccomp_fd=7)
    assert argv[1:3] == ["--seccomp", "7"]
    assert seccomp.program("sparc") is None
    allow, eperm, enosys = seccomp.ALLOW, seccomp.ERRNO | errno.EPERM, seccomp.ERRNO | errno.ENOSYS
    newuser, newnet, fork_flags = 0x10000000, 0x40000000, 0x01200011  # fork_flags: glibc's fork()
    for machine, nrs in {
        "x86_64": (272, 56, 435, 248, 249, 250, 0, 57),
        "aarch64": (97, 220, 435, 217, 218, 219, 63),
    }.items():
        code = seccomp.program(machine)
        arch = seccomp.ARCHES[machine][0]
        unshare, clone, clone3, *keys, read = nrs[:7]
        assert run_filter(code, arch, unshare, newuser) == eperm
        assert run_filter(code, arch, unshare, newuser | newnet) == eperm
        assert run_filter(code, arch, unshare, newnet) == allow  # refused by the kernel itself (no capability)
        assert run_filter(code, arch, clone, newuser | 17) == eperm
        assert run_filter(code, arch, clone, fork_flags) == allow
        assert run_filter(code, arch, clone3) == enosys
        assert all(run_filter(code, arch, nr) == eperm for nr in keys)
        assert run_filter(code, arch, read) == allow
        column = 0 if machine == "x86_64" else 1
        others = [nrs[column] for nrs in seccomp.ALWAYS.values()]
        shared = [nrs[column] for nrs in seccomp.SHARED_MEMORY.values()]
        assert all(run_filter(code, arch, nr) == eperm for nr in others)  # ptrace, pidfds, process_vm_*
        assert all(run_filter(code, arch, nr) == allow for nr in shared)  # bounded by the run's cgroup
        blocking = seccomp.program(machine, block_shared_memory=True)
        assert all(run_filter(blocking, arch, nr) == eperm for nr in shared + others)
        assert run_filter(blocking, arch, clone, newuser | 17) == eperm
        assert run_filter(blocking, arch, clone, fork_flags) == allow and run_filter(blocking, arch, read) == allow
        for name, nrs in seccomp.SIGNALS.items():  # the sandbox's init and harness, and everyone, cannot be signalled
            nr = nrs[column]
            assert [run_filter(code, arch, nr, pid) for pid in (1, 2, -1 & 0xFFFFFFFF)] == [eperm] * 3, name
            assert run_filter(code, arch, nr, 3) == allow and run_filter(code, arch, nr, 0) == allow, name
        setpgid = seccomp.SETPGID[column]
        assert run_filter(code, arch, setpgid, 0, 1) == eperm and run_filter(code, arch, setpgid, 0, 2) == eperm
        assert run_filter(code, arch, setpgid, 0, 0) == allow and run_filter(code, arch, setpgid, 0, 7) == allow
        assert run_filter(code, 0x40000003, 1) == eperm  # i386 on x86_64: a foreign ABI
    x86 = seccomp.program("x86_64")
    assert run_filter(x86, 0xC000003E, 0x40000000 | 272, newuser) == eperm  # x32
