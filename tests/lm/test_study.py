"""``troll study``: the statistics against hand-worked numbers, the grid parsing, bad input (exit 2, nothing
written), and end to end on the tiny random model of tests/support/tiny.py (cells run as ``troll train``
subprocesses)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import SRC, run_cli  # noqa: E402

from troll import runs  # noqa: E402
from troll.lm import study  # noqa: E402
from troll.lm.options import RunOptions, UsageError  # noqa: E402
from troll.study import parse_seeds  # noqa: E402
from troll.study.report import mean_curve  # noqa: E402

TINY = ["--steps", "2", "--heldout", "4", "--max-completion-length", "6", "--eval-every", "1"]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Own model cache per test; the cells (subprocesses) import this checkout's troll."""
    monkeypatch.setenv("TROLL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    return tmp_path / "cache"


# ---------------------------------------------------------------- statistics, worked by hand


def test_cell_metrics_and_curves_by_hand():
    rows = [
        {"step": 0, "heldout/accuracy": 0.25},
        {"step": 1, "reward": 0.1, "entropy": 2.0, "troll/kl_after/max": 0.0, "troll/kl_before/mean": 0.0},  # on-policy
        {"step": 2, "entropy": 1.5, "troll/kl_after/max": 0.04, "troll/kl_before/mean": 0.02,
         "troll/kl_before/max": 0.1, "heldout/accuracy": 0.75},
        {"step": 3, "reward": 0.3, "entropy": 1.0, "troll/kl_after/max": 0.0, "troll/kl_before/mean": 0.0},
        {"step": 4, "entropy": 0.5, "troll/kl_after/max": 0.05, "troll/kl_before/mean": 0.04,
         "troll/kl_before/max": 0.3, "heldout/accuracy": 0.5},
    ]  # fmt: skip
    summary = {"heldout_accuracy_before": 0.25, "heldout_accuracy_after": 0.5, "reward_last_quarter_mean": 0.3}
    m = study.cell_metrics(summary, rows, steps_per_rollout=2)
    # the peak is the best evaluation after step 0 (0.75 at step 2); KL over the off-policy steps 2 and 4 only
    assert m == {"acc_before": 0.25, "acc_after": 0.5, "acc_peak": 0.75, "reward_last_quarter": 0.3,
                 "entropy_final": 0.5, "kl_mean": pytest.approx(0.03), "kl_max": 0.3, "kl_after_max": 0.05,
                 "clipped_share": None}  # fmt: skip
    clip_rows = [{"step": s, "clip_ratio/region_mean": v} for s, v in [(1, 0.9), (2, 0.1), (3, 0.8), (4, 0.3)]]
    assert study.cell_metrics({}, clip_rows, 2)["clipped_share"] == pytest.approx(0.2)  # steps 2 and 4
    assert study.cell_metrics({"heldout_accuracy_after": 0.1}, [], 2)["acc_peak"] == 0.1  # no evaluation during
    curve = mean_curve([rows, [{"step": 4, "heldout/accuracy": 1.0}]], "heldout/accuracy")
    assert curve["step"] == [0, 2, 4] and curve["n"] == [1, 1, 2]
    assert curve["mean"] == [0.25, 0.75, 0.75] and curve["se"][0] is None and curve["se"][2] == pytest.approx(0.25)


# ---------------------------------------------------------------- the grid


def test_parse_grid():
    assert parse_seeds("3") == [0, 1, 2] and parse_seeds("4,0,7") == [4, 0, 7]
    assert parse_seeds("5,") == [5]
    types = {"steps_per_rollout": int, "lr": float, "task": str, "seed": int}
    assert study.parse_sweep("steps-per-rollout=2,4,8", types) == ("steps_per_rollout", [2, 4, 8])
    assert study.parse_sweep("lr=1e-6, 1e-5", types) == ("lr", [1e-6, 1e-5])
    base = RunOptions(loss=None, steps=2, clip_eps=0.3)
    spec = study.StudySpec(base, ["troll", "grpo"], [0, 1], "kl_bound", [0.01, 0.1])
    cells = study.plan(spec, Path("st"))
    assert [(c.value, c.arm, c.seed) for c in cells][:3] == [(0.01, "troll", 0), (0.01, "grpo", 0), (0.01, "troll", 1)]
    assert {c.options.clip_eps for c in cells if c.arm == "grpo"} == {0.3}  # --sweep kl-bound is TROLL's bound only
    assert {c.options.kl_bound for c in cells if c.arm == "grpo"} == {None}
    assert {c.options.kl_bound for c in cells if c.arm == "troll"} == {0.01, 0.1}
    assert cells[-1].options.out == str(Path("st/kl-bound=0.1/grpo/seed1")) and cells[-1].options.eval_every == 1
    assert study.StudySpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_arms_with_their_own_options(tmp_path, monkeypatch):
    """--losses troll,troll:tail=renormalize,...: arms that differ by more than the loss, in one study, paired like
    the plain losses (each TROLL arm minus each baseline arm)."""
    monkeypatch.chdir(tmp_path)  # the cells' options files are written beside their folders
    assert study.split_arm("troll:kl-bound=0.2:tail=renormalize") == ("troll", {"kl_bound": 0.2, "tail": "renormalize"})
    assert study.split_arm(" clip : dual-clip=5 ") == ("clip", {"dual_clip": 5.0})
    arms = study.parse_arms("troll, troll:tail=renormalize,troll_seq:agg=token-mean:kl-bound=0.2,gspo_tm")
    assert arms == ["troll", "troll:tail=renormalize", "troll_seq:agg=token-mean:kl-bound=0.2", "gspo_tm"]
    spec = study.StudySpec(RunOptions(loss=None, steps=2, lr=2e-5, clip_eps=1e-3), arms, [0])
    cells = {c.arm: c for c in study.plan(spec, Path("st"))}
    assert cells["troll:tail=renormalize"].options.tail == "renormalize"
    assert cells["troll:tail=renormalize"].folder == Path("st/troll:tail=renormalize/seed0")
    seq = cells["troll_seq:agg=token-mean:kl-bound=0.2"].options
    assert (seq.loss, seq.agg, seq.kl_bound, seq.tail, seq.lr) == ("troll_seq", "token-mean", 0.2, "bucket", 2e-5)
    assert cells["gspo_tm"].options.clip_eps == 1e-3 and cells["troll"].options.kl_bound == 0.05
    # pairs at the same setting only (options whose meaning depends on the loss, as the bounds or agg, aside)
    pairs = [("troll", "gspo_tm"), ("troll_seq:agg=token-mean:kl-bound=0.2", "gspo_tm")]
    assert study.troll_minus_baselines(arms) == pairs
    reuse = [f"{loss}:steps-per-rollout={k}" for k in (1, 16) for loss in ("troll", "clip")]
    assert study.troll_minus_baselines(reuse) == [(reuse[0], reuse[1]), (reuse[2], reuse[3])]
    ran = cell_runs(cells["troll:tail=renormalize"])
    assert ran == cells["troll:tail=renormalize"].options and (ran.loss, ran.tail) == ("troll", "renormalize")


def cell_runs(cell) -> RunOptions:
    """The options a cell's ``troll train`` builds from its command line and the options file the study writes."""
    from troll.cli import build_parser
    from troll.lm.cli import given_options
    from troll.study import options as options_file

    options_file.write(cell.options_file, study.cell_data(cell))
    argv = study.cell_argv(cell, resume=False, keep_checkpoints=False, keep_model=False)
    assert argv[:5] == [sys.executable, "-m", "troll.cli", "train", "--out"]
    assert argv[argv.index("--options") + 1] == str(cell.options_file)
    return given_options(build_parser().parse_args(argv[3:])).resolved()


def test_arms_take_the_shared_options_that_concern_them(tmp_path, monkeypatch):
    """One command line for every arm: --agg reaches the TROLL losses only, the clip options the clip losses only
    (resolved: clip-higher defaults to clip_eps, the dual clip to the loss's own: 10 for clip, none for grpo), and a
    cell's options file holds what its loss uses (None for the rest), which its command reads back as planned."""
    monkeypatch.chdir(tmp_path)  # the cells' options files are written beside their folders
    base = RunOptions(loss=None, steps=2, agg="token-mean", clip_eps_high=0.28)
    spec = study.StudySpec(base, ["troll_seq", "clip", "grpo"], [0], "tail", ["bucket", "renormalize"])
    cells = {(c.value, c.arm): c for c in study.plan(spec, Path("st"))}
    troll, clip, grpo = (cells["renormalize", arm].options for arm in ("troll_seq", "clip", "grpo"))
    assert (troll.agg, troll.clip_eps_high, troll.dual_clip, troll.tail) == ("token-mean", None, None, "renormalize")
    assert (clip.agg, clip.clip_eps, clip.clip_eps_high, clip.dual_clip) == (None, 0.2, 0.28, 10.0)
    assert (grpo.agg, grpo.clip_eps_high, grpo.dual_clip) == (None, 0.28, 0.0)
    data = study.cell_data(cells["renormalize", "clip"])
    assert data["agg"] is None and data["dual_clip"] == 10.0 and "out" not in data
    assert (data["tail"], data["measure_kl"]) == ("renormalize", "auto")
    assert cell_runs(cells["renormalize", "clip"]) == clip
    data = study.cell_data(cells["bucket", "troll_seq"])
    assert data["dual_clip"] is None and data["clip_eps_high"] is None and data["agg"] == "token-mean"
    assert cell_runs(cells["bucket", "troll_seq"]) == cells["bucket", "troll_seq"].options


def test_an_arms_bound_takes_its_losss_name(capsys, tmp_path, monkeypatch):
    """An arm names its loss's bound as ``troll train`` does (troll:kl-bound=, grpo:clip-eps=, cispo:cispo-cap=), and
    a cell's options hold it under that field."""
    monkeypatch.chdir(tmp_path)  # the cells' options files are written beside their folders
    arms = study.parse_arms("troll:kl-bound=0.2,grpo:clip-eps=0.3,cispo:cispo-cap=4")
    cells = {c.arm: c for c in study.plan(study.StudySpec(RunOptions(steps=2), arms, [0, 1]), Path("st"))}
    assert capsys.readouterr().err == ""
    assert [cells[a].options.bound for a in arms] == [0.2, 0.3, 4.0]
    assert (cells[arms[0]].options.kl_bound, cells[arms[1]].options.clip_eps, cells[arms[2]].options.cispo_cap) == (
        0.2, 0.3, 4.0)  # fmt: skip
    for arm, loss, name in [("troll:kl-bound=0.2", "troll", "kl_bound"), ("grpo:clip-eps=0.3", "grpo", "clip_eps"),
                            ("cispo:cispo-cap=4", "cispo", "cispo_cap")]:  # fmt: skip
        assert study.split_arm(arm) == (loss, {name: float(arm.split("=")[1])})
    with pytest.raises(UsageError, match="kl-bound= sets the per-token KL bound .* the loss grpo takes clip-eps="):
        study.split_arm("grpo:kl-bound=0.2")
    with pytest.raises(UsageError, match="clip-eps= sets the clip range .* the loss troll takes kl-bound="):
        study.split_arm("troll:clip-eps=0.2")
    for arm, name in zip(arms, ("kl_bound", "clip_eps", "cispo_cap")):
        data = study.cell_data(cells[arm])
        assert data[name] == cells[arm].options.bound
        assert cell_runs(cells[arm]) == cells[arm].options


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--losses", ""], "--losses '' is empty"),
        (["--losses", "troll,"], "empty entry"),
        (["--losses", "troll,troll"], "names a loss twice"),
        (["--losses", "troll,ppo"], "unknown loss 'ppo' in --losses"),
        (["--sweep", "colour=1,2"], "--sweep: unknown key 'colour'; sweep one of:"),
        (["--sweep", "seed=1,2"], "unknown key 'seed'"),
        (["--sweep", "loss=troll"], "unknown key 'loss'"),
        (["--sweep", "lr"], "write KEY=V1,V2"),
        (["--sweep", "lr="], "value list is empty"),
        (["--sweep", "lr=1e-5,abc"], "must be a float"),
        (["--sweep", "steps=2,2"], "names a value twice"),
        (["--sweep", "steps-per-rollout=2,3"], "--sweep steps-per-rollout=3 (troll): a rollout batch"),
        (["--sweep", "lr=1e-5,-1"], "--sweep lr=-1.0 (troll): --lr must be > 0"),
        (["--sweep", "alpha=nan"], "--sweep alpha=nan (troll): --alpha must be >= 0 and finite"),
        (["--sweep", "clip-eps=0.2,0"], "--clip-eps must be a finite number > 0"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--jobs=-2"], "--jobs must be >= 1"),
        (["--seeds", "0"], "a count of seeds must lie in [1, 1000]"),
        (["--seeds", "100000000000"], "a count of seeds must lie in [1, 1000]"),
        (["--seeds", "two"], "give a count"),
        (["--seeds", "1,1"], "names a seed twice"),
        (["--seeds=-1,2"], "each seed must lie in"),
        (["--clip-eps", "nan"], "--clip-eps must be a finite number > 0"),
        (["--kl-bound", "inf"], "--kl-bound must be > 0 and finite, got inf"),
        (["--steps", "0"], "--steps must be an integer >= 1"),
        (["--task", "no_such_task"], "unknown task"),
        (["--model", "/nonexistent/model"], "no such file or folder"),
        (["--overwrite", "--resume"], "exclude each other"),
        (["--resume"], "not found; start the study without --resume"),
        (["--losses", "grpo,clip", "--agg", "token-mean"], "--agg concerns the TROLL losses (troll, troll_seq)"),
        (["--losses", "troll", "--dual-clip", "10"], "--dual-clip concerns the clip losses"),
        (["--losses", "troll", "--sweep", "clip-eps-high=0.2,0.28"], "--clip-eps-high concerns the clip losses"),
        (["--losses", "troll,clip", "--dual-clip", "1.1"], "--dual-clip 1.1 must exceed 1 + the upper clip range"),
        (["--sweep", "tail=bucket,uniform"], "--sweep tail=uniform (troll): --tail='uniform' is not supported"),
        (["--sweep", "measure-kl=on,maybe"], "--measure-kl must be auto, on or off"),
        (["--losses", "troll:colour=1"], "--losses troll:colour=1: 'colour=1' is not KEY=VALUE with KEY one of"),
        (["--losses", "troll:kl-bound"], "'kl-bound' is not KEY=VALUE"),
        (["--losses", "troll:kl-bound=0.1:kl-bound=0.2"], "each once"),
        (["--losses", "troll:seed=3"], "is not KEY=VALUE"),
        (["--losses", "troll:kl-bound=abc"], "--losses troll:kl-bound=abc: kl-bound must be a float, got 'abc'"),
        (["--losses", "ppo:kl-bound=0.1"], "unknown loss 'ppo' in --losses"),
        (["--losses", "troll,troll"], "names a loss twice"),
        (
            ["--losses", "troll:kl-bound=0.2", "--sweep", "kl-bound=0.1,0.3"],
            "sets the swept option kl-bound; sweep it or set it",
        ),
        (["--losses", "clip:agg=token-mean"], "--losses clip:agg=token-mean: --agg sets the aggregation of the TROLL"),
        (["--losses", "troll:dual-clip=10"], "--losses troll:dual-clip=10: --dual-clip: only the clip losses"),
        (["--losses", "troll:kl-bound=0"], "--losses troll:kl-bound=0: --kl-bound must be > 0 and finite"),
    ],
)
def test_bad_input_writes_nothing(tmp_path, capsys, isolated, argv, message):
    out = tmp_path / "study"
    code, err = run_cli(capsys, "study", "--out", str(out), *argv)
    assert code == 2, err
    assert message in err
    assert not out.exists() and not isolated.exists()


