"""The reasoning_gym tasks of ``troll train`` (troll.lm.tasks): answer extraction, the reward on hand-made
completions, and a held-out split disjoint from training."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")

from troll.lm.tasks import TaskReward, build_task, extract_answer  # noqa: E402


@pytest.mark.parametrize(
    "text, numeric, expected",
    [
        ("The answer to this arithmetic problem is 1.", True, "1"),
        ("The answer to 6 - 2 is 4.", True, "4"),
        ("The answer is -4. Note that 4 and 8 differ.", True, "-4"),
        ("6 - 2 = 4", True, "4"),
        ("so \\boxed{12} it is, 13", True, "12"),
        ("<answer>7</answer> and 9", True, "7"),
        ("The answer is 1,200.0 dollars", True, "1200"),
        ("answer: 12.5.", True, "12.5"),
        ("The final answer to this problem is", True, None),
        ("no digits here", True, None),
        ("The answer is: scissors. Because", False, "scissors"),
        ("first line\nlast line", False, "last line"),
    ],
)
def test_extract_answer(text, numeric, expected):
    assert extract_answer(text, numeric=numeric) == expected


def test_reward_scores_hand_made_completions():
    task = build_task("chain_sum", seed=0, n_train=8, n_heldout=4)
    reward = TaskReward(task.train)
    idx = task.train_indices[:2]
    right = [task.train[i]["answer"] for i in idx]
    completions = [
        [{"role": "assistant", "content": f"The answer is {right[0]}."}],  # conversational
        f"{task.train[idx[1]]['question']} The answer is {int(right[1]) + 1}",  # plain, wrong
        [{"role": "assistant", "content": "I do not know."}],
        f"It is {right[1]}",  # plain, right (last number)
    ]
    scores = reward(prompts=["p"] * 4, completions=completions, rg_index=[idx[0], idx[1], idx[0], idx[1]])
    assert scores == [1.0, 0.0, 0.0, 1.0]
    assert reward.__name__ == "correct"


def test_heldout_split_is_disjoint():
    task = build_task("chain_sum", seed=3, n_train=200, n_heldout=32)
    held = {e["question"] for e in task.heldout}
    assert len(task.heldout) == 32
    assert all(task.train[i]["question"] not in held for i in task.train_indices)
    assert 0 < len(task.train_indices) < 200  # one-digit sums repeat, so some were dropped
