"""troll.study.archive's file of one cell, worked by hand: rounding to 7 significant digits, absent keys, order."""

from __future__ import annotations

import json
import math

from troll.study.archive import cell_text, read_cell


def test_a_cell_file_round_trips_to_seven_digits(tmp_path):
    rows = [
        {"env_steps": 800, "iteration": 1, "loss": 0.123456789, "eval/return": None},
        {"env_steps": 1600, "iteration": 2, "loss": -12345.678901, "eval/return": 2.0e-9 / 3, "other": 1.0},
    ]
    text = cell_text({"command": "c", "config": {"a": 1}}, {"return": 0.5}, rows, ("env_steps", "loss",
                                                                                   "eval/return", "never"))  # fmt: skip
    assert text.count("\n") == 4  # head + one line per row + the closing line
    data = json.loads(text)
    assert data["keys"] == ["env_steps", "loss", "eval/return"]  # "never" is logged by no row: dropped
    assert data["rows"] == [[800, 0.1234568, None], [1600, -12345.68, 6.666667e-10]]
    path = tmp_path / "seed0.json"
    path.write_text(text)
    config, summary, back = read_cell(path)
    assert (config, summary) == ({"command": "c", "config": {"a": 1}}, {"return": 0.5})
    assert back == [{"env_steps": 800, "loss": 0.1234568}, {"env_steps": 1600, "loss": -12345.68,
                                                            "eval/return": 6.666667e-10}]  # fmt: skip
    nan = json.loads(cell_text({}, {}, [{"x": float("nan"), "y": 0.0}], ("x", "y")))["rows"][0]
    assert math.isnan(nan[0]) and nan[1] == 0.0