def test_folder_holding_something_else(tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for extra in [[], ["--overwrite"], ["--resume"]]:
        code, err = run_cli(capsys, "study", "--out", str(out), *extra)
        assert code == 2 and ("holds something else" in err or "not found" in err), err
    runs.begin(out, "train")  # a train run (its manifest and config.json), not a study
    (out / "config.json").write_text(json.dumps({"command": "train", "options": {}}))
    code, err = run_cli(capsys, "study", "--out", str(out), "--overwrite")
    assert code == 2 and "'troll train', which 'troll study' never continues nor replaces" in err
    assert sorted(p.name for p in out.iterdir()) == [".troll-run.json", "config.json", "notes.txt"]
    (tmp_path / "file").write_text("x")
    code, err = run_cli(capsys, "study", "--out", str(tmp_path / "file" / "below"))
    assert code == 2 and "is a file" in err


def test_resume_checks(tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "config.json").write_text("{not json")
    code, err = run_cli(capsys, "study", "--out", str(out), "--resume")
    assert code == 2 and "cannot be read as JSON" in err
    (out / "config.json").write_text(json.dumps({"command": "study"}))
    code, err = run_cli(capsys, "study", "--out", str(out), "--resume")
    assert code == 2 and "has no 'spec' object" in err
    spec = study.StudySpec(RunOptions(steps=2), ["troll", "grpo"], [0, 1])
    (out / "config.json").write_text(json.dumps({"command": "study", "spec": spec.to_json()}))
    code, err = run_cli(capsys, "study", "--out", str(out), "--resume", "--steps", "3", "--seeds", "1")
    assert code == 2 and "--steps, --seeds differ from its config.json" in err
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]


