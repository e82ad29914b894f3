"""``--executor ray``: one Ray task per cell, each asking for the cell's cores (:mod:`troll.study.executors`).

The task is :func:`troll.study.cell.run_cell`, imported by the worker (every node needs troll installed, the same
version as the study's). A task whose node dies is rerun by Ray on another node, :data:`RETRIES` times at most; the
rerun owns the cell once the dead attempt's lease is stale and continues from its newest checkpoint. A cell that
fails by itself returns its status and is not retried. SIGTERM, SIGUSR1 or Ctrl-C to the study stops its tasks
gracefully: their cells save a checkpoint of their iteration first (:func:`run`). A kill of the study ends its tasks
at once, as Ray ends a driver's tasks. Either way ``--resume`` then submits the unfinished cells again.

Before anything is written, :func:`probe` asks the cluster at ``--ray-address`` for its nodes, which both proves that
a Ray cluster answers there and tells whether one of its nodes has a cell's cores.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

from troll.runs import protocol
from troll.study import cell as cell_lib
from troll.study import runner

RETRIES = 3  # reruns of a task whose node was lost (Ray's default for tasks)
# how long a stopping study waits for its tasks: a running cell's grace, or a stale lease's wait, and 30 s more;
# tasks Ray has not started by then (a busy cluster) are left to end with the study
STOP_WAIT_S = max(cell_lib.STOP_GRACE_S, cell_lib.lease_lib.STALE_S) + 30.0
CONNECT_S = 5.0  # for a TCP connection to --ray-address and its first answer
PROBE_S = 60.0  # for a driver to connect and list the nodes (a few seconds on a cluster that answers)
# HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113, 3.4): a gRPC server, as Ray's GCS and
# its client server are, answers with a SETTINGS frame (type 0x4) first
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0])
HEAD_HINT = ("give the address `ray start --head` printed for the other nodes (ray start --address='HOST:PORT'; "
             "port 6379 by default), or auto on a node of the cluster")  # fmt: skip
NODES_LINE = "troll-ray-nodes "
_PROBE = f"""
import json, logging, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level=logging.ERROR, configure_logging=False)
cpus = [node["Resources"].get("CPU", 0.0) for node in ray.nodes() if node["Alive"]]
print("\\n{NODES_LINE}" + json.dumps(cpus), flush=True)
"""


class NotRay(Exception):
    """No Ray cluster answers at an address: what answers there instead, and what to give."""


def probe(address: str, *, timeout_s: float | None = None) -> list[float]:
    """The CPUs of each live node of the Ray cluster at ``address`` (``HOST:PORT``, ``ray://HOST:PORT`` or
    ``auto``); :class:`NotRay` when none answers. A driver in a subprocess connects (``ray.init``) and lists the nodes,
    ended after ``timeout_s`` (default :data:`PROBE_S`): at an address that is not a Ray cluster's, ``ray.init`` would
    keep retrying for minutes. Before it, a given HOST:PORT must answer a TCP connection with HTTP/2's first frame
    within :data:`CONNECT_S` (:func:`_check_grpc`), so that the usual mistakes (nothing there, the dashboard's HTTP
    port) fail at once."""
    timeout_s = PROBE_S if timeout_s is None else timeout_s
    if address != "auto":
        _check_grpc(address)
    proc = subprocess.Popen([sys.executable, "-c", _PROBE, address], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise NotRay(f"no Ray cluster answered there within {timeout_s:g} s; {HEAD_HINT}") from None
    for line in out.splitlines():
        if line.startswith(NODES_LINE):
            return [float(cpus) for cpus in json.loads(line.removeprefix(NODES_LINE))]
    said = [line.strip() for line in err.splitlines() if line.strip()]
    raise NotRay(f"Ray could not connect to a cluster there ({said[-1] if said else f'exit {proc.returncode}'}); "
                 f"{HEAD_HINT}")  # fmt: skip


def _check_grpc(address: str) -> None:
    """:class:`NotRay` unless HOST:PORT accepts a connection and answers HTTP/2's preface with a SETTINGS frame (not
    checked when Ray talks TLS, ``RAY_USE_TLS=1``: its first bytes are TLS's)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise NotRay("give HOST:PORT (e.g. 10.0.0.1:6379, the head's GCS port), ray://HOST:PORT or auto")
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_S)
    except OSError as err:
        raise NotRay(f"nothing answers there ({err.strerror or err}); start the cluster (ray start --head on its "
                     f"head node) or {HEAD_HINT}") from None  # fmt: skip
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return
        first = b""
        try:
            conn.sendall(H2_PREFACE)
            while len(first) < 9 and (chunk := conn.recv(9 - len(first))):
                first += chunk
        except OSError:  # a timeout, or a reset
            pass
    if len(first) == 9 and first[3] == 0x4:
        return
    if first.lstrip().startswith((b"HTTP/", b"<")):  # a status line, or an HTTP/0.9 reply's HTML
        what = "an HTTP server answers there, not a Ray cluster (Ray's dashboard, port 8265 by default, is one)"
    elif first:
        what = "something answers there that does not speak Ray's protocol (gRPC)"
    else:
        what = f"something accepts connections there but did not answer within {CONNECT_S:g} s as Ray (gRPC) does"
    raise NotRay(f"{what}; {HEAD_HINT}")


