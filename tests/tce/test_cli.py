"""``troll tce train``: the flag tables against the configs, bad input (exit 2, a message naming the flag and the fix,
nothing written), a short run's folder, resume after an interruption, --overwrite, and the PPO arm (a short run,
its resume, and its evaluation checked by hand).

Runs are in-process (:func:`troll.cli.main`) on the toy task at a few iterations of 8 episodes (800 env steps an
iteration) and on gym/reacher for PPO at rollouts of 64 steps; the CI check that TCE solves the toy task is in
test_run.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import busy_elsewhere, make_run
from episodic.envs.test_step import run_episode

from troll.cli import build_parser, main
from troll.episodic.config import TCEConfig
from troll.episodic.envs.step import make_step_task
from troll.runs.files import read_jsonl
from troll.tce import flags as opts
from troll.tce.ppo import PPOConfig, evaluate

SRC = Path(__file__).parents[2] / "src"
TOY = ["--env", "toy/viapoint"]
# 8 episodes x 100 steps = 800 env steps an iteration; small networks and few epochs
TINY = ["--episodes", "8", "--eval-episodes", "8", "--eval-every", "2", "--checkpoint-every", "2", "--policy-hidden",
        "16", "--critic-hidden", "16", "--policy-epochs", "4", "--critic-epochs", "4", "--critic-minibatches", "2",
        "--workers", "0", "--no-progress"]  # fmt: skip
# PPO on gym/reacher (T = 50): rollouts of 64 steps, one epoch, evaluations on 2 episodes every 1 x 1 x 50 env steps
PPO_TINY = ["--env", "gym/reacher", "--algo", "ppo", "--ppo-n-steps", "64", "--ppo-batch-size", "32",
            "--ppo-n-epochs", "1", "--eval-episodes", "2", "--eval-every", "1", "--episodes", "1",
            "--no-progress"]  # fmt: skip
RUN_FILES = {".troll-run.json", "config.json", "metrics.jsonl", "summary.json", "plots.png"}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``troll tce <argv>`` in this process: exit status, stdout, stderr."""
    code = main(["tce", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def strip_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def snapshot(folder) -> dict:
    """name -> (mtime, bytes) of every file of a folder: to show that a refused command touched nothing."""
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------- the flag tables (options.py's docstring)


def test_flag_tables_cover_every_config_field():
    tce_fields = {f.name for f in dataclasses.fields(TCEConfig)}
    tce_flags = [name for name, _, _ in opts.TCE_FLAGS] + list(opts.OWN_FLAGS)
    assert sorted(tce_flags) == sorted(tce_fields)  # each field once
    ppo_fields = {f.name for f in dataclasses.fields(PPOConfig)}
    ppo_flags = [name for name, _, _ in opts.PPO_FLAGS] + list(opts.PPO_DERIVED)
    assert sorted(ppo_flags) == sorted(ppo_fields)
    # every table entry is a flag of both commands
    sub = build_parser()._subparsers._group_actions[0].choices["tce"]
    commands = sub._subparsers._group_actions[0].choices
    for command in ("train", "study"):
        have = {s for action in commands[command]._actions for s in action.option_strings}
        wanted = {opts.flag(n) for n, _, _ in opts.TCE_FLAGS} | {opts.flag(f"ppo_{n}") for n, _, _ in opts.PPO_FLAGS}
        wanted |= {"--steps", "--threads", "--workers", "--env", "--out", "--resume", "--overwrite"}
        assert wanted <= have, (command, wanted - have)
    assert opts.flag("mean_bound") == "--mean-bound" and opts.flag("total_env_steps") == "--steps"
    assert opts.flag("ppo_n_steps") == "--ppo-n-steps"


@pytest.mark.parametrize("env", ["toy/viapoint", "gym/reacher", "metaworld/reach-v3"])
def test_every_preset_value_round_trips_through_its_flag_text(env):
    kinds = opts.kinds()
    config = TCEConfig.preset(env, env_options={"gain": 25.0}, policy_hidden=())
    for name, _, _ in opts.TCE_FLAGS:
        value = getattr(config, name)
        assert opts.parse_value(name, opts.format_value(value), kinds[name]) == value, name
    ppo = PPOConfig.preset("gym/reacher")
    for name, _, _ in opts.PPO_FLAGS:
        value = getattr(ppo, name)
        assert opts.parse_value(f"ppo_{name}", opts.format_value(value), kinds[f"ppo_{name}"]) == value, name


@pytest.mark.parametrize(
    ("extra", "changed"),
    [
        (["--backend", "python"], {"backend": "python"}),
        (["--env-options", '{"gain": 25}'], {"gain": 25.0}),
        (["--env-options", '{"context": "varying"}', "--backend", "envpool"], {"context": "varying"}),
    ],
)
def test_env_options_given_complete_the_presets(extra, changed):
    """Regression: a backend or env option on the command line once replaced the metaworld/* preset's env options,
    and the run lost the authors' controller, gripper start and context without a word. Given ones complete them."""
    from troll.episodic.presets import METAWORLD_ENV
    from troll.tce.cli import train_config

    args = build_parser().parse_args(["tce", "train", "--env", "metaworld/reach-v3", "--algo", "bbrl", *extra])
    assert train_config(args, None).env_options == {**METAWORLD_ENV, "backend": "envpool", **changed}
    assert TCEConfig.preset("metaworld/reach-v3", env_options={"gain": 25.0}).env_options == {
        **METAWORLD_ENV,
        "gain": 25.0,
    }


def test_building_the_parser_imports_no_torch_and_no_simulator():
    code = (
        "import sys; from troll.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'gymnasium', 'mujoco', 'stable_baselines3') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- bad input: exit 2, the flag and the fix, no folder


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--env", "toy/viapiont"], "--env: unknown environment 'toy/viapiont'. Did you mean 'toy/viapoint'"),
        (["--env", "metaworld/reach"], "Did you mean 'metaworld/reach-v3'"),
        ([], "--env is required to start a run, e.g. --env toy/viapoint"),
        (
            [*TOY, "--algo", "tcee"],
            "--algo: unknown algorithm 'tcee'. Did you mean 'tce'? Choose one of tce",
        ),
        ([*TOY, "--mean-bound", "0"], "--mean-bound: mean_bound must be > 0 and a finite number, got 0.0"),
        ([*TOY, "--cov-bound", "-0.01"], "--cov-bound: cov_bound must be > 0 and a finite number, got -0.01"),
        ([*TOY, "--mean-bound", "big"], "--mean-bound 'big': expected a number"),
        ([*TOY, "--seed", "abc"], "--seed 'abc': expected an integer"),
        ([*TOY, "--seed", "1.5"], "--seed '1.5': expected an integer"),
        ([*TOY, "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
        ([*TOY, "--steps", "0"], "--steps must be an integer >= 1, got 0"),
        ([*TOY, "--workers", "-1"], "--workers must be an integer >= 0, got -1"),
        ([*TOY, "--threads", "0"], "--threads must be an integer >= 1, got 0"),
        ([*TOY, "--relative-goal", "maybe"], "--relative-goal 'maybe': expected true or false"),
        ([*TOY, "--policy-hidden", "wide"], "--policy-hidden 'wide': expected comma-separated widths"),
        ([*TOY, "--env-options", "[1]"], "--env-options '[1]': expected a JSON object"),
        ([*TOY, "--distance", "w2"], "--distance: unknown distance 'w2'. Choose one of 'kl', 'frobenius'"),
        ([*TOY, "--gamma", "0"], "--gamma: gamma must lie in (0, 1], got 0"),
        ([*TOY, "--algo", "bbrl", "--episodes", "1"], "--episodes: episodes must be >= 2 with algo='bbrl'"),
        ([*TOY, "--init-std", "1e-5"], "--init-std: init_std=1e-05 must exceed min_std=0.0001"),
        ([*TOY, "--algo", "ppo"], "--algo ppo needs a step-based env, and toy/viapoint has none"),
        ([*TOY, "--ppo-n-steps", "64"], "--ppo-n-steps is an option of ppo, not of --algo tce; drop it."),
        (["--env", "gym/reacher", "--algo", "ppo", "--mean-bound", "0.1"], "--mean-bound is an option of tce and bbrl"),
        (
            ["--env", "gym/reacher", "--algo", "ppo", "--ppo-gamma", "2"],
            "--ppo-gamma: gamma must be > 0 and <= 1 and a finite number",
        ),
        (["--env", "gym/reacher", "--algo", "ppo", "--ppo-net-arch", "0"], "--ppo-net-arch: net_arch must be layer"),
        # 0 is not "the preset": PPO's evaluation interval is eval_every x episodes x T
        (["--env", "gym/reacher", "--algo", "ppo", "--eval-every", "0"], "--eval-every: eval_every must be an integer"),
        (["--env", "gym/reacher", "--algo", "ppo", "--episodes", "0"], "--episodes: episodes must be an integer >= 1"),
        ([*TOY, "--resume", "--overwrite"], "--overwrite and --resume exclude each other"),
        (["--resume"], "holds no run to resume; start one without --resume, with --env"),
    ],
)
def test_bad_input_exits_2_naming_the_flag_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    # a short budget first (the case's own --steps wins): a regression then fails in seconds, not hours
    code, stdout, err = cli(capsys, "train", "--out", str(out), "--steps", "64", "--no-progress", *argv)
    assert code == 2, err
    assert err.startswith("troll tce train: error: ")
    assert message in err
    assert stdout == ""
    assert not out.exists()


def test_ppo_refusals_name_exactly_the_envs_ppo_runs_on():
    """Every env --algo ppo refuses (and PPOConfig, for a caller from Python) names, in its message, the envs
    check_env lets ppo run on (Meta-World's as metaworld/<task>), and only those."""
    import re

    from troll.episodic.envs.registry import ENV_NAMES, METAWORLD
    from troll.runs.files import UsageError
    from troll.tce.ppo import PPOConfig

    accepted, refusals = set(), []
    for name in ENV_NAMES:
        try:
            opts.check_env(name, "ppo")
            accepted.add("metaworld/<task>" if name in METAWORLD else name)
        except UsageError as err:
            refusals.append(str(err))
            with pytest.raises(ValueError) as config_err:
                PPOConfig(env=name)
            refusals.append(str(config_err.value).replace("PPO runs on", "troll's PPO steps"))
    assert len(refusals) == 2 * len(opts.TOY_ENVS) and {"fancy/box-pushing-dense", "fancy/hopper-jump"} <= accepted
    for message in refusals:
        listed = re.search(r"troll's PPO steps (.+?) only", message)
        assert listed, message
        assert set(re.split(r", | and ", listed[1])) == accepted, message


def test_resume_needs_out_and_out_may_not_be_empty(tmp_path, capsys, monkeypatch):
    code, _, err = cli(capsys, "train", "--resume")
    assert code == 2 and "--resume needs --out, the run folder to continue" in err
    monkeypatch.chdir(tmp_path)  # "" must not become "." (this folder)
    code, _, err = cli(capsys, "train", "--out", "", *TOY, *TINY, "--steps", "800")
    assert code == 2 and "--out is empty; give a folder path" in err
    assert list(tmp_path.iterdir()) == []


def test_a_folder_holding_something_else_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    before = snapshot(out)
    for extra in ([], ["--overwrite"], ["--resume"]):
        code, _, err = cli(capsys, "train", "--out", str(out), *TOY, *TINY, *extra)
        assert code == 2, extra
        assert f"--out {out} is not empty and holds no run of 'troll tce train'" in err
        assert "choose another --out" in err
    assert snapshot(out) == before
    # a study folder is not a run folder either
    out = make_run(tmp_path / "study", "tce study")
    before = snapshot(out)
    code, _, err = cli(capsys, "train", "--out", str(out), *TOY, *TINY, "--overwrite")
    assert code == 2 and "holds a folder of 'troll tce study', which 'troll tce train' never continues" in err
    assert snapshot(out) == before
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code, _, err = cli(capsys, "train", "--out", str(a_file), *TOY, *TINY)
    assert code == 2 and f"--out: run folder {a_file} exists and is not a folder" in err
    assert a_file.read_text() == "x"


def test_resume_holds_out_from_the_first_look_to_the_end(tmp_path, capsys, monkeypatch):
    """Between the command line's checks of --out and the run, no other process may start or delete a run there."""
    from troll.tce import cli as tce_cli

    out = tmp_path / "run"
    code, _, err = cli(capsys, "train", "--out", str(out), *TOY, *TINY, "--steps", "800")
    assert code == 0, err
    seen, train_config = [], tce_cli.train_config

    def spy(args, saved):
        seen.append(busy_elsewhere(out))
        return train_config(args, saved)

    monkeypatch.setattr(tce_cli, "train_config", spy)
    code, _, err = cli(capsys, "train", "--out", str(out), "--resume")
    assert code == 0, err
    assert seen == [True] and not busy_elsewhere(out)


# ---------------------------------------------------------------- a short run


def test_short_run_writes_the_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = cli(capsys, "train", "--out", str(out), *TOY, *TINY, "--steps", "2400", "--seed", "3")
    assert code == 0, err
    assert {p.name for p in out.iterdir()} == RUN_FILES | {"checkpoint-3.pt"}
    saved = json.loads((out / "config.json").read_text())
    assert saved["command"] == "tce train"
    config = TCEConfig.from_dict(saved["config"])
    # the flags given, the toy preset for the rest
    want = TCEConfig.preset("toy/viapoint", seed=3, total_env_steps=2400, episodes=8, eval_episodes=8, eval_every=2,
                            checkpoint_every=2, policy_hidden=(16,), critic_hidden=(16,), policy_epochs=4,
                            critic_epochs=4, critic_minibatches=2, workers=0)  # fmt: skip
    assert config == want
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert [r["env_steps"] for r in rows] == [800, 1600, 2400]
    assert [r.get("eval/success_rate") is not None for r in rows] == [False, True, True]  # every 2 and the last
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algo"] == "tce" and summary["env"] == "toy/viapoint" and summary["seed"] == 3
    assert summary["iterations"] == 3 and summary["planned_iterations"] == 3 and summary["env_steps"] == 2400
    assert summary["success_rate"] == rows[-1]["eval/success_rate"]
    assert summary["return"] == rows[-1]["eval/return"] and summary["distance"] == rows[-1]["eval/distance"]
    assert (out / "plots.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --no-progress: a line per evaluation, then the summary's main numbers and the folder
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("1600 env steps: eval success_rate ")
    assert lines[1].startswith("2400 env steps: eval success_rate ")
    printed = json.loads(lines[2])
    assert printed == {k: summary[k] for k in printed} and printed["env_steps"] == 2400
    assert lines[3] == f"run folder: {out}"


# ---------------------------------------------------------------- resume


@pytest.mark.parametrize("stop_at", [1, 3])
def test_resume_after_an_interruption_loses_and_repeats_no_iteration(tmp_path, capsys, monkeypatch, stop_at):
    """Ctrl-C after iteration ``stop_at`` was logged (checkpoints every 2: none yet at 1, the one of 2 at 3), then
    --resume: metrics.jsonl holds iterations 1..4 once each, equal to an uninterrupted run's."""
    from troll.tce import run as train_mod

    argv = [*TOY, *TINY, "--steps", "3200"]
    code, _, err = cli(capsys, "train", "--out", str(tmp_path / "full"), *argv)
    assert code == 0, err
    full = read_jsonl(tmp_path / "full" / "metrics.jsonl")

    out = tmp_path / "run"
    real = train_mod.append_jsonl

    def append_then_interrupt(path, row):
        real(path, row)
        if row["iteration"] == stop_at:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(train_mod, "append_jsonl", append_then_interrupt)
        try:
            code, _, err = cli(capsys, "train", "--out", str(out), *argv)
        except KeyboardInterrupt:
            pytest.fail("troll tce train let Ctrl-C through instead of reporting how to resume")
    assert code == 130
    assert f"interrupted; continue with: troll tce train --out {out} --resume" in err
    assert [r["iteration"] for r in read_jsonl(out / "metrics.jsonl")] == list(range(1, stop_at + 1))
    assert not (out / "summary.json").exists()
    assert [p.name for p in out.glob("checkpoint-*")] == ([] if stop_at < 2 else ["checkpoint-2.pt"])

    # a flag that differs from the run's is refused, and nothing changes
    before = snapshot(out)
    code, _, err = cli(capsys, "train", "--out", str(out), "--resume", "--mean-bound", "0.3", "--no-progress")
    assert code == 2 and "--mean-bound 0.3 (the run has 0.1)" in err and "start a new --out" in err
    assert snapshot(out) == before

    # the flags it was started with are accepted
    code, _, err = cli(capsys, "train", "--out", str(out), "--resume", *argv)
    assert code == 0, err
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert [r["env_steps"] for r in rows] == [800, 1600, 2400, 3200]
    assert strip_times(rows) == strip_times(full)  # everything random derives from the seed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == 4 and summary["env_steps"] == 3200

    # resuming a finished run reruns nothing
    before = snapshot(out)
    code, stdout, err = cli(capsys, "train", "--out", str(out), "--resume", "--no-progress")
    assert code == 0, err
    assert json.loads(stdout.splitlines()[0])["env_steps"] == 3200
    assert snapshot(out) == before


# ---------------------------------------------------------------- --overwrite


def test_overwrite_replaces_only_a_folder_of_this_command(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*TOY, *TINY, "--steps", "800"]
    assert cli(capsys, "train", "--out", str(out), *argv)[0] == 0
    before = snapshot(out)
    code, _, err = cli(capsys, "train", "--out", str(out), *argv)
    assert code == 2
    assert f"--out {out} already holds a run of 'troll tce train'; pass --resume to continue it, --overwrite" in err
    assert snapshot(out) == before

    code, _, err = cli(capsys, "train", "--out", str(out), *argv, "--seed", "1", "--algo", "bbrl", "--overwrite")
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["seed"] == 1 and config["algo"] == "bbrl"
    assert [r["iteration"] for r in read_jsonl(out / "metrics.jsonl")] == [1]
    assert json.loads((out / "summary.json").read_text())["algo"] == "bbrl"

    # a file this command did not write: --overwrite refuses and deletes nothing
    (out / "notes.txt").write_text("keep me")
    before = snapshot(out)
    code, _, err = cli(capsys, "train", "--out", str(out), *argv, "--overwrite")
    assert code == 2
    assert f"--overwrite: {out} holds files 'troll tce train' did not write: notes.txt; nothing was deleted" in err
    assert snapshot(out) == before


# ---------------------------------------------------------------- PPO


def test_ppo_short_run_writes_the_run_folder(tmp_path, capsys, monkeypatch):
    out = tmp_path / "ppo"
    system_tmp = tmp_path / "system-tmp"  # the temporary directory the run sees: it must leave nothing there
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    code, stdout, err = cli(capsys, "train", "--out", str(out), *PPO_TINY, "--steps", "128")
    assert code == 0, err
    assert {p.name for p in out.iterdir()} == RUN_FILES | {"checkpoint-128.zip"}
    # torch makes its compiler cache there (torchinductor_<user>) when an optimiser is built: one per user, reused
    assert [p.name for p in system_tmp.iterdir() if not p.name.startswith("torchinductor_")] == []
    saved = json.loads((out / "config.json").read_text())
    assert saved["command"] == "tce train"
    config = PPOConfig.from_dict(saved["config"])
    assert config == PPOConfig(env="gym/reacher", total_env_steps=128, eval_every_steps=50, eval_episodes=2,
                               n_steps=64, batch_size=32, n_epochs=1)  # fmt: skip
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["env_steps"] for r in rows] == [64, 128] and [r["iteration"] for r in rows] == [1, 2]
    for row in rows:  # evaluated after each rollout (every 50 env steps), one episode of 50 steps ended in each
        assert {"eval/return", "eval/success_rate", "eval/distance", "train/approx_kl"} <= set(row)
        assert row["rollout/episodes"] == 1
        assert row["policy/action_entropy"] == -row["train/entropy_loss"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algo"] == "ppo" and summary["env"] == "gym/reacher" and summary["seed"] == 0
    assert summary["iterations"] == 2 and summary["planned_iterations"] == 2 and summary["env_steps"] == 128
    assert summary["success_rate"] == rows[-1]["eval/success_rate"] and summary["return"] == rows[-1]["eval/return"]
    assert summary["rollout_return"] == rows[-1]["rollout/return"]
    assert (out / "plots.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert stdout.strip().splitlines()[-1] == f"run folder: {out}"


def test_ppo_resume_after_an_interruption(tmp_path, capsys, monkeypatch):
    from troll.tce import ppo

    out = tmp_path / "ppo"
    argv = [*PPO_TINY, "--steps", "192", "--checkpoint-every", "1"]
    real = ppo.append_jsonl

    def append_then_interrupt(path, row):
        real(path, row)
        if row["env_steps"] == 128:  # logged, but its checkpoint not yet written
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(ppo, "append_jsonl", append_then_interrupt)
        try:
            code, _, err = cli(capsys, "train", "--out", str(out), *argv)
        except KeyboardInterrupt:
            pytest.fail("troll tce train --algo ppo let Ctrl-C through")
    assert code == 130 and "--resume" in err
    assert [r["env_steps"] for r in read_jsonl(out / "metrics.jsonl")] == [64, 128]
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-64.zip"]

    # the flags it was started with are accepted (eval-every x episodes x T = its evaluation interval) ...
    code, _, err = cli(capsys, "train", "--out", str(out), "--resume", *argv)
    assert code == 0, err
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["env_steps"] for r in rows] == [64, 128, 192] and [r["iteration"] for r in rows] == [1, 2, 3]
    assert all("eval/return" in r for r in rows)
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-192.zip"]
    assert json.loads((out / "summary.json").read_text())["env_steps"] == 192
    # ... and another evaluation interval is not
    code, _, err = cli(capsys, "train", "--out", str(out), "--resume", "--eval-every", "2", "--episodes", "1")
    assert code == 2
    assert "--eval-every 2 --episodes 1 (evaluations every 100 env steps; the run has 50)" in err
    code, _, err = cli(capsys, "train", "--out", str(out), "--resume", "--eval-every", "1")  # x the preset's 16
    assert code == 2 and "--eval-every 1 (evaluations every 800 env steps; the run has 50)" in err


def test_ppo_preset_follows_tce_evaluation_schedule():
    # every eval_every x episodes x T env steps: Reacher 10 x 16 x 50, Meta-World 10 x 16 x 500
    assert PPOConfig.preset("gym/reacher").eval_every_steps == 8000
    assert PPOConfig.preset("metaworld/reach-v3").eval_every_steps == 80_000
    assert PPOConfig.preset("gym/reacher", eval_every=2, episodes=4).eval_every_steps == 2 * 4 * 50
    assert PPOConfig.preset("gym/reacher").total_env_steps == 400_000
    with pytest.raises(ValueError, match="eval_every must be an integer >= 1, got 0"):
        PPOConfig.preset("gym/reacher", eval_every=0)
    with pytest.raises(ValueError, match="no step-based interface"):
        PPOConfig.preset("toy/viapoint")


def test_evaluate_averages_the_episodes():
    """evaluate() with a policy that always sends (0.5, -0.5): the means of what the episodes give by hand."""

    class Constant:
        def predict(self, obs, deterministic):
            assert deterministic
            return np.array([0.5, -0.5], dtype=np.float32), None

    task = make_step_task("gym/reacher-sparse", seed=0)
    try:
        finals = [run_episode(task, s, [0.5, -0.5])[2][-1][2] for s in (11, 12, 13)]
        got = evaluate(Constant(), task, [11, 12, 13])
    finally:
        task.close()
    assert got["eval/return"] == pytest.approx(np.mean([-25.0 - 50 * f["distance"] for f in finals]), abs=1e-9)
    assert got["eval/distance"] == pytest.approx(np.mean([f["distance"] for f in finals]), abs=1e-12)
    assert got["eval/success_rate"] == np.mean([float(f["is_success"]) for f in finals])