def _study_cells(tmp_path, *argv):
    from troll.cli import build_parser
    from troll.lm.cli import study_spec

    spec, out = study_spec(build_parser().parse_args(["study", "--out", str(tmp_path / "st"), "--seeds", "1", *argv]))
    return spec, study.plan(spec, out)


def test_a_sweep_may_set_what_makes_the_batch_fit(tmp_path):
    """The study's options are checked value by value; how the batch shape fits together is checked in each cell,
    with its sweep value (the default --prompts-per-step 4 never has to fit --steps-per-rollout 3 when the sweep
    replaces it); a cell that does not fit is refused, naming its sweep value."""
    _, cells = _study_cells(tmp_path, "--losses", "troll", "--sweep", "prompts-per-step=3,6", "--generations", "2",
                            "--steps-per-rollout", "3")  # fmt: skip
    assert [(c.options.prompts_per_step, c.options.steps_per_rollout) for c in cells] == [(3, 3), (6, 3)]
    with pytest.raises(UsageError, match="--sweep prompts-per-step=4 .*cannot be split into --steps-per-rollout 3"):
        _study_cells(tmp_path, "--sweep", "prompts-per-step=3,4", "--generations", "2", "--steps-per-rollout", "3")


def test_an_arms_options_are_checked_with_the_shared_ones(tmp_path):
    """An arm's own options and the shared ones are checked together as the cell's run: --dual-clip 1.1 fits the
    clip range an arm sets (1 + 0.05), not the default one (1 + 0.2) it replaces; a cell that does not fit, or an
    arm that sets an option its loss ignores, is refused naming the arm."""
    _, cells = _study_cells(tmp_path, "--losses", "grpo:clip-eps=0.05,clip:clip-eps-high=0.05", "--dual-clip", "1.1")
    assert [(c.options.clip_eps, c.options.clip_eps_high, c.options.dual_clip) for c in cells] == [
        (0.05, 0.05, 1.1), (0.2, 0.05, 1.1)]  # fmt: skip
    with pytest.raises(UsageError, match="--losses grpo:clip-eps=0.2: --dual-clip 1.1 must exceed 1 \\+ the upper"):
        _study_cells(tmp_path, "--losses", "grpo:clip-eps=0.2", "--dual-clip", "1.1")
    with pytest.raises(UsageError, match="--losses grpo:dual-clip=5:agg=token-mean: --agg sets the aggregation"):
        _study_cells(tmp_path, "--losses", "grpo:dual-clip=5:agg=token-mean")


