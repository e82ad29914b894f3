"""The dispatcher (troll.cli): the console entry point, and a provider that adds its own subcommands."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import SRC, run_cli

from troll.cli import main


def test_console_entry_point(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-m", "troll.cli", "train", "--loss", "nope", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "troll train: error: unknown loss 'nope'" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_provider_adds_subcommands(tmp_path, capsys, monkeypatch):
    """The hook of troll.cli: a provider module registers `troll tce ...`; an absent one is skipped."""
    import troll.cli

    package = tmp_path / "fakeprov"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(
        "from troll.study import UsageError\n"
        "def add_commands(sub):\n"
        "    tce = sub.add_parser('tce').add_subparsers(required=True)\n"
        "    train = tce.add_parser('train')\n"
        "    train.add_argument('--env')\n"
        "    train.set_defaults(run=run, name='tce train')\n"
        "def run(args):\n"
        "    if args.env != 'reach':\n"
        "        raise UsageError(f'unknown env {args.env!r}')\n"
        "    print('ran', args.env)\n"
        "    return 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(troll.cli, "PROVIDERS", ("troll.lm.cli", "fakeprov.cli", "fakeprov.absent"))
    assert main(["tce", "train", "--env", "reach"]) == 0 and "ran reach" in capsys.readouterr().out
    code, err = run_cli(capsys, "tce", "train", "--env", "moon")
    assert code == 2 and "troll tce train: error: unknown env 'moon'" in err
    assert "{train,compare,study,eval-code,tce}" in troll.cli.build_parser().format_help()
