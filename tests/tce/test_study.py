"""``troll tce study`` (the report over study folders, ``python -m troll.tce.results``, is in test_results.py).

- bad input: exit 2, a message naming the flag and the fix, nothing written;
- a cell another process holds fails alone (the others run), whether the study would resume it or start it over;
- end to end on the toy task (tce, bbrl x 2 seeds, 2 iterations of 8 episodes; cells are ``troll tce train``
  subprocesses): study.json / study.md against the cells' own summary.json and metrics.jsonl, ``--resume`` of a
  finished study reruns nothing, and of a study with an unfinished cell continues only that cell.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from conftest import held_elsewhere, make_run

from troll.cli import main
from troll.runs.files import read_jsonl, write_json
from troll.tce import study

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
    study = make_run(tmp_path / "a-study", "tce study")
    code, _, err = cli(capsys, "study", "--out", str(study), "--env", "toy/viapoint")
    assert code == 2 and "already holds a study of 'troll tce study'; pass --resume to continue it, --overwrite" in err
    run = make_run(tmp_path / "a-run", "tce train")  # a run folder is not a study
    before = sorted(p.name for p in run.iterdir())
    code, _, err = cli(capsys, "study", "--out", str(run), "--env", "toy/viapoint", "--overwrite")
    assert code == 2 and "'troll tce train', which 'troll tce study' never continues nor replaces" in err
    assert sorted(p.name for p in run.iterdir()) == before


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
    assert log.endswith(f"tce train --out {folders['tce', 1]} --no-progress --options {out / 'tce/seed1.options.json'}")
    given = json.loads((out / "tce" / "seed1.options.json").read_text())  # the cell's config, as data
    assert given == json.loads((folders["tce", 1] / "config.json").read_text())["config"]
    assert (given["env"], given["algo"], given["seed"], given["threads"], given["workers"]) == ("toy/viapoint", "tce",
                                                                                               1, 1, 0)  # fmt: skip
    assert (given["total_env_steps"], given["episodes"]) == (1600, 8)

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


@pytest.mark.parametrize("algos", ["tce,bbrl,bbrl-cov", "tce"])
def test_a_metaworld_study_cell_runs_the_authors_env_options(tmp_path, algos):
    """Regression: the backend a study records (and passes to each cell in its env options) once replaced the
    preset's env options, so every metaworld/* study cell ran without the authors' mocap controller, gripper start
    and full context. Each planned cell, and the config its ``troll tce train`` builds from its options file, keeps
    them."""
    import argparse

    from troll.episodic.presets import METAWORLD_ENV

    args = argparse.Namespace(resume=False, env="metaworld/reach-v3", algos=algos, out=str(tmp_path / "x"))
    spec = study.spec_from_args(args, {})[0]
    backend = spec.options["env_options"]["backend"]
    cells = study.plan(spec, tmp_path / "x")
    assert len(cells) == 3 * len(algos.split(","))
    for cell in cells:
        config = cell.options["config"]
        assert config.env_options == {**METAWORLD_ENV, "backend": backend}, cell.folder
        assert cell_runs(cell, spec) == config


def test_a_study_records_its_backend_and_an_old_one_keeps_its_cells_backend(tmp_path):
    """Every cell of a study runs on one simulator: a new study records the env's default backend (unless given);
    a study saved before that rule resumes on the backend its started cells recorded, not today's default."""
    import argparse

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
    cell = study.plan(spec, tmp_path / "old")[-1]
    assert study.cell_data(cell)["env_options"] == {"backend": "python"}
    assert cell_runs(cell, spec).env_options == {"backend": "python"}


def test_a_cell_reads_back_the_config_the_study_planned_bit_for_bit(tmp_path):
    """Each algorithm's cell (PPO's config too) builds from its options file the config the study planned: floats
    without a short decimal, widths and None come back exactly, through JSON rather than flag text."""
    import argparse

    args = argparse.Namespace(resume=False, env="gym/reacher", algos="tce,ppo", seeds="2", out=str(tmp_path / "x"))
    given = {"ppo_gamma": 0.1 + 0.2, "ppo_net_arch": (7, 5), "mean_bound": 1e-7 / 3, "policy_hidden": (9,), "tau": None}
    spec = study.spec_from_args(args, given)[0]
    cells = study.plan(spec, tmp_path / "x")
    assert sorted((c.arm, c.seed) for c in cells) == [("ppo", 0), ("ppo", 1), ("tce", 0), ("tce", 1)]
    for cell in cells:
        ran = cell_runs(cell, spec)
        assert ran == cell.options["config"] and type(ran) is type(cell.options["config"]) and ran.seed == cell.seed
        if cell.arm == "ppo":
            assert (ran.gamma, ran.net_arch) == (0.30000000000000004, (7, 5))
        else:
            assert (ran.mean_bound, ran.policy_hidden, ran.tau) == (1e-7 / 3, (9,), None)


def cell_runs(cell, spec):
    """The config a cell's ``troll tce train`` builds from its command line and the options file the study writes."""
    from troll.cli import build_parser
    from troll.study import options as options_file
    from troll.tce.cli import train_config

    options_file.write(cell.options_file, study.cell_data(cell))
    argv = study.cell_argv(cell, spec, resume=False)
    assert argv[:5] == [sys.executable, "-m", "troll.cli", "tce", "train"]
    assert argv[argv.index("--options") + 1] == str(cell.options_file)
    return train_config(build_parser().parse_args(argv[3:]), None)


def test_resume_refuses_a_study_whose_started_cells_ran_other_settings(tmp_path, capsys):
    """A study folder made by an older version (here: a metaworld cell that ran with the backend alone as its env
    options, as every cell did before the preset's options were kept) is refused by --resume with exit 2, naming
    the cell, and left untouched; a cell started with today's settings (other threads allowed) passes."""
    import dataclasses

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
