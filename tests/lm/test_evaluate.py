"""pass@k of sampled completions and the format measures of the held-out evaluation (:mod:`troll.lm.evaluate`),
against hand-computed cases and a brute-force count."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from troll.lm.evaluate import mean_pass_at_k, pass_at_k, prose_first


def _brute_force(n: int, c: int, k: int) -> Fraction:
    """The share of the k-subsets of n samples (c of them right) that hold a right one, counted one by one."""
    right = set(range(c))
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(bool(right & set(s)) for s in subsets), len(subsets))


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),  # 1 - C(3,1)/C(4,1) = 1 - 3/4
        (4, 1, 4, 1.0),  # all four drawn: the right one is among them
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 0, 4, 0.0),
        (10, 3, 4, 5 / 6),  # 1 - C(7,4)/C(10,4) = 1 - 35/210
        (8, 8, 1, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(float(_brute_force(n, c, k)), abs=1e-12)


def test_pass_at_1_is_the_share_right_and_pass_at_k_matches_a_brute_force_count():
    for n in range(1, 8):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(_brute_force(n, c, k)), abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (4, 5, 1), (4, 1, 0), (0, 0, 1), (4.0, 1, 1)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_over_items():
    rights = [[True, False, False, False], [True, True, True, True], [False] * 4]
    out = mean_pass_at_k(rights)
    assert out == {"pass@1": pytest.approx((0.25 + 1 + 0) / 3), "pass@4": pytest.approx(2 / 3)}
    assert mean_pass_at_k([[True, False]]) == {"pass@1": 0.5}  # pass@4 needs 4 samples an item
    assert mean_pass_at_k([]) == {}


def test_prose_first():
    assert not prose_first("```python\ndef f(): pass\n```\nThis adds.")
    assert prose_first("Here is the function:\n```python\ndef f(): pass\n```")
    assert prose_first("def f(): pass")  # no fence at all
