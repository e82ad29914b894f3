"""The dispatcher (troll.cli): the console entry point, a provider that adds its own subcommands, and every command
(``troll train``, ``compare``, ``study``, ``tce train``, ``tce study``) through it: each keeps a user's files and
refuses a folder another process writes (the rules of tests/runs/test_folder.py), checks its values and its --out
before anything is written, and refuses an abbreviated flag. They refuse before anything is loaded (well under a
second each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SRC, held_elsewhere, make_run, run_cli, tree

from troll import runs
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
    assert "{train,compare,study,status,eval-code,tce}" in troll.cli.build_parser().format_help()


# ---------------------------------------------------------------- every command on the command line

COMMANDS = tuple(runs.LAYOUTS)


def _cli_argv(command: str, out: Path) -> list[str]:
    return {
        "train": ["train", "--out", str(out), "--overwrite"],
        "compare": ["compare", "--out", str(out), "--overwrite"],
        "study": ["study", "--out", str(out), "--overwrite"],
        "tce train": ["tce", "train", "--env", "toy/viapoint", "--out", str(out), "--overwrite"],
        "tce study": ["tce", "study", "--env", "toy/viapoint", "--out", str(out), "--overwrite"],
    }[command]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_keeps_a_user_file_on_overwrite(tmp_path, capsys, command):
    if command in ("train", "compare", "study"):
        pytest.importorskip("reasoning_gym")
    out = make_run(tmp_path / "r", command)
    if command == "compare":  # compare's config must hold its runs to be checked further
        runs.write_json(out / "config.json", {"command": "compare", "runs": []})
    for user in (".canary", "checkpoint-notes.txt", "checkpoint-backup/x", ".git/HEAD"):
        (out / user).parent.mkdir(parents=True, exist_ok=True)
        (out / user).write_text("mine")
    before = tree(out)
    code, err = run_cli(capsys, *_cli_argv(command, out))
    assert code == 2 and "did not write: .canary, .git/, checkpoint-backup/, checkpoint-notes.txt" in err, err
    assert tree(out) == before
    other = make_run(tmp_path / "other", "tce train" if command != "tce train" else "train")
    before = tree(other)
    code, err = run_cli(capsys, *_cli_argv(command, other))
    assert code == 2 and "never continues nor replaces" in err, err
    assert tree(other) == before
    json.loads((other / "config.json").read_text())


@pytest.mark.parametrize(
    "command, flag",
    # a study's --resume reads the saved grid first, which a made-up folder lacks: its refusal is check_folder's,
    # tested in tests/runs/test_folder.py
    [(c, f) for c in COMMANDS for f in ("--overwrite", "--resume") if not (c.endswith("study") and f == "--resume")],
)
def test_every_command_refuses_a_folder_another_process_writes(tmp_path, capsys, command, flag):
    if command in ("train", "compare", "study"):
        pytest.importorskip("reasoning_gym")
    out = make_run(tmp_path / "r", command)
    if command == "compare":
        runs.write_json(out / "config.json", {"command": "compare", "runs": []})
    runs.release(out)
    argv = [flag if a == "--overwrite" else a for a in _cli_argv(command, out)]
    with held_elsewhere(out, command):
        before = tree(out)
        code, err = run_cli(capsys, *argv)
    assert code == 2 and f"{out} is in use: another process is still writing there" in err, err
    assert tree(out) == before


# ---------------------------------------------------------------- values checked before anything is written

TOY = ["tce", "train", "--env", "toy/viapoint", "--steps", "800", "--workers", "0", "--no-progress"]
BIG_SEED = "12345678901234567890123"


@pytest.mark.parametrize(
    "argv, message",
    [
        ([*TOY, "--init-std", "1e300"], "--init-std: init_std must be > 0 and <= 1000"),
        ([*TOY, "--policy-lr", "1e300"], "--policy-lr: policy_lr must be > 0 and <= 1"),
        ([*TOY, "--critic-lr", "1e300"], "--critic-lr: critic_lr must be > 0 and <= 1"),
        ([*TOY, "--weights-scale", "1e300"], "--weights-scale: weights_scale must be > 0 and <= 1e+06"),
        ([*TOY, "--entropy-target", "1e300"], "--entropy-target: entropy_target must be >= -30 and <= 30"),
        ([*TOY, "--episodes", "1e30"], "--episodes: episodes must be an integer >= 1 and < 100000"),
        ([*TOY, "--critic-minibatches", "500", "--episodes", "2"], "(--critic-minibatches) 500 exceeds the 200 critic"),
        ([*TOY, "--seed", BIG_SEED], "--seed: seed must be an integer >= 0 and < 2**32"),
        (["tce", "study", "--env", "toy/viapoint", "--seeds", f"0,{BIG_SEED}"], "--seeds 0,1234"),
        (["tce", "study", "--env", "toy/viapoint", "--policy-lr", "1e300"], "--policy-lr: policy_lr must be"),
        (
            ["tce", "study", "--env", "toy/viapoint", "--critic-minibatches", "500", "--episodes", "2"],
            "(--critic-minibatches) 500 exceeds the 200 critic",
        ),
        (
            [
                "tce",
                "study",
                "--env",
                "toy/viapoint",
                "--env-options",
                '{"horizon": 20}',
                "--critic-minibatches",
                "41",
                "--episodes",
                "2",
            ],
            "(--critic-minibatches) 41 exceeds the 40 critic",
        ),
        (
            [
                "tce",
                "study",
                "--env",
                "gym/reacher",
                "--algos",
                "tce",
                "--critic-minibatches",
                "101",
                "--episodes",
                "2",
            ],
            "(--critic-minibatches) 101 exceeds the 100 critic",
        ),
        (["train", "--lr", "1e300"], "--lr must be > 0 and <= 1 and a finite number"),
        (["train", "--seed", BIG_SEED], "--seed must be an integer >= 0 and < 2**32, got 1.235e+22 (23 digits)"),
        (["train", "--steps", "10000000000"], "--steps must be an integer >= 1 and < 1000000000"),
    ],
)
def test_an_unchecked_value_exits_2_before_anything_is_written(tmp_path, capsys, argv, message):
    if argv[0] == "train":
        pytest.importorskip("reasoning_gym")
    out = tmp_path / "out"
    code, err = run_cli(capsys, *argv, "--out", str(out))
    assert code == 2 and message in err, err
    assert not out.exists()


@pytest.mark.parametrize("command", [["train"], ["compare"], ["study"], ["tce", "train"], ["tce", "study"]])
def test_a_read_only_out_exits_2_naming_the_flag(tmp_path, capsys, monkeypatch, command):
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    env = ["--env", "toy/viapoint"] if command[0] == "tce" else []
    code, err = run_cli(capsys, *command, *env, "--out", str(locked / "run"))
    assert code == 2 and f"--out {locked / 'run'}: {locked} is not writable" in err, err
    assert list(locked.iterdir()) == []


# Every subcommand refuses an abbreviated flag (argparse's prefix matching would read --seed as --seeds).
@pytest.mark.parametrize(
    "argv, flag",
    [
        (["tce", "study", "--env", "toy/viapoint", "--seed", "3"], "--seed"),
        (["tce", "train", "--env", "toy/viapoint", "--ste", "800"], "--ste"),
        (["study", "--seed", "3"], "--seed"),
        (["study", "--loss", "troll"], "--loss"),
        (["compare", "--loss", "troll"], "--loss"),
        (["train", "--ste", "3"], "--ste"),
        (["tce", "train", "--env", "toy/viapoint", "--policy", "16"], "--policy"),
    ],
)
def test_abbreviated_flags_are_refused(tmp_path, capsys, argv, flag):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        run_cli(capsys, *argv, "--out", str(out))
    assert exit_.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err
    assert not out.exists()
