"""``CodeReward`` (:mod:`troll.integrations.code_reward`) as TRL calls a reward function: through GRPOTrainer's own
reward step (dataset columns as keyword arguments, conversational completions), and in one real training step on a
tiny model."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from tiny import tiny_model, tiny_tokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from troll.integrations.trl import CodeReward  # noqa: E402

ADD = {
    "kind": "call",
    "entry_point": "add",
    "cases": [
        {"input": [1, 2], "expected": 3},
        {"input": [2, 2], "expected": 4},
        {"input": [0, 5], "expected": 5},
        {"input": [3, 0], "expected": 3},
    ],
}
ECHO = {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}  # the APPS/Eurus form, stdin/stdout


def _trainer(tmp_path, reward) -> GRPOTrainer:
    tok = tiny_tokenizer()
    rows = {
        "prompt": [[{"role": "user", "content": "write add"}], [{"role": "user", "content": "read and add"}]],
        "tests": [json.dumps(ADD), json.dumps(ECHO)],  # JSON strings: Arrow keeps any test values that way
    }
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, max_steps=1, learning_rate=1e-3, use_cpu=True, report_to="none",
                      save_strategy="no", logging_steps=1, disable_tqdm=True, bf16=False, seed=0)  # fmt: skip
    return GRPOTrainer(model=tiny_model(tok), reward_funcs=[reward], args=args, train_dataset=Dataset.from_dict(rows),
                       processing_class=tok)  # fmt: skip


def _say(code: str) -> list[dict]:
    return [{"role": "assistant", "content": f"Here it is:\n```python\n{code}\n```\nDone."}]


def test_trl_passes_the_tests_column_and_gets_the_fraction_passed(tmp_path):
    torch.set_num_threads(1)
    trainer = _trainer(tmp_path, CodeReward())
    rows = list(trainer.train_dataset)
    inputs = [rows[0], rows[0], rows[0], rows[1], rows[1]]
    completions = [
        _say("def add(a, b):\n    return a + b"),
        _say("def add(a, b):\n    return a + b if a else 0"),  # right on 3 of 4 cases
        [{"role": "assistant", "content": "I cannot write code."}],
        _say("a, b = map(int, input().split())\nprint(a + b)"),
        _say("print(3)"),  # right on the first case only
    ]
    prompts = [row["prompt"] for row in inputs]
    rewards = trainer._calculate_rewards(inputs, prompts, completions, [[1]] * len(inputs))
    assert rewards[:, 0].tolist() == [1.0, 0.75, 0.0, 1.0, 0.5]


def test_an_unscorable_completion_reaches_trl_as_none(tmp_path, monkeypatch):
    monkeypatch.setattr("troll.sandbox.score_completions", lambda c, s, **kw: [None] * len(c))
    trainer = _trainer(tmp_path, CodeReward())
    rows = list(trainer.train_dataset)
    rewards = trainer._calculate_rewards(rows, [r["prompt"] for r in rows], [_say("x")] * 2, [[1]] * 2)
    assert torch.isnan(rewards).all()  # TRL's "cannot score": left out of the sum, never read as 0


def test_one_grpo_step_with_the_code_reward(tmp_path):
    torch.set_num_threads(1)
    trainer = _trainer(tmp_path, CodeReward())
    trainer.train()
    assert [e["rewards/code/mean"] for e in trainer.state.log_history if "rewards/code/mean" in e] == [0.0]


def test_a_missing_tests_column_is_named():
    with pytest.raises(KeyError, match="no column 'tests'.*prompt_id"):
        CodeReward()(prompts=["p"], completions=["c"], prompt_id=[0])
