"""A run folder knows what it wrote: the rules of resume, overwrite and refusal for every ``troll`` command.

Each command (``troll train``, ``troll compare``, ``troll tce train``, ``troll study``, ``troll tce study``) writes
into its folder, before anything else, a manifest (:data:`MANIFEST`, JSON, written atomically) that names the
command and what it writes there:

- ``files``: relative paths of the files it writes (``config.json``), folders it owns whole (``checkpoint-{n}/``,
  ``model/``; a trailing ``/``) and numbered names (``{n}``: a whole number, so ``checkpoint-{n}.pt`` is the
  command's and ``checkpoint-backup/`` or ``checkpoint-notes.txt`` are not);
- ``runs``: sub-folders that are run folders of their own (a study's cells, a comparison's runs), each with its
  own manifest, and checked by it.

The temporary file of an atomic write of one of those names (``.NAME.tmp-PID``, :func:`troll.runs.files.write_json`)
is the command's too: it is removed when the folder is started or resumed again, so a kill at any instant leaves
a folder that the next start or resume takes up (before the manifest exists, the manifest's own temporary file and
that of the first config.json count as the command's).

The rules (:func:`check_folder`, which touches nothing):

- a missing or empty folder, or one that holds only the command's leftovers of a start killed before its first
  config.json was whole, is started anew (with ``--resume`` too: there is nothing to continue);
- a folder of another command is never continued nor replaced, whatever the flags;
- a folder of this command is continued with ``--resume``; ``--overwrite`` replaces it only when everything in it
  is the command's own (:func:`foreign` lists the rest, and the command refuses with that list); without either
  flag it is refused;
- a folder holding anything else is refused.

One process at a time: :func:`begin` (and :func:`clear`) take an exclusive lock on the folder for the process that
writes it, :func:`release` gives it back when the command ends, and the operating system drops it when the process
dies, however it dies. While another live process holds a folder, :func:`check_folder` refuses it (so ``--resume``
never runs a second writer beside the first, and ``--overwrite`` never deletes a run that is still going), and
:func:`begin` and :func:`clear` refuse it too. The lock is ``flock`` on the folder itself: nothing is written for
it, and a folder a killed process held is free at once. Where the file system has no ``flock`` (Windows; some
network mounts) there is no lock and the other rules still hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from troll.runs.files import (
    CHECKPOINT_FILE,
    COMPARE,
    CONFIG_FILE,
    METRICS_FILE,
    PLOTS_FILE,
    STUDY,
    SUMMARY_FILE,
    TCE_STUDY,
    TCE_TRAIN,
    TRAIN,
    VIDEO_FILE,
    UsageError,
    check_out_path,
    write_json,
)

try:
    import fcntl
except ImportError:  # Windows: no flock, no lock (see the module docstring)
    fcntl = None

MANIFEST = ".troll-run.json"
_TMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")

# What each command writes at the top of its folder (the manifest's ``files``); the sub-runs are listed per folder.
RUN_FILES = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, PLOTS_FILE)
LAYOUTS: dict[str, tuple[str, ...]] = {
    TRAIN: (*RUN_FILES, "model/", "checkpoint-{n}/"),
    TCE_TRAIN: (*RUN_FILES, CHECKPOINT_FILE.format("{n}"), "checkpoint-{n}.zip", VIDEO_FILE),  # video: troll tce render
    COMPARE: (CONFIG_FILE, "compare.png", "compare.md"),
    STUDY: (CONFIG_FILE, "study.json", "study.md", "study.png"),
    TCE_STUDY: (CONFIG_FILE, "study.json", "study.md", "study.png"),
}


# ---------------------------------------------------------------------------------------------- one writer


_HELD: dict[str, int] = {}  # real folder path -> descriptor of the open folder whose lock this process holds
_WAIT_S = 1.0  # how long hold() waits out another process's probe (busy() holds its lock for microseconds)


def _key(out: Path) -> str:
    return os.path.realpath(out)


class Busy(UsageError):
    """The folder is held by another live process (:func:`hold`, :func:`check_free`)."""


def _forget_in_child() -> None:
    """A forked child does not hold its parent's folders: close its copies of their descriptors (closing, not
    unlocking, which would free the parent's lock too)."""
    fds = list(_HELD.values())
    _HELD.clear()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _open_locked(out: Path, *, shared: bool = False, wait_s: float = 0.0) -> int | None:
    """A descriptor of ``out`` with its lock taken (exclusive, or ``shared`` for a probe), trying for ``wait_s``
    seconds; None when another process holds it. A file system without flock counts as free (the descriptor then
    holds no lock). FileNotFoundError when the folder is gone."""
    fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.02)
        except OSError:  # e.g. ENOLCK on a network mount: no lock to be had
            return fd


