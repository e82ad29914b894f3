"""``compute_score`` and ``compute_score_batch`` through verl's own reward managers (naive and batch) on CPU: a
DataProto of tokenized prompts and responses, the tests in ``reward_model.ground_truth`` as a JSON string."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verl")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tiny import tiny_tokenizer  # noqa: E402

from troll.integrations.verl.reward import compute_score, compute_score_batch  # noqa: E402

ADD = json.dumps({"kind": "call", "entry_point": "add",
                  "cases": [{"input": [1, 2], "expected": 3}, {"input": [5, 0], "expected": 5}]})  # fmt: skip
SUM = json.dumps({"inputs": ["1 2\n", "4 4\n"], "outputs": ["3\n", "8\n"]})  # APPS/Eurus form, stdin/stdout
ROWS = [  # (response, ground truth, expected score)
    ("```python\ndef add(a, b):\n    return a + b\n```", ADD, 1.0),
    ("```python\ndef add(a, b):\n    return 3\n```", ADD, 0.5),
    ("no code here", ADD, 0.0),
    ("```python\nprint(sum(map(int, input().split())))\n```", SUM, 1.0),
]


def _batch():
    from verl import DataProto

    tok = tiny_tokenizer()
    prompts = [tok("write it", add_special_tokens=False)["input_ids"]] * len(ROWS)
    responses = [tok(r, add_special_tokens=False)["input_ids"] for r, _, _ in ROWS]
    width = max(map(len, responses))
    resp = torch.full((len(ROWS), width), tok.pad_token_id)
    mask = torch.zeros(len(ROWS), len(prompts[0]) + width, dtype=torch.long)
    for i, ids in enumerate(responses):
        resp[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(prompts[0]) + len(ids)] = 1
    data = DataProto.from_dict(
        tensors={"prompts": torch.tensor(prompts), "responses": resp, "attention_mask": mask},
        non_tensors={
            "data_source": np.array(["code"] * len(ROWS), dtype=object),
            "reward_model": np.array([{"ground_truth": g, "style": "rule"} for _, g, _ in ROWS], dtype=object),
            "extra_info": np.array([{} for _ in ROWS], dtype=object),
        },
    )
    return tok, data, [len(ids) for ids in responses]


@pytest.mark.parametrize("manager", ["naive", "batch"])
def test_verl_reward_manager_calls_compute_score(manager):
    from verl.workers.reward_manager import get_reward_manager_cls

    torch.set_num_threads(1)
    tok, data, lengths = _batch()
    assert [tok.decode(tok(r)["input_ids"], skip_special_tokens=True) for r, _, _ in ROWS] == [r for r, _, _ in ROWS]
    fn = compute_score if manager == "naive" else compute_score_batch
    out = get_reward_manager_cls(manager)(tokenizer=tok, num_examine=0, compute_score=fn)(data, return_dict=True)
    rewards = out["reward_tensor"]
    assert [rewards[i, n - 1].item() for i, n in enumerate(lengths)] == [s for _, _, s in ROWS]  # on the last token
    assert rewards.sum().item() == sum(s for _, _, s in ROWS)
    assert list(out["reward_extra_info"]["acc"]) == [1.0, 0.0, 0.0, 1.0]
    assert list(out["reward_extra_info"]["scored"]) == [1.0] * 4


def test_an_infrastructure_failure_scores_zero_and_says_so(monkeypatch):
    monkeypatch.setattr("troll.sandbox.score_completions", lambda c, s, **kw: [None] * len(c))
    assert compute_score("code", "```python\nx = 1\n```", ADD) == {"score": 0.0, "acc": 0.0, "scored": 0.0}
