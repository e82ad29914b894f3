"""``troll.lm.run.train`` through the run protocol, as the Python API and ``troll compare`` call it: what a resumed
run refuses before anything is written or loaded."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from troll import runs  # noqa: E402
from troll.lm.options import RunOptions, UsageError  # noqa: E402
from troll.lm.run import train  # noqa: E402


@pytest.mark.parametrize(
    "config, message",
    [
        ("{not json", "cannot be read as JSON"),
        (json.dumps({"command": "train"}), "has no 'options' object"),
        (json.dumps({"command": "train", "options": {"steps": "many"}}), "are not valid"),
    ],
)
def test_resume_of_a_damaged_config_says_what_is_wrong(tmp_path, config, message):
    """A run folder of troll train (its manifest) with a checkpoint and a damaged config.json: the resume is refused
    saying so (not that it is "not a GRPO run", which every troll train run is), and nothing is changed."""
    out = tmp_path / "run"
    runs.begin(out, "train")
    runs.release(out)
    (out / "checkpoint-2").mkdir()
    (out / "config.json").write_text(config)
    with pytest.raises(UsageError, match=message):
        train(RunOptions(steps=2, out=str(out)).resolved(), resume=True)
    assert sorted(p.name for p in out.iterdir()) == [".troll-run.json", "checkpoint-2", "config.json"]
    assert (out / "config.json").read_text() == config


def test_shared_options_are_no_run(tmp_path):
    """``loss=None`` (the options a comparison or study shares) is refused as a run, before the folder is touched:
    not a TypeError from resolved(), nor a folder with a loss-less config.json and a KeyError after the model is
    loaded."""
    shared = RunOptions(loss=None, steps=2, heldout=4, out=str(tmp_path / "run"))
    with pytest.raises(UsageError, match="no loss .* make each loss's run with for_loss"):
        shared.resolved()
    with pytest.raises(UsageError, match="no loss .* make each loss's run with for_loss"):
        train(shared)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("keep", [False, True])
def test_a_finished_run_resumed_returns_its_summary_and_ends_its_checkpoints(tmp_path, keep):
    """A run killed after summary.json and before its checkpoint was removed: resuming it trains nothing (its summary
    comes back as written) and removes the checkpoint, as the run would have, unless --keep-checkpoints."""
    from troll.lm import checkpoints
    from troll.lm.run import write_config

    opts = RunOptions(steps=2, heldout=4, out=str(tmp_path / "run")).resolved()
    out = tmp_path / "run"
    runs.begin(out, "train")
    write_config(opts, fresh=True)
    runs.release(out)
    (out / "checkpoint-2").mkdir()
    checkpoints.mark_complete(out / "checkpoint-2", step=2, metrics_lines=0)
    runs.write_json(out / "summary.json", {"written": "by the run"})
    assert train(opts, resume=True, keep_checkpoints=keep) == {"written": "by the run"}
    assert (out / "checkpoint-2").exists() == keep