def _held_here(out: Path) -> bool:
    """True when this process holds the lock of the folder now at ``out`` (not of one deleted since)."""
    fd = _HELD.get(_key(out))
    if fd is None:
        return False
    try:
        mine, now = os.fstat(fd), os.stat(out)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


def busy(out: Path) -> bool:
    """True when another live process holds the folder ``out`` (see the module docstring). Touches nothing."""
    out = Path(out)
    if fcntl is None or not out.is_dir() or _held_here(out):
        return False
    try:
        fd = _open_locked(out, shared=True)  # shared: two probes never refuse each other
    except FileNotFoundError:  # deleted since: nobody's
        return False
    if fd is None:
        return True
    os.close(fd)  # closing gives the probe's lock back
    return False


def _busy_error(out: Path, action: str) -> Busy:
    return Busy(
        f"{out} is in use: another process is still writing there (a run, study or comparison that has not ended). "
        f"Wait for it to end or stop it, then try again, or use another folder; {action}."
    )


def check_free(out: Path) -> None:
    """:class:`UsageError` when another live process holds the folder ``out``. Touches nothing."""
    if busy(out):
        raise _busy_error(Path(out), "nothing was changed")


def hold(out: Path) -> None:
    """Take the lock of the existing folder ``out`` for this process until :func:`release` or its end;
    :class:`UsageError` when another live process holds it. Taking it again is a no-op."""
    out = Path(out)
    if fcntl is None or _held_here(out):
        return
    release(out)  # a descriptor of a folder deleted since
    try:
        fd = _open_locked(out, wait_s=_WAIT_S)
    except FileNotFoundError:  # deleted since: nothing to hold (whoever writes there next takes it)
        return
    if fd is None:
        raise _busy_error(out, "nothing was changed")
    _HELD[_key(out)] = fd


@contextlib.contextmanager
def holding(out: Path):
    """Hold the folder ``out`` for the block, from its start when it exists (:func:`hold`), and give back at the end
    what this process did not hold on entry: the lock taken here, or by :func:`begin` inside the block. Every
    command's top level uses it, so a lock never outlives the command (a notebook or a test keeps none)."""
    out = Path(out)
    held = _held_here(out)
    try:
        if out.is_dir():
            hold(out)
        yield
    finally:
        if not held:
            release(out)


def release(out: Path) -> None:
    """Give back the lock this process holds on ``out`` (nothing when it holds none), so that the same process (a
    notebook, a test) or another may take the folder up again; every command does so through :func:`holding`."""
    fd = _HELD.pop(_key(out), None)
    if fd is not None:
        os.close(fd)


def exclusive(*, resume: bool, overwrite: bool) -> None:
    """``--overwrite`` and ``--resume`` exclude each other (every command)."""
    if resume and overwrite:
        raise UsageError("--overwrite and --resume exclude each other: one discards the run, the other continues it.")


@dataclass(frozen=True)
class Manifest:
    """What a command recorded as its own in a folder (see the module docstring)."""

    command: str
    files: tuple[str, ...]
    runs: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"command": self.command, "files": list(self.files), "runs": list(self.runs)}


