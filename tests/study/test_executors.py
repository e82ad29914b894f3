"""Studies beyond one machine (:mod:`troll.study.executors`): ``--executor ray`` and ``slurm`` against ``local``.

One localhost Ray cluster serves the module (a head with no CPUs and two 1-CPU worker nodes, started one after the
other; nodes started at once on one host time out), with HOME and Ray's temp folder in a temporary folder (Ray
writes ~/.ray), ended node by node through the pids of their ``ray start --block`` processes (never ``ray stop``,
which would end every Ray process of the machine). The SLURM path runs through submitit's local executor
(``--slurm-local``). The toy task (tce, bbrl x seed 0, 6 iterations of 8 episodes) is the study; a cell is a
``troll tce train`` subprocess of a few seconds.

- the same study run by local, by Ray (losing a worker node after a cell's first checkpoint: Ray reruns the task on
  the other node, which continues from the checkpoint) and by a SLURM array of 2 cells per task gives byte-identical
  summary.json, metrics.jsonl, study.json and study.md, timing fields excepted;
- the study killed with its SLURM task mid-cell: ``--resume`` runs only the unfinished cells, from their checkpoints;
  the study killed alone while its task runs: ``--resume`` reattaches to the live job, submits nothing and starts no
  second writer; a failed cell fails alone and is not retried;
- a cell larger than every node of the cluster is refused (exit 2, nothing written), as the probe of the cluster
  reads its nodes; the checks that need no cluster are tests/study/test_executors_checks.py;
- teardown: no process of the cluster left, nothing written in the real $HOME.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import submitit
from conftest import parent_pid, process_state, processes_under
from deadline import within

from troll.cli import main
from troll.runs.files import UsageError, read_jsonl
from troll.study import executors, on_slurm, runner
from troll.study.frontend import Frontend, Pairing, against
from troll.study.grid import Cell

SRC = Path(__file__).parents[2] / "src"
RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
TINY = ["--env", "toy/viapoint", "--algos", "tce,bbrl", "--seeds", "1", "--steps", "4800", "--episodes", "8",
        "--eval-episodes", "8", "--eval-every", "1", "--checkpoint-every", "1", "--policy-hidden", "16",
        "--critic-hidden", "16", "--policy-epochs", "2", "--critic-epochs", "2", "--critic-minibatches", "1",
        "--workers", "0"]  # fmt: skip
CELLS = ("tce/seed0", "bbrl/seed0")
TIMING = ("seconds", "seconds_per_iteration", "minutes", "status")  # status: "kept" by a resumed study


@pytest.fixture(autouse=True)
def cells_import_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(SRC))


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["tce", "study", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------- what "the same study" means


def _steady(value, out: Path):
    """A JSON value without its timing fields, the study folder's path made neutral."""
    if isinstance(value, dict):
        return {k: _steady(v, out) for k, v in value.items() if k not in TIMING and not k.startswith("time/")}
    if isinstance(value, list):
        return [_steady(v, out) for v in value]
    if isinstance(value, str):
        return value.replace(str(out), "<out>")
    return value


def _table(text: str) -> list[str]:
    """study.md without its last column (minutes, the only timing in it)."""
    return [line.rsplit(" | ", 1)[0] if line.startswith("| ") else line for line in text.splitlines()]


def assert_same_study(out: Path, ref: Path) -> None:
    for cell in CELLS:
        for name in ("summary.json", "metrics.jsonl"):
            mine, theirs = (out / cell / name).read_text(), (ref / cell / name).read_text()
            if name == "metrics.jsonl":
                mine, theirs = read_jsonl(out / cell / name), read_jsonl(ref / cell / name)
            else:
                mine, theirs = json.loads(mine), json.loads(theirs)
            assert _steady(mine, out) == _steady(theirs, ref), (cell, name)
    study, reference = (json.loads((f / "study.json").read_text()) for f in (out, ref))
    assert _steady(study, out) == _steady(reference, ref)
    assert _table((out / "study.md").read_text()) == _table((ref / "study.md").read_text())


