"""What the benchmark scripts share: reading the peak memory of a process on CPU, and writing the results.

Peak memory: Linux keeps a resident-set high-water mark (VmHWM in /proc/self/status) that ``5 >
/proc/self/clear_refs`` resets to the current resident set. Resetting it after the inputs exist and reading
VmHWM - VmRSS after the measured work gives that work's own peak working set, inputs excluded. Each script runs
every measured configuration in a fresh process so that nothing else lives in the same high-water mark.
"""

from __future__ import annotations

import contextlib
import csv
import subprocess
import sys
from pathlib import Path


@contextlib.contextmanager
def competing_load(active: bool = True):
    """While the block runs, another process keeps one core busy (a Python busy loop), as a second job does on a
    shared machine or a CI runner; stopped afterwards. ``active=False`` runs the block alone."""
    if not active:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def status_kb(field: str) -> int:
    """A kB field of /proc/self/status, e.g. VmRSS or VmHWM."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def reset_peak() -> bool:
    """Reset VmHWM to the current resident set; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def quick_path(out: Path) -> Path:
    """Where a ``--quick`` run writes instead of ``out``: ``<name>-quick.csv`` beside it, so that a smoke run (``make
    bench``) never overwrites the full run's results."""
    return out.with_name(f"{out.stem}-quick{out.suffix}")


def write_results(rows: list[dict], out: Path, header: str) -> None:
    """Write ``rows`` as CSV to ``out`` and print ``header`` and a markdown table of them."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(header + "\n")
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(str(v) for v in row.values()) + " |")
    print(f"\nwrote {out}")
