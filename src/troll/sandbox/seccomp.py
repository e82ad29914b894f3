"""A seccomp filter (classic BPF, built here from the kernel's ABI) that forbids new user namespaces, the kernel
keyrings, reaching into other processes and, where no cgroup bounds a run, shared memory.

Run as root, the sandbox drops each program to an unprivileged uid in the host's user namespace, where bubblewrap's
``--disable-userns`` does not apply (it needs a user namespace of bwrap's own). Without this filter the program
could ``unshare(CLONE_NEWUSER | CLONE_NEWNS)`` (``/usr/bin/unshare -Urm``), become root of a namespace of its own and
mount a tmpfs the size of half the host's RAM, outside every rlimit, or reach kernel code only namespace root
reaches. The filter makes ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` fail with EPERM, makes ``clone3`` (whose
flags sit behind a pointer a filter cannot read) fail with ENOSYS, so that the C library falls back to ``clone``,
refuses every system call of a foreign ABI (i386 on x86_64, x32), whose numbers differ, and refuses:

- the kernel keyrings (``add_key``, ``request_key``, ``keyctl``): a uid's keyring outlives the run, so one run could
  leave data there for a later run on the same uid;
- ``ptrace``, ``process_vm_readv``/``writev`` and the pidfd calls: a stdio test's program runs as the same uid as the
  harness that forked it, and could otherwise read its memory or copy its result channel
  (``pidfd_getfd(pidfd_open(ppid))``) and report every test itself;
- signals to the sandbox's init and the harness (``kill``, ``tkill``, ``tgkill`` to pid 1 or 2, ``kill(-1)``) and
  ``setpgid`` into their process group (1 or 2), so that no program stops the harness;
- with ``block_shared_memory`` (the mode without a cgroup): ``shmget``, ``shmat``, ``memfd_create`` and
  ``memfd_secret``, memory that RLIMIT_AS does not count.

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

# machine -> (AUDIT_ARCH_*, unshare, clone, clone3, whether x32 must be refused)
ARCHES = {
    "x86_64": (0xC000003E, 272, 56, 435, True),
    "aarch64": (0xC00000B7, 97, 220, 435, False),
}
# refused always, by name -> (x86_64, aarch64) numbers: the kernel keyrings (kept per uid after the run), and every
# way to reach into another process of the same uid (the harness, from a program it forked): ptrace, cross-process
# memory access, and pidfds (``pidfd_getfd`` copies another process's descriptors)
ALWAYS = {
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "pidfd_open": (434, 434),
    "pidfd_getfd": (438, 438), "pidfd_send_signal": (424, 424),
}  # fmt: skip
# refused where no cgroup bounds a run's memory: shared memory that no per-process limit counts
SHARED_MEMORY = {"shmget": (29, 194), "shmat": (30, 196), "memfd_create": (319, 279), "memfd_secret": (447, 447)}


# the sandbox's own processes in its PID namespace: bwrap's init (pid 1, whose process group and session the harness
# shares) and the harness (pid 2); no program may signal them or join their process group, so none can stop the
# harness (a stdio test's program runs as its uid)
PROTECTED = (1, 2)
SIGNALS = {"kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131)}  # the pid (tgid) in args[0]
SETPGID = (109, 154)  # the process group in args[1]


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _assemble(ops: list[tuple]) -> bytes:
    """Classic BPF from ``(code, k, jt, jf)`` where a jump target may be a label (a str) placed as ``(label,)``."""
    at, placed = {}, []
    for op in ops:
        if len(op) == 1:
            at[op[0]] = len(placed)
        else:
            placed.append(op)
    out = []
    for pc, (code, k, jt, jf) in enumerate(placed):
        jt, jf = (at[j] - pc - 1 if isinstance(j, str) else j for j in (jt, jf))
        out.append(_op(code, k, jt, jf))
    return b"".join(out)


def program(machine: str | None = None, *, block_shared_memory: bool = False) -> bytes | None:
    """The filter for ``machine`` (default: this one) as the bytes of ``struct sock_filter[]`` bubblewrap's
    ``--seccomp FD`` reads, or None for a machine it does not know. ``block_shared_memory`` also refuses SysV
    shared memory and memfd (the mode without a cgroup)."""
    machine = machine or platform.machine()
    known = ARCHES.get(machine)
    if known is None:
        return None
    arch, unshare, clone, clone3, x32 = known
    column = 0 if machine == "x86_64" else 1
    refused = [numbers[column] for numbers in ALWAYS.values()]
    if block_shared_memory:
        refused += [numbers[column] for numbers in SHARED_MEMORY.values()]
    eperm, enosys = ERRNO | errno.EPERM, ERRNO | errno.ENOSYS
    ops = [
        (LD_ABS, 4, 0, 0),  # A = arch
        (JEQ, arch, 1, 0),  # native -> skip the next
        (RET, eperm, 0, 0),  # a foreign ABI: refused
        (LD_ABS, 0, 0, 0),  # A = nr
        (JGE, X32_BIT if x32 else 0xFFFFFFFF, "deny", 0),  # x32: refused
        (JEQ, clone3, 0, 1),  # clone3 -> ENOSYS (the C library falls back to clone)
        (RET, enosys, 0, 0),
        (JEQ, unshare, "flags", 0),
        (JEQ, clone, "flags", 0),
        *[(JEQ, numbers[column], "target", 0) for numbers in SIGNALS.values()],
        (JEQ, SETPGID[column], "group", 0),
        *[(JEQ, nr, "deny", 0) for nr in refused],
        (RET, ALLOW, 0, 0),
        ("flags",),
        (LD_ABS, 16, 0, 0),  # A = low 32 bits of args[0] (the flags)
        (JSET, CLONE_NEWUSER, "deny", "allow"),
        ("target",),
        (LD_ABS, 16, 0, 0),  # A = args[0], the pid (an int: its low 32 bits)
        *[(JEQ, pid, "deny", 0) for pid in PROTECTED],
        (JEQ, 0xFFFFFFFF, "deny", "allow"),  # -1: every process the caller may signal
        ("group",),
        (LD_ABS, 24, 0, 0),  # A = args[1], the process group
        *[(JEQ, pid, "deny", 0) for pid in PROTECTED],
        ("allow",),
        (RET, ALLOW, 0, 0),
        ("deny",),
        (RET, eperm, 0, 0),
    ]
    return _assemble(ops)
