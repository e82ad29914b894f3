"""Importing this module makes verl's workers build ``TrollFSDPEngine`` and use troll's ``ppo_loss`` (docs/verl.md).

It is the module to name in ``VERL_USE_EXTERNAL_MODULES=troll.integrations.verl.plugin``: verl imports it in every
process that imports verl, so Ray workers get the engine too when the variable is in the Ray runtime environment
(``python -m troll.integrations.verl.main`` puts it there). Stock loss modes are unchanged.
"""

from troll.integrations.verl.engine import register

register()
