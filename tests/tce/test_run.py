"""``train``: the run folder, refusals before anything is written, determinism, resume == uninterrupted, and the CI
check that TCE solves the toy task (docs/tce.md, "How to run": the run folder)."""

from __future__ import annotations

import json
import time

import pytest
import torch
from conftest import busy_elsewhere, make_run

from troll.episodic import algorithm
from troll.episodic.config import TCEConfig
from troll.runs.files import UsageError, read_jsonl
from troll.tce.run import checkpoints, train


def tiny(**overrides) -> TCEConfig:
    """A few fast iterations on the toy task (8 episodes of 100 steps an iteration)."""
    base = dict(
        episodes=8,
        eval_episodes=8,
        total_env_steps=8 * 100 * 4,
        eval_every=2,
        checkpoint_every=2,
        policy_hidden=(16,),
        critic_hidden=(16,),
        policy_epochs=4,
        critic_epochs=4,
        critic_minibatches=2,
    )
    return TCEConfig.preset("toy/viapoint", **{**base, **overrides})


def tiny_reacher(**overrides) -> TCEConfig:
    """A few fast iterations on gym/reacher on EnvPool (8 episodes of 50 steps an iteration, one thread)."""
    base = dict(episodes=8, eval_episodes=8, total_env_steps=8 * 50 * 4, eval_every=2, checkpoint_every=2,
                policy_hidden=(16,), critic_hidden=(16,), policy_epochs=4, critic_epochs=4, critic_minibatches=2,
                workers=1, env_options={"backend": "envpool"})  # fmt: skip
    return TCEConfig.preset("gym/reacher", **{**base, **overrides})


def strip_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def test_run_folder_contents(tmp_path):
    out = tmp_path / "run"
    seen = []
    summary = train(tiny(), out, progress=False, on_iteration=seen.append)
    assert sorted(p.name for p in out.iterdir()) == [
        ".troll-run.json",
        "checkpoint-4.pt",
        "config.json",
        "metrics.jsonl",
        "plots.png",
        "summary.json",
    ]
    saved = json.loads((out / "config.json").read_text())
    assert saved["command"] == "tce train" and TCEConfig.from_dict(saved["config"]) == tiny()
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4] and seen == rows
    assert [r["env_steps"] for r in rows] == [800 * i for i in range(1, 5)]
    assert [("eval/success_rate" in r) for r in rows] == [False, True, False, True]
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["iterations"] == 4 and summary["env_steps"] == 3200 and summary["algo"] == "tce"
    assert summary["success_rate"] == rows[-1]["eval/success_rate"]
    assert summary["return"] == rows[-1]["eval/return"]
    # finished: resuming returns the summary without running anything
    assert train(None, out, resume=True, progress=False, plot=False) == summary


def test_folders_that_cannot_be_used_are_refused_before_anything_is_written(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds something else"):
        train(tiny(), other, progress=False, plot=False)
    (other / "config.json").write_text(json.dumps({"command": "train", "options": {}}))  # without a manifest: not a run
    with pytest.raises(UsageError, match="holds something else"):
        train(tiny(), other, resume=True, progress=False, plot=False)
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "notes.txt"]
    lm_run = make_run(tmp_path / "lm", "train")
    with pytest.raises(UsageError, match="'troll train', which 'troll tce train' never continues nor replaces"):
        train(tiny(), lm_run, resume=True, progress=False, plot=False)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        train(tiny(), a_file, progress=False, plot=False)
    with pytest.raises(UsageError, match="no run to resume"):
        train(None, tmp_path / "empty", resume=True, progress=False, plot=False)
    assert not (tmp_path / "empty").exists()

    run = tmp_path / "run"
    train(tiny(total_env_steps=800), run, progress=False, plot=False)
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    with pytest.raises(UsageError, match="already holds a run of 'troll tce train'"):
        train(tiny(), run, progress=False, plot=False)
    with pytest.raises(UsageError, match="mean_bound: folder 0.1, given 0.3"):
        train(tiny(total_env_steps=800, mean_bound=0.3), run, resume=True, progress=False, plot=False)
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before


def test_bad_config_values_fail_before_the_folder_exists(tmp_path):
    with pytest.raises(ValueError, match="cov_bound must be > 0"):
        train(tiny(cov_bound=0.0), tmp_path / "x", progress=False, plot=False)
    with pytest.raises(ValueError, match="num_segments=101 exceeds"):
        train(tiny(num_segments=101), tmp_path / "y", progress=False, plot=False)
    assert not (tmp_path / "y").exists()


