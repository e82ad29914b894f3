"""Integrations of TROLL into RL trainers of other libraries.

Each integration lives in its own subpackage and imports its host library only when that is imported, so
``import troll`` never needs them. TRL: ``from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer``
(``pip install troll[trl]``). verl 0.9: ``python -m troll.integrations.verl.main`` (``pip install troll[verl]``;
the subpackage's docstring says where each piece lives; docs/verl.md). Both read the LM head of a transformers model
through :mod:`troll.integrations.hf`.
"""
