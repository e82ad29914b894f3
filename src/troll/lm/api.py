"""``troll.lm.train(options)``: one GRPO run from Python, as ``troll train`` runs it.

The command line builds a :class:`~troll.lm.options.RunOptions` from its flags and calls :func:`train`; a script
or notebook does the same with its own. :func:`train` resolves the options (the defaults a task decides, e.g. a code
task's temperature), checks them, the task, the model and the run folder, and raises
:class:`~troll.runs.files.UsageError` naming what is wrong and how to fix it before anything is loaded or written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from troll import runs
from troll.lm.options import COMMAND, RunOptions, UsageError, check_run_folder, last_checkpoint


def train(
    options: RunOptions,
    *,
    resume: bool = False,
    overwrite: bool = False,
    keep_checkpoints: bool = False,
    save_model: bool = True,
) -> dict:
    """Train the run ``options`` describe into its folder (``options.out``; "" for runs/<loss>-<task>-seed<seed>)
    and return its summary (summary.json: held-out greedy accuracy before and after, sampled pass@k for code tasks,
    times).

    ``resume``: continue the run in the folder from its last complete checkpoint (``options`` must be the saved
    ones but for --steps, --eval-every, --save-every and --threads); ``overwrite``: replace an earlier run there;
    ``keep_checkpoints``: keep checkpoint-N/ to extend the run later; ``save_model``: write model/. A folder holding
    anything else is never touched.
    """
    if not isinstance(options, RunOptions):
        raise UsageError(f"train() takes a RunOptions (troll.lm.RunOptions(task=..., loss=...)), got "
                         f"{type(options).__name__}.")  # fmt: skip
    runs.exclusive(resume=resume, overwrite=overwrite)
    opts = options.resolved()
    with runs.holding(opts.out):
        clear = check_run_folder(Path(opts.out), overwrite=overwrite, resume=resume)
        validate(opts)
        quiet()
        if clear:
            runs.clear(Path(opts.out), COMMAND)
        if resume and last_checkpoint(Path(opts.out)) is None:
            print(f"troll train: {opts.out} holds no complete checkpoint; the run starts over from step 0",
                  file=sys.stderr)  # fmt: skip
        from troll.lm import run

        cache_note(opts.model)
        return run.train(opts, resume=resume, keep_checkpoints=keep_checkpoints, save_model=save_model)


def validate(opts: RunOptions) -> None:
    """The checks of one run beyond its values (:func:`troll.lm.options.check_values`, run when the options are
    made): the task name and the model's location."""
    from troll.lm import model, tasks

    tasks.check_task(opts.task, heldout=opts.heldout)
    model.resolve_model(opts.model)


def cache_note(model_name: str) -> None:
    """Say so when the packaged model is converted on first use (~30 s)."""
    from troll.lm import model

    if model_name == model.DEFAULT_MODEL and not model.is_cached():
        target = model.cache_root() / model.CACHE_NAME
        print(f"first use: converting the packaged SmolLM2 GGUF into {target} (once, ~30 s)", file=sys.stderr)


def quiet() -> None:
    """Keep the terminal to our progress bar: no per-file loading bars or library warnings."""
    import warnings

    import datasets
    import huggingface_hub
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
