"""Shared fixtures and generators for the troll test suite, and the guard that keeps CI from passing by skipping.

Every generator takes an explicit ``torch.Generator`` so each test is reproducible on its own; the float64
reference (``troll.categorical.reference``) is what the fast paths are compared against.

``--require MOD1,MOD2`` (what ``make test`` passes for each environment): every listed module must import before
any test runs, and every skipped test fails the run unless its reason matches one of :data:`ALLOWED_SKIPS`. A broken
install therefore stops the run with the import error instead of showing as a few more skips. Without
``--require`` (a developer's partial run) skips are reported as usual.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
# MuJoCo picks its OpenGL backend when it is first imported (--require imports it): the offscreen one the render
# tests use (troll.tce.render), unless the caller chose one or libEGL is missing (mujoco's import would fail)
if ctypes.util.find_library("EGL"):
    os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402
import torch  # noqa: E402

# The checkout, its sources (on a subprocess's PYTHONPATH), and tests/support: the helper modules and torchrun scripts
# the test folders share (on sys.path through pyproject's [tool.pytest.ini_options] pythonpath).
ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
SUPPORT = ROOT / "tests" / "support"

# The skips CI accepts, as regular expressions on the skip reason: the one place that lists them. Empty: in the
# environments make test builds, every collected test must run.
ALLOWED_SKIPS: tuple[str, ...] = ()
_session_skips: list[tuple[str, str]] = []  # (node id, reason) of every skip in this session


def pytest_addoption(parser):
    parser.addoption(
        "--require",
        default="",
        help="comma-separated modules that must import; then any skip not in conftest.ALLOWED_SKIPS fails the run",
    )


def pytest_configure(config):
    required = [m.strip() for m in config.getoption("--require").split(",") if m.strip()]
    config._troll_strict = bool(required)
    config._troll_skips = []
    for name in required:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 -- any import failure is a broken install
            raise pytest.UsageError(
                f"--require: {name} failed to import ({type(err).__name__}: {err}); the suites that need it would "
                "be skipped. Rebuild the environment (make clean && make test)."
            ) from err


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _session_skips.append((report.nodeid, reason))


def pytest_sessionfinish(session, exitstatus):
    if not getattr(session.config, "_troll_strict", False):
        return
    unexpected = [(n, r) for n, r in _session_skips if not any(re.search(p, r) for p in ALLOWED_SKIPS)]
    if unexpected:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"  {node}: {reason}" for node, reason in unexpected]
        message = "\n".join(
            [f"{len(unexpected)} test(s) skipped under --require (only conftest.ALLOWED_SKIPS may skip):", *lines]
        )
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture(autouse=True)
def _seed_global_rng():
    """Tests draw from explicit generators; the global RNG is seeded too, for anything that uses it implicitly."""
    torch.manual_seed(0)


def peaked_logits(
    *lead: int,
    vocab: int,
    g: torch.Generator,
    head_max: int = 8,
    tail_log10: tuple[float, float] = (-9.0, -6.0),
    head_scale: float = 1.5,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Logits (*lead, V) shaped like an LLM's next-token distribution after a temperature of ~1.

    Each row has a head of ``n = 1 + floor(head_max u^2)`` tokens (u ~ U(0, 1), at random ids, logits
    ~ N(0, head_scale^2)) that holds all but ``10^U(tail_log10)`` of the mass; the other V - n tokens share that
    tail with N(0, 1) logits. So a row needs at most ``head_max`` tokens to reach 1 - 1e-5 of its mass; with the
    default head_max = 8, 79% of the rows need 1-5.
    """
    rows = 1
    for d in lead:
        rows *= d
    head_max = min(head_max, vocab - 1)
    u = torch.rand(rows, 1, generator=g, dtype=torch.float64)
    n_head = 1 + (u.square() * head_max).long().clamp_max(head_max - 1)  # skewed towards a short head
    rank = torch.rand(rows, vocab, generator=g, dtype=torch.float64).argsort(-1).argsort(-1)  # random permutation
    is_head = rank < n_head
    head = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * head_scale
    tail = torch.randn(rows, vocab, generator=g, dtype=torch.float64)
    lo, hi = tail_log10
    log_tail_mass = (lo + (hi - lo) * torch.rand(rows, 1, generator=g, dtype=torch.float64)) * torch.log(
        torch.tensor(10.0, dtype=torch.float64)
    )
    lse_head = torch.where(is_head, head, float("-inf")).logsumexp(-1, keepdim=True)
    lse_tail = torch.where(is_head, float("-inf"), tail).logsumexp(-1, keepdim=True)
    # tail mass / head mass = exp(log_tail_mass), i.e. a share of 10^U(lo, hi) of the total up to O(1e-6)
    tail = tail - lse_tail + lse_head + log_tail_mass
    return torch.where(is_head, head, tail).reshape(*lead, vocab).to(dtype)


