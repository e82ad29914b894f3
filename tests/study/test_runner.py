"""The study engine (:mod:`troll.study`) with a fake frontend: cells are tiny Python scripts, not training runs.

The fake frontend compares "algorithms" whose cells write metrics.jsonl (x-axis ``env_steps``, as an episodic agent
would) and summary.json with known numbers, so the aggregates, the paired differences and the curves can be checked
by hand; a cell can fail, kill itself (SIGKILL) or kill the study that started it, to check that a resumed study
reruns only the unfinished cells. Also here: the import layers of study/, train/ and cli/ (no circle, no import from
a lower layer to a higher one, no module over 600 lines). Seconds in all.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SRC, process_state

from troll.runs.files import append_jsonl, read_jsonl, truncate_jsonl, write_json
from troll.study import Grid, Study, UsageError, check_folder, load_spec, plan, run_study

# A cell: writes one metrics row per "environment step" block and a checkpoint after each, then summary.json.
# argv: folder arm seed value [--resume]. FAKE_KILL="<arm>/seed<k>:<rows>:<how>" makes that cell, on its first
# attempt, SIGKILL itself ("self") or the study ("parent") after <rows> rows; FAKE_FAIL="<arm>" makes it exit 3.
# FAKE_SLOW=<seconds> makes each row take that long and the cell stop as `troll tce train` does: SIGTERM ends it
# after its row's checkpoint with exit 143; the signals that reach it are noted in the files "sigterm" and "sigint";
# it starts a worker process of its own (its pid in the file "worker"), as a run starts env workers.
CELL = r"""
import json, os, signal, sys, time
from pathlib import Path
folder, arm, seed, value = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
resume = "--resume" in sys.argv
folder.mkdir(parents=True, exist_ok=True)
(folder / "pid").write_text(str(os.getpid()))
if os.environ.get("FAKE_FAIL") == arm:
    print("broken on purpose", flush=True)
    sys.exit(3)
start = json.loads((folder / "ckpt.json").read_text())["rows"] if resume else 0
if not resume:
    (folder / "metrics.jsonl").unlink(missing_ok=True)
stop = []
if os.environ.get("FAKE_SLOW"):
    signal.signal(signal.SIGTERM, lambda *_: (stop.append(1), (folder / "sigterm").write_text("")))
    signal.signal(signal.SIGINT, lambda *_: (folder / "sigint").write_text(""))
    import subprocess
    watch = "import os, sys, time\nwhile os.getppid() == int(sys.argv[1]): time.sleep(0.05)"  # ends with its cell
    worker = subprocess.Popen([sys.executable, "-c", watch, str(os.getpid())])
    (folder / "worker").write_text(str(worker.pid))
quality = {"base": 0.2, "tce": 0.7}.get(arm, 0.0) + 0.01 * seed + (0.0 if value == "None" else float(value))
kill = os.environ.get("FAKE_KILL", "")
for i in range(start, 4):
    time.sleep(float(os.environ.get("FAKE_SLOW", 0)))
    row = {"env_steps": 1000 * (i + 1), "success": quality * (i + 1) / 4}
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    (folder / "ckpt.json").write_text(json.dumps({"rows": i + 1}))
    if stop and i + 1 < 4:
        worker.kill()
        sys.exit(143)
    target, _, rest = kill.partition(":")
    rows, _, how = rest.partition(":")
    first = not (folder.parent / (folder.name + ".killed")).exists()
    if target == f"{arm}/seed{seed}" and i + 1 == int(rows) and first:
        (folder.parent / (folder.name + ".killed")).write_text("")
        if how == "parent":
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(30)  # PR_SET_PDEATHSIG ends this sleep at once
        os.kill(os.getpid(), signal.SIGKILL)
(folder / "summary.json").write_text(json.dumps({"score": quality, "resumed": resume}))
if os.environ.get("FAKE_SLOW"):
    worker.kill()
"""

# The frontend, as a module of its own so that a study process started by a test can import it too.
FRONTEND = r"""
import sys
from pathlib import Path
from troll.study import Curve, Frontend, Number, Pairing, against

CELL = Path(__file__).with_name("cell.py")

def numbers(cell, summary, rows):
    return {"score": summary["score"], "final": rows[-1]["success"] if rows else None}

