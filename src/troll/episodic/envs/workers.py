"""E episodes of a simulator split over worker processes, one round-trip per reset and per run.

A simulator is wrapped as an ``EpisodeRunner`` (numpy only, one environment instance, one episode at a time: the
whole episode, controller included, runs inside the worker from its desired trajectory). ``PooledEnv`` turns a
runner factory into an ``EpisodicEnv``: it gives each of ``workers`` processes a contiguous share of the E episodes
(or runs them in-process with ``workers=0``), so a 2-core machine steps two simulators at once. Each episode gets
its own seed from (reset seed, episode index), so results do not depend on how episodes are split: parallel and
serial runs are identical.

Failure handling: an exception in a worker (while building, resetting or running) comes back with its traceback
and is raised in the caller as EnvWorkerError (NonFiniteError for non-finite values, with the worker's traceback
appended); a worker that dies without a word (a segfault, os._exit) is noticed through its process sentinel. Either
way the pool is shut down, so nothing hangs and no process is left behind. (A simulator that loops forever does
hang the call: there is no time-out.)

Processes start with "forkserver" by default, the server preloading this module and the simulator packages: each
worker is then forked from a process that has torch and the simulator imported once, instead of importing them
again (~3 s each with "spawn"), and not from the caller's process with whatever threads it runs ("fork"). As with
any non-fork start method, a script that builds a pooled env at top level needs the ``if __name__ == "__main__":``
guard. Workers (and a forkserver started here) get 1-thread settings for OpenMP, MKL and OpenBLAS and one torch
thread, and ignore SIGINT: the caller handles Ctrl-C and stops them.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from troll.episodic.envs.base import Episodes, EpisodeStart, EpisodicEnv, NonFiniteError, episode_seeds
from troll.runs.protocol import STOP_SIGNALS

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class EnvWorkerError(RuntimeError):
    """A worker process failed or died; the message carries its exception and traceback."""


@dataclass(frozen=True)
class RunnerSpec:
    """The dimensions of a runner's episodes (see EpisodicEnv for the meaning of each)."""

    name: str
    dof: int
    horizon: int
    dt: float
    context_dim: int
    state_dim: int
    has_success: bool


@dataclass
class EpisodeResult:
    """One finished episode: states (T+1, S), rewards (T,), dones (T,) bool, success (None if the task has no
    rule) and final metrics (floats)."""

    states: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    success: bool | None
    final: dict[str, float] = field(default_factory=dict)