def test_same_seed_same_results(tmp_path):
    train(tiny(total_env_steps=1600), tmp_path / "a", progress=False, plot=False)
    train(tiny(total_env_steps=1600), tmp_path / "b", progress=False, plot=False)
    train(tiny(total_env_steps=1600, seed=1), tmp_path / "c", progress=False, plot=False)
    a, b, c = (strip_times(read_jsonl(tmp_path / n / "metrics.jsonl")) for n in "abc")
    assert a == b
    assert a != c


@pytest.mark.parametrize(("algo", "make"), [("tce", tiny), ("bbrl", tiny), ("tce", tiny_reacher)],
                         ids=["tce", "bbrl", "tce-reacher-envpool"])  # fmt: skip
def test_resume_equals_uninterrupted(tmp_path, algo, make):
    """Stopped after iteration 3 and resumed from the checkpoint of iteration 2: the same metrics (evaluations on
    the same fixed episodes included) and the same policy as an uninterrupted run; on the toy task and on Reacher
    on EnvPool, whose episodes are drawn by pools built per reset."""
    if make is tiny_reacher:
        pytest.importorskip("envpool")
    config = make(algo=algo, eval_every=1)
    train(config, tmp_path / "full", progress=False, plot=False)

    class Stop(Exception):
        pass

    def stop_after_three(row):
        if row["iteration"] == 3:
            raise Stop

    with pytest.raises(Stop):
        train(config, tmp_path / "cut", progress=False, plot=False, on_iteration=stop_after_three)
    # stopped after iteration 3 was logged, with the last checkpoint at 2: the resumed run redoes 3
    assert len(read_jsonl(tmp_path / "cut" / "metrics.jsonl")) == 3
    assert [it for it, _ in checkpoints(tmp_path / "cut")] == [2]
    assert not (tmp_path / "cut" / "summary.json").exists()
    train(None, tmp_path / "cut", resume=True, progress=False, plot=False)
    full = strip_times(read_jsonl(tmp_path / "full" / "metrics.jsonl"))
    cut = strip_times(read_jsonl(tmp_path / "cut" / "metrics.jsonl"))
    assert [r["iteration"] for r in cut] == [1, 2, 3, 4]
    assert cut == full
    a = torch.load(checkpoints(tmp_path / "full")[-1][1], weights_only=True)["agent"]["policy"]
    b = torch.load(checkpoints(tmp_path / "cut")[-1][1], weights_only=True)["agent"]["policy"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------ the CI check

CI_THRESHOLD = 0.8  # success rate of the mean trajectory on 64 fixed evaluation contexts


def test_ci_tce_solves_the_toy_task(tmp_path):
    """`troll tce train` on toy/viapoint with its preset reaches the threshold (the CI check of the toy task)."""
    config = TCEConfig.preset("toy/viapoint")
    start = time.perf_counter()
    summary = train(config, tmp_path / "toy", progress=False, plot=False)
    seconds = time.perf_counter() - start
    rows = read_jsonl(tmp_path / "toy" / "metrics.jsonl")
    curve = [(r["env_steps"], r["eval/success_rate"]) for r in rows if "eval/success_rate" in r]
    assert summary["success_rate"] >= CI_THRESHOLD, (curve, seconds)
    assert summary["env_steps_to_success"] is not None


def test_a_resumed_run_holds_its_folder_from_the_check_on(tmp_path, monkeypatch):
    """While a resumed run builds its simulators (seconds on Meta-World), no other process may start or delete its
    folder; once train() returns, the folder is free again (a notebook keeps no lock)."""
    out = tmp_path / "run"
    train(tiny(), out, progress=False, plot=False)
    assert not busy_elsewhere(out)
    (out / "summary.json").unlink()  # as if killed after its last checkpoint
    seen, make_env = [], algorithm.make_env

    def spy(name, **kwargs):
        seen.append(busy_elsewhere(out))
        return make_env(name, **kwargs)

    monkeypatch.setattr(algorithm, "make_env", spy)
    train(None, out, resume=True, progress=False, plot=False)
    assert seen == [True] and not busy_elsewhere(out)
