"""A study's numbers without its weights: the finished cells of study folders in a small archive, and back.

Why: a study of many hours outlives the machine it ran on only through what is kept, and a cell's folder is mostly
checkpoints (0.1-1 MB each) beside a metrics.jsonl of every logged key (about 2.4 KB a TCE iteration). The archive
keeps, per finished cell, what the report reads: the cell's config.json and summary.json whole, and its metrics rows
reduced to the keys the report plots and computes from, each number rounded to :data:`DIGITS` significant digits
(each logged value moves by less than one part in a million of itself; summary.json, which holds the numbers at the
budget, is kept exactly). :func:`restore` writes each archived cell back as a finished run folder (its manifest,
config.json, metrics.jsonl, summary.json), so that the study, resumed, keeps it, reports it and runs only the cells
still missing.

Layout (``<study>`` is the study folder's path below the folder that was saved)::

    <archive>/<study>/config.json           the study's config.json: command, spec (the grid) and argv
    <archive>/<study>/<arm>/seed<k>.json    one finished cell: {"config", "summary", "keys", "rows"}, a row a line

A cell is restored only when the current code would run it with the same settings: the caller's ``expected``
gives the config a cell would get today (the episodic study builds it from the study's spec and the presets), and an
archived cell whose config differs is reported and left for the study to rerun. Nothing here writes over a finished
cell or over a file a command did not write (:mod:`troll.runs.folder`'s rules).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from troll import runs
from troll.runs.files import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, UsageError, read_jsonl, write_json
from troll.runs.folder import read_manifest
from troll.study import report as report_lib
from troll.study.grid import grows

DIGITS = 7  # significant digits kept of each logged number; float32 metrics carry about 7
CELL_SUFFIX = ".json"


@dataclass
class Outcome:
    """What :func:`save` or :func:`restore` did, per cell label (``<study>/<arm>/seed<k>``)."""

    done: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # label -> why it was not saved / restored


def _round(value):
    if isinstance(value, float) and math.isfinite(value) and value != 0.0:
        return float(f"{value:.{DIGITS - 1}e}")
    return value


def cell_text(config: dict, summary: dict, rows: list[dict], keys: Iterable[str]) -> str:
    """The archive file of one cell: JSON whose rows hold ``keys`` (absent keys as null; a key no row logs a value
    of is left out, so that a restored cell saves to the same file), one row a line."""
    kept = [k for k in keys if any(r.get(k) is not None for r in rows)]
    head = json.dumps({"config": config, "summary": summary, "keys": kept}, sort_keys=True)
    lines = [json.dumps([_round(r.get(k)) for k in kept], separators=(",", ":")) for r in rows]
    return head[:-1] + ', "rows": [\n' + ",\n".join(lines) + "\n]}\n"


def read_cell(path: Path) -> tuple[dict, dict, list[dict]]:
    """(config.json, summary.json, metrics rows) of an archived cell; ValueError naming the file when damaged."""
    try:
        data = json.loads(Path(path).read_text())
        keys, rows = data["keys"], data["rows"]
        return data["config"], data["summary"], [{k: v for k, v in zip(keys, r) if v is not None} for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not an archived cell ({err!r}); the archive is damaged.") from None


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically, and only when it changed (an unchanged archive stays unchanged on disk)."""
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def studies(root: Path, command: str) -> list[Path]:
    """The study folders of ``command`` at or below ``root`` (their config.json names the command), sorted."""
    found = []
    for config in sorted(Path(root).rglob(CONFIG_FILE)):
        manifest = read_manifest(config.parent)
        if manifest is not None and manifest.command == command:
            found.append(config.parent)
    return found


