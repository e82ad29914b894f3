"""``within(seconds)``: a deadline for a test that would otherwise wait on a cluster for ever."""

from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def within(seconds: float):
    """Raise TimeoutError in the main thread once ``seconds`` have passed: a check that fails to refuse must not leave a
    test waiting on a cluster for ever."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds:g} s")

    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