class EpisodeRunner(Protocol):
    """One simulator instance in a worker. ``reset`` and ``run`` of the same (episode, seed) start from the same
    state: ``run`` resets again rather than keeping E live instances."""

    spec: RunnerSpec

    def reset(self, episode: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Context (C,), tracked position (D,) and velocity (D,) at the start of the episode."""

    def run(self, episode: int, seed: int, pos: np.ndarray, vel: np.ndarray) -> EpisodeResult:
        """Reset to the episode's start and track pos, vel (T+1, D) for T steps."""

    def close(self) -> None: ...


def _serve(conn: Connection, factory: Callable[[], EpisodeRunner]) -> None:
    """Worker main loop: build the runner, then answer ("reset" | "run" | "close", ...) messages until closed."""
    # Ctrl-C and the stop signals (troll.runs.protocol.STOP_SIGNALS) are the caller's to handle: it stops us, after a
    # checkpoint for the latter (a cluster may signal every process of a job)
    for name in ("SIGINT", *STOP_SIGNALS):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    torch.set_num_threads(1)  # in case this process (or its forkserver) was started before one_thread_children
    runner = None
    try:
        runner = factory()
        conn.send(("ok", runner.spec))
        while True:
            cmd, *args = conn.recv()
            if cmd == "close":
                break
            if cmd == "reset":
                episodes, seeds = args
                conn.send(("ok", [runner.reset(e, s) for e, s in zip(episodes, seeds)]))
            elif cmd == "run":
                episodes, seeds, pos, vel = args
                conn.send(("ok", [runner.run(e, s, p, v) for e, s, p, v in zip(episodes, seeds, pos, vel)]))
            else:
                raise ValueError(f"unknown worker command {cmd!r}")
    except BaseException as exc:  # everything goes back to the caller, who raises it
        try:
            conn.send(("error", type(exc).__name__, str(exc), traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if runner is not None:
            runner.close()
        conn.close()


@contextlib.contextmanager
def one_thread_children():
    """Processes started inside (the forkserver too, if this starts it) inherit 1-thread settings for OpenMP, MKL
    and OpenBLAS, read when those libraries load; the caller's environment is restored afterwards."""
    saved = {var: os.environ.get(var) for var in _THREAD_VARS}
    os.environ.update(dict.fromkeys(_THREAD_VARS, "1"))
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


class WorkerPool:
    """``workers`` processes, each holding one runner built by ``factory`` (a picklable callable)."""

    def __init__(
        self,
        factory: Callable[[], EpisodeRunner],
        *,
        workers: int,
        name: str,
        start_method: str | None,
        preload: tuple[str, ...] = (),
    ):
        method = start_method or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        ctx = mp.get_context(method)
        if method == "forkserver":
            # applies only if this process's server is not running yet; modules that fail to import are skipped
            ctx.set_forkserver_preload([__name__, *preload])
        self.name = name
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for i in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, factory), name=f"troll-env-{i}", daemon=True)
            with one_thread_children():
                proc.start()
            child.close()  # so that the worker's death reads as EOF here
            self.conns.append(parent)
            self.procs.append(proc)
        self.specs: list[RunnerSpec] = self.gather("build")

    def call(self, cmd: str, per_worker: list[tuple]) -> list:
        """Send (cmd, *args) to each worker (args from ``per_worker``), then gather every answer in order."""
        for i, (conn, args) in enumerate(zip(self.conns, per_worker)):
            try:
                conn.send((cmd, *args))
            except (BrokenPipeError, OSError):
                self._fail(i, cmd, None)
        return self.gather(cmd)

    def gather(self, cmd: str) -> list:
        """One answer per worker; a worker's error or death closes the pool and raises."""
        answers: dict[int, Any] = {}
        while len(answers) < len(self.conns):
            pending = {i: c for i, c in enumerate(self.conns) if i not in answers}
            ready = wait(list(pending.values()) + [self.procs[i].sentinel for i in pending])
            for i, conn in pending.items():
                if conn not in ready and self.procs[i].sentinel not in ready:
                    continue
                try:
                    msg = conn.recv() if conn.poll() else None
                except (EOFError, OSError):
                    msg = None
                if msg is None or msg[0] != "ok":
                    self._fail(i, cmd, msg)
                answers[i] = msg[1]
        return [answers[i] for i in range(len(self.conns))]

    def _fail(self, i: int, cmd: str, msg: tuple | None) -> None:
        """Shut every worker down and raise what worker i reported (or that it died)."""
        proc = self.procs[i]
        self.close(timeout=1.0)
        if msg is None:
            hint = (
                "; if it never started: a script that builds the env at top level needs an "
                "`if __name__ == '__main__':` guard with this start method (see its stderr)"
                if cmd == "build"
                else ""
            )
            raise EnvWorkerError(
                f"{self.name}: worker {i} (pid {proc.pid}) died during {cmd} with exit code {proc.exitcode} and "
                f"left no traceback (a crash in native code, or it was killed){hint}"
            )
        _, type_name, text, tb = msg
        if type_name == NonFiniteError.__name__:
            raise NonFiniteError(f"{text}\n\nworker {i} (pid {proc.pid}) traceback:\n{tb}")
        raise EnvWorkerError(
            f"{self.name}: worker {i} (pid {proc.pid}) failed during {cmd}: {type_name}: {text}\n\n"
            f"worker traceback:\n{tb}"
        )

    def close(self, timeout: float = 5.0) -> None:
        """Ask each worker to stop, then terminate any that does not within ``timeout`` seconds; idempotent."""
        for conn in self.conns:
            try:
                conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []


def _chunks(n: int, parts: int) -> list[range]:
    """Contiguous, near-equal shares of range(n)."""
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


class PooledEnv(EpisodicEnv):
    """An EpisodicEnv over ``workers`` processes (0: in this process) each running one ``factory()`` runner.

    ``name`` labels errors raised while the workers are built; afterwards the runner's spec names the env.
    ``preload``: modules the forkserver imports once for all workers (the simulator packages).
    """

    def __init__(
        self,
        factory: Callable[[], EpisodeRunner],
        *,
        name: str,
        num_episodes: int,
        workers: int = 2,
        start_method: str | None = None,
        preload: tuple[str, ...] = (),
    ):
        if num_episodes < 1:
            raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
        if workers < 0:
            raise ValueError(f"workers must be >= 0 (0 runs the episodes in this process), got {workers}")
        self.num_episodes = num_episodes
        self._runner: EpisodeRunner | None = None
        self._pool: WorkerPool | None = None
        self._seeds: list[int] | None = None
        self._closed = False
        if workers == 0:
            self._runner = factory()
            spec = self._runner.spec
        else:
            n = min(workers, num_episodes)
            self._pool = WorkerPool(factory, workers=n, name=name, start_method=start_method, preload=preload)
            spec = self._pool.specs[0]
        self.spec = spec
        self.name, self.dof, self.horizon, self.dt = spec.name, spec.dof, spec.horizon, spec.dt
        self.context_dim, self.state_dim = spec.context_dim, spec.state_dim
        self._shares = _chunks(num_episodes, 1 if self._pool is None else len(self._pool.conns))

    @property
    def workers(self) -> int:
        """Worker processes in use (0: episodes run in this process)."""
        return 0 if self._pool is None else len(self._pool.conns)

    @property
    def runner(self) -> EpisodeRunner:
        """The runner of an env built with ``workers=0`` (e.g. to watch its simulator step: troll tce render)."""
        if self._runner is None:
            raise RuntimeError(f"{self.name}: its episodes run in {self.workers} worker processes; build it with "
                               "workers=0 to reach its runner.")  # fmt: skip
        return self._runner

    @property
    def seeds(self) -> list[int]:
        """The episode seeds of the last reset (episode i's runner.run takes seeds[i])."""
        if self._seeds is None:
            raise RuntimeError(f"{self.name}: call reset(seed) first")
        return list(self._seeds)

    def _map(self, cmd: str, args: list[list]) -> list:
        """Apply the runner's ``cmd`` to every episode (args: one list per argument, E items each), in order."""
        if self._closed:
            raise RuntimeError(f"{self.name}: the environment is closed (after close() or a worker failure)")
        if self._pool is None:
            method = getattr(self._runner, cmd)
            return [method(*a) for a in zip(range(self.num_episodes), *args)]
        per_worker = [(list(share), *[a[share.start : share.stop] for a in args]) for share in self._shares]
        try:
            answers = self._pool.call(cmd, per_worker)
        except BaseException:  # a worker failed (the pool is down already) or e.g. Ctrl-C: stop them all now
            self._closed = True
            self._pool.close(timeout=0.5)
            raise
        return [item for answer in answers for item in answer]

    def reset(self, seed: int) -> EpisodeStart:
        """Start E episodes; episode i draws its task variation from (seed, i)."""
        seeds = episode_seeds(seed, self.num_episodes)
        starts = self._map("reset", [seeds])
        self._seeds = seeds
        context, pos, vel = (torch.from_numpy(np.stack(x)).float() for x in zip(*starts))
        return EpisodeStart(context=context, pos=pos, vel=vel)

    def run(self, pos: Tensor, vel: Tensor) -> Episodes:
        """Track pos, vel (E, T+1, D) in the episodes of the last reset; one round-trip to each worker."""
        if self._seeds is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before run()")
        self.check_trajectory(pos, vel)
        pos_np = pos.detach().cpu().double().numpy()
        vel_np = vel.detach().cpu().double().numpy()
        results: list[EpisodeResult] = self._map("run", [self._seeds, list(pos_np), list(vel_np)])
        final = {k: torch.tensor([r.final[k] for r in results], dtype=torch.float32) for k in results[0].final}
        success = torch.tensor([bool(r.success) for r in results]) if self.spec.has_success else None
        return Episodes(
            states=torch.from_numpy(np.stack([r.states for r in results])).float(),
            rewards=torch.from_numpy(np.stack([r.rewards for r in results])).float(),
            dones=torch.from_numpy(np.stack([r.dones for r in results])).bool(),
            success=success,
            final=final,
        )

    def close(self) -> None:
        """Stop the workers (or close the in-process simulator); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.close()
        if self._runner is not None:
            self._runner.close()

    def __del__(self):
        # a forgotten close() must not leave worker processes behind (daemon workers also die with this process)
        if getattr(self, "_closed", True) is False:
            self.close()
