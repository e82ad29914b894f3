"""The backend layer without bubblewrap: the capped pipe reader every local backend runs its command with (a
trusted command here), the limits' validation, and the bubblewrap command line (no run)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from troll.sandbox import BubblewrapSandbox, Limits
from troll.sandbox.backend import run_capped


def test_input_larger_than_a_pipe_and_both_outputs():
    code = "import sys; d = sys.stdin.buffer.read(); print(len(d)); sys.stderr.write('e' * 10)"
    result = run_capped([sys.executable, "-c", code], b"x" * (1 << 20), wall=10, cap=100)
    assert (result.stdout, result.stderr, result.returncode) == (b"1048576\n", b"e" * 10, 0)
    assert not result.timed_out and not result.truncated


def test_the_output_cap_is_exact():
    exact = run_capped([sys.executable, "-c", "print('x' * 99)"], b"", wall=10, cap=100)
    assert len(exact.stdout) == 100 and not exact.truncated
    over = run_capped([sys.executable, "-c", "print('x' * 100)"], b"", wall=10, cap=100)
    assert over.stdout == b"x" * 100 and over.truncated


def test_the_wall_clock_kills_the_whole_group():
    code = "import subprocess, time; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); time.sleep(30)"
    start = time.monotonic()
    result = run_capped([sys.executable, "-c", code], b"", wall=1.0, cap=100)
    assert result.timed_out and result.returncode == -9 and time.monotonic() - start < 3
    child = int(result.stdout)
    time.sleep(0.1)
    try:
        with open(f"/proc/{child}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z", "the program's child outlived the run"
    except FileNotFoundError:
        pass


def test_a_program_that_ignores_its_input():
    result = run_capped([sys.executable, "-c", "pass"], b"abc" * 100_000, wall=10, cap=100)
    assert result.returncode == 0 and not result.timed_out


def test_limits_are_checked():
    with pytest.raises(ValueError, match="Limits.memory"):
        Limits(memory=0)
    with pytest.raises(ValueError, match="Limits.cpu must be a whole number"):
        Limits(cpu=1.5)
    with pytest.raises(ValueError, match="Limits.wall"):
        Limits(wall=True)


def test_the_command_line_binds_no_checkout_or_home():
    sandbox = BubblewrapSandbox(check=False)
    argv = sandbox.argv("pass", Limits(), 2_000_123)
    binds = [argv[i + 2] for i, a in enumerate(argv) if a == "--ro-bind"]
    here = os.path.dirname(os.path.abspath(__file__))
    assert not any(here.startswith(b) or b == os.path.expanduser("~") for b in binds), binds
    assert "--die-with-parent" in argv and "--clearenv" in argv and argv[-4:-1] == ["-I", "-S", "-c"]
    if os.geteuid() == 0:
        assert "--reuid=2000123" in argv and "--no-new-privs" in argv
