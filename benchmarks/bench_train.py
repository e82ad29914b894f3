"""Seconds per optimiser step of ``troll train``, split by phase: generation, reward scoring, the no-grad
forwards of a rollout batch (TRL's old log-probs and TROLL's old-policy capture), the optimiser steps, and the
held-out evaluation.

    .venv/bin/python benchmarks/bench_train.py                       # the default run (troll, 16 steps)
    .venv/bin/python benchmarks/bench_train.py --loss grpo --steps 8 -- --steps-per-rollout 4

Each phase is timed by wrapping the trainer method that does it (the wrappers add nothing but a clock read).
Prints a table and writes benchmarks/results/bench_train.csv. Run it on an idle machine: it is one process with
one torch thread, as ``troll train`` runs by default.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from _report import write_results  # noqa: E402

PHASES = {
    # (module, class, method) -> phase name; nested phases are subtracted from their parents below.
    ("trl.trainer.grpo_trainer", "GRPOTrainer", "_generate"): "generate",
    ("trl.trainer.grpo_trainer", "GRPOTrainer", "_calculate_rewards"): "reward",
    ("trl.trainer.grpo_trainer", "GRPOTrainer", "_generate_and_score_completions"): "rollout (total)",
    ("troll.integrations.trl", "TrollGRPOTrainer", "_troll_capture_old"): "troll capture",
    ("trl.trainer.grpo_trainer", "GRPOTrainer", "training_step"): "train step (fwd+bwd)",
    ("troll.train.callbacks", "HeldoutEval", "run"): "held-out eval",
}


def _wrap(cls, name, phase, clock, counts, no_grad_only=False):
    original = getattr(cls, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            clock[phase] += time.perf_counter() - start
            counts[phase] += 1

    setattr(cls, name, timed)


def _no_grad_forwards(clock, counts):
    """TRL's old log-probs: the no-grad calls of _get_per_token_logps_and_entropies."""
    import torch
    from trl.trainer.grpo_trainer import GRPOTrainer

    original = GRPOTrainer._get_per_token_logps_and_entropies

    @functools.wraps(original)
    def timed(self, *args, **kwargs):
        if torch.is_grad_enabled():
            return original(self, *args, **kwargs)
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            clock["trl old log-probs"] += time.perf_counter() - start
            counts["trl old log-probs"] += 1

    GRPOTrainer._get_per_token_logps_and_entropies = timed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loss", default="troll")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--label", default="", help="a name for this configuration in the CSV")
    parser.add_argument("extra", nargs="*", help="further `troll train` flags, after --")
    args = parser.parse_args(argv)

    import importlib

    from troll.cli import main as troll_main

    clock, counts = defaultdict(float), defaultdict(int)
    for (module, cls_name, method), phase in PHASES.items():
        _wrap(getattr(importlib.import_module(module), cls_name), method, phase, clock, counts)
    _no_grad_forwards(clock, counts)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        start = time.perf_counter()
        code = troll_main(["train", "--loss", args.loss, "--steps", str(args.steps), "--out", str(out), *args.extra])
        wall = time.perf_counter() - start
    if code:
        return code
    steps = args.steps
    # The rollout runs inside the first training_step of each rollout batch; TROLL's capture runs after TRL's part.
    rollout = clock["rollout (total)"] + clock["troll capture"]
    rollout_other = clock["rollout (total)"] - clock["generate"] - clock["reward"] - clock["trl old log-probs"]
    optimiser = clock["train step (fwd+bwd)"] - rollout
    rows = [
        ("generate", clock["generate"]),
        ("reward", clock["reward"]),
        ("trl old log-probs", clock["trl old log-probs"]),
        ("troll capture", clock["troll capture"]),
        ("rest of rollout", rollout_other),
        ("loss forward + backward", optimiser),
        ("held-out eval", clock["held-out eval"]),
        ("other (AdamW, model load, logging)", wall - sum(clock[k] for k in ("train step (fwd+bwd)", "held-out eval"))),
        ("wall (whole command)", wall),
    ]
    table = [
        dict(phase=n, total_s=round(t, 1), s_per_step=round(t / steps, 2), calls=counts.get(n, "")) for n, t in rows
    ]
    header = f"{args.loss}, {steps} optimiser steps, flags: {' '.join(args.extra) or '(defaults)'}"
    write_results(table, Path(__file__).parent / "results" / f"bench_train{args.label}.csv", header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
