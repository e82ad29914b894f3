"""``python -m troll.lm.archive``: a ``troll study`` archive restored on a "new machine", resumed, saved again.

The archive is written by hand from the options today's code gives each cell (no training): restored, each cell is a
finished run folder that ``troll study --resume`` keeps without running it, whose numbers reach study.json; saving
the restored study gives the same files back; a cell archived with other options than today's is named and left to
rerun; a runtime field (its folder, threads) does not count as another setting.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import SRC, run_cli  # noqa: E402

from troll.lm import archive  # noqa: E402
from troll.lm import study as study_lib  # noqa: E402
from troll.lm.options import RunOptions  # noqa: E402
from troll.study.archive import cell_text  # noqa: E402

ACCURACY = {("troll", 0): (0.25, 0.75), ("clip", 0): (0.25, 0.5)}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("TROLL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))


def write_archive(dest, model: str, *, lr_of_clip: float | None = None):
    """An archive of one study (troll and clip, seed 0, 2 steps) as ``troll study`` and ``save`` would write it."""
    base = RunOptions(model=model, steps=2, heldout=4, max_completion_length=6, eval_every=1)
    spec = study_lib.StudySpec(base, ["troll", "clip"], [0])
    (dest / "toy").mkdir(parents=True)
    argv = ["troll", "study", "--out", "toy"]
    (dest / "toy" / "config.json").write_text(json.dumps({"command": "study", "spec": spec.to_json(), "argv": argv}))
    wanted = archive.expected(spec.to_json(), dest / "toy")
    for (loss, seed), (before, after) in ACCURACY.items():
        config = dict(wanted[f"{loss}/seed{seed}"], argv=["troll", "train"], versions={"troll": "0.1.0"})
        config["options"] = dict(config["options"], out=f"/elsewhere/{loss}", threads=2)  # runtime fields
        if loss == "clip" and lr_of_clip is not None:
            config["options"]["lr"] = lr_of_clip
        summary = {"loss": loss, "steps": 2, "heldout_accuracy_before": before, "heldout_accuracy_after": after,
                   "heldout_n": 4, "reward_last_quarter_mean": 0.5}  # fmt: skip
        rows = [{"step": 0, "heldout/accuracy": before}, {"step": 1, "reward": 0.25, "entropy": 1.0, "loss": 0.1},
                {"step": 2, "reward": 0.5, "heldout/accuracy": after}]  # fmt: skip
        (dest / "toy" / loss).mkdir(exist_ok=True)
        (dest / "toy" / loss / f"seed{seed}.json").write_text(cell_text(config, summary, rows, archive.KEYS))


def test_restored_cells_are_kept_by_a_resumed_study_and_save_back_unchanged(tmp_path, capsys, tiny_model_dir):
    source, root = tmp_path / "archive", tmp_path / "machine-b"
    write_archive(source, str(tiny_model_dir))
    assert archive.main(["restore", str(source), str(root)]) == 0
    assert "restored 2 finished cell(s)" in capsys.readouterr().out
    cell = root / "toy" / "troll" / "seed0"
    assert {"config.json", "metrics.jsonl", "summary.json"} <= {p.name for p in cell.iterdir()}
    assert "loss" not in json.loads((cell / "metrics.jsonl").read_text().splitlines()[1])  # only the report's keys
    data = json.loads((root / "toy" / "study.json").read_text())  # the report written over the restored cells
    assert {(c["loss"], c["metrics"]["acc_after"]) for c in data["cells"]} == {("troll", 0.75), ("clip", 0.5)}

    code, err = run_cli(capsys, "study", "--out", str(root / "toy"), "--resume")
    assert code == 0, err
    assert "started" not in err  # nothing trained
    data = json.loads((root / "toy" / "study.json").read_text())
    assert [c["status"] for c in data["cells"]] == ["kept", "kept"]
    paired = next(p for p in data["paired"] if p["metric"] == "acc_after")
    assert paired["mean"] == pytest.approx(0.25)  # troll 0.75 - clip 0.5

    again = tmp_path / "archive-again"
    assert archive.main(["save", str(root), str(again)]) == 0
    for path in source.rglob("*.json"):
        if path.name != "config.json":
            assert (again / path.relative_to(source)).read_text() == path.read_text(), path


def test_a_cell_of_other_options_is_named_and_left_to_rerun(tmp_path, capsys, tiny_model_dir):
    source, root = tmp_path / "archive", tmp_path / "machine-b"
    write_archive(source, str(tiny_model_dir), lr_of_clip=3e-4)
    assert archive.main(["restore", str(source), str(root)]) == 0
    out = capsys.readouterr().out
    assert "restored 1 finished cell(s)" in out and "toy/clip/seed0: run with other settings than today's (lr)" in out
    assert (root / "toy" / "troll" / "seed0" / "summary.json").is_file()
    assert not (root / "toy" / "clip" / "seed0" / "summary.json").exists()


def test_bad_input(tmp_path, capsys):
    assert archive.main(["save", str(tmp_path / "none"), str(tmp_path / "a")]) == 2
    assert "give the folder 'troll study' wrote" in capsys.readouterr().err
    assert archive.main(["restore", str(tmp_path / "none"), str(tmp_path / "b")]) == 0
    assert "no archive yet, nothing restored" in capsys.readouterr().out and not (tmp_path / "b").exists()


def test_the_committed_archive_matches_todays_options():
    """docs/ quotes the archived runs of docs/data/code-results: each must be a run today's code would make with the
    study's options (else a default changed since, and `make code-results CODE_TRAIN=1` reruns it)."""
    root = Path(__file__).parents[2] / "docs" / "data" / "code-results"
    studies = sorted(p.parent for p in root.glob("*/config.json"))
    assert [s.name for s in studies] == ["except-string", "recipe"]
    for study in studies:
        check_cells(study)


