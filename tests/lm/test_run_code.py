"""One run (:mod:`troll.lm.run`) of ``troll train --task code`` end to end on the tiny model: the sandbox's reward
reaches TRL, the held-out evaluation scores code, and the run folder says which task and completion length it used."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

pytest.importorskip("trl")


def test_train_on_a_code_task(tmp_path, capsys, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TROLL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    code, err = run_cli(capsys, "train", "--task", "code", "--model", str(tiny_model_dir), "--out", str(out),
                        "--steps", "2", "--steps-per-rollout", "1", "--prompts-per-step", "2", "--generations", "2",
                        "--max-completion-length", "8", "--heldout", "3", "--eval-every", "0",
                        "--no-model")  # fmt: skip
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "code" and summary["heldout_n"] == 3
    assert summary["heldout_accuracy_before"] == 0.0  # random tokens hold no code block
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["rewards/correct/mean"] for r in rows if "rewards/correct/mean" in r] == [0.0, 0.0]
    assert "```python" not in summary["samples_after"][0]["completion"]
    assert summary["samples_after"][0]["answer"]["kind"] == "call"  # the tests stand for the answer
