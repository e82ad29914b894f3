"""The run layer every command shares (torch-free): run folders, their files, and the checks of user numbers.

- :mod:`troll.runs.files`: atomic JSON, append-only JSONL, :class:`UsageError` (bad input: exit status 2);
- :mod:`troll.runs.folder`: what a command wrote into its folder (a manifest), the one rule set of a new,
  resumed, replaced or refused folder, and one writer at a time;
- :mod:`troll.runs.checkpoints`: the numbered checkpoint names;
- :mod:`troll.runs.numbers`: "a finite real number, not a bool", in a range, named as the user wrote it.

Below ``troll.study``, ``troll.lm`` and ``troll.episodic``; it imports nothing of troll's above it.
"""

from troll.runs.checkpoints import numbered_files
from troll.runs.files import (
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    UsageError,
    append_jsonl,
    check_out_path,
    read_jsonl,
    truncate_jsonl,
    write_json,
)
from troll.runs.folder import (
    LAYOUTS,
    MANIFEST,
    Busy,
    begin,
    busy,
    check_folder,
    check_free,
    clear,
    exclusive,
    foreign,
    hold,
    holding,
    release,
    seal,
)
from troll.runs.numbers import check_int, check_real, check_seed, is_int, is_real

__all__ = [
    "CONFIG_FILE",
    "LAYOUTS",
    "MANIFEST",
    "METRICS_FILE",
    "SUMMARY_FILE",
    "Busy",
    "UsageError",
    "append_jsonl",
    "begin",
    "busy",
    "check_folder",
    "check_free",
    "check_int",
    "check_out_path",
    "check_real",
    "check_seed",
    "clear",
    "exclusive",
    "foreign",
    "hold",
    "holding",
    "is_int",
    "is_real",
    "numbered_files",
    "read_jsonl",
    "release",
    "seal",
    "truncate_jsonl",
    "write_json",
]
