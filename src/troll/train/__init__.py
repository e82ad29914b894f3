"""The ``troll`` command line: small GRPO runs on CPU with TROLL or clipping (``troll train``, ``troll compare``).

Modules: ``options`` (the run's validated settings, checked before anything heavy is imported), ``model`` (the
default SmolLM2-135M-Instruct GGUF and its cache), ``tasks`` (reasoning_gym tasks, prompts, answer extraction,
reward), ``evaluate`` (greedy held-out accuracy), ``run`` (one training run into a run folder), ``compare`` and
``plots``.
"""