def read_manifest(out: Path) -> Manifest | None:
    """The folder's manifest; None when there is none. A damaged one (not JSON of the right shape) is None too."""
    try:
        data = json.loads((Path(out) / MANIFEST).read_text())
        return Manifest(str(data["command"]), tuple(map(str, data["files"])), tuple(map(str, data.get("runs", []))))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _pattern(entry: str) -> re.Pattern:
    """A manifest entry as a regex on a relative path: ``{n}`` a whole number; ``x/`` the folder and all in it."""
    body = re.escape(entry.rstrip("/")).replace(re.escape("{n}"), r"\d+")
    return re.compile(body + (r"(/.*)?" if entry.endswith("/") else ""))


def _owned(rel: str, entries: tuple[str, ...]) -> bool:
    """Whether the relative path ``rel`` is one of ``entries`` (or inside a folder entry), or the temporary file of
    an atomic write of one of them."""
    match = _TMP.match(rel.rsplit("/", 1)[-1])
    if match:
        head = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
        target = head + match["name"]
        # the manifest's and the first config.json's temporaries are the command's before any manifest exists
        files = [e for e in entries if not e.endswith("/")]
        return target in (MANIFEST, CONFIG_FILE) or any(_pattern(e).fullmatch(target) for e in files)
    return any(_pattern(e).fullmatch(rel) for e in entries)


def _leads_to(rel: str, entries: tuple[str, ...]) -> bool:
    """Whether folder ``rel`` lies on the way to an entry (a study's ``mean_bound=0.05/tce/``)."""
    return any(e.startswith(rel + "/") for e in entries)


def foreign(out: Path, command: str | None = None) -> list[str]:
    """Every path below ``out`` (relative, sorted) that the command of ``out`` did not write, sub-runs included.

    Without a manifest only the first write's leftovers (the manifest's and config.json's temporary files) count as
    the command's.
    """
    out = Path(out)
    manifest = read_manifest(out) or Manifest(command or "", ())
    found: list[str] = []
    _walk(out, "", manifest, found)
    return sorted(found)


def _walk(root: Path, prefix: str, manifest: Manifest, found: list[str]) -> None:
    folder = root / prefix if prefix else root
    for path in sorted(folder.iterdir()):
        rel = f"{prefix}{path.name}"
        if rel == MANIFEST or _owned(rel, manifest.files):
            continue
        real_dir = path.is_dir() and not path.is_symlink()
        if real_dir and rel in manifest.runs:
            found += [f"{rel}/{p}" for p in foreign(path)]
        elif real_dir and _leads_to(rel, manifest.files + manifest.runs):
            _walk(root, rel + "/", manifest, found)
        else:
            found.append(rel + ("/" if real_dir else ""))


@dataclass(frozen=True)
class Found:
    """What :func:`inspect` saw in a folder: whose it is (None: nobody's), whether a run was started (config.json
    is whole), and what in it is foreign."""

    command: str | None
    started: bool
    foreign: list[str]


def inspect(out: Path, command: str) -> Found:
    """Look at ``out`` without touching it (see :func:`check_folder`)."""
    out = Path(out)
    if not out.is_dir():
        return Found(None, False, [])
    manifest = read_manifest(out)
    owner = manifest.command if manifest else None
    started = (out / CONFIG_FILE).is_file() and manifest is not None
    return Found(owner, started, foreign(out, command))


def check_folder(out: Path, command: str, *, resume: bool, overwrite: bool, what: str = "run") -> str:
    """The action for folder ``out`` of ``command``: "new" (start; leftovers of a killed first start are removed),
    "resume" or "replace" (delete it with :func:`clear`, then start). :class:`UsageError` with the reason
    otherwise. Touches nothing."""
    exclusive(resume=resume, overwrite=overwrite)
    out = Path(out)
    check_out_path(out, f"{what} folder")
    check_free(out)
    found = inspect(out, command)
    if found.command not in (None, command):
        raise UsageError(
            f"--out {out} holds a folder of 'troll {found.command}', which 'troll {command}' never continues nor "
            "replaces; choose another --out."
        )
    if not found.started:
        if found.foreign:
            raise UsageError(
                f"--out {out} is not empty and holds no {what} of 'troll {command}': it holds something else "
                f"({_listed(found.foreign)}); choose another --out (nothing was deleted)."
            )
        return "new"
    if resume:
        return "resume"
    if not overwrite:
        raise UsageError(
            f"--out {out} already holds a {what} of 'troll {command}'; pass --resume to continue it, --overwrite to "
            "replace it, or choose another --out."
        )
    if found.foreign:
        raise UsageError(
            f"--overwrite: {out} holds files 'troll {command}' did not write: {_listed(found.foreign)}; nothing was "
            "deleted. Move them away, or choose another --out."
        )
    return "replace"


