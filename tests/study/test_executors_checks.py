"""What a study on a cluster checks before it writes anything (:mod:`troll.study.executors`), and the command that
continues it; no cluster is needed (the Ray cluster tests, tests/study/test_executors.py, run alone).

- the sbatch script matches a golden file and is the one submitit submits (a fake sbatch records it);
- bad input exits 2, naming the flag and the fix, with nothing written: an --executor typo, options of another
  executor or that another one overrules (--jobs beside ray or slurm, a --slurm-sbatch option a --slurm-* flag or the
  study sets), a --ray-address where nothing, an HTTP server, a silent server or a gRPC server that is no Ray cluster
  answers (within seconds), a relative path where nodes need a shared one, SLURM without sbatch, a study folder that
  cannot be made;
- the command a stopped or interrupted study prints chooses its executor again, every option as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import processes_under
from deadline import within

from troll.cli import main
from troll.runs.files import UsageError
from troll.study import executors, on_slurm, runner

SRC = Path(__file__).parents[2] / "src"
GOLDEN = Path(__file__).parent / "data" / "sbatch.golden"
GRID = ["--env", "toy/viapoint", "--algos", "tce,bbrl", "--seeds", "1", "--workers", "0"]  # checked, never run


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["tce", "study", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


SLURM = ["--executor", "slurm", "--slurm-partition", "cpu", "--slurm-time", "90", "--slurm-cpus-per-task", "2",
         "--slurm-mem-gb", "4", "--slurm-array-parallelism", "8", "--slurm-sbatch", "account=proj",
         "--slurm-setup", "source /shared/venv/bin/activate", "--slurm-cells-per-task", "2"]  # fmt: skip


def _neutral(script: str, out: Path) -> str:
    return script.replace(str(out), "<out>").replace(sys.executable, "<python>")


def test_sbatch_script_is_the_golden_one_and_what_submitit_submits(tmp_path, capsys, monkeypatch):
    out = tmp_path / "study"
    code, printed, err = cli(capsys, "--out", str(out), *GRID, "--seeds", "2", *SLURM, "--slurm-script")
    assert code == 0, err
    assert not out.exists()  # printed, nothing written
    assert _neutral(printed, out) == GOLDEN.read_text()  # 4 cells, 2 per task: an array of 2
    # what submitit's SlurmExecutor writes and hands to sbatch (a fake one that records it) is that script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("sbatch", 'cp "$1" "$(dirname "$0")/submitted.sh"; echo "Submitted batch job 4242"'),
                       ("srun", "exit 0")):  # fmt: skip
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    executor = _slurm_from(SLURM)
    executor = executors.Executor("slurm", slurm=executor.slurm, out=out)
    jobs = on_slurm.submit(executor, [["cell a", "cell b"], ["cell c", "cell d"]], cores=1)
    assert [j.job_id for j in jobs] == ["4242_0", "4242_1"]
    assert (bin_dir / "submitted.sh").read_text() == printed.removesuffix("\n")


def _slurm_from(argv: list[str]) -> executors.Executor:
    parser = argparse.ArgumentParser()
    executors.add_flags(parser)
    return executors.from_args(parser.parse_args(argv))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "extra, env, message",
    [
        (["--executor", "rey"], {}, "--executor 'rey' is not one of local, ray, slurm. Did you mean --executor ray?"),
        (["--executor", "ray", "--ray-address", "127.0.0.1:1"], {}, "--ray-address 127.0.0.1:1: nothing answers"),
        (["--executor", "ray", "--ray-address", "head-node"], {}, "give HOST:PORT"),
        (["--ray-address", "127.0.0.1:6379"], {}, "--ray-address applies to --executor ray"),
        (["--slurm-partition", "cpu"], {}, "--slurm-partition applies to --executor slurm"),
        (["--executor", "slurm"], {"PATH": "/nonexistent"}, "--executor slurm: there is no sbatch on this machine"),
        (["--executor", "slurm", "--slurm-mem-gb", "0"], {}, "--slurm-mem-gb must be a number of GB > 0"),
        (["--executor", "slurm", "--slurm-time", "1"], {}, "--slurm-time must be at least 2 minutes, got 1: each"),
        (["--executor", "slurm", "--slurm-time", "1h"], {}, "--slurm-time must be a whole number of minutes, got '1h'"),
        (["--executor", "slurm", "--slurm-sbatch", "account"], {}, "--slurm-sbatch 'account': write KEY=VALUE"),
        (["--executor", "slurm", "--slurm-local"], {"PYTHONPATH": "src"}, "PYTHONPATH entry 'src', a relative path"),
        (
            ["--executor", "slurm", "--slurm-time", "30", "--slurm-sbatch", "time=10"],
            {},
            "--slurm-sbatch time=10: sbatch's --time is what --slurm-time sets, and the two would overrule each other; "
            "give --slurm-time instead.",
        ),
        (
            ["--executor", "slurm", "--slurm-partition", "cpu", "--slurm-sbatch", "p=gpu"],
            {},
            "--slurm-sbatch p=gpu: sbatch's --partition is what --slurm-partition sets",
        ),
        (["--executor", "slurm", "--slurm-sbatch", "cpus_per_task=4"], {}, "is what --slurm-cpus-per-task sets"),
        (["--executor", "slurm", "--slurm-sbatch", "signal=USR1@10"], {}, "the study sets sbatch's --signal itself"),
        (
            ["--executor", "slurm", "--slurm-mem-gb", "4", "--slurm-sbatch", "mem-per-cpu=1G"],
            {},
            "--slurm-sbatch mem-per-cpu=... and --slurm-mem-gb both set the memory",
        ),
        (
            ["--executor", "slurm", "--slurm-local", "--jobs", "3"],
            {},
            "--jobs 3 applies to --executor local (cells run at once on this machine); with --executor slurm, "
            "--slurm-array-parallelism sets how many array tasks run at once. Drop --jobs.",
        ),
        (
            ["--executor", "ray", "--ray-address", "127.0.0.1:1", "--jobs", "2"],
            {},
            "--jobs 2 applies to --executor local (cells run at once on this machine); with --executor ray, Ray starts",
        ),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, monkeypatch, extra, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(SRC.parent)  # where a relative PYTHONPATH entry "src" exists
    out = tmp_path / "study"
    code, printed, err = cli(capsys, "--out", str(out), *GRID, *extra)
    assert code == 2, err
    assert message in err, err
    assert printed == "" and not out.exists()


def test_which_sbatch_options_a_study_takes():
    """A --slurm-sbatch option is refused when sbatch would read it as one a flag or the study sets (its name, its
    letter, a prefix of three letters or more, _ for -), and taken otherwise, as it is."""
    refused = {"time": "--slurm-time", "t": "--slurm-time", "tim": "--slurm-time", "part": "--slurm-partition",
               "cpus-per-task": "--slurm-cpus-per-task", "c": "--slurm-cpus-per-task", "mem": "--slurm-mem-gb",
               "a": "itself", "array": "itself", "sig": "itself", "o": "itself", "error": "itself",
               "open_mode": "itself"}  # fmt: skip
    for key, says in refused.items():
        with pytest.raises(UsageError, match=f"^--slurm-sbatch {key}=1: .*{says}"):
            _slurm_from(["--executor", "slurm", "--slurm-sbatch", f"{key}=1"])
    taken = ["account=proj", "qos=short", "time-min=30", "cpu-freq=high", "constraint=avx2", "mem-per-cpu=2G",
             "#SBATCH --exclusive=user", "nodes=1"]  # fmt: skip
    executor = _slurm_from(["--executor", "slurm", *[a for key in taken for a in ("--slurm-sbatch", key)]])
    assert [f"{k}={v}" for k, v in executor.slurm.sbatch] == [k.removeprefix("#SBATCH ").lstrip("-") for k in taken]


class _Server(threading.Thread):
    """A TCP server on a free port of this host that answers every connection with ``reply`` and then keeps it
    open, silent, until the server is closed."""

    def __init__(self, reply: bytes):
        super().__init__(daemon=True)
        self.reply, self.sock = reply, socket.create_server(("127.0.0.1", 0))
        self.port, self.conns = self.sock.getsockname()[1], []
        self.start()

    def run(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
                conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def test_an_address_where_no_ray_cluster_answers_is_refused_quickly(tmp_path, capsys, monkeypatch):
    """Something answers at --ray-address, not a Ray cluster: an HTTP server (``python3 -m http.server``'s), a server
    that accepts and then says nothing, one that speaks HTTP/2 as gRPC does but is no Ray cluster (the driver the
    study starts to list the nodes is ended after ``on_ray.PROBE_S``, with all it started), or Ray's connection
    fails: exit 2 within seconds (not the minutes ``ray.init`` would retry), naming the address and the fix, and
    nothing written."""
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from troll.study import on_ray

    web = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    settings = bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0])  # an empty HTTP/2 SETTINGS frame, a gRPC server's first words
    cases = [
        (web, 10, "an HTTP server answers there, not a Ray cluster (Ray's dashboard, port 8265 by default, is one)"),
        (b"", 10, "something accepts connections there but did not answer within 1 s as Ray (gRPC) does"),
        (settings, 15, "no Ray cluster answered there within 3 s; give the address `ray start --head` printed"),
    ]
    out = tmp_path / "study"
    for k, (reply, most_s, message) in enumerate(cases):
        if k == 1:  # the HTTP server is told at once; the others are waited for, shorter here
            monkeypatch.setattr(on_ray, "PROBE_S", 3.0)
            monkeypatch.setattr(on_ray, "CONNECT_S", 1.0)
        server = reply if reply is web else _Server(reply)
        address = f"127.0.0.1:{server.server_address[1] if reply is web else server.port}"
        start = time.monotonic()
        try:
            with within(60):
                code, printed, err = cli(
                    capsys, "--out", str(out), *GRID, "--executor", "ray", "--ray-address", address
                )
        finally:
            if reply is web:
                web.shutdown()
                web.server_close()
            else:
                server.close()
        assert time.monotonic() - start < most_s
        assert code == 2 and f"--ray-address {address}: {message}" in err and "Nothing was written." in err, err
        assert printed == "" and not out.exists()
    assert not processes_under(on_ray.NODES_LINE)  # the probe that was ended left nothing behind
    # Ray's own refusal reaches the user as its last line, not as a traceback
    monkeypatch.setattr(on_ray, "_PROBE", "raise ConnectionError('Could not find any running Ray instance.')")
    with pytest.raises(on_ray.NotRay, match=r"^Ray could not connect to a cluster there \(ConnectionError: Could not "
                       r"find any running Ray instance.\); give the address"):  # fmt: skip
        on_ray.probe("auto")


@pytest.mark.parametrize("command", ["tce study", "study"])
def test_a_study_folder_that_cannot_be_made_is_refused(capsys, command):
    """/proc takes no new folder, not even root's: both study commands exit 2 at once, naming --out and the fix."""
    grid = [*GRID, "--seeds", "1"] if command == "tce study" else ["--losses", "grpo", "--seeds", "1"]
    code = main([*command.split(), "--out", "/proc/troll-study", *grid])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--out /proc/troll-study: a folder cannot be made in /proc (" in err  # ENOENT for root, else EACCES
    assert "); give --out a folder on a file system you can write." in err
    assert not Path("/proc/troll-study").exists()


def test_jobs_beside_a_cluster_executor_is_refused_by_the_language_model_study_too(tmp_path, capsys):
    out = tmp_path / "study"
    code = main(["study", "--losses", "grpo", "--seeds", "1", "--out", str(out), "--jobs", "2", "--executor",
                 "slurm", "--slurm-script"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--jobs 2 applies to --executor local" in err, err
    assert not out.exists()


CONTINUED = [
    [],
    ["--jobs", "3"],
    ["--executor", "ray"],
    ["--executor", "ray", "--ray-address", "10.0.0.1:6379"],
    [*SLURM, "--slurm-sbatch", "qos=short", "--slurm-setup", "export A='b c'", "--slurm-mem-gb", "1.5"],
    ["--executor", "slurm", "--slurm-local", "--slurm-time", "30"],
]


@pytest.mark.parametrize("given", CONTINUED, ids=lambda argv: " ".join(argv[:4]) or "local")
def test_the_command_that_continues_a_study_runs_it_where_it_ran(tmp_path, capsys, given):
    """Interrupted, stopped, or ended with stopped cells, a study prints the command that continues it: pasted, it
    chooses the same executor with the same options (and a local study's --jobs), not this machine by default."""
    import shlex

    from troll.study.command import cmd_study

    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", default=1, type=int)
    executors.add_flags(parser)
    args = parser.parse_args(given)  # the last --slurm-mem-gb counts
    executor = executors.from_args(args)
    out = tmp_path / "a study"

    def stopped(report):
        raise runner.StudyStopped("SIGTERM", {"a/seed0": "stopped (SIGTERM)"})

    def interrupted(report):
        raise KeyboardInterrupt

    said = []
    for run in (stopped, interrupted):
        cmd_study("tce study", out, 1, args.jobs, run, executor=executor)
        said.append(capsys.readouterr().err.rsplit("continue with: ", 1)[1].strip())
    assert cmd_study("tce study", out, 1, args.jobs, lambda report: {"a/seed0": "stopped (SIGTERM)"},
                     executor=executor) == 1  # fmt: skip
    said.append(capsys.readouterr().err.rsplit("continue with: ", 1)[1].strip())
    assert said[0] == said[1] == said[2]
    words = shlex.split(said[0])
    assert words[:6] == ["troll", "tce", "study", "--out", str(out), "--resume"]
    again = parser.parse_args(words[6:])
    assert executors.from_args(again) == executor and again.jobs == args.jobs
    assert executors.flags(executor) == words[6 + 2 * (args.jobs != 1) :]


def test_a_relative_path_a_cell_reads_is_refused_and_the_study_folder_resolved(tmp_path, capsys, monkeypatch):
    """The language-model study through the same executors: a model folder given relatively is refused (a node
    starts elsewhere); a relative --out is made absolute in the cells' command lines."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text("{}")  # a saved model, as far as the checks look
    code = main(["study", "--model", "my-model", "--losses", "grpo", "--seeds", "1", "--out", "rel", "--executor",
                 "slurm", "--slurm-script"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "the cells would read --model my-model, a relative path" in err, err
    code, printed, err = cli(capsys, "--out", "rel", *GRID, "--executor", "slurm", "--slurm-script")
    assert code == 0, err
    assert f"{tmp_path}/rel/slurm" in printed and not (tmp_path / "rel").exists()