def save(
    root: Path,
    archive: Path,
    *,
    command: str,
    keys: Iterable[str],
    expected: Callable[[dict, Path], dict[str, dict]],
    runtime: Iterable[str] = (),
    upgrade: Callable[[dict], dict] = lambda config: config,
) -> Outcome:
    """Archive every finished cell of every study of ``command`` below ``root`` into ``archive``.

    A study's cells are the runs its manifest lists; unfinished ones (no summary.json) are skipped, and so is a cell
    run with other settings than ``expected`` gives today (it would be rerun, not restored). A study whose grid is
    smaller than the archived one (fewer seeds or arms) is not saved at all: the archive keeps what it holds.
    Files already archived are rewritten only when their content changed; a study's config.json is kept when only
    its command line differs (a restored study resumed elsewhere has another ``--out``: the archive stays as it was
    committed).
    """
    root, archive, keys, runtime, outcome = Path(root), Path(archive), tuple(keys), frozenset(runtime), Outcome()
    for study in studies(root, command):
        rel = study.relative_to(root)
        here = upgrade(json.loads((study / CONFIG_FILE).read_text()))
        archived = archive / rel / CONFIG_FILE
        old = upgrade(json.loads(archived.read_text())) if archived.is_file() else None
        if old is not None and not _holds(here.get("spec"), old.get("spec"), runtime):
            outcome.skipped[rel.as_posix()] = f"its grid is not the archive's or grown from it; {archived} kept"
            continue
        wanted = expected(here["spec"], study)
        if not (old is not None and _same_but_argv(here, old)):
            _write_text(archived, (study / CONFIG_FILE).read_text())
        for cell in read_manifest(study).runs:
            folder, label = study / cell, (rel / cell).as_posix()
            if not (folder / SUMMARY_FILE).is_file():
                outcome.skipped[label] = "not finished"
                continue
            config = upgrade(json.loads((folder / CONFIG_FILE).read_text()))
            why = differs(config, wanted.get(cell), runtime)
            if why:
                outcome.skipped[label] = why + ": not saved"
                continue
            summary = json.loads((folder / SUMMARY_FILE).read_text())
            text = cell_text(config, summary, read_jsonl(folder / METRICS_FILE), keys)
            _write_text(archive / rel / (cell + CELL_SUFFIX), text)
            outcome.done.append(label)
    return outcome


def restore(
    archive: Path,
    root: Path,
    *,
    command: str,
    run_command: str,
    expected: Callable[[dict, Path], dict[str, dict]],
    runtime: Iterable[str] = (),
    upgrade: Callable[[dict], dict] = lambda config: config,
) -> Outcome:
    """Write the archived cells back below ``root`` as finished run folders, for a study resumed there.

    ``expected(spec, study_folder)`` maps each cell of a study (``<arm>/seed<k>``) to the config.json its command
    would write today; an archived cell of another config (apart from the ``runtime`` fields, how a run executes, not
    what it computes) is not restored, and its reason is in the outcome, as is a damaged cell file. A study folder
    that exists must hold the archive's spec, or one grown from it by more seeds or arms (:class:`UsageError`
    otherwise, before anything is written); a finished cell is never touched, and an unfinished one is replaced only
    when its folder holds nothing but its command's files.
    """
    archive, root, runtime, outcome = Path(archive), Path(root), frozenset(runtime), Outcome()
    plans = []
    for config_path in sorted(archive.rglob(CONFIG_FILE)):
        rel = config_path.parent.relative_to(archive)
        saved = upgrade(json.loads(config_path.read_text()))
        if saved.get("command") != command:
            continue
        study = root / rel
        if (study / CONFIG_FILE).is_file():
            runs.check_folder(study, command, resume=True, overwrite=False, what="study")
            here = upgrade(json.loads((study / CONFIG_FILE).read_text())).get("spec")
            if not _holds(here, saved["spec"], runtime):
                raise UsageError(f"{study} holds a study of another grid than the archive's {config_path}; move "
                                 "one of them away, or restore into another folder.")  # fmt: skip
        else:
            runs.check_folder(study, command, resume=False, overwrite=False, what="study")
        plans.append((rel, saved, study, expected(saved["spec"], study)))
    for rel, saved, study, wanted in plans:
        cells = sorted(p for p in (archive / rel).rglob("*" + CELL_SUFFIX) if p.name != CONFIG_FILE)
        try:
            if not (study / CONFIG_FILE).is_file():
                runs.begin(study, command)
                write_json(study / CONFIG_FILE, saved)
            for path in cells:
                cell = path.relative_to(archive / rel).as_posix()[: -len(CELL_SUFFIX)]
                label = (rel / cell).as_posix()
                why = _restore_cell(path, study, cell, command, run_command, wanted.get(cell), runtime, upgrade)
                if why:
                    outcome.skipped[label] = why
                else:
                    outcome.done.append(label)
        finally:
            runs.release(study)  # the lock runs.begin took
    return outcome