def test_a_resumed_study_takes_its_own_flags_again(tmp_path):
    """--resume with a flag given again at its saved value continues the study, whatever the defaults of the
    others (a saved --steps-per-rollout 3 fits the saved batch, not the default one)."""
    shape = ["--prompts-per-step", "3", "--generations", "2", "--steps-per-rollout", "3"]
    spec, _ = _study_cells(tmp_path, *shape)
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "config.json").write_text(json.dumps({"command": "study", "spec": spec.to_json()}))
    for again in (["--steps-per-rollout", "3"], ["--generations", "2", "--threads", "2"]):
        _, cells = _study_cells(tmp_path, "--resume", *again)
        assert {(c.options.prompts_per_step, c.options.steps_per_rollout) for c in cells} == {(3, 3)}
    with pytest.raises(UsageError, match="; --steps-per-rollout differ from its config.json"):
        _study_cells(tmp_path, "--resume", "--steps-per-rollout", "2")


def test_a_resumed_study_may_add_losses_and_seeds_never_drop_them():
    from troll.lm.cli import _check_same_grid

    saved = study.StudySpec(RunOptions(steps=2), ["troll", "grpo"], [0, 1])
    _check_same_grid(study.StudySpec(RunOptions(steps=2), ["troll", "grpo", "clip"], [0, 1, 2]), saved)  # grows
    for losses, seeds, named in ((["troll"], [0, 1], "--losses"), (["troll", "grpo"], [1, 2], "--seeds")):
        with pytest.raises(UsageError, match=f"; {named} differ from its config.json"):
            _check_same_grid(study.StudySpec(RunOptions(steps=2), losses, seeds), saved)