def starts(out: Path, cell: str) -> int:
    """How many times the cell's command was started (its log's ``$ ...`` lines)."""
    return sum(line.startswith("$ ") for line in (out / f"{cell}.log").read_text().splitlines())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The study run by ``--executor local`` (its cells one at a time)."""
    out = tmp_path_factory.mktemp("local") / "study"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(SRC))
        assert main(["tce", "study", "--out", str(out), *TINY, "--jobs", "2"]) == 0
    assert all((out / c / "summary.json").is_file() for c in CELLS)
    return out


# ---------------------------------------------------------------- the Ray cluster


def _start_node(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(argv + ["--block"], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 90
    while "Ray runtime started" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    return proc


class _Cluster:
    """A head and two 1-CPU nodes on this host, started in a thread (while the first tests run), ended by pid."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="trray", dir="/tmp"))  # short: Ray's socket paths stay < 108 bytes
        self.nodes: list[subprocess.Popen] = []
        self.address, self.error = None, None
        self.thread = threading.Thread(target=self._boot, daemon=True)
        self.thread.start()

    def _boot(self) -> None:
        env = {**os.environ, "HOME": str(self.root), "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(SRC),
               "OMP_NUM_THREADS": "1", "RAY_TMPDIR": str(self.root),
               # a lost node noticed in about 2 s instead of Ray's 15 (its health checks: every 3 s, 5 missed)
               "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
               "RAY_health_check_failure_threshold": "2"}  # fmt: skip
        common = ["--temp-dir", str(self.root / "ray"), "--disable-usage-stats"]
        try:
            head = [RAY, "start", "--head", "--num-cpus=0", "--port=0", "--include-dashboard=false", *common]
            self.nodes.append(_start_node(head, env, self.root / "head.log"))
            address = re.search(r"ray start --address='([^']+)'", (self.root / "head.log").read_text())[1]
            for k in (1, 2):  # one after the other
                node = [RAY, "start", f"--address={address}", "--num-cpus=1", *common]
                self.nodes.append(_start_node(node, env, self.root / f"node{k}.log"))
            self.address = address
        except BaseException as err:  # noqa: BLE001 -- reported by ready()
            self.error = err

    def ready(self) -> str:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.address

    def close(self) -> list[int]:
        """End every node by the pid of its `ray start --block` (never `ray stop`), then any process of this cluster
        still running by its pid (a lost node's workers); returns the pids still alive after that (none)."""
        self.thread.join()
        for proc in reversed(self.nodes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while any(p.poll() is None for p in self.nodes) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in processes_under(str(self.root)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.nodes:
            proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while processes_under(str(self.root)) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = processes_under(str(self.root))
        shutil.rmtree(self.root, ignore_errors=True)
        return left


@pytest.fixture(scope="module", autouse=True)
def _booting():
    """The module's cluster, booting from the first test on; at the end no process of it is left and $HOME is as
    it was (the tests point HOME at the cluster's folder)."""
    home_before = sorted(p.name for p in Path.home().iterdir())
    booting = _Cluster()
    yield booting
    left = booting.close()
    assert not left, f"processes of the test cluster outlived it: {left}"
    assert sorted(p.name for p in Path.home().iterdir()) == home_before, "the tests wrote in $HOME"


@pytest.fixture
def cluster(_booting, monkeypatch):
    """(address, folder) of the running cluster; the study (the Ray driver, in-process) gets its HOME too."""
    address = _booting.ready()
    monkeypatch.setenv("HOME", str(_booting.root))
    monkeypatch.setenv("RAY_TMPDIR", str(_booting.root))
    return address, _booting.root


def _kill_node_of(out: Path, cell: str) -> int:
    """Lose the node running ``cell`` once its first checkpoint exists, as a machine that dies loses it: every
    process of the cell at once. Returns the pid of the node's raylet.

    The cell's command is frozen first (SIGSTOP): a Ray worker notices its raylet's death only after about a second,
    time in which a tiny cell could finish and hand its result back, and the node would not have been lost at all.
    Then the raylet and the worker are killed; the frozen command dies with the worker (its parent-death signal)."""
    deadline = time.monotonic() + 120
    while not any((out / cell).glob("checkpoint-*.pt")):  # a run keeps only its newest checkpoint
        assert time.monotonic() < deadline, "the cell never wrote its first checkpoint"
        time.sleep(0.01)
    holder = json.loads((out / f"{cell}.lease").read_text())["pid"]  # the Ray worker running the cell
    commands = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _safe_parent(p.name) == holder]
    assert len(commands) == 1, f"the worker {holder} runs {len(commands)} commands, not one"
    os.kill(commands[0], signal.SIGSTOP)
    raylet = parent_pid(holder)
    assert "raylet" in Path(f"/proc/{raylet}/cmdline").read_bytes().decode(), "the worker's parent is not a raylet"
    os.kill(raylet, signal.SIGKILL)
    os.kill(holder, signal.SIGKILL)
    return raylet


def _safe_parent(pid: str) -> int | None:
    """The parent of a process that may end while it is read (None then)."""
    try:
        return parent_pid(int(pid))
    except (OSError, ValueError, IndexError):
        return None


# ---------------------------------------------------------------- SLURM through submitit's local executor


def _study_until(argv: list[str], cell: Path) -> subprocess.Popen:
    """The study as a process of its own session (with the array tasks it starts), once ``cell`` has a checkpoint
    (any: a run keeps only its newest, so on a fast machine checkpoint-1.pt may be gone before a poll sees it)."""
    log = cell.parents[2] / f"{cell.parents[1].name}-{time.monotonic_ns()}.log"  # beside the study folder
    with log.open("w") as sink:
        study = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not any(cell.glob("checkpoint-*.pt")):
        ended = study.poll() is not None
        assert not ended and time.monotonic() < deadline, f"the study ended before {cell} had a checkpoint:\n" + (
            log.read_text()[-3000:] if ended else ""
        )
        time.sleep(0.01)
    return study


def test_killed_studies_resume_only_unfinished_cells_and_reattach(tmp_path, capsys, reference):
    """1. The machine of the study and its array task dies (all killed) after the first cell's first checkpoint:
    ``--resume`` submits the unfinished cells again, the first one continuing from its checkpoint. 2. That study is
    killed alone once the second cell is under way, its task living on (a SLURM job outlives its submitter):
    ``--resume`` reattaches to it and submits nothing. No cell ever had two writers, and the study is the local one."""
    out = tmp_path / "study"
    slurm = ["--executor", "slurm", "--slurm-local", "--slurm-cells-per-task", "2"]
    study = [sys.executable, "-m", "troll.cli", "tce", "study", "--out", str(out)]
    crashed = _study_until([*study, *TINY, *slurm], out / "tce/seed0")
    os.killpg(crashed.pid, signal.SIGKILL)  # the study, its task and the cell at once
    crashed.wait()
    (first,) = json.loads((out / on_slurm.JOBS_FILE).read_text())["jobs"]
    assert first["cells"] == list(CELLS)  # one array task runs both cells, one after the other
    assert not (out / "tce/seed0/summary.json").exists()
    resumed = _study_until([*study, "--resume", *slurm], out / "bbrl/seed0")
    resumed.kill()  # the study alone: its task runs on
    resumed.wait()
    jobs = json.loads((out / on_slurm.JOBS_FILE).read_text())["jobs"]
    assert jobs[0] == first and [e["cells"] for e in jobs[1:]] == [list(CELLS)]  # the crashed job's cells, again
    code, _, err = cli(capsys, "--out", str(out), "--resume", "--executor", "slurm", "--slurm-local")
    assert code == 0, err
    assert f"reattached to job {jobs[1]['id']}" in err and "submitted" not in err
    assert json.loads((out / on_slurm.JOBS_FILE).read_text())["jobs"] == jobs  # nothing submitted the third time
    # tce: started, killed, resumed from its checkpoint; bbrl: started once, by the second task, never again
    assert starts(out, "tce/seed0") == 2 and starts(out, "bbrl/seed0") == 1
    again = [line for line in (out / "tce/seed0.log").read_text().splitlines() if line.startswith("$ ")][-1]
    assert again.endswith("--resume --threads 1 --workers 0")
    assert not list(out.glob("*/*.lease"))  # every attempt gave its cell back
    assert_same_study(out, reference)  # a SLURM array's study is the local one


def _freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it has stopped: a signal sent to it after that waits (:func:`_pending`),
    where one that came while the SIGSTOP was still pending would be taken first (lower signals first)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while process_state(pid) != "T":
        assert time.monotonic() < deadline, f"{pid} did not stop"
        time.sleep(0.01)


def _await_pending(pid: int, signum: int, seconds: float = 30.0) -> None:
    """Wait until signal ``signum`` waits for the stopped process ``pid`` (:func:`_pending`), ``seconds`` at most."""
    deadline = time.monotonic() + seconds
    while not _pending(pid, signum) and time.monotonic() < deadline:
        time.sleep(0.05)


def _pending(pid: int, signum: int) -> bool:
    """True when signal ``signum`` waits to be delivered to the (stopped) process ``pid``; False when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    fields = dict(line.split(":\t") for line in text.splitlines() if ":\t" in line)
    return any(int(fields[key], 16) >> (signum - 1) & 1 for key in ("SigPnd", "ShdPnd"))


def test_a_time_limit_notice_checkpoints_the_running_cell_and_requeues(tmp_path, reference):
    """submitit's notice before a time limit (SIGUSR2 to the array task) reaches the running cell as SIGTERM: it
    saves a checkpoint of the iteration it is in and exits 143, and the task is requeued (submitit's local executor
    restarts it as SLURM would). The cell continues from that checkpoint, the task's next cell runs once, and the
    study is the local one. The cell is frozen while the notice arrives, so that it cannot be in its last
    iteration."""
    out = tmp_path / "study"
    slurm = ["--executor", "slurm", "--slurm-local", "--slurm-cells-per-task", "2"]
    study = _study_until([sys.executable, "-m", "troll.cli", "tce", "study", "--out", str(out), *TINY, *slurm],
                         out / "tce/seed0")  # fmt: skip
    (cell,) = [pid for pid in processes_under(str(out / "tce/seed0")) if _cmdline(pid)[3:5] == ["tce", "train"]]
    _freeze(cell)
    try:
        done = [int(p.stem.split("-")[1]) for p in (out / "tce/seed0").glob("checkpoint-*.pt")]
        assert max(done) < 5  # of 6 iterations: the one it is in is not the last
        task = parent_pid(cell)
        assert "submitit" in " ".join(_cmdline(task))
        os.kill(task, signal.SIGUSR2)
        _await_pending(cell, signal.SIGTERM)
        logs = "".join(f"{f}:\n{f.read_text()[-1500:]}\n" for f in sorted((out / "slurm").glob("*.err")))
        logs += (out / "tce/seed0.log").read_text()[-1500:]
        assert _pending(cell, signal.SIGTERM), logs  # the task passed the notice on
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(cell, signal.SIGCONT)
    assert study.wait(timeout=180) == 0
    log = (out / "tce/seed0.log").read_text()
    assert "troll tce train: stopped by SIGTERM after step" in log and "# troll cell: stopped (SIGTERM)" in log
    assert starts(out, "tce/seed0") == 2 and starts(out, "bbrl/seed0") == 1
    assert not list(out.glob("*/*.lease"))
    assert_same_study(out, reference)


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


def test_a_cell_stopped_by_a_signal_ends_its_task(tmp_path):
    """A cell whose command a stop signal ends (SLURM signals every process of a job it preempts) is "stopped",
    not failed, and its task starts none of its other cells: they are left for the requeue, their logs say why."""
    from troll.study import cell as cell_lib

    script = ("import os, pathlib, signal, sys, time; f = pathlib.Path(sys.argv[1]); f.mkdir(parents=True, "
              "exist_ok=True); signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)); "
              "(f / 'pid').write_text(str(os.getpid())); time.sleep(60)")  # fmt: skip
    argv = lambda cell, resume: [sys.executable, "-c", script, str(cell.folder)]  # noqa: E731
    front = dataclasses.replace(_fake_frontend(tmp_path), cell_argv=argv)
    cells = [Cell(None, "a", s, tmp_path / "a" / f"seed{s}") for s in (0, 1)]
    jobs = [cell_lib.job_for(front, c) for c in cells]

    def stop_the_first() -> None:
        pid_file = cells[0].folder / "pid"
        while not pid_file.is_file() or not pid_file.read_text():
            time.sleep(0.02)
        os.kill(int(pid_file.read_text()), signal.SIGTERM)

    threading.Thread(target=stop_the_first, daemon=True).start()
    results = cell_lib.run_cells(jobs)
    assert [r["status"] for r in results] == ["stopped (SIGTERM)"] and results[0]["code"] == 143
    assert starts(tmp_path, "a/seed1") == 0 and not cells[1].folder.exists()
    assert "# troll cell: stopped (not started: its task was stopped)" in (tmp_path / "a/seed1.log").read_text()
    assert on_slurm._ended(cells[1], {"id": "1"}) == "stopped (not started: its task was stopped)"
    line = cell_lib.progress_line(cells[0], "stopped (SIGTERM)")
    assert line == f"stopped {cells[0].label} (SIGTERM); --resume continues it"


def test_a_stop_request_stops_the_cell_an_entry_point_runs(tmp_path, monkeypatch):
    """A study on Ray stops its cells through the shared folder: the entry point that finds a cell's stop request
    passes SIGTERM to the command and waits for it (a checkpoint: exit 143, "stopped (SIGTERM)"); a command that
    outlives the grace is killed; a task that starts after the request runs nothing. The next study removes it."""
    from troll.study import cell as cell_lib

    script = ("import pathlib, signal, sys, time; f = pathlib.Path(sys.argv[1]); f.mkdir(parents=True, "
              "exist_ok=True); stubborn = f.parent.name == 'stubborn'; signal.signal(signal.SIGTERM, signal.SIG_IGN "
              "if stubborn else lambda *_: ((f / 'sigterm').write_text(''), sys.exit(143))); "
              "(f / 'ready').write_text(''); time.sleep(60)")  # fmt: skip
    argv = lambda cell, resume: [sys.executable, "-c", script, str(cell.folder)]  # noqa: E731
    front = dataclasses.replace(_fake_frontend(tmp_path), cell_argv=argv)
    monkeypatch.setattr(cell_lib, "STOP_GRACE_S", 0.5)

    def request_stop(cell: Cell) -> None:  # as the study does, once the command runs
        while not (cell.folder / "ready").exists():
            time.sleep(0.02)
        cell.stop_request.write_text("SIGTERM\n")

    killed = "stopped (killed: no checkpoint within 0.5 s)"
    for arm, code, status in (("a", 143, "stopped (SIGTERM)"), ("stubborn", cell_lib.KILLED, killed)):
        cell = Cell(None, arm, 0, tmp_path / arm / "seed0")
        threading.Thread(target=request_stop, args=(cell,), daemon=True).start()
        start = time.monotonic()
        assert cell_lib.run_cell(cell_lib.job_for(front, cell)) == {"label": cell.label, "code": code, "status": status}
        assert time.monotonic() - start < 15
        assert (cell.folder / "sigterm").exists() == (arm == "a")
        assert cell_lib.last_status(cell) == status and not cell_lib.lease_lib.lease_path(cell.folder).exists()
    later = Cell(None, "a", 2, tmp_path / "a" / "seed2")
    later.folder.parent.mkdir(parents=True, exist_ok=True)
    later.stop_request.write_text("SIGTERM\n")
    assert cell_lib.run_cell(cell_lib.job_for(front, later))["status"] == "stopped (not started)"
    assert not later.folder.exists() and cell_lib.last_status(later) == "stopped (not started)"
    assert "$ " not in later.log.read_text()
    # a request that a study killed outright left behind does not stop the next study's cell
    assert runner.run_cells(_fake_frontend(tmp_path), [later], jobs=1, report=lambda text: None) == {
        later.label: "done"}  # fmt: skip
    assert not later.stop_request.exists()


class _OneSlotRay:
    """Stands in for the ``ray`` module in :func:`troll.study.on_ray.run`: one task at a time, each in a thread of
    this process; with ``schedules_after_stop=False`` a task still queued when the study stops is never started (a
    busy cluster)."""

    class exceptions:  # noqa: N801 -- as ray.exceptions
        RayError = RuntimeError

    def __init__(self, stopping: threading.Event, schedules_after_stop: bool):
        self.queue, self.results, self.started = [], {}, []
        self.stopping, self.schedules_after_stop, self.thread = stopping, schedules_after_stop, None
        self.shut = False

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, **_):
                return self

            def remote(self, job):
                ref = object()
                ray.queue.append((ref, fn, job))
                return ref

        return Task()

    def _schedule(self) -> None:
        if (self.thread is None or not self.thread.is_alive()) and self.queue:
            if self.stopping.is_set() and not self.schedules_after_stop:
                return
            ref, fn, job = self.queue.pop(0)
            self.started.append(job.label)
            self.thread = threading.Thread(target=lambda: self.results.__setitem__(ref, fn(job)), daemon=True)
            self.thread.start()

    def wait(self, refs, num_returns, timeout):
        self._schedule()
        done = [r for r in refs if r in self.results][:num_returns]
        if not done:
            time.sleep(timeout / 10)
        return done, [r for r in refs if r not in done]

    def get(self, ref):
        return self.results[ref]

    def shutdown(self):
        self.shut = True


@pytest.mark.parametrize("schedules_after_stop", [True, False])
def test_a_stopping_study_on_ray_stops_started_and_queued_tasks(tmp_path, monkeypatch, schedules_after_stop):
    """The stop reaches a cell whose task runs (SIGTERM, its checkpoint) and one whose task is queued, whose arm has
    no folder yet: its task, if Ray starts it, runs nothing; if Ray never starts it, the study ends all the same
    once :data:`on_ray.STOP_WAIT_S` has passed. No stop request is left behind."""
    from troll.study import cell as cell_lib
    from troll.study import on_ray

    script = ("import pathlib, signal, sys, time; f = pathlib.Path(sys.argv[1]); f.mkdir(parents=True, "
              "exist_ok=True); signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)); "
              "(f / 'ready').write_text(''); time.sleep(60)")  # fmt: skip
    front = dataclasses.replace(_fake_frontend(tmp_path), cell_argv=lambda cell, resume: [sys.executable, "-c",
                                script, str(cell.folder)])  # fmt: skip
    cells = [Cell(None, arm, 0, tmp_path / arm / "seed0") for arm in ("a", "b")]
    stopping = threading.Event()
    ray = _OneSlotRay(stopping, schedules_after_stop)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setattr(on_ray, "_connect", lambda address: None)
    monkeypatch.setattr(on_ray, "STOP_WAIT_S", 3.0)

    def stop_when_running() -> None:
        while not (cells[0].folder / "ready").exists():
            time.sleep(0.02)
        assert not (tmp_path / "b").exists()  # the queued cell's arm: nothing made it yet
        stopping.set()
        os.kill(os.getpid(), signal.SIGTERM)  # to the study, in this process's main thread

    threading.Thread(target=stop_when_running, daemon=True).start()
    executor = executors.Executor("ray", out=tmp_path)
    lines = []
    with pytest.raises(runner.StudyStopped) as stopped:
        runner.run_cells(front, cells, jobs=1, report=lines.append, executor=executor)
    queued = "stopped (not started)" if schedules_after_stop else "stopped (its task had not ended 3 s after the stop)"
    assert stopped.value.status == {cells[0].label: "stopped (SIGTERM)", cells[1].label: queued}
    assert ray.started == [c.label for c in cells][: 2 if schedules_after_stop else 1] and ray.shut
    assert not list(tmp_path.glob("*/*.stop")) and not list(tmp_path.glob("*/*.lease"))
    assert not cells[1].folder.exists()  # its command never ran
    assert cell_lib.last_status(cells[0]) == "stopped (SIGTERM)"


def test_the_entry_point_s_parts_that_a_stop_relies_on(tmp_path, monkeypatch):
    """- a cell's command ignores SIGUSR2 (SLURM sends submitit's notice to every process of the job step);
    - a cell that does not stop within the grace is killed, and its log says so; the wait beats the cell's lease
      (a handler's wait blocks the loop that beats it otherwise), and ends the cell at once if it was taken over;
    - the last status of a log is the last attempt's: none when a command started after the last status line;
    - submitit's notice comes :data:`on_slurm.NOTICE_S` before the time limit, on SLURM and with --slurm-local,
      30 s more than the grace."""
    from troll.study import cell as cell_lib

    script = ("import pathlib, signal, sys, time; f = pathlib.Path(sys.argv[1]); f.mkdir(parents=True, "
              "exist_ok=True); (f / 'usr2').write_text(str(signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN)); "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); (f / 'ready').write_text(''); "
              "time.sleep(60)")  # fmt: skip
    argv = lambda cell, resume: [sys.executable, "-c", script, str(cell.folder)]  # noqa: E731
    front = dataclasses.replace(_fake_frontend(tmp_path), cell_argv=argv)
    cell = Cell(None, "a", 0, tmp_path / "a" / "seed0")
    job = cell_lib.job_for(front, cell)
    took = []

    def stop_it() -> None:  # as a task's handler would, once the command runs
        while not (cell.folder / "ready").exists():
            time.sleep(0.02)
        start = time.monotonic()
        cell_lib.stop_running(1.0)
        took.append(time.monotonic() - start)

    threading.Thread(target=stop_it, daemon=True).start()
    result = cell_lib.run_cell(job)
    assert (cell.folder / "usr2").read_text() == "True"
    assert result["code"] == -signal.SIGKILL and 1.0 <= took[0] < 5
    assert "# troll cell: stopped (killed: no checkpoint within 1 s)" in cell.log.read_text()
    # the wait in the main thread, as in a handler: the heartbeat still moves
    from troll.study import lease as lease_lib

    other = Cell(None, "a", 1, tmp_path / "a" / "seed1")
    lease = lease_lib.Lease(other.folder, beat_s=0.1)
    lease.acquire()
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert stubborn.stdout.readline() == "ready\n"
    cell_lib._RUNNING.append((cell_lib.job_for(front, other), lease, stubborn))
    try:
        before = lease_lib._read_beat(lease.beat_file)
        cell_lib.stop_running(1.0)
        after = lease_lib._read_beat(lease.beat_file)
    finally:
        cell_lib._RUNNING.clear()
        stubborn.kill()
        stubborn.wait()
        lease.release()
    assert before is not None and after is not None and int(after) >= int(before) + 5
    # a lease another attempt took over meanwhile: the cell is theirs, and this attempt's command ends at once
    lease = lease_lib.Lease(other.folder, beat_s=0.1)
    lease.acquire()
    stubborn = subprocess.Popen(stubborn.args, stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline() == "ready\n"
    lease.path.write_bytes(lease_lib.Lease(other.folder)._record())  # another attempt's record
    cell_lib._RUNNING.append((cell_lib.job_for(front, other), lease, stubborn))
    try:
        start = time.monotonic()
        cell_lib.stop_running(30.0)
        assert time.monotonic() - start < 5 and stubborn.wait(timeout=10) == -signal.SIGKILL
    finally:
        cell_lib._RUNNING.clear()
        stubborn.kill()
        stubborn.wait()
    assert cell_lib.last_status(other) == "failed (lease lost)"
    lease.release()
    assert lease.path.is_file()  # the other attempt's lease is left to it
    lease.path.unlink()
    assert cell_lib.last_status(cell) == "failed (exit -9)"  # what run_cell adds when no exception ends the task
    assert not list(tmp_path.glob("a/*.lease"))
    with cell.log.open("a") as log:
        log.write("$ the next attempt, killed with its machine\n")
    assert cell_lib.last_status(cell) is None
    assert on_slurm._ended(cell, {"id": "7"}) == "failed (job 7 ended before the cell did)"
    seen = {}
    monkeypatch.setattr(submitit.LocalExecutor, "update_parameters", lambda self, **kw: seen.update(kw))
    monkeypatch.setattr(submitit.LocalExecutor, "batch", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(submitit.LocalExecutor, "submit", lambda self, *a: None)
    local = executors.Executor("slurm", slurm=executors.SlurmOptions(local=True), out=tmp_path)
    on_slurm.submit(local, [[job]], cores=1)
    assert seen["signal_delay_s"] == on_slurm.parameters(local, 1)["signal_delay_s"] == on_slurm.NOTICE_S
    assert on_slurm.NOTICE_S >= cell_lib.STOP_GRACE_S + 30
    assert executors.SLURM_TIME_LOW * 60 > on_slurm.NOTICE_S  # the shortest task allowed gets its notice
    with pytest.raises(UsageError, match=f"its stop notice {on_slurm.NOTICE_S} s before its time limit"):
        executors.from_args(argparse.Namespace(executor="slurm", slurm_time=str(executors.SLURM_TIME_LOW - 1)))


LM_CELL = """
import json, pathlib, sys
argv = json.loads(sys.argv[1])  # the troll train command line the language-model frontend built
out = pathlib.Path(argv[argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "argv.json").write_text(json.dumps(argv))
(out / "summary.json").write_text("{}")
"""


def test_language_model_cells_through_an_array(tmp_path):
    """``troll study``'s frontend through the same executor, each cell a stand-in that records the command line
    the frontend built (a real language-model cell takes minutes here): a fresh cell gets its ``troll train --options``
    command, a cell with a complete checkpoint its ``--resume`` one, and every task its cores (``--threads``)."""
    import dataclasses

    from troll.lm import checkpoints, study
    from troll.lm.options import RunOptions
    from troll.study.cell import job_for

    spec = study.StudySpec(RunOptions(threads=2, steps=4), ["grpo", "troll"], [0])
    cells = study.plan(spec, tmp_path)
    engine = study.frontend(threads=2)
    stand_in = dataclasses.replace(
        engine,
        cell_argv=lambda cell, resume: [sys.executable, "-c", LM_CELL, json.dumps(engine.cell_argv(cell, resume))],
    )
    assert [job_for(engine, c).cores for c in cells] == [2, 2]
    slurm = executors.Executor("slurm", slurm=executors.SlurmOptions(local=True, cells_per_task=2), out=tmp_path)

    def run() -> dict:
        return runner.run_cells(stand_in, cells, jobs=1, report=lambda text: None, executor=slurm)

    assert run() == {c.label: "done" for c in cells}
    for cell in cells:
        argv = json.loads((cell.folder / "argv.json").read_text())
        assert argv == engine.cell_argv(cell, False)
        assert argv[3:6] == ["train", "--out", str(cell.folder)] and "--resume" not in argv
        assert argv[6:8] == ["--options", str(cell.options_file)]  # written by the study (run_study) before its cells
        data = study.cell_data(cell)
        assert (data["loss"], data["threads"]) == (cell.arm, 2)
    troll = cells[1].folder
    (troll / "summary.json").unlink()  # stopped after its checkpoint at step 2
    (troll / "checkpoint-2").mkdir()
    checkpoints.mark_complete(troll / "checkpoint-2", step=2, metrics_lines=0)
    assert run() == {cells[0].label: "kept", cells[1].label: "done"}
    assert json.loads((troll / "argv.json").read_text()) == engine.cell_argv(cells[1], True)
    assert "--resume" in engine.cell_argv(cells[1], True)


# ---------------------------------------------------------------- a failing cell


def _fake_frontend(tmp_path) -> Frontend:
    """Cells that write their summary (seed 0) or exit 3 (seed 1), each start logged."""
    script = (
        "import json, pathlib, sys; f = pathlib.Path(sys.argv[1]); f.mkdir(parents=True, exist_ok=True); "
        "sys.exit(3) if f.name == 'seed1' else (f / 'summary.json').write_text(json.dumps({'x': 1}))"
    )
    return Frontend(
        command="tce study",
        arm="algo",
        cell_argv=lambda cell, resume: [sys.executable, "-c", script, str(cell.folder)],
        numbers=lambda cell, summary, rows: {},
        table=(),
        paired=(),
        pairing=Pairing(against("a")),
        curves=(),
    )


@pytest.mark.parametrize("where", ["slurm", "ray", "ray started here"])
def test_a_failing_cell_fails_alone_once(tmp_path, where, request, monkeypatch):
    """Through the array, the module's cluster, and a cluster ``ray.init()`` starts for the study when no
    --ray-address is given (its processes ended with the study; HOME and Ray's folder in a temporary one). The study
    gives the process back the RAY_* variables it had (``ray.init()`` sets RAY_AUTH_MODE=token for a cluster it
    starts, which the next study's probe of a cluster without tokens would inherit)."""
    address = request.getfixturevalue("cluster")[0] if where == "ray" else None
    own = Path(tempfile.mkdtemp(prefix="trhere", dir="/tmp")) if where == "ray started here" else None
    if own is not None:
        monkeypatch.setenv("HOME", str(own))
        monkeypatch.setenv("RAY_TMPDIR", str(own))
        monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    cells = [Cell(None, "a", s, tmp_path / "a" / f"seed{s}") for s in (0, 1)]
    name = where.split()[0]
    executor = executors.Executor(name, ray_address=address, slurm=executors.SlurmOptions(local=True), out=tmp_path)
    import ray  # noqa: F401 -- on import it sets RAY_CLIENT_MODE=0 (once); the study must change nothing else

    environ = dict(os.environ)
    try:
        status = runner.run_cells(_fake_frontend(tmp_path), cells, jobs=1, report=lambda text: None, executor=executor)
    finally:
        if own is not None:
            deadline = time.monotonic() + 15
            while processes_under(str(own)) and time.monotonic() < deadline:
                time.sleep(0.2)
            left = processes_under(str(own))
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            started = list(own.glob("ray/session_*"))  # a cluster of its own, not the module's
            shutil.rmtree(own, ignore_errors=True)
            assert started, "ray.init() started no cluster of its own"
            assert not left, f"the cluster ray.init() started outlived the study: {left}"
    assert status == {cells[0].label: "done", cells[1].label: "failed (exit 3)"}
    assert starts(tmp_path, "a/seed1") == 1  # not retried
    assert dict(os.environ) == environ


# ---------------------------------------------------------------- Ray, losing a node


def _ray_study_with_frozen_cell(out: Path, address: str) -> tuple[subprocess.Popen, int]:
    """The toy study on the Ray cluster at ``address``, started until tce/seed0 has a checkpoint, and that cell's
    ``tce train`` process, frozen (:func:`_freeze`); the caller sends it SIGCONT."""
    argv = [sys.executable, "-m", "troll.cli", "tce", "study", "--out", str(out), *TINY, "--executor", "ray",
            "--ray-address", address]  # fmt: skip
    study = _study_until(argv, out / "tce/seed0")
    (cell,) = [pid for pid in processes_under(str(out / "tce/seed0")) if _cmdline(pid)[3:5] == ["tce", "train"]]
    _freeze(cell)
    return study, cell


def test_a_stopped_study_on_ray_checkpoints_its_cells(tmp_path, capsys, cluster, reference):
    """SIGTERM to a study on Ray stops its tasks gracefully: each passes SIGTERM to its cell, which saves a
    checkpoint of its iteration, and the study exits 143 once they have ended. ``--resume`` gives the local study.
    The cell is frozen while the stop arrives, so that it cannot be in its last iteration."""
    address, _ = cluster
    out = tmp_path / "study"
    study, cell = _ray_study_with_frozen_cell(out, address)
    try:
        done = [int(p.stem.split("-")[1]) for p in (out / "tce/seed0").glob("checkpoint-*.pt")]
        assert max(done) < 5  # of 6 iterations: the one it is in is not the last
        study.send_signal(signal.SIGTERM)
        _await_pending(cell, signal.SIGTERM)
        assert _pending(cell, signal.SIGTERM)  # the stop request reached the entry point, which passed it on
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(cell, signal.SIGCONT)
    assert study.wait(timeout=120) == 143
    log = (out / "tce/seed0.log").read_text()
    assert "troll tce train: stopped by SIGTERM after step" in log and "# troll cell: stopped (SIGTERM)" in log
    status = {c["folder"]: c["status"] for c in json.loads((out / "study.json").read_text())["cells"]}
    assert status[(out / "tce/seed0").as_posix()] == "stopped (SIGTERM)"
    assert status[(out / "bbrl/seed0").as_posix()] in ("done", "stopped (SIGTERM)")
    assert not list(out.glob("*/*.lease")) and not list(out.glob("*/*.stop"))
    code, _, err = cli(capsys, "--out", str(out), "--resume", "--executor", "ray", "--ray-address", address)
    assert code == 0, err
    assert starts(out, "tce/seed0") == 2
    assert_same_study(out, reference)


def test_a_second_ctrl_c_on_ray_ends_the_cells_at_once(tmp_path, capsys, cluster, reference):
    """Ctrl-C twice to a study on Ray: the first stops its tasks gracefully (their cells get SIGTERM), the second
    ends the study, and Ray its tasks, without waiting for a checkpoint. The cell stays frozen throughout, so only a
    kill can end it; the study exits 130 at once, the cell is gone, and ``--resume`` gives the local study."""
    address, _ = cluster
    out = tmp_path / "study"
    study, cell = _ray_study_with_frozen_cell(out, address)
    try:
        study.send_signal(signal.SIGINT)
        _await_pending(cell, signal.SIGTERM)
        assert _pending(cell, signal.SIGTERM)  # the first Ctrl-C: a stop request, passed on as SIGTERM
        start = time.monotonic()
        study.send_signal(signal.SIGINT)
        assert study.wait(timeout=60) == 130
        deadline = time.monotonic() + 30
        while process_state(cell) not in ("", "Z") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process_state(cell) in ("", "Z"), "the frozen cell outlived a second Ctrl-C"
        assert time.monotonic() - start < 30
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(cell, signal.SIGCONT)
    assert "stopped by SIGTERM after step" not in (out / "tce/seed0.log").read_text()  # no checkpoint of its step
    code, _, err = cli(capsys, "--out", str(out), "--resume", "--executor", "ray", "--ray-address", address)
    assert code == 0, err
    assert_same_study(out, reference)


def test_a_cell_larger_than_every_node_is_refused(tmp_path, capsys, cluster, monkeypatch):
    """The module's cluster: a head without CPUs and two 1-CPU nodes, as the study's probe of it reads them. A cell of
    2 threads would wait for ever for a 2-CPU node: refused before anything is written, as is one larger than this
    machine when the study would start its own cluster here (none is started). The message names the flags that set
    a cell's cores as the frontend names them (``Frontend.cores_from``)."""
    from troll.study import on_ray

    address, _ = cluster
    assert sorted(on_ray.probe(address)) == [0.0, 1.0, 1.0]
    out = tmp_path / "study"
    with within(60):
        code, printed, err = cli(capsys, "--out", str(out), *TINY, "--threads", "2", "--executor", "ray",
                                 "--ray-address", address)  # fmt: skip
    assert code == 2, err
    assert "--executor ray: a cell asks for 2 cores (--threads + --workers)" in err, err
    assert (f") but the Ray cluster at {address} has no node that large: its largest node has 1; Ray would hold the "
            "cell until such a node joins. Lower --threads + --workers") in err  # fmt: skip
    assert " or give the cluster larger nodes. Nothing was written." in err
    assert printed == "" and not out.exists()
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    with within(60):
        code, printed, err = cli(capsys, "--out", str(out), *TINY, "--threads", "4", "--executor", "ray")
    assert code == 2, err
    assert "a cell asks for 4 cores (--threads + --workers)" in err
    assert ") but the cluster the study starts on this machine has no node that large: its largest node has 3;" in err
    assert printed == "" and not out.exists()


def test_ray_survives_a_lost_node_and_matches_local(tmp_path, capsys, cluster, reference):
    address, _ = cluster
    out = tmp_path / "study"
    killed = {}
    watcher = threading.Thread(target=lambda: killed.update(pid=_kill_node_of(out, "tce/seed0")))
    watcher.start()
    code, _, err = cli(capsys, "--out", str(out), *TINY, "--executor", "ray", "--ray-address", address)
    watcher.join()
    assert code == 0, err
    assert killed["pid"] > 0
    # the lost cell ran twice (its second attempt from the checkpoint the first one left), the other once
    assert starts(out, "tce/seed0") == 2 and starts(out, "bbrl/seed0") == 1
    resumed = [line for line in (out / "tce/seed0.log").read_text().splitlines() if line.startswith("$ ")][-1]
    assert resumed.endswith("--resume --threads 1 --workers 0")
    assert_same_study(out, reference)