def _same_but_argv(config: dict, archived: dict) -> bool:
    return {k: v for k, v in config.items() if k != "argv"} == {k: v for k, v in archived.items() if k != "argv"}


def differs(config: dict, wanted: dict | None, runtime: frozenset) -> str | None:
    """Why a cell's config.json is not the one its command would write today (None when it is): its command, and
    each section of ``wanted`` beside it (the settings: ``config`` of ``troll tce train``, ``options`` of ``troll
    train``) key by key, the ``runtime`` keys aside."""
    if wanted is None:
        return "not a cell of the study's grid"
    differ = []
    for section in sorted(k for k in wanted if k != "command"):  # "config" (troll tce train), "options" (troll train)
        old, new = config.get(section) or {}, wanted[section]
        differ += sorted(k for k in set(old) | set(new) if k not in runtime and old.get(k) != new.get(k))
    if config.get("command") != wanted.get("command") or differ:
        return "run with other settings than today's (" + (", ".join(differ) or "command") + ")"
    return None


def _holds(here, saved, runtime: frozenset = frozenset()) -> bool:
    """True when the study spec ``here`` is ``saved`` or grew from it (a resumed study that added seeds or arms
    since the archive was saved, and was stopped before saving it again): lists may hold more, the ``runtime``
    entries (threads, workers) may differ, nothing else."""
    if not (isinstance(here, dict) and isinstance(saved, dict)) or set(here) != set(saved):
        return False
    return all(
        k in runtime or here[k] == v or (isinstance(v, list) and isinstance(here[k], list) and grows(v, here[k]))
        for k, v in saved.items()
    )