# ---------------------------------------------------------------- end to end


def test_study_end_to_end_two_jobs(tmp_path, capsys, tiny_model_dir):
    out = tmp_path / "study"
    argv = ["study", "--model", str(tiny_model_dir), "--out", str(out), "--losses", "troll,grpo", "--seeds", "2"]
    code, err = run_cli(capsys, *argv, *TINY, "--jobs", "2")
    assert code == 0, err
    assert {"study.json", "study.md", "study.png", "config.json", "troll", "grpo"} <= {p.name for p in out.iterdir()}
    data = json.loads((out / "study.json").read_text())
    assert [(c["loss"], c["seed"], c["status"]) for c in data["cells"]] == [
        ("troll", 0, "done"), ("grpo", 0, "done"), ("troll", 1, "done"), ("grpo", 1, "done")
    ]  # fmt: skip
    for cell in data["cells"]:
        folder = Path(cell["folder"])
        assert {"config.json", "metrics.jsonl", "summary.json", "plots.png"} <= {p.name for p in folder.iterdir()}
        assert not (folder / "model").exists() and not list(folder.glob("checkpoint-*"))  # small disk by default
        assert cell["summary"]["heldout_n"] == 4 and cell["summary"]["steps"] == 2
    troll_agg = next(a for a in data["aggregates"] if a["loss"] == "troll")
    accs = [c["metrics"]["acc_after"] for c in data["cells"] if c["loss"] == "troll"]
    assert troll_agg["acc_after"]["n"] == 2 and troll_agg["acc_after"]["mean"] == pytest.approx(sum(accs) / 2)
    assert troll_agg["kl_after_max"]["mean"] is not None and troll_agg["clipped_share"]["mean"] is None
    paired = [p for p in data["paired"] if p["metric"] == "acc_after"]
    assert len(paired) == 1 and paired[0]["troll"] == "troll" and paired[0]["baseline"] == "grpo"
    curve = next(c for c in data["curves"] if c["loss"] == "grpo" and c["key"] == "heldout/accuracy")
    assert curve["step"] == [0, 1, 2] and curve["n"] == [2, 2, 2]  # evaluated before, at step 1 and after
    table = (out / "study.md").read_text()
    assert "| troll | 2 |" in table and "| held-out acc. after | troll - grpo |" in table
    assert (out / "study.png").stat().st_size > 10_000


