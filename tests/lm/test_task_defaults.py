"""The options a task decides (:mod:`troll.lm.task_defaults`): a code task's own defaults beside the math ones,
resolved into the options a run records, and the held-out share of a JSONL file."""

from __future__ import annotations

import json

import pytest

from troll.lm.options import CODE_DEFAULTS, MATH_DEFAULTS, RunOptions, UsageError


def test_code_tasks_have_their_own_defaults_and_math_keeps_its_own():
    code = RunOptions(task="code").resolved()
    assert (code.temperature, code.max_completion_length, code.heldout, code.heldout_samples) == (0.7, 160, 128, 4)
    assert RunOptions(task="code_list").resolved().temperature == CODE_DEFAULTS.temperature
    math = RunOptions(task="chain_sum").resolved()
    assert (math.temperature, math.max_completion_length, math.heldout, math.heldout_samples) == (1.0, 16, 128, 0)
    assert MATH_DEFAULTS.temperature == 1.0
    given = RunOptions(task="code", temperature=1.0, heldout=8, heldout_samples=0).resolved()
    assert (given.temperature, given.heldout, given.heldout_samples) == (1.0, 8, 0)  # what is given stays


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