def _listed(paths: list[str], most: int = 8) -> str:
    shown = ", ".join(paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def clear(out: Path, command: str) -> None:
    """Delete the folder of ``command`` that :func:`check_folder` allowed to replace, looking once more first: a
    file that appeared since is never deleted, nor a folder another live process holds."""
    out = Path(out)
    if out.is_dir():
        try:
            hold(out)
        except UsageError:
            raise _busy_error(out, "nothing was deleted") from None
    try:
        found = inspect(out, command)
        if found.command not in (None, command) or found.foreign:
            listed = _listed(found.foreign)
            raise UsageError(f"--overwrite: {out} changed since it was checked ({listed}); nothing was deleted.")
        shutil.rmtree(out)
    finally:
        release(out)


def begin(out: Path, command: str, *, files: tuple[str, ...] | None = None, runs: tuple[str, ...] = ()) -> Manifest:
    """Make ``out`` the folder of ``command``: record (atomically, before any other file of the run is written)
    what it writes there, adding to what an earlier start recorded, and remove the temporary files a killed
    process left behind. Call it on every start and resume, before the first write; it takes the folder's lock for
    this process (:func:`hold`, :class:`UsageError` when another process holds it), which :func:`release` gives
    back when the command ends."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    held = _held_here(out)
    hold(out)
    try:
        old = read_manifest(out)
        if old is not None and old.command != command:
            raise UsageError(f"{out} holds a folder of 'troll {old.command}', not of 'troll {command}'.")
        files = LAYOUTS[command] if files is None else files
        merged = Manifest(
            command,
            tuple(dict.fromkeys((*(old.files if old else ()), *files))),
            tuple(dict.fromkeys((*(old.runs if old else ()), *runs))),
        )
        if merged != old:
            write_json(out / MANIFEST, merged.to_json())
        remove_leftovers(out, merged)
    except BaseException:
        if not held:  # refused or failed: the lock this call took goes back
            release(out)
        raise
    return merged


def remove_leftovers(out: Path, manifest: Manifest | None = None) -> list[Path]:
    """Delete the temporary files of atomic writes of the folder's own names left by earlier processes (not this
    one's), at the top and in owned sub-folders but not inside sub-runs; returns what was removed."""
    out = Path(out)
    manifest = manifest or read_manifest(out)
    if manifest is None:
        return []
    removed = []
    for path in out.rglob(".*.tmp-*"):
        rel = path.relative_to(out).as_posix()
        match = _TMP.match(path.name)
        inside_run = any(rel.startswith(r.rstrip("/") + "/") for r in manifest.runs)
        if match and int(match["pid"]) != os.getpid() and not inside_run and path.is_file():
            if _owned(rel, manifest.files):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def seal(out: Path, folder: str) -> None:
    """Record the files now in the owned sub-folder ``folder`` (e.g. ``model/``) one by one instead of the folder
    whole: a file a user puts there later is then foreign and survives ``--overwrite``."""
    out = Path(out)
    manifest = read_manifest(out)
    if manifest is None:
        return
    entry = folder.rstrip("/") + "/"
    names = sorted(p.relative_to(out).as_posix() for p in (out / folder).rglob("*") if p.is_file())
    files = tuple(e for e in manifest.files if e != entry) + tuple(n for n in names if n not in manifest.files)
    write_json(out / MANIFEST, Manifest(manifest.command, files, manifest.runs).to_json())
