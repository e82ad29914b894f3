"""``bench_step.py --rollout``: seconds and peak memory per rollout batch, troll_old_policy "sampler" vs "recompute".

What is timed: ``TrollGRPOTrainer._generate_and_score_completions`` on one rollout batch (--prompts x --group
completions of at most --completion-len tokens, HF generate on CPU), i.e. generation, rewards, advantages and the
old policy: "recompute" runs TRL's no-grad scoring forward over the batch and reads TROLL's old policy off it;
"sampler" records the old policy in a logits processor during generation and skips that forward. Both sample the
same completions (same seed before every batch; the recorder draws no random numbers), so the difference is the
forward that is no longer run minus the recorder's per-step top-K. Each configuration runs in a fresh process: one
untimed batch, one for the peak memory (VmHWM - VmRSS, as bench_step.py), then --steps timed batches;
configurations alternate over --rounds rounds; times are medians.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from _report import reset_peak, status_kb

POLICIES = ("recompute", "sampler")


def make_trainer(model, tok, policy: str, args, out_dir: str, prompts: list[str]):
    from datasets import Dataset

    from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer

    targs = TrollGRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        steps_per_generation=args.reuse,  # > 1: "recompute" needs the old policy, hence the scoring forward
        max_completion_length=args.completion_len,
        troll_old_policy=policy,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=args.seed,
    )
    tr = TrollGRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=targs,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
    )
    tr.model.train()
    return tr


def one_batch(tr, rows: list[dict], seed: int) -> dict:
    torch.manual_seed(seed)
    return tr._generate_and_score_completions(rows)


def child(args, load_model, prompts: list[str]) -> None:
    """One policy in a fresh process: prints JSON with the batch times, the peak memory and the batch's size."""
    model, tok = load_model()
    rows = [{"prompt": p} for p in (prompts * args.prompts)[: args.prompts] for _ in range(args.group)]
    with tempfile.TemporaryDirectory() as out:
        tr = make_trainer(model, tok, args.child_rollout, args, out, prompts)
        one_batch(tr, rows, args.seed)  # untimed: kernels, thread pools, the LM-head probe
        reset_peak()
        base = status_kb("VmRSS")
        batch = one_batch(tr, rows, args.seed)
        peak_mb = (status_kb("VmHWM") - base) / 1024
        times = []
        for i in range(args.steps):
            t0 = time.perf_counter()
            one_batch(tr, rows, args.seed + 1 + i)
            times.append(time.perf_counter() - t0)
    tokens = int(batch["completion_mask"].sum())
    kept = float(batch["troll_old_mask"].sum(-1).float()[batch["completion_mask"].bool()].mean())
    print(json.dumps({"times": times, "peak_mb": peak_mb, "tokens": tokens, "kept": kept}))


def run_child(policy: str, args, script: str) -> dict:
    cmd = [sys.executable, script, "--child-rollout", policy, "--steps", str(args.steps)]
    for name in ("prompts", "group", "completion_len", "reuse", "seed", "threads"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{policy} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args, script: str) -> tuple[list[dict], str]:
    """(rows, header) of the table: the policies alternating over the rounds."""
    load = [os.getloadavg()[0]]
    runs = {p: [] for p in POLICIES}
    for r in range(args.rounds):
        for policy in POLICIES[r % 2 :] + POLICIES[: r % 2]:
            runs[policy].append(run_child(policy, args, script))
            load.append(os.getloadavg()[0])
    med = {p: statistics.median(t for r in rs for t in r["times"]) for p, rs in runs.items()}
    mem = {p: statistics.median(r["peak_mb"] for r in rs) for p, rs in runs.items()}
    rows = [
        {
            "old_policy": p,
            "B": args.prompts * args.group,
            "max_completion_len": args.completion_len,
            "completion_tokens": rs[0]["tokens"],
            "batch_s": round(med[p], 3),
            "batch_s_min": round(min(t for r in rs for t in r["times"]), 3),
            "time_vs_recompute": round(med[p] / med["recompute"], 3),
            "peak_mb": round(mem[p], 1),
            "mem_vs_recompute": round(mem[p] / mem["recompute"], 3),
            "old_kept_mean": round(rs[0]["kept"], 2),
            "timed_batches": sum(len(r["times"]) for r in rs),
        }
        for p, rs in runs.items()
    ]
    header = (
        f"torch {torch.__version__}, {args.threads} threads, SmolLM2-135M-Instruct fp32, HF generate, one rollout "
        f"batch = generation + scoring + old policy; medians of {args.rounds} x {args.steps} batches; 1-min load "
        f"average {min(load):.2f}-{max(load):.2f}"
    )
    return rows, header
