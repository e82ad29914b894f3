"""The files of run and study folders: moved to :mod:`troll.runs.files` (this name keeps old imports working)."""

from troll.runs.files import (  # noqa: F401
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    UsageError,
    append_jsonl,
    check_out_path,
    load_config,
    read_config,
    read_jsonl,
    truncate_jsonl,
    write_json,
)
