"""``python -m troll.tce.archive``: a real toy study saved, restored on a "new machine", and resumed.

- the archive holds each finished cell's config.json and summary.json whole and the report's metrics keys, each
  number to 7 significant digits; saving again changes no file;
- restored into an empty folder, ``troll tce study --resume`` runs no cell and reports what the original reported
  (to the rounding);
- a finished local cell is never touched; an unfinished one is replaced by the archive's finished run unless its
  folder holds a foreign file; an archived cell whose config today's presets would not give is left to rerun;
- a cell or study another process is writing is left alone (a study of the archive's grid: exit 2);
- a folder holding another grid is refused with exit 2 before anything is written; one grown from the archive's
  (more seeds) takes its cells.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import held_elsewhere

from troll.cli import main
from troll.runs.files import read_jsonl
from troll.study.archive import DIGITS, read_cell
from troll.tce import archive

SRC = Path(__file__).parents[2] / "src"
TINY = ["--episodes", "8", "--eval-episodes", "8", "--eval-every", "1", "--checkpoint-every", "1", "--policy-hidden",
        "16", "--critic-hidden", "16", "--policy-epochs", "2", "--critic-epochs", "2", "--critic-minibatches", "1",
        "--workers", "0"]  # fmt: skip
ARGV = ["--env", "toy/viapoint", "--algos", "tce,bbrl", "--seeds", "2", "--steps", "1600", *TINY]
CELLS = ("tce/seed0", "bbrl/seed0", "tce/seed1", "bbrl/seed1")


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """A finished study (toy task, tce and bbrl x 2 seeds, 2 iterations) below ``<root>/studies/toy``."""
    root = tmp_path_factory.mktemp("machine-a")
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), old])
    try:
        assert main(["tce", "study", "--out", str(root / "studies" / "toy"), "--jobs", "2", *ARGV]) == 0
    finally:
        os.environ["PYTHONPATH"] = old
    return root / "studies"


@pytest.fixture(autouse=True)
def cells_import_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))


def close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 10 ** (1 - DIGITS) * abs(b)
    return a == b


def test_save_keeps_configs_summaries_and_the_report_keys(original, tmp_path):
    dest = tmp_path / "archive"
    assert archive.main(["save", str(original), str(dest)]) == 0
    assert json.loads((dest / "toy" / "config.json").read_text()) == json.loads(
        (original / "toy" / "config.json").read_text()
    )
    for cell in CELLS:
        config, summary, rows = read_cell(dest / "toy" / f"{cell}.json")
        folder = original / "toy" / cell
        assert config == json.loads((folder / "config.json").read_text())
        assert summary == json.loads((folder / "summary.json").read_text())
        full = read_jsonl(folder / "metrics.jsonl")
        assert len(rows) == len(full) == 2
        for kept, whole in zip(rows, full):
            assert set(kept) == {k for k in archive.KEYS if whole.get(k) is not None}
            assert "eval/success_rate" in kept and "policy/entropy" in kept and "critic/loss" not in kept
            assert all(close(kept[k], whole[k]) for k in kept), kept
    stamps = {p: p.stat().st_mtime_ns for p in dest.rglob("*")}
    assert archive.main(["save", str(original), str(dest)]) == 0
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*")} == stamps  # unchanged cells are not rewritten


def test_restore_then_resume_runs_nothing_and_reports_the_same(original, tmp_path, capsys):
    dest, machine_b = tmp_path / "archive", tmp_path / "machine-b"
    archive.main(["save", str(original), str(dest)])
    assert archive.main(["restore", str(dest), str(machine_b)]) == 0
    assert "restored 4 finished cell(s)" in capsys.readouterr().out
    out = machine_b / "toy"
    # the report over the restored cells is written at once (results.py reads it without running anything)
    want, got = (json.loads((d / "toy" / "study.json").read_text()) for d in (original, machine_b))
    assert [a["success"]["mean"] for a in got["aggregates"]] == [a["success"]["mean"] for a in want["aggregates"]]
    code = main(["tce", "study", "--out", str(out), "--resume", "--jobs", "2"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "started" not in err
    committed = (dest / "toy" / "config.json").read_text()
    assert archive.main(["save", str(machine_b), str(dest)]) == 0  # as make's targets save after the study
    assert (dest / "toy" / "config.json").read_text() == committed  # machine b's --out is not written into it
    want, got = (json.loads((d / "toy" / "study.json").read_text()) for d in (original, machine_b))
    assert {c["status"] for c in got["cells"]} == {"kept"}
    for a, b in zip(want["aggregates"], got["aggregates"]):
        for key, entry in a.items():
            if isinstance(entry, dict) and entry.get("mean") is not None:
                assert b[key]["mean"] == pytest.approx(entry["mean"], rel=1e-6), key
    assert len(got["paired"]) == len(want["paired"])
    for a, b in zip(want["paired"], got["paired"]):
        assert (b["metric"], b["n"]) == (a["metric"], a["n"])
        if a["mean"] is not None:
            assert b["mean"] == pytest.approx(a["mean"], rel=1e-6, abs=1e-9), a["metric"]


def test_restore_keeps_finished_cells_and_replaces_only_clean_unfinished_ones(original, tmp_path, capsys):
    dest, machine_b = tmp_path / "archive", tmp_path / "machine-b"
    archive.main(["save", str(original), str(dest)])
    archive.main(["restore", str(dest), str(machine_b)])
    out = machine_b / "toy"
    finished = out / "tce" / "seed0" / "summary.json"
    finished.write_text(json.dumps({**json.loads(finished.read_text()), "mark": 1}))
    (out / "bbrl" / "seed0" / "summary.json").unlink()  # an unfinished run: the archive's finished one replaces it
    (out / "tce" / "seed1" / "summary.json").unlink()
    (out / "tce" / "seed1" / "notes.txt").write_text("mine")  # ... but never over a file its command did not write
    capsys.readouterr()
    assert archive.main(["restore", str(dest), str(machine_b)]) == 0
    text = capsys.readouterr().out
    assert "restored 1 finished cell(s)" in text
    assert "toy/tce/seed0: already finished here" in text and "toy/tce/seed1: not restored over" in text
    assert json.loads(finished.read_text())["mark"] == 1
    assert (out / "bbrl" / "seed0" / "summary.json").is_file()
    assert (out / "tce" / "seed1" / "notes.txt").read_text() == "mine"
    assert not (out / "tce" / "seed1" / "summary.json").exists()


def test_restore_leaves_what_another_process_is_writing(original, tmp_path, capsys):
    dest, machine_b = tmp_path / "archive", tmp_path / "machine-b"
    archive.main(["save", str(original), str(dest)])
    archive.main(["restore", str(dest), str(machine_b)])
    out = machine_b / "toy"
    (out / "bbrl" / "seed0" / "summary.json").unlink()  # unfinished, and its run resumed by another process
    other = machine_b / "other"  # a study the archive does not hold, running
    shutil.copytree(out, other)
    (other / "study.md").unlink()
    with held_elsewhere(out / "bbrl" / "seed0", "tce train"), held_elsewhere(other, "tce study"):
        capsys.readouterr()
        assert archive.main(["restore", str(dest), str(machine_b)]) == 0
        text = capsys.readouterr().out
        assert "toy/bbrl/seed0: not restored over the unfinished run there" in text and "is in use" in text
        assert not (out / "bbrl" / "seed0" / "summary.json").exists()
        assert not (other / "study.md").exists()  # its report is the running study's to write
        with held_elsewhere(out, "tce study"):  # a study of the archive's grid, running: nothing is restored
            assert archive.main(["restore", str(dest), str(machine_b)]) == 2
            assert "is in use" in capsys.readouterr().err


def test_a_cell_run_with_other_settings_is_left_to_rerun(original, tmp_path, capsys):
    dest, machine_b = tmp_path / "archive", tmp_path / "machine-b"
    archive.main(["save", str(original), str(dest)])
    path = dest / "toy" / "bbrl" / "seed1.json"
    data = json.loads(path.read_text())
    data["config"]["config"]["mean_bound"] *= 2  # as if the preset had changed since the run
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert archive.main(["restore", str(dest), str(machine_b)]) == 0
    text = capsys.readouterr().out
    assert "restored 3 finished cell(s)" in text
    assert "toy/bbrl/seed1: run with other settings than today's (mean_bound)" in text
    assert not (machine_b / "toy" / "bbrl" / "seed1").exists()


def test_a_folder_of_another_grid_is_refused_and_a_grown_one_restored(original, tmp_path, capsys):
    dest, machine_b = tmp_path / "archive", tmp_path / "machine-b"
    archive.main(["save", str(original), str(dest)])
    other = machine_b / "toy"
    shutil.copytree(original / "toy", other)
    config = json.loads((other / "config.json").read_text())
    shutil.rmtree(other / "bbrl" / "seed1")
    for key, value in (("seeds", [0]), ("steps", 2400), ("algos", ["tce"])):  # fewer seeds or arms, another budget
        (other / "config.json").write_text(json.dumps({**config, "spec": {**config["spec"], key: value}}))
        capsys.readouterr()
        assert archive.main(["restore", str(dest), str(machine_b)]) == 2, key
        assert "holds a study of another grid" in capsys.readouterr().err
        assert not (other / "bbrl" / "seed1").exists()
    # a study grown since the archive was saved (more seeds, stopped before saving again) takes the archive's cells
    (other / "config.json").write_text(json.dumps({**config, "spec": {**config["spec"], "seeds": [0, 1, 2]}}))
    assert archive.main(["restore", str(dest), str(machine_b)]) == 0
    assert (other / "bbrl" / "seed1" / "summary.json").is_file()


def test_no_archive_and_no_studies(tmp_path, capsys):
    assert archive.main(["restore", str(tmp_path / "none"), str(tmp_path / "studies")]) == 0
    assert "no archive yet" in capsys.readouterr().out
    assert archive.main(["save", str(tmp_path / "none"), str(tmp_path / "a")]) == 2
    assert "is not a folder of studies" in capsys.readouterr().err


def test_the_committed_archives_match_todays_presets():
    """docs/ quotes the archived cells: each must be a run today's code would make (else a preset changed since, and
    the study and the docs must be rerun: `make tce-authors` reruns such cells by itself)."""
    data = Path(__file__).parents[2] / "docs" / "data"
    configs = {p.parent: json.loads(p.read_text()) for p in data.rglob("config.json")}
    studies = sorted(folder for folder, config in configs.items() if config.get("command") == "tce study")
    assert studies, f"no archived study below {data}"
    checked = 0
    for study in studies:  # the archives of troll tce study (docs/data holds language-model runs too)
        spec = configs[study]["spec"]
        wanted = archive.expected(spec, study)
        for path in sorted(study.rglob("seed*.json")):
            cell = path.relative_to(study).as_posix()[: -len(".json")]
            config, summary, rows = read_cell(path)
            want = wanted[cell]
            assert config["command"] == want["command"], path
            assert {k: v for k, v in config["config"].items() if k not in ("threads", "workers")} == {
                k: v for k, v in want["config"].items() if k not in ("threads", "workers")
            }, path
            assert summary["env_steps"] == rows[-1]["env_steps"], path
            checked += 1
    assert checked


def test_save_never_shrinks_the_archive_nor_stores_a_stale_cell(original, tmp_path, capsys):
    dest, machine_b = tmp_path / "archive", tmp_path / "machine-b"
    archive.main(["save", str(original), str(dest)])
    before = {p: p.read_text() for p in dest.rglob("*.json")}
    archive.main(["restore", str(dest), str(machine_b)])
    out = machine_b / "toy"
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "spec": {**config["spec"], "seeds": [0]}}))
    capsys.readouterr()
    assert archive.main(["save", str(machine_b), str(dest)]) == 0  # a smaller grid: the archive keeps its own
    assert "toy: its grid is not the archive's or grown from it" in capsys.readouterr().out
    assert {p: p.read_text() for p in dest.rglob("*.json")} == before
    (out / "config.json").write_text(json.dumps({**config, "spec": {**config["spec"], "threads": 2}}))
    cell = out / "bbrl" / "seed0" / "config.json"  # a finished cell run with other settings than today's
    data = json.loads(cell.read_text())
    cell.write_text(json.dumps({**data, "config": {**data["config"], "init_std": 0.9}}))
    assert archive.main(["save", str(machine_b), str(dest)]) == 0
    assert "toy/bbrl/seed0: run with other settings than today's (init_std): not saved" in capsys.readouterr().out
    assert {p: p.read_text() for p in dest.rglob("seed*.json")} == {
        p: t for p, t in before.items() if p.name.startswith("seed")
    }


def test_a_damaged_cell_file_is_skipped_and_a_runtime_change_is_no_other_grid(original, tmp_path, capsys):
    dest, machine_b = tmp_path / "archive", tmp_path / "machine-b"
    archive.main(["save", str(original), str(dest)])
    (dest / "toy" / "tce" / "seed1.json").write_text('{"config": {"command": "tce tra')  # a torn file
    shutil.copytree(original / "toy", machine_b / "toy")
    shutil.rmtree(machine_b / "toy" / "tce" / "seed1")
    shutil.rmtree(machine_b / "toy" / "bbrl" / "seed1")
    config = json.loads((machine_b / "toy" / "config.json").read_text())
    (machine_b / "toy" / "config.json").write_text(json.dumps({**config, "spec": {**config["spec"], "threads": 2}}))
    capsys.readouterr()
    assert archive.main(["restore", str(dest), str(machine_b)]) == 0
    text = capsys.readouterr().out
    assert "restored 1 finished cell(s)" in text and "toy/tce/seed1.json is not an archived cell" in text
    assert (machine_b / "toy" / "bbrl" / "seed1" / "summary.json").is_file()
    assert not (machine_b / "toy" / "tce" / "seed1").exists()
