"""Fixtures of the study tests."""

from __future__ import annotations

import contextlib
import signal

import pytest


@contextlib.contextmanager
def _within(seconds: float):
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds:g} s")

    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


@pytest.fixture
def within():
    """``with within(seconds):`` raises TimeoutError in the main thread once ``seconds`` have passed: a check that
    fails to refuse must not leave a test waiting on a cluster for ever."""
    return _within
