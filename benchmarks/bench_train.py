"""Seconds per optimiser step of ``troll train``, split by phase: generation, reward scoring, the no-grad
forwards of a rollout batch (TRL's old log-probs and TROLL's old-policy capture), the optimiser steps, and the
held-out evaluation.

    .venv/bin/python benchmarks/bench_train.py                       # the default run (troll, 16 steps)
    .venv/bin/python benchmarks/bench_train.py --loss grpo --steps 8 -- --steps-per-rollout 4
    .venv/bin/python benchmarks/bench_train.py --quick               # smoke run: 2 steps of 2 x 2 completions

Each phase is timed by wrapping the trainer method that does it (the wrappers add nothing but a clock read), in
wall time and in the process's CPU time. Prints a table and writes benchmarks/results/bench_train<label>.csv
(--quick: bench_train<label>-quick.csv; its flags go before the ones after --, which win). It is one
process with one torch thread, as ``troll train`` runs by default: on an idle machine the two agree; on a shared
one the CPU time is what the run needs of a core of its own (wall time = CPU time divided by the share it got).

The stability map's cell (``make map``; 16 completions per optimiser step, 4 steps per rollout batch):

    .venv/bin/python benchmarks/bench_train.py --loss clip --steps 8 --label _map_clip -- --prompts-per-step 8 \
        --generations 8 --steps-per-rollout 4 --max-completion-length 8 --system "You are a helpful AI assistant." \
        --eval-every 0
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

QUICK_FLAGS = ("--prompts-per-step", "2", "--generations", "2", "--steps-per-rollout", "1",
               "--max-completion-length", "8", "--heldout", "4", "--eval-every", "0")  # fmt: skip
PHASES = {
    # (module, class, method) -> phase name; nested phases are subtracted from their parents below.
    ("trl.trainer.grpo_trainer", "GRPOTrainer", "_generate"): "generate",
    ("trl.trainer.grpo_trainer", "GRPOTrainer", "_calculate_rewards"): "reward",
    ("trl.trainer.grpo_trainer", "GRPOTrainer", "_generate_and_score_completions"): "rollout (total)",
    ("troll.integrations.trl", "TrollGRPOTrainer", "_troll_capture_old"): "troll capture",
    ("trl.trainer.grpo_trainer", "GRPOTrainer", "training_step"): "train step (fwd+bwd)",
    ("troll.lm.callbacks", "HeldoutEval", "run"): "held-out eval",
}


def _wrap(cls, name, phase, clock, counts, cpu):
    original = getattr(cls, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            clock[phase] += time.perf_counter() - start
            cpu[phase] += time.process_time() - start_cpu
            counts[phase] += 1

    setattr(cls, name, timed)


def _no_grad_forwards(clock, counts, cpu):
    """TRL's old log-probs: the no-grad calls of _get_per_token_logps_and_entropies."""
    import torch
    from trl.trainer.grpo_trainer import GRPOTrainer

    original = GRPOTrainer._get_per_token_logps_and_entropies

    @functools.wraps(original)
    def timed(self, *args, **kwargs):
        if torch.is_grad_enabled():
            return original(self, *args, **kwargs)
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            clock["trl old log-probs"] += time.perf_counter() - start
            cpu["trl old log-probs"] += time.process_time() - start_cpu
            counts["trl old log-probs"] += 1

    GRPOTrainer._get_per_token_logps_and_entropies = timed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loss", default="troll")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--label", default="", help="a name for this configuration in the CSV")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 steps, 2 prompts x 2 completions of 8")
    parser.add_argument("extra", nargs="*", help="further `troll train` flags, after --")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.label = 2, args.label + "-quick"
        args.extra = [*QUICK_FLAGS, *args.extra]

    import importlib

    from troll.cli import main as troll_main

    clock, cpu, counts = defaultdict(float), defaultdict(float), defaultdict(int)
    for (module, cls_name, method), phase in PHASES.items():
        _wrap(getattr(importlib.import_module(module), cls_name), method, phase, clock, counts, cpu)
    _no_grad_forwards(clock, counts, cpu)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        start, start_cpu = time.perf_counter(), time.process_time()
        code = troll_main(["train", "--loss", args.loss, "--steps", str(args.steps), "--out", str(out), *args.extra])
        wall, wall_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if code:
        return code
    table = [_row(name, clock, cpu, counts, args.steps) for name in _phases(clock, cpu, wall, wall_cpu)]
    header = f"{args.loss}, {args.steps} optimiser steps, flags: {' '.join(args.extra) or '(defaults)'}"
    write_results(table, Path(__file__).parent / "results" / f"bench_train{args.label}.csv", header)
    return 0


def _phases(clock, cpu, wall, wall_cpu) -> list[str]:
    """Derive the rows that are differences of the wrapped phases, in both clocks; returns the row order."""
    for t, total in ((clock, wall), (cpu, wall_cpu)):
        # The rollout runs inside the first training_step of each rollout batch; TROLL's capture after TRL's part.
        rollout = t["rollout (total)"] + t["troll capture"]
        t["rest of rollout"] = t["rollout (total)"] - t["generate"] - t["reward"] - t["trl old log-probs"]
        t["loss forward + backward"] = t["train step (fwd+bwd)"] - rollout
        t["other (AdamW, model load, logging)"] = total - t["train step (fwd+bwd)"] - t["held-out eval"]
        t["wall (whole command)"] = total
    return ["generate", "reward", "trl old log-probs", "troll capture", "rest of rollout", "loss forward + backward",
            "held-out eval", "other (AdamW, model load, logging)", "wall (whole command)"]  # fmt: skip


def _row(name: str, clock, cpu, counts, steps: int) -> dict:
    wall, used = clock[name], cpu[name]
    return dict(phase=name, total_s=round(wall, 1), s_per_step=round(wall / steps, 2), cpu_s=round(used, 1),
                cpu_s_per_step=round(used / steps, 2), calls=counts.get(name, ""))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
