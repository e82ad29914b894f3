"""One writer per cell across machines: a lease file and a heartbeat, on any shared file system (NFS included).

Why not the folder lock of :mod:`troll.runs.folder`: it is ``flock``, which NFS may not honour across clients (and an
error there reads as "free"). A cluster study needs ownership that holds wherever a cell runs, so a cell's attempt
(one run of :func:`troll.study.cell.run_cell`, identified by a random attempt id) owns the cell through files beside
its folder ``<cell>``:

- ``<cell>.lease``: created with ``O_CREAT | O_EXCL`` (atomic on a local disk and on NFSv3 or later), holding the
  owner's attempt id, host, boot id and pid. Whoever creates it owns the cell; nobody else writes it.
- ``<cell>.beat-<attempt>``: the owner's heartbeat, a counter rewritten every ``beat_s`` seconds by a temporary file
  and a rename (atomic; NFS's close-to-open consistency makes the next ``open`` of another client read the new
  counter, whatever its attribute cache says about mtimes).

A contender that finds the lease taken watches the heartbeat on its own clock (no clocks are compared across hosts):

- a counter that moves proves a live owner: the contender gives up (:class:`Busy`);
- a counter that stays still for ``stale_s`` seconds (or a lease whose owner ran on this host and whose process is
  gone, which is known at once) is stale: the contender removes it and creates its own.

Removing a stale lease is guarded by ``<cell>.break-<attempt>`` (again ``O_EXCL``): of all contenders that judged
attempt A stale, one removes A's lease, after reading under that guard that the lease still names A; the others find
a new lease or none, and retry creating it with ``O_EXCL``. The owner checks at every beat that the lease still names
it (:meth:`Lease.beat` returns False otherwise, and the caller stops its cell). What this assumes: a live owner never
pauses longer than ``stale_s`` between beats (a process stopped longer than that loses the cell, and is told so at its
next beat).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from troll.runs.folder import Busy as FolderBusy

BEAT_S = 10.0  # seconds between heartbeats
STALE_S = 60.0  # a heartbeat still for this long is a dead owner's (6 missed beats: slow NFS writes are not deaths)
_POLL_S = 0.1


class Busy(FolderBusy):
    """The cell is owned by a live attempt elsewhere (a :class:`troll.runs.Busy`: a folder in use)."""


def lease_path(folder: Path) -> Path:
    folder = Path(folder)
    return folder.with_name(folder.name + ".lease")


def _beat_path(lease: Path, attempt: int) -> Path:
    return lease.with_name(lease.name.removesuffix(".lease") + f".beat-{attempt}")


def _break_path(lease: Path, key: str) -> Path:
    return lease.with_name(lease.name.removesuffix(".lease") + f".break-{key}")


def manifest_entries(rel: str) -> tuple[str, ...]:
    """The names a cell's lease writes beside the cell folder ``rel``, as a study manifest lists them."""
    return (f"{rel}.lease", f"{rel}.beat-{{n}}", f"{rel}.break-{{n}}")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _alive(pid: int, start: str | None) -> bool:
    """Whether the process ``pid`` started at ``start`` still runs on this host (a reused pid is another)."""
    if Path("/proc").is_dir():
        now = _start_time(pid)
        return now is not None and (start is None or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_attempt() -> int:
    return secrets.randbits(62)


@dataclass(frozen=True)
class Holder:
    """What a lease file says of its owner."""

    attempt: int
    host: str
    boot: str
    pid: int
    start: str | None

    def gone_here(self) -> bool:
        """True when the owner ran on this host (same boot) and its process has ended: stale without waiting."""
        return self.here() and not _alive(self.pid, self.start)

    def here(self) -> bool:
        return self.host == socket.gethostname() and self.boot == _boot_id()

    def runs_here(self) -> bool:
        return self.here() and _alive(self.pid, self.start)


def read_holder(lease: Path) -> Holder | None:
    """The owner a lease names; None when there is no lease or it is not (yet) whole."""
    try:
        data = json.loads(Path(lease).read_text())
        return Holder(int(data["attempt"]), str(data["host"]), str(data["boot"]), int(data["pid"]), data["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _read_beat(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def probably_live(folder: Path, stale_s: float = STALE_S) -> Holder | None:
    """The owner of a cell when it looks alive without waiting (its process runs here, or its heartbeat file changed
    in the last ``stale_s`` seconds by this host's clock); None otherwise. For a quick look before starting a cell;
    :meth:`Lease.acquire` is the one that decides."""
    lease = lease_path(folder)
    holder = read_holder(lease)
    if holder is None or holder.gone_here():
        return None
    if holder.here():
        return holder
    try:
        age = time.time() - _beat_path(lease, holder.attempt).stat().st_mtime
    except OSError:
        return None
    return holder if age < stale_s else None


class Lease:
    """An attempt's ownership of one cell (module docstring). ``acquire`` takes it, ``beat`` keeps it, ``release``
    gives it back."""

    def __init__(self, folder: Path, *, attempt: int | None = None, beat_s: float = BEAT_S, stale_s: float = STALE_S):
        self.path = lease_path(folder)
        self.attempt = new_attempt() if attempt is None else attempt
        self.beat_s, self.stale_s = beat_s, stale_s
        self._count, self._last = 0, 0.0
        self.held = False

    @property
    def beat_file(self) -> Path:
        return _beat_path(self.path, self.attempt)

    def _record(self) -> bytes:
        pid = os.getpid()
        data = {"attempt": self.attempt, "host": socket.gethostname(), "boot": _boot_id(), "pid": pid,
                "start": _start_time(pid)}  # fmt: skip
        return (json.dumps(data) + "\n").encode()

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, self._record())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.held = True
        self._write_beat()
        return True

    def acquire(self) -> None:
        """Own the cell, taking over a stale lease (at most ``stale_s`` seconds of watching); :class:`Busy` when
        a live attempt owns it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        seen: tuple[str, str | None] | None = None  # (whose lease, its heartbeat) as first seen
        since = time.monotonic()
        while not self._create():
            holder = read_holder(self.path)
            key = str(holder.attempt) if holder else _inode_key(self.path)
            if key is None:
                continue  # removed since: try creating again
            beat = _read_beat(_beat_path(self.path, holder.attempt)) if holder else None
            if seen is None or seen[0] != key:
                seen, since = (key, beat), time.monotonic()
            elif beat != seen[1] or (holder is not None and holder.runs_here()):
                # its heartbeat moved, or its process runs on this host: a live owner
                raise Busy(f"{self.path.with_suffix('')} is in use: attempt {key} on {holder.host} (pid {holder.pid}) "
                           "keeps its heartbeat; it is left to it.")  # fmt: skip
            stale = (holder is not None and holder.gone_here()) or time.monotonic() - since >= self.stale_s
            if stale:
                self._break(key, holder)
                seen = None
            else:
                time.sleep(min(_POLL_S * 5, self.beat_s / 2))

    def _break(self, key: str, holder: Holder | None) -> None:
        guard = _break_path(self.path, key)
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            time.sleep(_POLL_S)  # another contender is removing it
            return
        os.close(fd)
        try:
            now = read_holder(self.path)
            if (str(now.attempt) if now else _inode_key(self.path)) == key:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                if holder is not None:
                    _beat_path(self.path, holder.attempt).unlink(missing_ok=True)
        finally:
            guard.unlink(missing_ok=True)

    def _write_beat(self) -> None:
        self._count += 1
        tmp = self.beat_file.with_name(f".{self.beat_file.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(f"{self._count}\n")
            os.replace(tmp, self.beat_file)
        except FileNotFoundError:  # the temporary file was removed as a leftover (a study resumed meanwhile)
            tmp.unlink(missing_ok=True)  # this beat is skipped; the next one writes (stale_s spans several beats)
            return
        self._last = time.monotonic()

    def beat(self, *, force: bool = False) -> bool:
        """Renew the heartbeat when ``beat_s`` has passed (or ``force``); False when the lease was taken over (seen
        at the renewal: callers may call this as often as they like, the files are touched once per ``beat_s``)."""
        if not force and time.monotonic() - self._last < self.beat_s:
            return self.held
        holder = read_holder(self.path)
        if holder is None or holder.attempt != self.attempt:
            self.held = False
            return False
        if force or time.monotonic() - self._last >= self.beat_s:
            self._write_beat()
        return True

    def release(self) -> None:
        """Give the cell back (only the lease this attempt still owns is removed)."""
        if not self.held:
            return
        holder = read_holder(self.path)
        if holder is not None and holder.attempt == self.attempt:
            self.path.unlink(missing_ok=True)
        self.beat_file.unlink(missing_ok=True)
        self.held = False


def _inode_key(path: Path) -> str | None:
    """A key for a lease whose content is not whole (its creator died between create and write): its inode."""
    try:
        return f"0{os.stat(path).st_ino}"
    except OSError:
        return None
