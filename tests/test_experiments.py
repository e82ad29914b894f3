"""The scripts of experiments/: experiments/stale_rollouts.py makes valid options for every setting its flags allow
(the model, the training and the evaluation are stood in for: a real run takes minutes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "stale_rollouts.py"


def test_stale_rollouts_accuracy_before_takes_the_runs_batch_shape(monkeypatch):
    """--generations reaches the options of the accuracy before training as it reaches the runs': with --prompts 1
    --generations 6 --steps-per-rollout 3 (a rollout of 6 completions, 2 per step) the options are valid, not the
    default 4 generations, which 3 steps cannot share."""
    from troll.lm import evaluate, model, run

    spec = importlib.util.spec_from_file_location("stale_rollouts", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seen = []
    monkeypatch.setattr(model, "resolve_model", lambda name: name)
    monkeypatch.setattr(model, "load_model", lambda ref: (None, None))
    monkeypatch.setattr(run, "_build_task", lambda opts: seen.append(opts))
    monkeypatch.setattr(evaluate, "heldout_accuracy", lambda *a, **k: SimpleNamespace(accuracy=0.5))
    args = SimpleNamespace(task="chain_sum", steps=6, steps_per_rollout=3, prompts=1, generations=6, heldout=4,
                           system=None, max_len=8)  # fmt: skip
    assert script.before_accuracy(0, args) == 0.5
    assert (seen[0].prompts_per_step, seen[0].generations, seen[0].steps_per_rollout) == (1, 6, 3)