def drift(logits: torch.Tensor, g: torch.Generator, scale: float = 0.5) -> torch.Tensor:
    """A policy after a few optimiser steps: the logits plus N(0, sigma^2) noise, sigma = scale * 10^U(-1, 0.5) per
    row, so that a batch mixes rows inside and outside the trust region."""
    noise = torch.randn(logits.shape, generator=g, dtype=torch.float64)
    sigma = scale * 10 ** (1.5 * torch.rand(*logits.shape[:-1], 1, generator=g, dtype=torch.float64) - 1)
    return logits + (sigma * noise).to(logits.dtype)


def mass_needed(logits: torch.Tensor, delta: float = 1e-5) -> torch.Tensor:
    """(...) the number of most probable tokens a row needs to reach 1 - delta of its mass."""
    p = torch.softmax(logits.double(), -1).sort(-1, descending=True).values
    before = p.cumsum(-1) - p
    return (before < 1 - delta).sum(-1)


def torchrun(procs: int, log_dir: Path) -> list[str]:
    """torchrun's command line for ``procs`` local processes, its logs in ``log_dir`` (without one it makes a
    torchelastic_* folder in the system's temporary directory on every run and leaves it there)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs),
            "--log-dir", str(log_dir)]  # fmt: skip


def run_script(cmd: list[str], env: dict, timeout: float = 300) -> tuple[int, str]:
    """Run ``cmd`` in its own session; on timeout kill the whole group (torchrun's workers included)."""
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    return proc.returncode, err


# What torchrun prints when the process group itself cannot start here (its store or rendezvous, a port in use, no
# network device for gloo); any other failure before a helper writes its "ready" file is a failure of the code
# under test. (Not "gloo" alone: a rank that outlives a crashed peer prints gloo's "Connection closed by peer".)
LAUNCH_FAILURES = (
    "DistNetworkError",
    "DistStoreError",
    "RendezvousConnectionError",
    "Address already in use",
    "gloo/transport/tcp/device",
)


def check_torchrun(code: int, err: str, ready: Path) -> None:
    """Skip if torchrun could not start its process group (``ready`` never written); fail on any other error."""
    if not ready.exists():
        if any(marker in err for marker in LAUNCH_FAILURES):
            pytest.skip(f"torchrun with gloo could not start here: {err[-500:]}")
        pytest.fail(f"the torchrun helper stopped before its process group was ready:\n{err[-3000:]}")
    assert code == 0, err[-3000:]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A tiny random model and its tokenizer saved as a transformers folder, for the CLI tests."""
    from tiny import tiny_model, tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """``troll`` with ``argv``: its exit code and what it printed to stderr."""
    from troll.cli import main

    code = main(list(argv))
    return code, capsys.readouterr().err


# ---------------------------------------------------------------- run folders, and the ones another process holds


def make_run(out: Path, command: str, **manifest) -> Path:
    """A folder as ``command`` leaves it: its manifest, its config.json and a few of its files."""
    from troll import runs

    runs.begin(out, command, **manifest)
    runs.write_json(out / "config.json", {"command": command, "config": {}, "options": {}, "spec": {}, "runs": []})
    for name in {
        "train": ("metrics.jsonl", "checkpoint-2/trainer_state.json", "model/model.safetensors"),
        "tce train": ("metrics.jsonl", "checkpoint-4.pt", ".checkpoint-6.pt.tmp-999999"),
    }.get(command, ()):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("ours")  # fmt: skip
    return out


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes, by its path relative to ``folder``."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


HOLDER = """
import sys, time
from troll import runs
runs.begin(sys.argv[1], sys.argv[2])
print("held", flush=True)
time.sleep(300)
"""


@contextlib.contextmanager
def held_elsewhere(out: Path, command: str):
    """``out`` held by another live process (a run still writing there), killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), command], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def busy_elsewhere(out: Path) -> bool:
    """What another process sees: is ``out`` held by someone else?"""
    probe = "import sys; from troll import runs; print(runs.busy(sys.argv[1]))"
    return subprocess.run([sys.executable, "-c", probe, str(out)], capture_output=True, text=True).stdout == "True\n"


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_state(pid: int) -> str:
    """The state letter of process ``pid`` (R, S, D; T: stopped; Z: ended, not yet reaped), "" once it is gone."""
    try:
        return _proc_stat(pid)[0]
    except (OSError, IndexError):  # no such file, or ESRCH: reaped between open and read
        return ""


def parent_pid(pid: int) -> int:
    """The parent of the live process ``pid``."""
    return int(_proc_stat(pid)[1])


def processes_under(marker: str) -> list[int]:
    """Pids of the processes whose command line mentions ``marker`` (a cluster's or a study's folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
    return found
