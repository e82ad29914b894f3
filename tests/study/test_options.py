"""A cell's options as data (troll.study.options): the values come back exactly, and a bad file is refused by name."""

from __future__ import annotations

import dataclasses
import json

import pytest

from troll.cli import main
from troll.episodic.config import TCEConfig
from troll.lm.options import RunOptions
from troll.study import options as cell_options
from troll.study.grid import Cell
from troll.study.runner import UsageError


def test_a_tce_config_comes_back_bit_for_bit(tmp_path):
    """Floats to their last bit (0.1 + 0.2 is not 0.3; 1e-7 has no short decimal), bools, None, tuples and a dict:
    what the file gives is the config that was written, and its tuples stay tuples."""
    config = TCEConfig.preset("toy/viapoint", mean_bound=0.1 + 0.2, cov_bound=1e-7 / 3, tau=None,
                              normalize_values=False, policy_hidden=(7, 5, 3), critic_hidden=())  # fmt: skip
    path = tmp_path / "seed0.options.json"
    cell_options.write(path, config.to_dict())
    values = cell_options.read(path, TCEConfig)
    assert values["mean_bound"] == 0.30000000000000004 and values["cov_bound"] == 1e-7 / 3
    assert values["tau"] is None and values["normalize_values"] is False
    assert values["policy_hidden"] == (7, 5, 3) and values["critic_hidden"] == ()
    assert TCEConfig(**values) == config
    assert json.loads(path.read_text())["policy_hidden"] == [7, 5, 3]  # a plain JSON object


def test_a_partial_file_takes_the_defaults_and_a_whole_number_is_a_float():
    values = cell_options.check({"lr": 1, "loss": None, "top_k": 3}, RunOptions, "here")
    assert values == {"lr": 1.0, "loss": None, "top_k": 3} and isinstance(values["lr"], float)
    assert RunOptions(**values).steps == RunOptions().steps


@pytest.mark.parametrize(
    "data, message",
    [
        ({"mean_bnd": 0.1}, "here: unknown field 'mean_bnd' (did you mean 'mean_bound'?); the fields of TCEConfig"),
        ({"mean_bound": "0.1"}, "here: field 'mean_bound' must be a finite number, got '0.1'."),
        ({"mean_bound": True}, "here: field 'mean_bound' must be a finite number, got True."),
        ({"mean_bound": float("nan")}, "here: field 'mean_bound' must be a finite number, got nan."),
        ({"episodes": 8.0}, "here: field 'episodes' must be an integer, got 8.0."),
        ({"episodes": False}, "here: field 'episodes' must be an integer, got False."),
        ({"tau": "none"}, "here: field 'tau' must be a finite number or null, got 'none'."),
        ({"normalize_values": 1}, "here: field 'normalize_values' must be true or false, got 1."),
        ({"policy_hidden": "128,128"}, "here: field 'policy_hidden' must be a list of integers, got '128,128'."),
        ({"policy_hidden": [128, 1.5]}, "here: field 'policy_hidden' must be a list of integers, got [128, 1.5]."),
        ({"env_options": []}, "here: field 'env_options' must be a JSON object, got []."),
    ],
)
def test_an_unknown_or_ill_typed_field_is_refused_by_name(data, message):
    with pytest.raises(UsageError) as err:
        cell_options.check(data, TCEConfig, "here")
    assert str(err.value).startswith(message)


def test_a_file_that_is_not_a_json_object_is_refused(tmp_path):
    path = tmp_path / "cell.options.json"
    with pytest.raises(UsageError, match=f"--options {path}: cannot be read"):
        cell_options.read(path, TCEConfig)
    path.write_text("[1, 2]")
    with pytest.raises(UsageError, match=f"--options {path}: must hold a JSON object of option fields, got list."):
        cell_options.read(path, TCEConfig)
    path.write_text("{mean_bound: 1}")
    with pytest.raises(UsageError, match=f"--options {path}: not valid JSON"):
        cell_options.read(path, TCEConfig)


def test_the_file_sits_beside_the_cell(tmp_path):
    cell = Cell(None, "tce", 0, tmp_path / "tce" / "seed0")
    assert cell.options_file == tmp_path / "tce" / "seed0.options.json"


def test_train_commands_refuse_a_bad_file_and_flags_beside_it(tmp_path, capsys):
    """``troll tce train`` and ``troll train`` with ``--options``: a bad field exits 2 naming it, before the folder
    is made; a flag that sets an option beside the file, or --resume, is refused."""
    path, out = tmp_path / "cell.options.json", tmp_path / "run"
    config = dataclasses.replace(TCEConfig.preset("toy/viapoint"), workers=0)
    cell_options.write(path, {**config.to_dict(), "mean_bound": -1.0})
    assert main(["tce", "train", "--out", str(out), "--options", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--options {path}: field 'mean_bound': " in err and not out.exists()
    cell_options.write(path, {**config.to_dict(), "algo": "ppo"})
    assert main(["tce", "train", "--out", str(out), "--options", str(path)]) == 2
    assert f"--options {path}: unknown field" in capsys.readouterr().err  # a PPOConfig has no TCE fields
    cell_options.write(path, config.to_dict())
    assert main(["tce", "train", "--out", str(out), "--options", str(path), "--seed", "1", "--mean-bound", "1"]) == 2
    assert f"--options {path} gives every setting of the run; drop --seed, --mean-bound" in capsys.readouterr().err
    assert main(["tce", "train", "--out", str(out), "--options", str(path), "--resume"]) == 2
    assert "--resume continues with the settings in the folder's config.json; drop --options." in (
        capsys.readouterr().err
    )
    cell_options.write(path, {"steps": 2, "lr": "fast"})
    assert main(["train", "--out", str(out), "--options", str(path)]) == 2
    assert f"--options {path}: field 'lr' must be a finite number, got 'fast'." in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--options", str(path), "--steps", "3"]) == 2
    assert f"--options {path} gives every option of the run; drop --steps" in capsys.readouterr().err
    assert not out.exists()
