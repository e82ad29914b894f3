"""Integrations of TROLL into RL trainers of other libraries.

Each integration lives in its own module and imports its host library only when that module is imported, so
``import troll`` never needs them. TRL: ``from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer``
(``pip install troll[trl]``). verl 0.9: ``python -m troll.integrations.verl_main`` (``pip install troll[verl]``;
docs/verl.md).
"""