def _connect(address: str | None) -> None:
    import ray

    quiet = {"log_to_driver": False, "logging_level": logging.WARNING, "configure_logging": False}
    if address is None:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, **quiet)
    else:
        ray.init(address=address, **quiet)


def run(executor, frontend, cells, status: dict, *, report, on_finish=None) -> dict[str, str]:
    """Run the cells as Ray tasks. SIGTERM, SIGUSR1 or Ctrl-C stops them through the shared folder, not through Ray:
    the study writes each cell's stop request (:attr:`troll.study.grid.Cell.stop_request`), the task's entry point
    passes SIGTERM to its cell and waits for its checkpoint, and a task that had not started yet ends at once. Once
    every task has returned (or :data:`STOP_WAIT_S` has passed: a task Ray has not even started by then, on a busy
    cluster, ends with the study), :class:`troll.study.runner.StudyStopped` is raised. A second Ctrl-C ends the
    study, and with it, as Ray ends a driver's tasks, the tasks and their cells. (Ray's own cancel is not used: in
    Ray 2.60 a cancel that meets a task just ending can abort the driver on an internal check.)"""
    import ray

    cells = runner.runnable_cells(frontend, cells, status, report, probe_leases=True)
    if not cells:
        return status
    environ = dict(os.environ)
    try:
        _connect(executor.ray_address)  # before the study's stop handlers: ray.init sets a SIGTERM handler of its own
    except BaseException:
        _restore_environ(environ)
        raise
    refs: dict = {}
    with protocol.stop_requests(runner.STUDY_STOP_SIGNALS) as stop:
        try:
            task = ray.remote(cell_lib.run_cell)
            for cell in cells:
                job = cell_lib.job_for(frontend, cell)
                ref = task.options(num_cpus=job.cores, max_retries=RETRIES, retry_exceptions=False).remote(job)
                refs[ref] = job
                report(f"submitted {job.label} to Ray ({job.cores} core{'s' if job.cores > 1 else ''})")
            deadline = None
            while refs:
                if stop.signal is not None and deadline is None:
                    deadline = time.monotonic() + STOP_WAIT_S
                    report(f"{stop.signal}: stopping; {len(refs)} task(s) stop their cells, which save a checkpoint "
                           "(Ctrl-C again: at once, losing their iteration)")  # fmt: skip
                    for job in refs.values():
                        problem = cell_lib.request_stop(job.cell, stop.signal)
                        if problem is not None:
                            report(f"{job.label}: {problem}; it ends with the study")
                if deadline is not None and time.monotonic() > deadline:
                    for job in refs.values():  # most likely never started by Ray; it ends with the study
                        status[job.label] = f"stopped (its task had not ended {STOP_WAIT_S:g} s after the stop)"
                        report(cell_lib.progress_line(job.cell, status[job.label]))
                    break
                done, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
                for ref in done:
                    job = refs.pop(ref)
                    status[job.label] = _status(ray, ref)
                    if not status[job.label].startswith("failed (in use"):  # else the request may be another study's
                        job.cell.stop_request.unlink(missing_ok=True)
                    report(cell_lib.progress_line(job.cell, status[job.label], f"; see {job.cell.log}"))
                    if on_finish is not None:
                        on_finish(status)
        finally:
            ray.shutdown()  # tasks still running (an error, a second Ctrl-C) end with the driver
            _restore_environ(environ)
            for job in refs.values():
                job.cell.stop_request.unlink(missing_ok=True)
    if stop.signal is not None and any(s not in ("done", "kept") for s in status.values()):
        raise runner.StudyStopped(stop.signal, status)
    return status


def _restore_environ(before: dict[str, str]) -> None:
    """Give the process back the environment it had before it connected: ``ray.init()`` sets variables of its own
    (PYTHONBREAKPOINT; RAY_AUTH_MODE=token when it starts a cluster here, with which a later driver of this process,
    or a subprocess of it such as the next study's probe, would ask a cluster without tokens for one)."""
    for key in [k for k in os.environ if k not in before]:
        del os.environ[key]
    os.environ.update(before)


def _status(ray, ref) -> str:
    """A finished task's cell status: its result, or why Ray could not give it."""
    try:
        return ray.get(ref)["status"]
    except ray.exceptions.RayError as err:  # its node lost more often than RETRIES, or Ray failed
        return f"failed (ray: {type(err).__name__})"
