"""The options a task decides (:mod:`troll.lm.task_defaults`): a code task's own defaults beside the math ones,
resolved into the options a run records, and the held-out share of a JSONL file."""

from __future__ import annotations

import json

import pytest

from troll.lm.options import CODE_DEFAULTS, MATH_DEFAULTS, RunOptions, UsageError


def test_code_tasks_have_their_own_defaults_and_math_keeps_its_own():
    code = RunOptions(task="code").resolved()
    assert (code.temperature, code.max_completion_length, code.heldout, code.heldout_samples) == (0.7, 160, 128, 4)
    # the code recipe (docs/code.md): 24 steps on the all-pass reward, a checkpoint at 12, an evaluation every 6
    assert (code.steps, code.code_reward, code.lr, code.save_every, code.eval_every) == (24, "all", 1e-5, 12, 6)
    assert (code.generations, code.prompts_per_step, code.steps_per_rollout, code.rollout_size) == (8, 4, 2, 32)
    for task in ("code_list", "code_except_string"):
        assert RunOptions(task=task).resolved().temperature == CODE_DEFAULTS.temperature
    math = RunOptions(task="chain_sum").resolved()
    assert (math.temperature, math.max_completion_length, math.heldout, math.heldout_samples) == (1.0, 16, 128, 0)
    assert (math.steps, math.code_reward, math.save_every, math.eval_every) == (16, None, 8, 4)
    assert (math.generations, math.rollout_size) == (4, 16)
    assert MATH_DEFAULTS.temperature == 1.0
    given = RunOptions(task="code", temperature=1.0, heldout=8, heldout_samples=0, steps=8).resolved()
    assert (given.temperature, given.heldout, given.heldout_samples, given.steps) == (1.0, 8, 0, 8)  # given stays
    assert (given.save_every, given.eval_every) == (4, 2)  # from the steps given


def _jsonl(path, lines: int) -> str:
    row = {"prompt": "Write add(a, b).", "tests": {"kind": "call", "entry_point": "add",
                                                  "cases": [{"input": [1, 2], "expected": 3}]}}  # fmt: skip
    path.write_text("".join(json.dumps({**row, "prompt": f"Write add(a, b), {i}."}) + "\n" for i in range(lines)))
    return f"jsonl:{path}"


def test_a_jsonl_file_holds_out_a_quarter_of_its_lines(tmp_path):
    assert RunOptions(task=_jsonl(tmp_path / "forty.jsonl", 40)).resolved().heldout == 10
    assert RunOptions(task=_jsonl(tmp_path / "big.jsonl", 1000)).resolved().heldout == 128  # at most 128
    assert RunOptions(task=_jsonl(tmp_path / "three.jsonl", 3)).resolved().heldout == 1  # at least 1


def test_heldout_samples_is_checked():
    with pytest.raises(UsageError, match="--heldout-samples"):
        RunOptions(heldout_samples=-1)
    with pytest.raises(UsageError, match="--temperature"):
        RunOptions(temperature=0.0)
