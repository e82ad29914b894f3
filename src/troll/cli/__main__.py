"""``python -m troll.cli ...``: the ``troll`` command (the study engine starts its cells this way)."""

import sys

from troll.cli import main

sys.exit(main())
