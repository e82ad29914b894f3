"""TROLL for verl (https://github.com/volcengine/verl): the version guard and the TROLL settings of an actor config.

Status (see docs/verl.md): this module holds the parts of the verl plug-in that are written and tested -- the
tested-version guard and the reading / validation of the TROLL hyper-parameters from verl's actor config. The loss
itself is not wired into verl yet: verl 0.9's policy-loss registry hands a loss function per-token log-probs only,
so TROLL (which needs the current full next-token distribution) must hook the engine's model-output step instead;
docs/verl.md describes that design and what is missing.

Importing this module checks the installed verl against :data:`SUPPORTED_VERL` and fails with a clear message
outside it.
"""

from __future__ import annotations

from troll.integrations._verl_config import (
    OLD_PREFIX,
    SUPPORTED_VERL,
    TROLL_KEYS,
    TROLL_LOSS_MODES,
    check_verl_version,
    troll_settings,
)

check_verl_version()

__all__ = ["OLD_PREFIX", "SUPPORTED_VERL", "TROLL_KEYS", "TROLL_LOSS_MODES", "check_verl_version", "troll_settings"]
