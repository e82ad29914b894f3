"""The report over study folders (``python -m troll.tce.results``) on fabricated studies (2 algorithms x 3
seeds): means, standard errors and paired differences against numbers worked by hand, the per-task count, and the
comparison of two studies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from troll.runs.files import write_json
from troll.tce import results, study
from troll.tce.report import summarise

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


def fake_study(out: Path, env: str, evals: dict, heights: dict | None = None) -> None:
    """A finished ``tce study`` folder: each cell's config.json, metrics.jsonl and summary.json (report.summarise of
    the rows, as a run writes it), then the study's own report through the engine (every cell kept, none run).
    ``heights``: per (algo, seed) the evaluations' max heights (hopper jump logs them)."""
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
        for row, height in zip(rows, (heights or {}).get((cell.arm, cell.seed), [])):
            row["eval/max_height"] = height
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


def test_a_hopper_study_adds_its_max_height_to_the_table_and_a_figure(tmp_path, capsys):
    """Hopper jump logs the torso's max height: the report adds its column (mean ± standard error over seeds, worked
    by hand), its paired difference and tce_max_height.png; a report without it has neither."""
    root = tmp_path / "studies"
    heights = {("tce", 0): [1.5, 1.75], ("tce", 1): [1.5, 2.0], ("tce", 2): [1.5, 1.5],
               ("bbrl", 0): [1.5, 1.5], ("bbrl", 1): [1.5, 1.75], ("bbrl", 2): [1.5, 1.5]}  # fmt: skip
    fake_study(root / "hopper", "fancy/hopper-jump", GYM_EVALS, heights)
    assert results.main([str(root)]) == 0
    printed = capsys.readouterr().out
    assert "tce_max_height.png" in printed and (root / "report" / "tce_max_height.png").is_file()
    text = (root / "report" / "tce_results.md").read_text()
    assert "| max height at the budget (m) | env steps to success >= 0.8 |" in text
    # tce [1.75, 2.0, 1.5]: mean 1.75, se sqrt((0 + 0.0625 + 0.0625) / 2 / 3) = 0.144; bbrl [1.5, 1.75, 1.5]
    # 1.583, se sqrt((0.00694 + 0.02778 + 0.00694) / 6) = 0.083; paired [0.25, 0.25, 0]: mean +0.167
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| fancy/hopper-jump | ")}
    assert " | 1.750 ± 0.144 | " in rows["tce"] and " | 1.583 ± 0.083 | " in rows["bbrl"]
    assert "| fancy/hopper-jump | tce - bbrl | max height at the budget (m) | +0.167 |" in text
