"""The checkpoint listing every run folder shares: numbered names (``checkpoint-{n}/``, ``checkpoint-{n}.pt``).

A checkpoint is written under its final name only once it is whole (an atomic rename, or a completion mark for a
Trainer's folder: :mod:`troll.lm.checkpoints`); its number is the step or iteration it holds. Only names whose
number is a whole number count, so ``checkpoint-backup/`` or ``checkpoint-notes.txt`` are never taken for one.
"""

from __future__ import annotations

from pathlib import Path


def numbered_files(out: Path, template: str, *, folders: bool | None = None) -> list[tuple[int, Path]]:
    """(number, path) of the entries of ``out`` named ``template`` with a whole number for its ``{}``, by number.

    ``folders``: True only folders, False only files, None both."""
    prefix, suffix = template.split("{}")
    found = []
    for path in Path(out).glob(template.format("*")):
        stem = path.name[len(prefix) : len(path.name) - len(suffix)]
        if stem.isdigit() and (folders is None or path.is_dir() == folders):
            found.append((int(stem), path))
    return sorted(found)