def _restore_cell(
    path: Path,
    study: Path,
    cell: str,
    command: str,
    run_command: str,
    wanted: dict | None,
    runtime: frozenset,
    upgrade: Callable[[dict], dict],
) -> str | None:
    """Restore one archived cell into ``study / cell``; None when done, else why not."""
    folder = study / cell
    if wanted is None:
        return "not a cell of the study's grid"
    try:
        config, summary, rows = read_cell(path)
    except ValueError as err:
        return str(err)
    config = upgrade(config)
    why = differs(config, wanted, runtime)
    if why:
        return why + ": the study reruns it"
    if (folder / SUMMARY_FILE).is_file():
        return "already finished here"
    if folder.exists():  # unfinished here: the archive's finished run replaces it, if all in it is the command's
        try:
            if runs.check_folder(folder, run_command, resume=False, overwrite=True, what="cell") == "replace":
                runs.clear(folder, run_command)
        except UsageError as err:
            return f"not restored over the unfinished run there: {err}"
    runs.begin(study, command, runs=(cell,))
    with runs.holding(folder):
        runs.begin(folder, run_command)
        write_json(folder / CONFIG_FILE, config)
        _write_text(folder / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
        write_json(folder / SUMMARY_FILE, summary)  # last: a cell is finished when its summary exists
    return None


def write_reports(root: Path, command: str, study_of: Callable[[Path], Any]) -> None:
    """Write each study's study.json / study.md / study.png below ``root`` over its finished cells, as a running
    study writes them, so that its numbers read without running a cell; ``study_of(folder)`` gives the
    :class:`troll.study.Study` of a study folder. A study another process is running is left to it."""
    for folder in studies(root, command):
        try:
            runs.hold(folder)
        except UsageError:
            print(f"{folder}: another process is running this study; its report is left to it", file=sys.stderr)
            continue
        try:
            study = study_of(folder)
            status = {c.label: "kept" for c in study.cells if (c.folder / SUMMARY_FILE).is_file()}
            if status:
                report_lib.write(study, status)
        finally:
            runs.release(folder)


@dataclass(frozen=True)
class StudyArchive:
    """One application's archive of its studies (``troll study``, ``troll tce study``) and its command line
    (``python -m troll.lm.archive``, ``python -m troll.tce.archive``): what :func:`save` and :func:`restore` need,
    given once."""

    command: str  # the study command's name in config.json
    run_command: str  # the cells' command
    keys: tuple[str, ...]  # the metrics keys kept per row
    expected: Callable[[dict, Path], dict[str, dict]]  # spec, study folder -> each cell's config today
    runtime: tuple[str, ...]  # config keys that say how a run executed, not what it computed
    study_of: Callable[[Path], Any]  # a study folder -> its troll.study.Study, for the report
    prog: str  # the module's command line, for --help
    doc: str  # the module's docstring; its first line is --help's description
    study_command: str  # the study command as a user types it, for error messages
    # A config.json written before a setting existed -> the same config with that setting at the value those runs
    # had (so that an archive outlives the addition of an option whose default reproduces the older runs)
    upgrade: Callable[[dict], dict] = lambda config: config

    def save(self, root: Path, dest: Path) -> Outcome:
        return save(root, dest, command=self.command, keys=self.keys, expected=self.expected, runtime=self.runtime,
                    upgrade=self.upgrade)  # fmt: skip

    def restore(self, source: Path, root: Path) -> Outcome:
        """Restore (:func:`restore`), then write each restored study's study.json / study.md / study.png over its
        finished cells, as a study writes them while it runs, so its numbers read without running a cell."""
        outcome = restore(source, root, command=self.command, run_command=self.run_command, expected=self.expected,
                          runtime=self.runtime, upgrade=self.upgrade)  # fmt: skip
        write_reports(root, self.command, self.study_of)
        return outcome

    def main(self, argv: list[str] | None = None) -> int:
        """``save STUDIES ARCHIVE`` or ``restore ARCHIVE STUDIES``; prints what was done and why a cell was not;
        2 on bad input."""
        parser = argparse.ArgumentParser(prog=self.prog, description=self.doc.split("\n")[0])
        sub = parser.add_subparsers(dest="action", required=True)
        s = sub.add_parser("save", help="archive the finished cells of the studies below STUDIES into ARCHIVE")
        s.add_argument("studies", type=Path)
        s.add_argument("archive", type=Path)
        r = sub.add_parser("restore", help="write the cells of ARCHIVE back below STUDIES as finished cells")
        r.add_argument("archive", type=Path)
        r.add_argument("studies", type=Path)
        args = parser.parse_args(argv)
        try:
            if args.action == "save":
                if not args.studies.is_dir():
                    raise UsageError(f"{args.studies} is not a folder of studies; give the folder "
                                     f"'{self.study_command}' wrote.")  # fmt: skip
                outcome = self.save(args.studies, args.archive)
            else:
                if not args.archive.is_dir():
                    print(f"{args.archive} does not exist: no archive yet, nothing restored.")
                    return 0
                outcome = self.restore(args.archive, args.studies)
        except (UsageError, ValueError) as err:  # ValueError: a damaged config.json of a study or of the archive
            print(f"error: {err}", file=sys.stderr)
            return 2
        verb = "saved" if args.action == "save" else "restored"
        print(f"{verb} {len(outcome.done)} finished cell(s)")
        for label, why in outcome.skipped.items():
            if why != "not finished":
                print(f"  {label}: {why}")
        return 0
