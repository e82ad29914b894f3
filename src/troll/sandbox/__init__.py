"""Running untrusted Python safely and scoring it by tests: the sandbox (bubblewrap, or any :class:`Sandbox`
backend) and the scoring of completions against a task's tests. Stdlib only; the integrations stand on it.

docs/sandbox.md describes what the sandbox contains, its limits and its threat model.
"""

from troll.sandbox.backend import Limits, RunResult, Sandbox, SandboxError, SandboxUnavailable, Watch
from troll.sandbox.bubblewrap import BubblewrapSandbox
from troll.sandbox.scoring import (
    Score,
    TestCase,
    TestSuite,
    extract_program,
    run_tests,
    score_completions,
)

__all__ = [
    "BubblewrapSandbox",
    "Limits",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "Score",
    "TestCase",
    "TestSuite",
    "Watch",
    "extract_program",
    "run_tests",
    "score_completions",
]
