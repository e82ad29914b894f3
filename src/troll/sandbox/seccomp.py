"""A seccomp filter (classic BPF, built here from the kernel's ABI) that forbids new user namespaces.

Run as root, the sandbox drops each program to an unprivileged uid in the host's user namespace, where bubblewrap's
``--disable-userns`` does not apply (it needs a user namespace of bwrap's own). Without this filter the program
could ``unshare(CLONE_NEWUSER | CLONE_NEWNS)`` (``/usr/bin/unshare -Urm``), become root of a namespace of its own and
mount a tmpfs the size of half the host's RAM, outside every rlimit, or reach kernel code only namespace root
reaches. The filter makes ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` fail with EPERM, makes ``clone3`` (whose
flags sit behind a pointer a filter cannot read) fail with ENOSYS, so that the C library falls back to ``clone``,
refuses every system call of a foreign ABI (i386 on x86_64, x32), whose numbers differ, and refuses the kernel
keyrings (``add_key``, ``request_key``, ``keyctl``): a uid's keyring outlives the run, so one run could leave
data there for a later run on the same uid.

``struct seccomp_data`` (linux/seccomp.h): ``nr`` at byte 0, ``arch`` at 4, ``args[i]`` at 16 + 8 i (the low
32 bits first on these little-endian machines). Known machines: x86_64 and aarch64; elsewhere ``program()`` is None.
"""

from __future__ import annotations

import errno
import platform
import struct

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ, JGE, JSET = 0x15, 0x35, 0x45  # BPF_JMP | BPF_{JEQ,JGE,JSET} | BPF_K
RET = 0x06  # BPF_RET | BPF_K
ALLOW = 0x7FFF0000
ERRNO = 0x00050000
CLONE_NEWUSER = 0x10000000
X32_BIT = 0x40000000

# machine -> (AUDIT_ARCH_*, unshare, clone, clone3, (add_key, request_key, keyctl), whether x32 must be refused)
ARCHES = {
    "x86_64": (0xC000003E, 272, 56, 435, (248, 249, 250), True),
    "aarch64": (0xC00000B7, 97, 220, 435, (217, 218, 219), False),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one) as the bytes of ``struct sock_filter[]`` bubblewrap's
    ``--seccomp FD`` reads, or None for a machine it does not know. A jump goes ``jt`` or ``jf`` instructions
    past the next one."""
    known = ARCHES.get(machine or platform.machine())
    if known is None:
        return None
    arch, unshare, clone, clone3, keys, x32 = known
    eperm, enosys = ERRNO | errno.EPERM, ERRNO | errno.ENOSYS
    ops = [
        (LD_ABS, 4, 0, 0),  # 0: A = arch
        (JEQ, arch, 1, 0),  # 1: native -> 3
        (RET, eperm, 0, 0),  # 2: a foreign ABI: refused
        (LD_ABS, 0, 0, 0),  # 3: A = nr
        (JGE, X32_BIT if x32 else 0xFFFFFFFF, 0, 1),  # 4: x32 -> 5
        (RET, eperm, 0, 0),  # 5
        (JEQ, clone3, 0, 1),  # 6: clone3 -> 7
        (RET, enosys, 0, 0),  # 7
        (JEQ, unshare, 6, 0),  # 8: unshare -> 15
        (JEQ, clone, 5, 0),  # 9: clone -> 15
        (JEQ, keys[0], 3, 0),  # 10: the kernel keyrings (kept per uid after the run) -> 14
        (JEQ, keys[1], 2, 0),  # 11
        (JEQ, keys[2], 1, 0),  # 12
        (RET, ALLOW, 0, 0),  # 13
        (RET, eperm, 0, 0),  # 14
        (LD_ABS, 16, 0, 0),  # 15: A = low 32 bits of args[0] (the flags)
        (JSET, CLONE_NEWUSER, 0, 1),  # 16: CLONE_NEWUSER -> 17
        (RET, eperm, 0, 0),  # 17
        (RET, ALLOW, 0, 0),  # 18
    ]
    return b"".join(_op(code, k, jt, jf) for code, k, jt, jf in ops)