def test_study_of_arms_with_options_end_to_end(tmp_path, capsys, tiny_model_dir):
    """Arms with their own options run as troll train subprocesses with those options; the clip arm logs its KL."""
    out = tmp_path / "study"
    argv = ["study", "--model", str(tiny_model_dir), "--out", str(out), "--seeds", "1", *TINY, "--jobs", "2"]
    code, err = run_cli(capsys, *argv, "--losses", "troll:tail=renormalize:agg=seq-mean-token-mean,clip")
    assert code == 0, err
    saved = json.loads((out / "troll:tail=renormalize:agg=seq-mean-token-mean" / "seed0" / "config.json").read_text())
    assert (saved["options"]["tail"], saved["options"]["agg"]) == ("renormalize", "seq-mean-token-mean")
    assert json.loads((out / "clip" / "seed0" / "config.json").read_text())["options"]["dual_clip"] == 10.0
    data = json.loads((out / "study.json").read_text())
    assert [c["metrics"]["kl_mean"] is not None for c in data["cells"]] == [True, True]
    assert "| troll:tail=renormalize:agg=seq-mean-token-mean | 1 |" in (out / "study.md").read_text()


def test_study_resumes_without_rerunning_finished_cells(tmp_path, capsys, tiny_model_dir):
    out = tmp_path / "study"
    argv = ["study", "--model", str(tiny_model_dir), "--out", str(out), "--losses", "grpo", "--seeds", "2", *TINY]
    code, err = run_cli(capsys, *argv, "--jobs", "2", "--keep-checkpoints")
    assert code == 0, err
    done, cut = out / "grpo" / "seed0", out / "grpo" / "seed1"
    (done / "marker").write_text("finished earlier")
    stamp = (done / "summary.json").stat().st_mtime_ns
    # seed1 was interrupted after its last checkpoint, before its summary
    (cut / "summary.json").unlink()
    assert (cut / "checkpoint-2").is_dir()
    code, err = run_cli(capsys, "study", "--out", str(out))
    assert code == 2 and "pass --resume" in err  # never overwrites
    code, err = run_cli(capsys, "study", "--out", str(out), "--resume", "--jobs", "2")
    assert code == 0, err
    assert (done / "marker").is_file() and (done / "summary.json").stat().st_mtime_ns == stamp  # not rerun
    assert "started" not in "".join(line for line in err.splitlines() if "seed0" in line)
    commands = [line for line in (cut.parent / "seed1.log").read_text().splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and commands[-1].endswith("--resume --no-model") and "(resuming)" in err
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["resumed"] is True and summary["steps"] == 2
    assert not list(out.glob("grpo/*/checkpoint-*"))  # without --keep-checkpoints this time: dropped
    data = json.loads((out / "study.json").read_text())
    assert [c["status"] for c in data["cells"]] == ["kept", "done"]

    # an interrupted cell without a checkpoint starts over, its own files replaced; a user's file in it is never
    # deleted: that cell is reported failed and keeps it
    (cut / "summary.json").unlink()
    (cut / "notes.txt").write_text("mine")
    code, err = run_cli(capsys, "study", "--out", str(out), "--resume")
    assert code == 1 and "did not write: notes.txt" in err and (cut / "notes.txt").read_text() == "mine"
    (cut / "notes.txt").unlink()
    code, err = run_cli(capsys, "study", "--out", str(out), "--resume")
    assert code == 0, err
    assert (cut / "summary.json").is_file()
    assert json.loads((cut / "summary.json").read_text())["resumed"] is False
    assert (done / "summary.json").stat().st_mtime_ns == stamp


def test_failed_cell_does_not_stop_the_others(tmp_path, capsys, tiny_model_dir):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for p in tiny_model_dir.iterdir():
        (broken / p.name).write_bytes(p.read_bytes())
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    out = tmp_path / "study"
    argv = ["study", "--out", str(out), "--losses", "grpo", "--seeds", "1", "--jobs", "2", *TINY]
    code, err = run_cli(capsys, *argv, "--sweep", f"model={tiny_model_dir},{broken}")
    assert code == 1 and "FAILED" in err and "1 cell(s) failed" in err
    data = json.loads((out / "study.json").read_text())
    assert sorted(c["status"].split(" ")[0] for c in data["cells"]) == ["done", "failed"]
    assert "Cells without a result" in (out / "study.md").read_text()
    assert math.isfinite(next(c for c in data["cells"] if c["status"] == "done")["metrics"]["entropy_final"])


def test_usage_error_type():
    with pytest.raises(UsageError):
        study.parse_losses(" ")
