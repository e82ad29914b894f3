"""The ``troll`` command: a dispatcher over subcommands that *providers* register.

A provider is a module with a function ``add_commands(sub)`` that adds its subparsers to ``sub`` (argparse's
``add_subparsers()`` object) and gives each a handler and a name for messages::

    def add_commands(sub) -> None:
        tce = sub.add_parser("tce", help="episodic RL with movement primitives")
        tce_sub = tce.add_subparsers(required=True, metavar="{train,study}")
        train = tce_sub.add_parser("train", help="one TCE run")
        train.add_argument("--env", ...)
        train.set_defaults(run=cmd_train, name="tce train")   # run(args) -> exit status

:data:`PROVIDERS` lists them: :mod:`troll.lm.cli` (``troll train``, ``compare``, ``study``, ``eval-code``) and
:mod:`troll.tce.cli` (the episodic agent's ``troll tce ...``); a provider whose module is absent is skipped
without importing its package, one that fails to import fails loudly. Building the parser imports every provider,
so a provider imports nothing heavy at module level (no torch, transformers, TRL, gymnasium or MuJoCo; ``import
troll`` is lazy): handlers import what their run needs.
A ``tce study`` handler reuses the study engine, :mod:`troll.study`, as ``troll study`` does
(:mod:`troll.study.frontend` shows a TCE frontend).

A handler raises :class:`troll.runs.UsageError` for bad input, before anything is written; :func:`main` prints
``troll <name>: error: <message>`` and returns 2. ``python -m troll.cli`` runs :func:`main` (the study engine starts
its cells that way).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

from troll.runs.files import UsageError

PROVIDERS = ("troll.lm.cli", "troll.tce.cli")


def _providers() -> list:
    """The provider modules that exist, in :data:`PROVIDERS` order, imported."""
    return [importlib.import_module(name) for name in PROVIDERS if _exists(name)]


def _exists(name: str) -> bool:
    """Whether module ``name`` is there, found without executing its package (a provider being written beside
    this one, absent or not, never affects the others): errors inside a provider that exists are its own, loud."""
    package, _, leaf = name.rpartition(".")
    spec = importlib.util.find_spec(package)  # imports the packages above ``package``, not ``package`` itself
    places = (spec.submodule_search_locations or []) if spec else []
    return any((Path(p) / f"{leaf}.py").is_file() or (Path(p) / leaf / "__init__.py").is_file() for p in places)


class Parser(argparse.ArgumentParser):
    """argparse's parser without prefix matching (``allow_abbrev=False``): ``--seed 3`` on a study is refused,
    never read as ``--seeds 3``. Every subparser is one too (``add_subparsers`` makes its parsers of this class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="troll", description="TROLL: trust-region RL runs, comparisons and studies from the command line."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for provider in _providers():
        provider.add_commands(sub)
    sub.metavar = "{" + ",".join(sub.choices) + "}"
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's), run the chosen subcommand, return its exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as err:
        print(f"troll {args.name}: error: {err}", file=sys.stderr)
        return 2
