"""Former module paths, kept importable: ``troll.train.run`` is ``troll.lm.run`` (the same module object, not a
copy), ``troll.episodic.prodmp`` is ``troll.episodic.tce.prodmp``, and ``python -m troll.train.stability_map`` runs
``troll.lm.results``. New code imports the new paths; ``tests/test_architecture.py`` refuses the old ones in src/.

:data:`MOVED` maps an old name, or an old package prefix, to its new name; the longest matching prefix wins. A
finder on ``sys.meta_path`` answers for the old names alone, so nothing else about importing changes.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

MOVED = {
    "troll.train": "troll.lm",
    "troll.train.stability_map": "troll.lm.results",
    "troll.cli.lm": "troll.lm.cli",
    "troll.episodic.train": "troll.episodic.run",
    "troll.episodic.options": "troll.episodic.flags",
    **{
        f"troll.episodic.{name}": f"troll.episodic.tce.{name}"
        for name in ("agent", "config", "critic", "normalize", "policy", "prodmp", "segments")
    },
}


def new_name(name: str) -> str | None:
    """The current name of module ``name`` if it was moved (``troll.train.tasks`` -> ``troll.lm.tasks``), else None."""
    for old in sorted(MOVED, key=len, reverse=True):
        if name == old or name.startswith(old + "."):
            return MOVED[old] + name[len(old) :]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name as the module of its new name; ``get_code`` serves ``python -m old.name``."""

    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        found = importlib.util.find_spec(new)
        if found is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=found.origin)
        spec.submodule_search_locations = found.submodule_search_locations
        spec.loader_state = new
        return spec

    def create_module(self, spec):
        module = importlib.import_module(spec.loader_state)
        spec.loader_state = (spec.loader_state, module.__spec__)  # the import machinery overwrites __spec__ next
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state[1]  # the module keeps its own spec: it already ran

    def get_code(self, fullname):
        new = new_name(fullname)
        return importlib.util.find_spec(new).loader.get_code(new)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` once (``import troll`` does it)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
