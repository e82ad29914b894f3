"""Small GRPO runs of a language model on CPU with TROLL or clipping: what ``troll train``, ``troll compare`` and
``troll study`` run.

From Python: ``troll.lm.train(troll.lm.RunOptions(task="code", loss="clip", out="runs/c"))`` runs what
``troll train --task code --loss clip --out runs/c`` runs (:mod:`troll.lm.api`) and returns the run's summary.

Modules, lowest first: ``options`` (the run's validated settings, checked before anything heavy is imported),
``checkpoints`` (which checkpoint a resumed run continues from: only complete ones), ``metrics`` (reading
metrics.jsonl), ``model`` (the default SmolLM2-135M-Instruct GGUF and its cache), ``tasks`` (reasoning_gym tasks,
prompts, answer extraction, reward), ``evaluate`` (greedy held-out accuracy and sampled pass@k), ``callbacks``,
``card`` (the model card), ``plots``, ``run`` (one training run into a run folder), ``api`` (:func:`train`, its
checked entry), ``compare`` and ``study`` (the language-model frontend of the study engine :mod:`troll.study`); the
stability map's report over ``make map``'s studies is a script, ``experiments/stability_map.py``. Nothing here
imports :mod:`troll.cli`; the engine never imports this package.
"""

__all__ = ["RunOptions", "train"]


def __getattr__(name: str):
    """``train`` and ``RunOptions``, imported when first used (importing the package stays cheap)."""
    if name == "train":
        from troll.lm.api import train

        return train
    if name == "RunOptions":
        from troll.lm.options import RunOptions

        return RunOptions
    raise AttributeError(f"module 'troll.lm' has no attribute {name!r}")
