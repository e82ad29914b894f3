"""The generated code tasks: seeded, their tests agree with what the prompt says, the splits are disjoint, and a code
task gets the longer completion default."""

from __future__ import annotations

import json
import re

import pytest

from troll.lm import code_tasks, tasks
from troll.lm.options import RunOptions, UsageError, check_values


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"-?\d+", text)]


def _oracle(question: str):
    """An independent reading of the prompt: the function the words describe (parameters parsed from the text)."""
    name = re.search(r"`(\w+)\(", question).group(1)
    does = question.split("` that ", 1)[1].rsplit(". Reply", 1)[0]
    n = _numbers(does)
    if "if x is greater than" in does:
        t = int(re.search(r"greater than (-?\d+)", does).group(1))
        if '"big"' in does:
            return lambda x: "big" if x > t else "small"
        a, b = int(re.search(r"x times (-?\d+)", does).group(1)), int(re.search(r"x plus (-?\d+)", does).group(1))
        return lambda x: x * a if x > t else x + b
    if name in ("scale_and_shift", "linear", "affine_value", "transform", "map_affine"):
        sign = -1 if " minus " in does else 1
        a, b = n[0], sign * abs(n[1])
        return (lambda nums: [a * v + b for v in nums]) if name == "map_affine" else (lambda x: a * x + b)
    k = n[0] if n else None
    letter = re.search(r'letter "(.)"', does)
    table = {
        "total": sum, "largest": max, "count_even": lambda v: len([x for x in v if x % 2 == 0]),
        "scale_all": lambda v: [x * k for x in v], "keep_positive": lambda v: [x for x in v if x > 0],
        "sum_of_squares": lambda v: sum(x**2 for x in v), "count_vowels": lambda s: len([c for c in s if c in "aeiou"]),
        "repeat_text": lambda s: "".join([s] * k), "prefix": lambda s: s[:k],
        "remove_vowels": lambda s: re.sub("[aeiou]", "", s), "double_letters": lambda s: re.sub("(.)", r"\1\1", s),
        "count_letter": lambda s: len(re.findall(letter.group(1), s)),
        "sum_above": lambda v: sum(x for x in v if x > k), "reverse_upper": lambda s: s.upper()[::-1],
        "scaled_length": lambda s: k * len(s),
    }  # fmt: skip
    return table[name]


@pytest.mark.parametrize("task", sorted(code_tasks.TASKS))
def test_every_test_agrees_with_the_prompt(task):
    for item in code_tasks.items(task, seed=7, size=40):
        oracle = _oracle(item["question"])
        tests = item["tests"]
        assert tests["kind"] == "call" and f"`{tests['entry_point']}(" in item["question"]
        assert 1 <= len(tests["cases"]) <= code_tasks.CASES
        assert len({repr(c["input"]) for c in tests["cases"]}) == len(tests["cases"])  # distinct inputs
        for case in tests["cases"]:
            assert oracle(*case["input"]) == case["expected"], (item["question"], case)


def test_items_are_seeded_and_the_mix_cycles_through_the_families():
    a, b = code_tasks.items("code", seed=3, size=10), code_tasks.items("code", seed=3, size=10)
    assert a == b
    assert a != code_tasks.items("code", seed=4, size=10)
    assert [x["family"] for x in a[:5]] == ["string", "compose", "affine", "piecewise", "list"]  # family (3 + i) % 5
    assert {x["family"] for x in code_tasks.items("code_string", seed=0, size=5)} == {"string"}


def test_a_code_task_splits_into_disjoint_training_and_heldout_items():
    task = tasks.build_task("code", seed=0, n_train=64, n_heldout=32, system=None)
    held = {e["question"] for e in task.heldout}
    assert len(task.heldout) == 32 and len(task.train) == 64
    assert task.train_indices and not {task.train[i]["question"] for i in task.train_indices} & held
    assert len(task.train_indices) < 64  # the small families repeat questions, and those are dropped
    assert task.heldout[0] == code_tasks.item("code", tasks.HELDOUT_SEED_OFFSET)


def test_code_tasks_get_longer_completions_unless_given(tmp_path):
    assert RunOptions(task="code_list").resolved().max_completion_length == 160
    assert RunOptions(task="chain_sum").resolved().max_completion_length == 16
    assert RunOptions(task="code", max_completion_length=96).resolved().max_completion_length == 96
    path = tmp_path / "my.tests.jsonl"
    path.write_text(json.dumps({"prompt": "p", "tests": {"kind": "stdio", "cases": [{"input": "", "expected": ""}]}}))
    assert RunOptions(task=f"jsonl:{path}").resolved().out == "runs/troll-jsonl-my.tests-seed0"
    with pytest.raises(UsageError, match="--max-completion-length"):
        check_values(RunOptions(task="code", max_completion_length=0))


def test_task_names_are_checked():
    tasks.check_task("code_affine")
    with pytest.raises(UsageError, match="code_<family>"):
        tasks.check_task("code_nope")
    with pytest.raises(UsageError, match="eval-code"):
        tasks.check_task("humaneval")


def test_list_tasks_names_the_code_tasks(capsys):
    from troll.lm.cli import list_tasks

    assert list_tasks() == 0
    listed = capsys.readouterr().out.splitlines()
    assert "chain_sum [default]" in [line.split("  ")[0] for line in listed]
    assert any(line.startswith("code_string  (code:") for line in listed) and listed[-1].startswith("jsonl:PATH")


def test_training_and_held_out_items_are_the_same_mix_of_families():
    """The five families take turns in both splits (item i of seed s is family (s + i) mod 5, and the held-out seed
    is s + 1,000,000, a multiple of 5 away): any 64 held-out items and 64 training items hold 13, 13, 13, 13, 12."""
    from collections import Counter

    for seed in (0, 1, 2):
        task = tasks.build_task("code", seed=seed, n_train=64, n_heldout=64, system=None)
        held = Counter(e["family"] for e in task.heldout)
        train = Counter(e["family"] for e in task.train)
        assert held == train and sorted(held.values()) == [12, 13, 13, 13, 13]


def test_a_family_left_out_is_never_drawn_and_the_other_four_take_turns():
    drawn = [x["family"] for x in code_tasks.items("code_except_string", seed=0, size=8)]
    assert drawn == ["affine", "piecewise", "list", "compose"] * 2


def test_the_all_pass_reward_is_one_only_when_every_test_passes():
    from troll.lm.code_data import CodeTaskReward

    class Fixed:  # the sandbox's fraction of tests passed, as CodeReward returns it
        def __call__(self, prompts, completions, tests):
            return [1.0, 5 / 6, 0.0, None]

    items = [{"tests": {}}] * 4
    rewards = {}
    for shape in ("fraction", "all"):
        reward = CodeTaskReward(items, shape=shape)
        reward.reward = Fixed()
        rewards[shape] = reward(completions=["a"] * 4, rg_index=[0, 1, 2, 3])
    assert rewards == {"fraction": [1.0, 5 / 6, 0.0, None], "all": [1.0, 0.0, 0.0, None]}


def test_the_code_reward_option_is_checked_and_only_for_code_tasks():
    assert RunOptions(task="code", code_reward="fraction").resolved().code_reward == "fraction"
    assert RunOptions(task="code").resolved().code_reward == "all"
    assert RunOptions(task="chain_sum").resolved().code_reward is None
    with pytest.raises(UsageError, match="--code-reward must be one of fraction, all"):
        RunOptions(task="code", code_reward="most")
    with pytest.raises(UsageError, match="--code-reward applies to code tasks only"):
        RunOptions(task="chain_sum", code_reward="all")
