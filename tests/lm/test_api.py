"""``troll.lm.train(options)``, the Python entry of ``troll train``: it resolves and checks its own input (nothing
written on bad input) and trains the run, recording the defaults the task decided."""

from __future__ import annotations

import json

import pytest

import troll.lm
from troll.lm.options import RunOptions, UsageError

pytest.importorskip("trl")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TROLL_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task": "no_such_task"}, "unknown task 'no_such_task'"),
        ({"loss": None}, "these options have no loss"),
        ({"model": "/nonexistent/model"}, "no such file or folder"),
    ],
)
def test_train_refuses_bad_input_before_writing(tmp_path, options, message):
    out = tmp_path / "run"
    with pytest.raises(UsageError, match=message):
        troll.lm.train(RunOptions(**options, out=str(out)))
    assert not out.exists()


def test_train_takes_run_options_and_one_of_resume_or_overwrite(tmp_path):
    with pytest.raises(UsageError, match="takes a RunOptions"):
        troll.lm.train({"task": "code"})
    with pytest.raises(UsageError, match="exclude each other"):
        troll.lm.train(RunOptions(out=str(tmp_path / "run")), resume=True, overwrite=True)


def test_train_runs_and_records_the_task_defaults(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    options = troll.lm.RunOptions(model=str(tiny_model_dir), steps=2, max_completion_length=4, heldout=2,
                                  eval_every=0, out=str(out))  # fmt: skip
    summary = troll.lm.train(options, save_model=False)
    assert summary["steps"] == 2 and summary["heldout_n"] == 2
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    saved = json.loads((out / "config.json").read_text())["options"]
    assert (saved["temperature"], saved["heldout_samples"]) == (1.0, 0)  # chain_sum: the math defaults
    with pytest.raises(UsageError, match="--overwrite"):  # a finished run is not replaced unasked
        troll.lm.train(options, save_model=False)


def test_a_kl_penalty_to_the_starting_model_reaches_trl(tmp_path, tiny_model_dir):
    """``beta > 0`` with clip: TRL loads a second copy of the starting model from the run's model folder and logs the
    KL to it at every step, exactly 0 here (the random tiny model earns no reward, so its weights stay the starting
    ones). Without beta TRL loads no copy and logs no such KL."""
    kl = {}
    for beta in (0.5, 0.0):
        out = tmp_path / f"run-{beta}"
        options = troll.lm.RunOptions(model=str(tiny_model_dir), loss="clip", beta=beta, steps=2, lr=0.05,
                                      max_completion_length=4, heldout=2, eval_every=0, out=str(out))  # fmt: skip
        troll.lm.train(options, save_model=False)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        kl[beta] = [row["kl"] for row in rows if "kl" in row]
        assert json.loads((out / "config.json").read_text())["options"]["beta"] == beta
    assert kl == {0.5: [0.0, 0.0], 0.0: []}