def check_cells(study: Path) -> None:
    from troll.study.archive import differs, read_cell

    wanted = archive.expected(archive.upgrade(json.loads((study / "config.json").read_text()))["spec"], study)
    cells = sorted(study.rglob("seed*.json"))
    assert cells, f"no archived run below {study}"
    for path in cells:
        config, summary, rows = read_cell(path)
        assert differs(archive.upgrade(config), wanted[path.relative_to(study).as_posix()[: -len(".json")]],
                       frozenset(archive.RUNTIME)) is None, path  # fmt: skip
        assert summary["heldout_accuracy_after"] == rows[-1]["heldout/accuracy"], path
        assert summary["steps"] == max(r["step"] for r in rows) == config["options"]["steps"], path


def test_docs_quote_make_code_results(tmp_path):
    """docs/results.md, "Code", quotes `make code-results`: restored from docs/data/code-results, the report's table
    rows all appear on that page, so a number there is one the archive gives."""
    import importlib.util

    repo = Path(__file__).parents[2]
    assert archive.main(["restore", str(repo / "docs" / "data" / "code-results"), str(tmp_path)]) == 0
    # the archive's first runs predate --beta: they restore as the runs without a KL penalty they were
    restored = sorted(tmp_path.glob("*/*/seed*/config.json"))
    assert len(restored) == 13  # 6 seeds of each loss, 1 run without the string family
    assert {json.loads(p.read_text())["options"]["beta"] for p in restored} == {0.0}
    for e in ("humaneval", "heldout-family"):
        (tmp_path / e).mkdir(exist_ok=True)
        for path in (repo / "docs" / "data" / "code-results" / e).glob("*.json"):
            (tmp_path / e / path.name).write_text(path.read_text())
    spec = importlib.util.spec_from_file_location("code_results", repo / "experiments" / "code_results.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = (repo / "docs" / "results.md").read_text()
    rows = [line for line in script.report(tmp_path).splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 20
    assert [row for row in rows if row not in page] == []
