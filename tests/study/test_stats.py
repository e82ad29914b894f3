"""The study engine's statistics (troll.study.stats) against hand-worked numbers and scipy: mean and standard
error, the t quantiles, the paired interval and Welch's interval."""

from __future__ import annotations

import pytest

from troll.study import stats


def test_mean_and_standard_error_by_hand():
    # [1, 2, 3, 4]: mean 2.5; squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5; s^2 = 5/3; se = sqrt(5/3/4)
    assert stats.mean([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert stats.std_error([1.0, 2.0, 3.0, 4.0]) == pytest.approx(0.6454972244, abs=1e-10)
    # [0.25, 0.5]: mean 0.375, s^2 = 2 * 0.125^2 / 1 = 0.03125, se = sqrt(0.03125 / 2) = 0.125
    assert stats.std_error([0.25, 0.5]) == pytest.approx(0.125, abs=1e-12)
    assert stats.std_error([0.7]) is None and stats.mean([]) is None
    assert stats.summarize([0.25, None, 0.5]) == {"mean": 0.375, "se": pytest.approx(0.125), "n": 2}


def test_t_quantile_table_and_expansion():
    # Student's t 0.975 quantiles from printed tables
    assert stats.t975(1) == 12.7062 and stats.t975(2) == 4.3027 and stats.t975(30) == 2.0423
    for df, exact in [(31, 2.039513), (40, 2.021075), (60, 2.000298), (120, 1.979930), (10_000, 1.960201)]:
        assert stats.t975(df) == pytest.approx(exact, abs=1e-4)
    assert stats.t975(31) < stats.t975(30)  # the table and the expansion join without a jump up
    with pytest.raises(ValueError, match="df"):
        stats.t975(0)


def test_paired_interval_by_hand():
    # troll - grpo per seed: 0.2, 0.3, 0.0 -> mean 1/6; deviations 1/30, 4/30, -5/30; s^2 = (1+16+25)/900/2 = 7/300;
    # se = sqrt(7/900) = 0.0881917; t(0.975, 2) = 4.3027; half width 0.3794626
    troll = {0: 0.5, 1: 0.7, 2: 0.4, 3: None}
    grpo = {0: 0.3, 1: 0.4, 2: 0.4, 4: 0.9}  # seeds 3 and 4 have no pair
    p = stats.paired(troll, grpo)
    assert p["n"] == 3 and list(p["diffs"]) == [0, 1, 2]
    assert p["diffs"][0] == pytest.approx(0.2) and p["diffs"][2] == pytest.approx(0.0)
    assert p["mean"] == pytest.approx(1 / 6, abs=1e-12)
    assert p["se"] == pytest.approx(0.0881917104, abs=1e-9)
    assert p["ci95"][0] == pytest.approx(1 / 6 - 0.3794626, abs=1e-6)
    assert p["ci95"][1] == pytest.approx(1 / 6 + 0.3794626, abs=1e-6)
    one = stats.paired({0: 1.0}, {0: 0.5})
    assert one["mean"] == 0.5 and one["se"] is None and one["ci95"] is None


def test_welch_interval_by_hand_and_against_scipy():
    # a = [1, 2, 3]: mean 2, se^2 = 1/3; b = [2, 4, 6, 8]: mean 5, s^2 = 20/3, se^2 = 5/3; var = 2;
    # df = 4 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 4 / (1/18 + 25/27) = 4.0755 -> 4; t(0.975, 4) = 2.7764
    w = stats.welch([1.0, 2.0, None, 3.0], [2.0, 4.0, 6.0, 8.0])
    assert (w["mean"], w["df"], w["n_a"], w["n_b"]) == (-3.0, 4, 3, 4)
    assert w["se"] == pytest.approx(2**0.5, abs=1e-12)
    assert w["ci95"] == pytest.approx([-3 - 2.7764 * 2**0.5, -3 + 2.7764 * 2**0.5], abs=1e-9)
    scipy_stats = pytest.importorskip("scipy.stats")
    exact = scipy_stats.ttest_ind([1, 2, 3], [2, 4, 6, 8], equal_var=False)
    assert exact.df == pytest.approx(4.0755, abs=1e-4)  # ours rounds it down: a wider interval than scipy's
    low, high = exact.confidence_interval(0.95)
    assert w["ci95"][0] < low and w["ci95"][1] > high
    one = stats.welch([1.0], [0.5, 0.7])
    assert one["mean"] == pytest.approx(0.4) and one["ci95"] is None
    same = stats.welch([1.0, 1.0], [0.5, 0.5])
    assert same["ci95"] == [0.5, 0.5] and same["se"] == 0.0
