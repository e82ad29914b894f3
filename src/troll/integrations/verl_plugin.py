"""Import this module to switch verl's FSDP language-model engine to TrollFSDPEngine (see docs/verl.md).

It is the module to name in ``VERL_USE_EXTERNAL_MODULES=troll.integrations.verl_plugin``: verl imports it in every
process that imports verl, so Ray workers get the engine too when the variable is in the Ray runtime environment.
"""

from troll.integrations.verl import register

register()
