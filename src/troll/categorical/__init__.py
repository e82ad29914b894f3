"""The categorical wing: TROLL's per-token KL trust region for language models (docs/method.md).

The old policy as a few stored ids per token (:mod:`~troll.categorical.sparse`), the current one from logits or
from hidden states and the LM head in vocabulary chunks (:mod:`~troll.categorical.policy`,
:mod:`~troll.categorical.lm_head`), the dense and sparse projections (:mod:`~troll.categorical.projection`,
:mod:`~troll.categorical.sparse_projection`), the losses (:mod:`~troll.categorical.losses`,
:mod:`~troll.categorical.baselines`) and their float64 references (:mod:`~troll.categorical.reference`).
:mod:`~troll.categorical.defaults` and :mod:`~troll.categorical.settings` are torch-free, so that the command line
checks its input before torch loads; the public names are re-exported by :mod:`troll` itself, imported on first use.
"""
