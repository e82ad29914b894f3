"""``troll tce study`` and the report over study folders (``python -m troll.episodic.results``).

- bad input: exit 2, a message naming the flag and the fix, nothing written;
- a cell another process holds fails alone (the others run), whether the study would resume it or start it over;
- end to end on the toy task (tce, bbrl x 2 seeds, 2 iterations of 8 episodes; cells are ``troll tce train``
  subprocesses): study.json / study.md against the cells' own summary.json and metrics.jsonl, ``--resume`` of a
  finished study reruns nothing, and of a study with an unfinished cell continues only that cell;
- results.py on fabricated study folders (2 algorithms x 3 seeds): means, standard errors and paired differences
  against numbers worked by hand.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from conftest import held_elsewhere

from troll.cli import main
from troll.episodic import results, study
from troll.episodic.report import summarise
from troll.runs.files import read_jsonl, write_json

SRC = Path(__file__).parents[2] / "src"
# 8 episodes x 100 steps = 800 env steps an iteration, evaluated and checkpointed after each
TINY = ["--episodes", "8", "--eval-episodes", "8", "--eval-every", "1", "--checkpoint-every", "1", "--policy-hidden",
        "16", "--critic-hidden", "16", "--policy-epochs", "2", "--critic-epochs", "2", "--critic-minibatches", "1",
        "--workers", "0"]  # fmt: skip


@pytest.fixture(autouse=True)
def cells_import_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["tce", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def mean(xs):
    return sum(xs) / len(xs)


def se(xs):
    """Standard error of the mean with n - 1, written out."""
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def pm(xs) -> str:
    """study.md's cell: mean ± standard error over the values that are not None."""
    kept = [x for x in xs if x is not None]
    if not kept:
        return "-"
    return f"{mean(kept):.3f}" + (f" ± {se(kept):.3f}" if len(kept) > 1 else "")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--env", "toy/viapiont"], "--env: unknown environment 'toy/viapiont'. Did you mean 'toy/viapoint'"),
        ([], "--env is required to start a study"),
        (["--env", "toy/viapoint", "--algos", "tce,foo"], "unknown algorithm 'foo' in --algos; choose from: tce"),
        (["--env", "toy/viapoint", "--algos", "tce,tce"], "list each once"),
        (["--env", "toy/viapoint", "--algos", "tce,ppo"], "--algo ppo needs a step-based env, and toy/viapoint has"),
        (["--env", "toy/viapoint", "--seeds", "0"], "--seeds 0: a count of seeds must lie in [1, 1000]"),
        (["--env", "toy/viapoint", "--seeds", "a,b"], "--seeds 'a,b': give a count"),
        (["--env", "toy/viapoint", "--jobs", "0"], "--jobs must be an integer >= 1, got 0"),
        (["--env", "toy/viapoint", "--mean-bound", "0"], "--mean-bound: mean_bound must be > 0"),
        (["--env", "toy/viapoint", "--cov-bound", "-1"], "--cov-bound: cov_bound must be > 0"),
        (["--env", "toy/viapoint", "--ppo-n-steps", "64"], "--ppo-n-steps applies to none of --algos tce,bbrl"),
        (["--env", "toy/viapoint", "--sweep", "mean-bound=0.1,x"], "--sweep 'mean-bound=0.1,x': each value of"),
        (
            ["--env", "gym/reacher", "--algos", "tce,bbrl", "--sweep", "ppo-n-steps=64,128"],
            "--sweep ppo-n-steps does not apply to tce, bbrl",
        ),
        (["--env", "toy/viapoint", "--sweep", "mean-bound=0.1,0.2", "--mean-bound", "0.1"], "sweep it or set it"),
        (["--env", "toy/viapoint", "--resume"], "config.json not found; start the study without --resume"),
        (["--env", "toy/viapoint", "--resume", "--overwrite"], "--overwrite and --resume exclude each other"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "study"
    code, stdout, err = cli(capsys, "study", "--out", str(out), "--steps", "800", *TINY, *argv)
    assert code == 2, err
    assert err.startswith("troll tce study: error: ")
    assert message in err
    assert stdout == ""
    assert not out.exists()


def test_a_folder_holding_something_else_or_a_study_is_not_reused(tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"], ["--resume"]):
        code, _, err = cli(capsys, "study", "--out", str(out), "--env", "toy/viapoint", *extra)
        assert code == 2, extra
        assert "holds something else" in err or "config.json not found" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    (out / "notes.txt").unlink()
    write_json(out / "config.json", {"command": "tce study", "spec": {}})
    code, _, err = cli(capsys, "study", "--out", str(out), "--env", "toy/viapoint")
    assert code == 2 and "already holds a study of 'troll tce study'; pass --resume to continue it, --overwrite" in err
    write_json(out / "config.json", {"command": "tce train", "config": {}})  # a run folder is not a study
    code, _, err = cli(capsys, "study", "--out", str(out), "--env", "toy/viapoint", "--overwrite")
    assert code == 2 and "'troll tce train', which 'troll tce study' never continues nor replaces" in err
    assert [p.name for p in out.iterdir()] == ["config.json"]


@pytest.mark.parametrize("cell", ["with a checkpoint", "without one"])
def test_a_cell_another_process_holds_fails_alone(tmp_path, capsys, cell):
    out = tmp_path / "study"
    argv = ["--env", "toy/viapoint", "--algos", "tce", "--seeds", "2", "--steps", "800", *TINY]
    assert cli(capsys, "study", "--out", str(out), *argv)[0] == 0
    seed1 = out / "tce" / "seed1"
    (seed1 / "summary.json").unlink()  # unfinished: the study would resume it, or start it over
    if cell == "without one":
        for path in seed1.glob("checkpoint-*.pt"):
            path.unlink()
    (out / "tce" / "seed0" / "summary.json").unlink()
    with held_elsewhere(seed1, "tce train"):  # e.g. its run resumed by hand
        before = {p.name: p.stat().st_mtime_ns for p in seed1.iterdir()}
        code, _, err = cli(capsys, "study", "--out", str(out), "--resume", *argv)
        assert {p.name: p.stat().st_mtime_ns for p in seed1.iterdir()} == before  # untouched
    assert code == 1 and f"FAILED {seed1.as_posix()}: {seed1} is in use: another process is still writing" in err
    cells = json.loads((out / "study.json").read_text())["cells"]
    status = {Path(c["folder"]).relative_to(out).as_posix(): c["status"] for c in cells}
    assert status == {"tce/seed0": "done", "tce/seed1": "failed (in use)"}, status


# ---------------------------------------------------------------- end to end on the toy task


def test_study_end_to_end_then_resume(tmp_path, capsys):
    out = tmp_path / "study"
    argv = ["--env", "toy/viapoint", "--algos", "tce,bbrl", "--seeds", "2", "--steps", "1600", *TINY]
    code, stdout, err = cli(capsys, "study", "--out", str(out), "--jobs", "2", *argv)
    assert code == 0, err
    assert f"wrote {out / 'study.json'}" in stdout
    for name in ("config.json", "study.json", "study.md", "study.png"):
        assert (out / name).is_file(), name
    assert json.loads((out / "config.json").read_text())["command"] == "tce study"
    folders = {(a, s): out / a / f"seed{s}" for a in ("tce", "bbrl") for s in (0, 1)}
    summaries = {k: json.loads((f / "summary.json").read_text()) for k, f in folders.items()}
    rows = {k: read_jsonl(f / "metrics.jsonl") for k, f in folders.items()}
    for (algo, seed), summary in summaries.items():
        assert (summary["algo"], summary["seed"], summary["env_steps"]) == (algo, seed, 1600)
        assert [r["env_steps"] for r in rows[algo, seed]] == [800, 1600]
    log = (out / "tce" / "seed1.log").read_text().splitlines()[0]
    assert "tce train --out" in log and "--env toy/viapoint --algo tce --seed 1 --threads 1 --workers 0" in log
    assert "--steps 1600 --episodes 8" in log

    data = json.loads((out / "study.json").read_text())
    table = (out / "study.md").read_text()
    for algo in ("tce", "bbrl"):
        (agg,) = [a for a in data["aggregates"] if a["algo"] == algo]
        assert agg["seeds"] == [0, 1]
        cells = [(summaries[algo, s], rows[algo, s]) for s in (0, 1)]
        evals = [[r for r in rs if r.get("eval/return") is not None] for _, rs in cells]
        numbers = {  # study.py's numbers of each cell, from its own files
            "success": [s["success_rate"] for s, _ in cells],
            "success_any": [s["success_any"] for s, _ in cells],
            "best_success": [max(r["eval/success_rate"] for r in e) for e in evals],
            "success_auc": [mean([r["eval/success_rate"] for r in e]) for e in evals],
            "return": [s["return"] for s, _ in cells],
            "best_return": [max(r["eval/return"] for r in e) for e in evals],
            "distance": [s["distance"] for s, _ in cells],
            "steps_to_success": [s["env_steps_to_success"] for s, _ in cells],
            "env_steps": [s["env_steps"] for s, _ in cells],
            "minutes": [s["seconds"] / 60 for s, _ in cells],
        }
        for key, values in numbers.items():
            kept = [v for v in values if v is not None]
            assert agg[key]["n"] == len(kept), key
            if kept:
                assert agg[key]["mean"] == pytest.approx(mean(kept), rel=1e-12, abs=1e-12), key
                assert agg[key]["se"] == pytest.approx(se(kept), rel=1e-9, abs=1e-12), key
        assert f"| {algo} | 2 | " + " | ".join(pm(v) for v in numbers.values()) + " |" in table
    for metric, key in (("success", "success_rate"), ("return", "return"), ("distance", "distance")):
        (pair,) = [p for p in data["paired"] if p["metric"] == metric and p["baseline"] == "bbrl"]
        diffs = [summaries["tce", s][key] - summaries["bbrl", s][key] for s in (0, 1)]
        assert [pair["diffs"][str(s)] for s in (0, 1)] == pytest.approx(diffs, abs=1e-12)
        assert pair["mean"] == pytest.approx(mean(diffs), abs=1e-12) and pair["n"] == 2

    # --resume of a finished study (with the options it was started with) runs no cell
    def stamps():
        return {p: p.stat().st_mtime_ns for f in folders.values() for p in sorted(f.iterdir())}

    before = stamps()
    code, _, err = cli(capsys, "study", "--out", str(out), "--resume", "--policy-hidden", "16", "--jobs", "2")
    assert code == 0, err
    assert "started" not in err
    assert stamps() == before
    assert {c["status"] for c in json.loads((out / "study.json").read_text())["cells"]} == {"kept"}
    # the grid may grow on resume, never shrink nor change
    for flag, value in (("--seeds", "1"), ("--seeds", "1,2"), ("--algos", "tce"), ("--steps", "800")):
        code, _, err = cli(capsys, "study", "--out", str(out), "--resume", flag, value)
        assert code == 2 and f"{flag} differ from its config.json" in err, (flag, value)

    # a cell without its summary (stopped after its last checkpoint) continues from it, with the new --threads
    unfinished = folders["tce", 1]
    (unfinished / "summary.json").unlink()
    code, _, err = cli(capsys, "study", "--out", str(out), "--resume", "--threads", "2")
    assert code == 0, err
    assert err.count("started") == 1 and f"started {unfinished} (resuming)" in err
    last = [line for line in (out / "tce" / "seed1.log").read_text().splitlines() if line.startswith("$ ")][-1]
    assert last.endswith(f"--out {unfinished} --no-progress --resume --threads 2 --workers 0")
    assert json.loads((unfinished / "summary.json").read_text()) == summaries["tce", 1]
    assert read_jsonl(unfinished / "metrics.jsonl") == rows["tce", 1]
    assert {p: t for p, t in stamps().items() if unfinished not in p.parents} == {
        p: t for p, t in before.items() if unfinished not in p.parents
    }

    # more seeds: only the new seed's cells run, and the saved grid now holds them
    before = stamps()
    code, _, err = cli(capsys, "study", "--out", str(out), "--resume", "--seeds", "3", "--jobs", "2")
    assert code == 0, err
    assert sorted(line.split("started ")[1] for line in err.splitlines() if "started " in line) == [
        str(out / "bbrl" / "seed2"), str(out / "tce" / "seed2")]  # fmt: skip
    assert stamps() == before
    assert json.loads((out / "config.json").read_text())["spec"]["seeds"] == [0, 1, 2]
    assert json.loads((out / "tce" / "seed2" / "summary.json").read_text())["seed"] == 2
    assert len(json.loads((out / "study.json").read_text())["cells"]) == 6


# ---------------------------------------------------------------- results.py on fabricated studies

# per (algo, seed): the two evaluations (success rate, return, final distance), at 800 and 1600 env steps
GYM_EVALS = {
    ("tce", 0): [(0.5, -15.0, 0.5), (1.0, -10.0, 0.125)],
    ("tce", 1): [(0.25, -25.0, 0.5), (0.5, -20.0, 0.25)],
    ("tce", 2): [(0.5, -35.0, 0.5), (0.75, -30.0, 0.375)],
    ("bbrl", 0): [(0.25, -30.0, 0.5), (0.5, -20.0, 0.25)],
    ("bbrl", 1): [(0.0, -30.0, 0.5), (0.25, -20.0, 0.25)],
    ("bbrl", 2): [(0.5, -45.0, 0.5), (0.75, -40.0, 0.25)],
}
TOY_EVALS = {("tce", 0): [(0.25, -2.0, 0.5), (0.5, -1.5, 0.25)]}


def fake_study(out: Path, env: str, evals: dict) -> None:
    """A finished ``tce study`` folder: each cell's config.json, metrics.jsonl and summary.json (report.summarise of
    the rows, as a run writes it), then the study's own report through the engine (every cell kept, none run)."""
    algos = list(dict.fromkeys(a for a, _ in evals))
    seeds = sorted({s for _, s in evals})
    spec = study.StudySpec(env, algos, seeds, steps=1600, options={"policy_hidden": (16,)})
    cells = study.plan(spec, out)
    assert {(c.arm, c.seed) for c in cells} == set(evals)
    for cell in cells:
        rows = [
            {
                "iteration": i,
                "env_steps": 800 * i,
                "rollout/return": ret - 1.0,
                "eval/success_rate": success,
                "eval/return": ret,
                "eval/distance": distance,
                "time/iteration": 30.0,
            }  # fmt: skip
            for i, (success, ret, distance) in enumerate(evals[cell.arm, cell.seed], start=1)
        ]
        cell.folder.mkdir(parents=True)
        config = {"algo": cell.arm, "env": env, "seed": cell.seed}
        write_json(cell.folder / "config.json", {"command": "tce train", "config": config})
        (cell.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        write_json(cell.folder / "summary.json", summarise(rows, config, iterations=len(rows)))
    status = study.run(out, spec, cells, clear=False, jobs=1, report=lambda text: None)
    assert set(status.values()) == {"kept"}


def test_results_report_by_hand(tmp_path, capsys):
    root = tmp_path / "studies"
    fake_study(root / "gym-reacher-sparse", "gym/reacher-sparse", GYM_EVALS)
    fake_study(root / "toy", "toy/viapoint", TOY_EVALS)
    (root / "notes").mkdir()
    (root / "notes" / "config.json").write_text("{not json")  # skipped, not an error

    # the engine's study.json (what results.py reads), worked by hand:
    # tce success at the budget [1, 0.5, 0.75]: mean 0.75, se sqrt((0.0625 + 0.0625 + 0) / 2 / 3) = 0.1443376
    # tce success over the run [0.75, 0.375, 0.625]: mean 0.5833333, se sqrt(0.0729167 / 2 / 3) = 0.1102396
    # tce return [-10, -20, -30]: mean -20, se sqrt(200 / 2 / 3) = 5.7735027; bbrl [-20, -20, -40]: -26.666667,
    # se sqrt(266.666667 / 6) = 6.6666667; tce distance [0.125, 0.25, 0.375]: 0.25, se sqrt(0.03125 / 6) = 0.0721688
    data = json.loads((root / "gym-reacher-sparse" / "study.json").read_text())
    agg = {a["algo"]: a for a in data["aggregates"]}
    assert agg["tce"]["success"] == {"mean": 0.75, "se": pytest.approx(0.1443376, abs=1e-7), "n": 3}
    assert agg["tce"]["success_auc"]["mean"] == pytest.approx(0.5833333, abs=1e-7)
    assert agg["tce"]["success_auc"]["se"] == pytest.approx(0.1102396, abs=1e-7)
    assert agg["tce"]["return"] == {"mean": -20.0, "se": pytest.approx(5.7735027, abs=1e-7), "n": 3}
    assert agg["bbrl"]["return"]["mean"] == pytest.approx(-26.6666667, abs=1e-7)
    assert agg["bbrl"]["return"]["se"] == pytest.approx(6.6666667, abs=1e-7)
    assert agg["tce"]["distance"] == {"mean": 0.25, "se": pytest.approx(0.0721688, abs=1e-7), "n": 3}
    assert agg["bbrl"]["distance"] == {"mean": 0.25, "se": 0.0, "n": 3}
    assert agg["tce"]["minutes"]["mean"] == 1.0  # 2 rows x 30 s
    # paired tce - bbrl, per seed: success [0.5, 0.25, 0]: mean 0.25, se 0.1443376, 95% 0.25 -+ 4.3027 x se
    paired = {p["metric"]: p for p in data["paired"]}
    assert paired["success"]["diffs"] == {"0": 0.5, "1": 0.25, "2": 0.0}
    assert paired["success"]["ci95"] == pytest.approx([0.25 - 0.6210412, 0.25 + 0.6210412], abs=1e-6)
    assert paired["return"]["diffs"] == {"0": 10.0, "1": 0.0, "2": 10.0}
    assert paired["return"]["mean"] == pytest.approx(6.6666667, abs=1e-7)
    assert paired["return"]["ci95"] == pytest.approx([6.6666667 - 14.3423333, 6.6666667 + 14.3423333], abs=1e-6)

    assert results.main([str(root)]) == 0
    report = root / "report"
    printed = capsys.readouterr().out.splitlines()
    names = ["tce_results.md", "tce_results.json", "tce_success.png", "tce_return.png", "tce_distance.png"]
    assert printed == [f"wrote {report / n}" for n in names]
    for name in names[2:]:
        assert (report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    head, text = (report / "tce_results.md").read_text().split("## At the budget")
    # by task: success after the last step / at any step (none off Meta-World), TCE - bbrl paired (above)
    assert [line for line in head.splitlines() if line.startswith("| ") and not line.startswith("| task |")] == [
        "| toy/viapoint | 0.50 / - (1) | - | - |",
        "| gym/reacher-sparse | 0.75 ± 0.14 / - (3) | 0.50 ± 0.14 / - (3) | +0.25 [-0.37, +0.87] (3) |",
    ]
    assert (
        "At 1,600 env steps, TCE's mean success after the last step is at or above bbrl's on 1 of 1 tasks (0 of "
        "them ties, 0 at 0 for both)." in head
    )
    table = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| task |")]
    assert table[:3] == [  # the toy task first; one seed: no standard error
        "| toy/viapoint | tce | 1 | 1,600 | 0.500 | - | 0.500 | 0.375 | -1.500 | 0.250 | - |",
        "| gym/reacher-sparse | tce | 3 | 1,600 | 0.750 ± 0.144 | - | 0.750 ± 0.144 | 0.583 ± 0.110 | -20.000 ± 5.774 "
        "| 0.250 ± 0.072 | 1,600 (1 of 3) |",
        "| gym/reacher-sparse | bbrl | 3 | 1,600 | 0.500 ± 0.144 | - | 0.500 ± 0.144 | 0.375 ± 0.144 | -26.667 ± 6.667 "
        "| 0.250 ± 0.000 | - |",
    ]
    # success over the run, per seed [0.375, 0.25, 0]: mean 0.2083333, se 0.1102396, half-width 0.4743276;
    # distance [-0.125, 0, 0.125]: mean 0, se 0.0721688, half-width 0.3105220
    assert table[3:] == [
        "| gym/reacher-sparse | tce - bbrl | success at the budget | +0.250 | [-0.371, +0.871] | 3 |",
        "| gym/reacher-sparse | tce - bbrl | mean success over the run | +0.208 | [-0.266, +0.683] | 3 |",
        "| gym/reacher-sparse | tce - bbrl | return at the budget | +6.667 | [-7.676, +21.009] | 3 |",
        "| gym/reacher-sparse | tce - bbrl | final distance at the budget | +0.000 | [-0.311, +0.311] | 3 |",
    ]
    saved = json.loads((report / "tce_results.json").read_text())
    assert [s["task"] for s in saved] == ["toy/viapoint", "gym/reacher-sparse"]
    assert saved[1]["aggregates"] == data["aggregates"] and saved[1]["paired"] == data["paired"]


def test_by_task_counts_the_tasks_where_tce_is_at_or_above_bbrl():
    def study_data(tce: list[float], bbrl: list[float], any_step: float | None) -> dict:
        agg = [{"algo": a, "success": {"mean": sum(v) / len(v), "se": None, "n": len(v)},
                "success_any": {"mean": any_step, "se": None, "n": 0 if any_step is None else len(v)}}
               for a, v in (("tce", tce), ("bbrl", bbrl))]  # fmt: skip
        diff = sum(tce) / len(tce) - sum(bbrl) / len(bbrl)
        return {"aggregates": agg, "paired": [{"baseline": "bbrl", "metric": "success", "mean": diff, "ci95": None,
                                               "n": 1}]}  # fmt: skip

    studies = [("a", study_data([0.5], [0.5], 0.75)), ("b", study_data([0.25], [0.5], None)),
               ("c", study_data([1.0], [0.0], 1.0)), ("d", study_data([0.0], [0.0], None)),
               ("e", {**study_data([0.0], [0.5], None), "spec": {"steps": 10_000_000}})]  # fmt: skip
    text = results.by_task(studies)
    assert "| a | 0.50 / 0.75 (1) | 0.50 / 0.75 (1) | +0.00 (1) |" in text
    assert "| b | 0.25 / - (1) | 0.50 / - (1) | -0.25 (1) |" in text
    # a tie counts, b is below; e is at another budget and counted apart
    assert (
        "At preset env steps, TCE's mean success after the last step is at or above bbrl's on 3 of 4 tasks (2 of "
        "them ties, 1 at 0 for both)." in text
    )
    assert "At 10M env steps, TCE's mean success after the last step is at or above bbrl's on 0 of 1 tasks" in text
    assert results.by_task([]) == ""


def test_results_without_a_finished_study_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no finished 'troll tce study'"):
        results.main([str(tmp_path)])
    assert not (tmp_path / "report").exists()


def test_results_compare_two_studies_by_hand(tmp_path, capsys):
    """--compare: one algorithm in two studies whose seeds share nothing, Welch's interval per number."""
    fake_study(tmp_path / "a", "gym/reacher-sparse", GYM_EVALS)
    other = {(algo, seed): [(s, r - 10.0, d) for s, r, d in e] for (algo, seed), e in GYM_EVALS.items()}
    fake_study(tmp_path / "b", "gym/reacher-sparse", other)
    assert results.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in capsys.readouterr().out.splitlines()[4:]}
    # tce return: A [-10, -20, -30], B [-20, -30, -40]: difference +10, se sqrt(2 x 100/3) = 8.1649658,
    # df (200/3)^2 / (2 (100/3)^2 / 2) = 4, t 2.7764: half-width 22.6692
    assert rows["return at the budget"][1:5] == ["-20.000 ± 5.774 (n=3)", "-30.000 ± 5.774 (n=3)", "+10.000",
                                                   "[-12.669, +32.669]"]  # fmt: skip
    assert rows["success at the budget"][3:5] == ["+0.000", "[-0.567, +0.567]"]  # se 0.1443376 each, df 4
    assert "success at any step, at the budget" not in rows  # off Meta-World: no value
    with pytest.raises(SystemExit, match="no finished cell of --algo ppo"):
        results.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--algo", "ppo"])
    with pytest.raises(SystemExit):
        results.main([str(tmp_path / "a"), "--compare", str(tmp_path / "a"), str(tmp_path / "b")])


@pytest.mark.parametrize("algos", ["tce,bbrl,bbrl-cov", "tce"])
def test_a_metaworld_study_cell_runs_the_authors_env_options(tmp_path, algos):
    """Regression: the backend a study records (and passes to each cell as ``--env-options``) once replaced the
    preset's env options, so every metaworld/* study cell ran without the authors' mocap controller, gripper start
    and full context. Each planned cell, and the config its ``troll tce train`` command line builds, keeps them."""
    import argparse

    from troll.cli import build_parser
    from troll.episodic.cli import train_config
    from troll.episodic.tce.config import METAWORLD_ENV

    args = argparse.Namespace(resume=False, env="metaworld/reach-v3", algos=algos, out=str(tmp_path / "x"))
    spec = study.spec_from_args(args, {})[0]
    backend = spec.options["env_options"]["backend"]
    cells = study.plan(spec, tmp_path / "x")
    assert len(cells) == 3 * len(algos.split(","))
    for cell in cells:
        config = cell.options["config"]
        assert config.env_options == {**METAWORLD_ENV, "backend": backend}, cell.folder
        argv = study.cell_argv(cell, spec, resume=False)
        assert argv[1:3] == ["-m", "troll.cli"]
        assert train_config(build_parser().parse_args(argv[3:]), None) == config


def test_a_study_records_its_backend_and_an_old_one_keeps_its_cells_backend(tmp_path):
    """Every cell of a study runs on one simulator: a new study records the env's default backend (unless given);
    a study saved before that rule resumes on the backend its started cells recorded, not today's default."""
    import argparse

    from troll.runs.files import write_json

    def new(env, given):
        return study.spec_from_args(argparse.Namespace(resume=False, env=env, out=str(tmp_path / "x")), given)[0]

    assert new("gym/reacher", {}).options["env_options"] == {"backend": "envpool"}
    assert new("metaworld/door-open-v3", {}).options["env_options"] == {"backend": "python"}  # registry.PYTHON_DEFAULT
    given = {"env_options": {"backend": "python", "kp": 6.0}}
    assert new("gym/reacher", given).options["env_options"] == {"backend": "python", "kp": 6.0}
    assert "env_options" not in new("toy/viapoint", {}).options

    old = study.StudySpec("gym/reacher", ["tce", "bbrl"], [0, 1], steps=800, options={})
    (tmp_path / "old" / "tce" / "seed0").mkdir(parents=True)
    write_json(tmp_path / "old" / "config.json", {"command": "tce study", "spec": old.to_json(), "argv": []})
    resume = argparse.Namespace(resume=True, out=str(tmp_path / "old"))
    assert study.spec_from_args(resume, {})[0].options["env_options"] == {"backend": "envpool"}  # nothing started
    cell = {"command": "tce train", "config": {"algo": "tce", "env_options": {"backend": "python"}}}
    write_json(tmp_path / "old" / "tce" / "seed0" / "config.json", cell)
    spec, _ = study.spec_from_args(resume, {})
    assert spec.options["env_options"] == {"backend": "python"}
    argv = study.cell_argv(study.plan(spec, tmp_path / "old")[-1], spec, resume=False)
    assert argv[argv.index("--env-options") + 1] == '{"backend": "python"}'


def test_resume_refuses_a_study_whose_started_cells_ran_other_settings(tmp_path, capsys):
    """A study folder made by an older version (here: a metaworld cell that ran with the backend alone as its env
    options, as every cell did before the preset's options were kept) is refused by --resume with exit 2, naming
    the cell, and left untouched; a cell started with today's settings (other threads allowed) passes."""
    import dataclasses

    from troll.runs.files import write_json

    out = tmp_path / "st"
    spec = study.StudySpec("metaworld/reach-v3", ["tce", "bbrl"], [0], steps=16_000,
                           options={"env_options": {"backend": "envpool"}})  # fmt: skip
    out.mkdir()
    write_json(out / "config.json", {"command": "tce study", "spec": spec.to_json(), "argv": []})
    cells = study.plan(spec, out)
    tce, bbrl = cells
    today = dataclasses.replace(tce.options["config"], threads=2)
    (tce.folder).mkdir(parents=True)
    write_json(tce.folder / "config.json", {"command": "tce train", "config": today.to_dict()})
    study.check_started(cells, out)  # today's settings: resumes

    old = dataclasses.replace(bbrl.options["config"], env_options={"backend": "envpool"})
    bbrl.folder.mkdir(parents=True)
    write_json(bbrl.folder / "config.json", {"command": "tce train", "config": old.to_dict()})
    before = sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file())
    assert main(["tce", "study", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "1 started cell(s)" in err and "bbrl/seed0 (other settings than today's (env_options))" in err, err
    assert "new --out" in err and "Nothing was changed" in err
    assert sorted((p.relative_to(out), p.read_bytes()) for p in out.rglob("*") if p.is_file()) == before

    # a cell from before its env had an EnvPool backend ran on the Python package and resumes there
    spec = dataclasses.replace(spec, options={"env_options": {"backend": "python"}})
    (cell,) = study.plan(dataclasses.replace(spec, algos=["tce"]), tmp_path / "py")
    cell.folder.mkdir(parents=True)
    no_backend = dataclasses.replace(cell.options["config"], env_options={
        k: v for k, v in cell.options["config"].env_options.items() if k != "backend"})  # fmt: skip
    write_json(cell.folder / "config.json", {"command": "tce train", "config": no_backend.to_dict()})
    study.check_started([cell], tmp_path / "py")


def test_resume_takes_the_env_options_the_study_was_started_with(tmp_path):
    """--resume with the --env-options a study was started with is not refused, though the saved spec also holds
    the backend the study recorded; a value that differs is."""
    import argparse

    from troll.runs.files import write_json

    saved = study.StudySpec("metaworld/reach-v3", ["tce"], [0], steps=16_000,
                            options={"env_options": {"context": "varying", "backend": "envpool"}})  # fmt: skip
    (tmp_path / "st").mkdir()
    write_json(tmp_path / "st" / "config.json", {"command": "tce study", "spec": saved.to_json(), "argv": []})
    resume = argparse.Namespace(resume=True, out=str(tmp_path / "st"))
    spec, _ = study.spec_from_args(resume, {"env_options": {"context": "varying"}})
    assert spec.options == saved.options
    with pytest.raises(study.UsageError, match="--env-options"):
        study.spec_from_args(resume, {"env_options": {"context": "full"}})
    with pytest.raises(study.UsageError, match="--env-options"):
        study.spec_from_args(resume, {"env_options": {"gain": 25.0}})