FAKE = Frontend(
    command="fake study",
    arm="algo",
    cell_argv=lambda cell, resume: [sys.executable, str(CELL), str(cell.folder), cell.arm, str(cell.seed),
                                    str(cell.value)] + (["--resume"] if resume else []),
    numbers=numbers,
    table=(Number("score", "score"), Number("final", "final success rate")),
    paired=(Number("score", "score"),),
    pairing=Pairing(against("base")),
    curves=(Curve("success", "success rate", ylim=(-0.02, 1.02)),),
    x_key="env_steps",
    x_label="environment steps",
    can_resume=lambda cell: (cell.folder / "ckpt.json").is_file(),
)
"""

# A study process: python study.py OUT [--resume] [--command]: run_study (jobs=1, progress on stdout, exit 1 when a
# cell failed) or, with --command, the study command around it (jobs=2, its exit status and messages).
DRIVER = r"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from fakefront import FAKE
from troll.study import Grid, Study, check_folder, plan, run_study
from troll.study.command import cmd_study
from troll.study.executors import Executor
out, resume = Path(sys.argv[1]), "--resume" in sys.argv
grid = Grid(["base", "tce"], [0, 1])
cells = plan(grid, out, lambda value, arm, seed, folder: None)
clear = check_folder(out, command=FAKE.command, overwrite=False, resume=resume)
study = Study(out, FAKE, grid, {"arms": grid.arms}, cells)
if "--command" in sys.argv:
    run = lambda report: run_study(study, clear=clear, jobs=2, report=report)
    sys.exit(cmd_study("fake study", out, len(cells), 2, run, executor=Executor()))
status = run_study(study, clear=clear, jobs=1, report=print)
sys.exit(1 if any(s.startswith("failed") for s in status.values()) else 0)
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake frontend (its module and cell script written under tmp_path); cells see this checkout's troll."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "cell.py").write_text(CELL)
    (code / "fakefront.py").write_text(FRONTEND)
    (code / "study.py").write_text(DRIVER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("FAKE_KILL", raising=False)
    monkeypatch.delenv("FAKE_FAIL", raising=False)
    monkeypatch.delenv("FAKE_SLOW", raising=False)
    spec = importlib.util.spec_from_file_location("fakefront", code / "fakefront.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FAKE


def _study(frontend, out: Path, grid: Grid) -> Study:
    cells = plan(grid, out, lambda value, arm, seed, folder: {"arm": arm, "seed": seed})
    return Study(out, frontend, grid, {"arms": grid.arms, "seeds": grid.seeds}, cells)


def _run(study: Study, *, resume: bool = False, jobs: int = 2) -> tuple[dict, list[str]]:
    lines: list[str] = []
    clear = check_folder(study.out, command=study.frontend.command, overwrite=False, resume=resume)
    return run_study(study, clear=clear, jobs=jobs, report=lines.append), lines


# ---------------------------------------------------------------- the report, by hand


def test_engine_with_a_fake_frontend(tmp_path, fake):
    out = tmp_path / "st"
    study = _study(fake, out, Grid(["base", "tce"], [0, 1, 2]))
    assert [c.label for c in study.cells[:3]] == [(out / "base/seed0").as_posix(), (out / "tce/seed0").as_posix(),
                                                  (out / "base/seed1").as_posix()]  # fmt: skip
    status, lines = _run(study)
    assert set(status.values()) == {"done"} and len(lines) == 12  # started + finished per cell
    assert json.loads((out / "config.json").read_text())["command"] == "fake study"
    data = json.loads((out / "study.json").read_text())
    assert data["spec"] == {"arms": ["base", "tce"], "seeds": [0, 1, 2]}
    # scores: base 0.20, 0.21, 0.22; tce 0.70, 0.71, 0.72 (seed adds 0.01)
    agg = {a["algo"]: a for a in data["aggregates"]}
    assert agg["tce"]["score"]["mean"] == pytest.approx(0.71) and agg["tce"]["score"]["n"] == 3
    assert agg["base"]["score"]["se"] == pytest.approx(0.01 / 3**0.5)  # s = 0.01, se = s / sqrt(3)
    (paired,) = data["paired"]
    assert (paired["arm"], paired["reference"], paired["metric"]) == ("tce", "base", "score")
    assert paired["mean"] == pytest.approx(0.5) and paired["ci95"] == pytest.approx([0.5, 0.5])
    curve = next(c for c in data["curves"] if c["algo"] == "tce")
    assert curve["env_steps"] == [1000, 2000, 3000, 4000] and curve["n"] == [3, 3, 3, 3]
    assert curve["mean"][-1] == pytest.approx(0.71)
    table = (out / "study.md").read_text()
    assert "## Per algo: mean ± standard error over seeds" in table
    assert "| algo | seeds | score | final success rate |" in table and "| tce | 3 | 0.710 ± 0.006 |" in table
    assert "## Paired: arm minus reference, same seed" in table and "| score | tce - base |" in table
    assert (out / "study.png").stat().st_size > 10_000


def test_swept_grid_and_failed_cell(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "broken")
    out = tmp_path / "st"
    study = _study(fake, out, Grid(["base", "broken", "tce"], [0], "bonus", [0.0, 0.1]))
    assert study.cells[0].folder == out / "bonus=0.0" / "base" / "seed0"
    status, lines = _run(study, jobs=3)
    assert sorted(status.values()) == ["done"] * 4 + ["failed (exit 3)"] * 2
    assert any("FAILED" in line and "broken on purpose" in line for line in lines)
    data = json.loads((out / "study.json").read_text())
    pairs = [(p["value"], p["arm"], p["n"]) for p in data["paired"]]
    assert pairs == [(0.0, "broken", 0), (0.0, "tce", 1), (0.1, "broken", 0), (0.1, "tce", 1)]  # broken: no result
    assert data["paired"][3]["mean"] == pytest.approx(0.5)
    assert "Cells without a result" in (out / "study.md").read_text()


def test_the_plot_title_says_when_its_curves_are_over_part_of_the_grid(tmp_path, fake, monkeypatch):
    """The curves average the finished cells only: a grid with cells lacking a result says how many it has."""
    import troll.study.plot as plot_lib

    titles = []
    monkeypatch.setattr(plot_lib, "plot_study", lambda *args, title="", **kwargs: titles.append(title))
    _run(_study(fake, tmp_path / "all", Grid(["base", "tce"], [0])))
    assert titles and "cells finished" not in titles[-1]
    monkeypatch.setenv("FAKE_FAIL", "broken")
    _run(_study(fake, tmp_path / "part", Grid(["base", "broken", "tce"], [0, 1])))
    assert titles[-1].endswith(", 4 of 6 cells finished")


# ---------------------------------------------------------------- folders and resume


def test_folder_checks(tmp_path, fake):
    out = tmp_path / "st"
    _run(_study(fake, out, Grid(["base"], [0])))
    with pytest.raises(UsageError, match="pass --resume to continue it"):
        check_folder(out, command="fake study", overwrite=False, resume=False)
    with pytest.raises(UsageError, match="never continues nor replaces"):  # another command's study is not ours
        check_folder(out, command="study", overwrite=True, resume=False)
    assert check_folder(out, command="fake study", overwrite=True, resume=False) is True
    assert load_spec(out) == {"arms": ["base"], "seeds": [0]}
    with pytest.raises(UsageError, match="not found; start the study without --resume"):
        load_spec(tmp_path / "nowhere")


def test_killed_cell_reruns_alone(tmp_path, fake, monkeypatch):
    out = tmp_path / "st"
    study = _study(fake, out, Grid(["base", "tce"], [0, 1]))
    monkeypatch.setenv("FAKE_KILL", "tce/seed1:2:self")
    status, _ = _run(study)
    killed = out / "tce" / "seed1"
    assert status[killed.as_posix()] == "failed (exit -9)" and list(status.values()).count("done") == 3
    stamps = {c.label: (c.folder / "summary.json").stat().st_mtime_ns for c in study.cells if c.folder != killed}
    status, lines = _run(study, resume=True)
    assert status[killed.as_posix()] == "done" and list(status.values()).count("kept") == 3
    assert lines[0] == f"started {killed.as_posix()} (resuming)" and len(lines) == 2
    assert {
        c.label: (c.folder / "summary.json").stat().st_mtime_ns for c in study.cells if c.folder != killed
    } == stamps
    assert [r["env_steps"] for r in read_jsonl(killed / "metrics.jsonl")] == [1000, 2000, 3000, 4000]
    assert json.loads((killed / "summary.json").read_text())["resumed"] is True
    commands = [line for line in killed.with_name("seed1.log").read_text().splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and commands[-1].endswith("--resume")


def test_killed_study_takes_its_cells_along_and_resumes(tmp_path, fake):
    out = tmp_path / "st"
    driver = [sys.executable, str(tmp_path / "code" / "study.py"), str(out)]
    env = {**os.environ, "FAKE_KILL": "tce/seed0:1:parent"}  # the second cell kills the study, jobs=1
    proc = subprocess.run(driver, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    cut = out / "tce" / "seed0"
    pid = int((cut / "pid").read_text())
    deadline = time.time() + 10
    while _alive(pid) and time.time() < deadline:  # PR_SET_PDEATHSIG: the orphan dies with its study
        time.sleep(0.05)
    assert not _alive(pid)
    assert (out / "base" / "seed0" / "summary.json").is_file() and not (cut / "summary.json").exists()
    stamp = (out / "base" / "seed0" / "summary.json").stat().st_mtime_ns
    proc = subprocess.run([*driver, "--resume"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"started {cut.as_posix()} (resuming)" in proc.stdout and "started " + (out / "base/seed0").as_posix() \
        not in proc.stdout  # fmt: skip
    assert (out / "base" / "seed0" / "summary.json").stat().st_mtime_ns == stamp
    assert [r["env_steps"] for r in read_jsonl(cut / "metrics.jsonl")] == [1000, 2000, 3000, 4000]
    data = json.loads((out / "study.json").read_text())
    assert [c["status"] for c in data["cells"]] == ["kept", "done", "done", "done"]


@pytest.fixture
def command(tmp_path):
    """``command(out, *more, slow=seconds)``: the fake study through the study command, in a session of its own
    (as a terminal's foreground job); killed at the end if a failed test left it running or paused."""
    started: list[subprocess.Popen] = []

    def start(out: Path, *more: str, slow: float) -> subprocess.Popen:
        argv = [sys.executable, str(tmp_path / "code" / "study.py"), str(out), "--command", *more]
        env = {**os.environ, "FAKE_SLOW": str(slow)}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:  # its cells die with it (their parent-death signal)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def _number_in(path: Path) -> bool:
    try:
        return path.read_text().isdigit()
    except FileNotFoundError:
        return False


def _when_running(out: Path, count: int, proc: subprocess.Popen) -> list[Path]:
    """The folders of the first ``count`` cells, once each has written its pid (the file exists before the number is
    in it: write_text creates it, then writes)."""
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        started = sorted(p.parent for p in out.glob("*/seed*/pid") if _number_in(p))
        if len(started) >= count:
            return started
        time.sleep(0.05)
    raise AssertionError(f"{count} cells did not start: {proc.communicate()}")


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_a_stopped_study_stops_its_cells_with_a_checkpoint_and_resumes(tmp_path, fake, command, how):
    """SIGTERM to the study, or Ctrl-C at a terminal (SIGINT to its whole process group): no cell is started after
    it, the running cells get SIGTERM (never the terminal's SIGINT), save their row and exit 143; the study writes
    its report, names the command that continues it and exits 143 or 130. Resumed, each cell ends with every row
    once."""
    out = tmp_path / "st"
    proc = command(out, slow=0.6)
    running = _when_running(out, 2, proc)
    if how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (143 if how == "SIGTERM" else 130), err
    signal_name = "SIGTERM" if how == "SIGTERM" else "SIGINT"
    assert f"{signal_name}: stopping; 2 running cell(s) end their iteration and save a checkpoint" in err
    assert f"continue with: troll fake study --out {out} --resume" in err
    assert sorted(p.parent for p in out.glob("*/seed*/pid")) == running  # nothing started after the signal
    data = {c["folder"]: c["status"] for c in json.loads((out / "study.json").read_text())["cells"]}
    names = sorted(data)
    assert [data[n] for n in names].count("stopped (SIGTERM)") == 2 and [data[n] for n in names].count("not run") == 2
    for folder in running:
        assert not (folder / "sigint").exists() and not (folder / "summary.json").exists()
        rows = json.loads((folder / "ckpt.json").read_text())["rows"]
        assert 1 <= rows < 4 and len(read_jsonl(folder / "metrics.jsonl")) == rows
    proc = command(out, "--resume", slow=0.0)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    for cell in json.loads((out / "study.json").read_text())["cells"]:
        assert cell["status"] == "done"
    for folder in out.glob("*/seed*"):
        if folder.is_dir():
            assert [r["env_steps"] for r in read_jsonl(folder / "metrics.jsonl")] == [1000, 2000, 3000, 4000]


def test_a_cell_stopped_by_hand_is_stopped_not_failed_and_the_others_go_on(tmp_path, fake, command):
    out = tmp_path / "st"
    proc = command(out, slow=0.3)
    first = _when_running(out, 1, proc)[0]
    os.kill(int((first / "pid").read_text()), signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert f"stopped {first.as_posix()} (SIGTERM)" in err and "failed" not in err
    assert f"1 cell(s) were stopped before their end: {first.as_posix()}; continue with: troll fake study" in err
    status = [c["status"] for c in json.loads((out / "study.json").read_text())["cells"]]
    assert sorted(status) == ["done", "done", "done", "stopped (SIGTERM)"]


def test_a_second_ctrl_c_kills_the_cells_at_once(tmp_path, fake, command):
    out = tmp_path / "st"
    proc = command(out, slow=30.0)  # a row takes 30 s: the first Ctrl-C alone would wait for it
    running = _when_running(out, 2, proc)
    start = time.time()
    os.killpg(proc.pid, signal.SIGINT)
    deadline = time.time() + 10
    while time.time() < deadline and not all((folder / "sigterm").exists() for folder in running):
        time.sleep(0.05)  # the study passes the first Ctrl-C on as SIGTERM
    assert all((folder / "sigterm").exists() for folder in running)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and time.time() - start < 10, err
    assert f"interrupted; continue with: troll fake study --out {out} --resume" in err
    pids = [int((folder / "pid").read_text()) for folder in running]
    deadline = time.time() + 10
    while any(_alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
    assert not any((folder / "ckpt.json").exists() for folder in running)  # killed within their first row
    assert not list(out.glob("*/seed*.lease"))


def _until(predicate, what: str, seconds: float = 20.0) -> None:
    deadline = time.time() + seconds
    while not predicate():
        assert time.time() < deadline, what
        time.sleep(0.02)


def test_ctrl_z_pauses_the_study_with_its_cells_and_fg_resumes_them(tmp_path, fake, command):
    """The cells run in sessions of their own, so a terminal's Ctrl-Z (SIGTSTP to the study's process group) does
    not reach them: the study stops them with their workers, then itself; SIGCONT to the study (``fg``) continues
    them too."""
    out = tmp_path / "st"
    proc = command(out, slow=0.3)
    running = _when_running(out, 2, proc)
    written = [folder / name for folder in running for name in ("pid", "worker")]
    _until(lambda: all(_number_in(f) for f in written), "workers started")
    pids = [int(f.read_text()) for f in written]
    os.killpg(proc.pid, signal.SIGTSTP)
    _until(
        lambda: process_state(proc.pid) == "T" and all(process_state(pid) == "T" for pid in pids),
        "study, cells, workers paused",
    )
    rows = [read_jsonl(folder / "metrics.jsonl") if (folder / "metrics.jsonl").exists() else [] for folder in running]
    time.sleep(1.0)  # three rows' time: nothing is written while paused
    assert [read_jsonl(f / "metrics.jsonl") if (f / "metrics.jsonl").exists() else [] for f in running] == rows
    os.kill(proc.pid, signal.SIGCONT)
    _until(lambda: all(process_state(pid) not in ("T", "") for pid in pids[1::2]), "workers continued")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert sorted(c["status"] for c in json.loads((out / "study.json").read_text())["cells"]) == ["done"] * 4


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped by init, counts as gone)."""
    return process_state(pid) not in ("Z", "")


# ---------------------------------------------------------------- files written whole


def test_jsonl_drops_a_torn_last_line_and_json_is_replaced_whole(tmp_path):
    path = tmp_path / "m.jsonl"
    for step in (1, 2):
        append_jsonl(path, {"step": step})
    with path.open("a") as f:
        f.write('{"step": 3, "lo')  # a write cut short by SIGKILL
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    assert truncate_jsonl(path, 1) == [{"step": 1}] and path.read_text() == '{"step": 1}\n'
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="m.jsonl:2 is not a JSON line"):
        read_jsonl(path)
    write_json(tmp_path / "s.json", {"a": 1})
    write_json(tmp_path / "s.json", {"a": 2})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl", "s.json"]  # no temporary file left


# ---------------------------------------------------------------- layers


# the layers of every package: tests/test_architecture.py


def test_engine_imports_nothing_heavy():
    code = "import sys, troll.study, troll.cli; troll.cli.build_parser(); "
    code += "print(sorted({'matplotlib', 'transformers', 'trl', 'reasoning_gym'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
