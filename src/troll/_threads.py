"""One torch thread for the many small operations of a projection (docs/numerics.md, "Threads").

The solver and the loss's bookkeeping run dozens of element-wise operations on (rows, support) tensors of a few
hundred thousand elements. With more than one intra-op thread each of them ends in a barrier, and when another
process holds a core the barrier waits for a thread that lost its core: measured on a 2-core machine, the dense
TROLL loss took 7-16x longer under such load with 2 threads. These operations are too small to gain from a second
thread on an idle machine, so they run on one; the large passes over the vocabulary keep the caller's threads.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def threads(count: int):
    """Run the block with ``count`` torch intra-op threads (a run's ``--threads``), restoring the caller's count
    afterwards (also on error)."""
    previous = torch.get_num_threads()
    if previous == count:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def one_thread():
    """Run the block with one torch intra-op thread, restoring the caller's count afterwards (also on error)."""
    return threads(1)
