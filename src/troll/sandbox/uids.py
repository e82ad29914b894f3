"""The uids the sandbox runs programs as (when root), unique on the machine: across slots, sandboxes and processes.

The kernel does not enforce RLIMIT_NPROC for uid 0, so as root every run drops to an unused uid of its own, and two
runs must never share one: a run's processes count against the process limit of every other run on that uid, and
could signal its processes. Uids are handed out in blocks of :data:`BLOCK`; a block belongs to the process that holds
an exclusive ``flock`` on its lock file under :data:`LOCK_DIR` (a root-owned directory), for as long as the
:class:`UidPool` that took it lives. The kernel releases the lock when the process ends, however it ends, and with
it the block. A block is taken only if no account and no running process has a uid in it.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import stat
import threading

from troll.sandbox.backend import SandboxUnavailable

BLOCK = 64
FIRST = 2_000_000  # above the uids of accounts and of the usual container subordinate ranges (100000 + 65536 k)
BLOCKS = 30_000  # blocks searched: uids 2,000,000 to 3,920,000
LOCK_DIR = "/run/troll-sandbox"


def lock_dir(path: str = LOCK_DIR) -> str:
    """``path``, created root-owned 0755 if missing; refused if anyone but root could write in it (a lock there
    could then be faked or removed by another user)."""
    os.makedirs(path, mode=0o755, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise SandboxUnavailable(
            f"{path} must be a directory owned by root and writable only by it (it holds the sandbox's uid locks): "
            f"`rm -rf {path}` as root and let the sandbox make it again"
        )
    return path


def processes_in(lo: int, hi: int) -> bool:
    """Whether any running process has a real, effective or saved uid in [lo, hi)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                uids = next(line.split()[1:4] for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if any(lo <= int(u) < hi for u in uids):
            return True
    return False


class UidPool:
    """The uids of one sandbox: blocks taken as it needs them (the first at ``start`` rounded down to a block, or
    the next free one), a uid handed to one run at a time (:meth:`take`, :meth:`give_back`). ``close`` (or the
    process ending) releases the blocks."""

    def __init__(self, start: int = FIRST, *, directory: str = LOCK_DIR):
        if isinstance(start, bool) or not isinstance(start, int) or start < BLOCK:
            raise ValueError(f"uid_base must be a uid of at least {BLOCK} (the first to try), got {start!r}")
        self.directory = lock_dir(directory)
        self.next_block = start - start % BLOCK
        self.blocks: list[tuple[int, int]] = []  # (first uid, lock fd)
        self._free: list[int] = []
        self._lock = threading.Lock()

    @property
    def uids(self) -> list[range]:
        """The uid ranges this pool holds."""
        return [range(first, first + BLOCK) for first, _ in self.blocks]

    def take(self) -> int:
        with self._lock:
            if not self._free:
                self._claim()
            return self._free.pop()

    def give_back(self, uid: int) -> None:
        """Return ``uid`` once nothing of its run is left (the caller has waited for that)."""
        with self._lock:
            self._free.append(uid)

    def _claim(self) -> None:
        for _ in range(BLOCKS):
            first, self.next_block = self.next_block, self.next_block + BLOCK
            fd = os.open(os.path.join(self.directory, f"uids-{first}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            free = [u for u in range(first, first + BLOCK) if not _account(u)]
            if len(free) < BLOCK // 2 or processes_in(first, first + BLOCK):
                os.close(fd)
                continue
            self.blocks.append((first, fd))
            self._free.extend(reversed(free))
            return
        raise SandboxUnavailable(f"no free block of {BLOCK} uids for the sandbox in {BLOCKS} tried")

    def close(self) -> None:
        with self._lock:
            for _, fd in self.blocks:
                os.close(fd)
            self.blocks, self._free = [], []

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- at interpreter exit
            pass


def reclaim(uids, clean, *, directory: str = LOCK_DIR) -> None:
    """Call ``clean(uid)`` for each of ``uids`` whose block no one holds, holding the block's lock meanwhile (so no
    sandbox takes it halfway): what a scorer that was killed left on its uids is removed."""
    blocks: dict[int, list[int]] = {}
    for uid in uids:
        blocks.setdefault(uid - uid % BLOCK, []).append(uid)
    directory = lock_dir(directory)
    for first, members in sorted(blocks.items()):
        fd = os.open(os.path.join(directory, f"uids-{first}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a live sandbox holds it: its runs are its own
        try:
            for uid in members:
                clean(uid)
        finally:
            os.close(fd)


def _account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False
