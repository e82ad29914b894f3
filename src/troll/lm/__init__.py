"""Small GRPO runs of a language model on CPU with TROLL or clipping: what ``troll train``, ``troll compare`` and
``troll study`` run.

Modules, lowest first: ``options`` (the run's validated settings, checked before anything heavy is imported),
``checkpoints`` (which checkpoint a resumed run continues from: only complete ones), ``metrics`` (reading
metrics.jsonl), ``model`` (the default SmolLM2-135M-Instruct GGUF and its cache), ``tasks`` (reasoning_gym tasks,
prompts, answer extraction, reward), ``evaluate`` (greedy held-out accuracy), ``callbacks``, ``card`` (the model
card), ``plots``, ``run`` (one training run into a run folder), ``compare``, ``study`` (the language-model
frontend of the study engine :mod:`troll.study`) and ``stability_map`` (the report of ``make map`` over its
studies). Nothing here imports :mod:`troll.cli`; the engine never imports this package.
"""
