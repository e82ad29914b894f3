"""The machine-wide uid blocks of the sandbox (run as root, as the sandbox's uid drop is)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from troll.sandbox import SandboxUnavailable
from troll.sandbox.uids import BLOCK, UidPool, lock_dir


def test_blocks_are_exclusive_and_released(tmp_path):
    locks = tmp_path / "locks"
    a, b = UidPool(3_500_042, directory=str(locks)), UidPool(3_500_032, directory=str(locks))
    first, second = a.take(), b.take()
    assert a.uids == [range(3_500_032, 3_500_032 + BLOCK)]  # the start rounded down to a block
    assert b.uids == [range(3_500_032 + BLOCK, 3_500_032 + 2 * BLOCK)]
    assert first in a.uids[0] and second in b.uids[0]
    a.give_back(first)
    assert a.take() == first  # a uid given back is the next one taken
    taken = {a.take() for _ in range(BLOCK)}  # past one block: a second is claimed
    assert len(a.uids) == 2 and len(taken) == BLOCK and not taken & set(b.uids[0])
    a.close()
    assert UidPool(3_500_032, directory=str(locks)).take() in range(3_500_032, 3_500_032 + BLOCK)


def test_another_process_holds_its_block(tmp_path):
    locks = str(tmp_path / "locks")
    held = UidPool(3_600_000, directory=locks)
    held.take()
    code = (
        f"from troll.sandbox.uids import UidPool; p = UidPool(3_600_000, directory={locks!r}); p.take(); "
        "print(p.uids[0].start)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == 3_600_000 + BLOCK


def test_the_lock_directory_must_be_root_s_alone(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    with pytest.raises(SandboxUnavailable, match="owned by root and writable only by it"):
        lock_dir(str(loose))
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o755)
    os.chown(foreign, 65534, 65534)
    with pytest.raises(SandboxUnavailable, match="rm -rf"):
        lock_dir(str(foreign))
    with pytest.raises(ValueError, match="uid_base"):
        UidPool(5, directory=str(tmp_path / "locks"))
