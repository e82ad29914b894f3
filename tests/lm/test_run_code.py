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
    # the code defaults not given on the command line, recorded as used
    options = json.loads((out / "config.json").read_text())["options"]
    assert (options["temperature"], options["heldout_samples"], options["code_reward"]) == (0.7, 4, "all")
    held = next(r for r in rows if r["step"] == 0 and "heldout/accuracy" in r)
    assert held["heldout/sampled_pass@1"] == 0.0 and held["heldout/sampled_pass@4"] == 0.0
    assert held["heldout/cut"] == 1.0 and held["heldout/prose_first"] == 1.0  # 8 random tokens: no end, no fence
    assert summary["heldout_sampled_pass@4_after"] == 0.0


def test_sampled_completions_are_seeded_and_leave_the_callers_random_state(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from troll.lm.evaluate import generate

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = ["one two", "three"]
    torch.manual_seed(7)
    state = torch.get_rng_state()
    first, cut = generate(model, tokenizer, texts, max_new_tokens=5, samples=3, temperature=1.0, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    assert [len(c) for c in first] == [3, 3] and all(len(c) == 3 for c in cut)
    assert generate(model, tokenizer, texts, max_new_tokens=5, samples=3, temperature=1.0, seed=1)[0] == first
    greedy, _ = generate(model, tokenizer, texts, max_new_tokens=5)
    assert [len(c) for c in greedy] == [1, 1]
