"""The checks of user numbers (:mod:`troll.runs.numbers`): a message that names the flag and the range."""

from __future__ import annotations

import pytest

from troll.runs import UsageError, numbers


@pytest.mark.parametrize("value", [True, None, "1", float("nan"), float("inf"), -1.0, 0.0, 1e300])
def test_check_real_names_the_flag_and_the_range(value):
    with pytest.raises(UsageError, match=r"--lr must be > 0 and <= 1 and a finite number, got"):
        numbers.check_real("--lr", value, low=0, high=1, error=UsageError)


def test_check_seed_names_the_flag_for_a_23_digit_seed():
    with pytest.raises(ValueError, match=r"--seed must be an integer >= 0 and < 2\*\*32, got 1.235e\+22 \(23"):
        numbers.check_seed("--seed", 12345678901234567890123)
    numbers.check_seed("--seed", 2**32 - 1)
