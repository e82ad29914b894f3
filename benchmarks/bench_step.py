"""Step-level benchmark: one optimiser step of TrollGRPOTrainer on SmolLM2-135M-Instruct, TROLL against TRL's GRPO.

Configurations, all on the same weights and the same fixed micro-batch:
    troll        loss_type="troll", troll_lm_head="chunked" (the default): TROLL from the final hidden states
    grpo         loss_type="grpo": TRL 1.16's own _compute_loss (fused LM head, clipped surrogate, eps 0.2)
    grpo_compact the same, with the fused head scoring the completion positions only, as TRL does on a device with
                 Triton (on CPU it scores every position, prompt included): trl.trainer.utils._use_triton is
                 patched to say yes for that choice only; the tiles still run as TRL's torch fallback
    troll_dense  loss_type="troll", troll_lm_head="dense": TROLL on the full (B, T, V) logits (reference)

What is timed, per step: ``trainer.compute_loss(model, inputs)`` (the policy forward, the loss and its metrics),
``loss.backward()``, ``clip_grad_norm_(1.0)``, ``optimizer.step()`` (the trainer's AdamW at the paper's lr 1e-6)
and ``optimizer.zero_grad()``. Not timed: generation, scoring and the old-policy capture, which happen once per
rollout batch. TRL's training_step is bypassed because its _prepare_inputs would generate.

The batch is built once by the parent process: --prompts chat prompts x --group samples of exactly
--completion-len tokens each (sampled from the model at temperature 1, EOS suppressed, so every completion token
enters the loss), advantages from random rewards normalised per group, and, from the initial weights W0, TRL's
old per-token log-probs and TROLL's captured old policy (``troll_old_*``, chunked capture). A rollout batch feeds
--reuse optimiser steps (steps_per_generation), so the old tensors exist as in real training. To be off-policy as
on a later mini-batch of the rollout, the parent then takes --warmup AdamW steps of "grpo" at --warmup-lr; those
weights W1 and the batch go to a file that every measurement process loads, so all configurations start from the
same state (the TROLL rows report how much of the batch the trust region projects).

Each measurement runs in a fresh subprocess: one untimed step (allocates AdamW's moments, warms kernels), one step
for the peak memory, then --steps timed steps. Configurations alternate within each of --rounds rounds, so drifting
load from other processes hits all of them alike; times are medians over all timed steps, memory the median over
rounds. Peak memory on CPU, as in bench_loss.py: reset the kernel's high-water mark (``5 > /proc/self/clear_refs``),
read VmRSS, run the step, read VmHWM; the difference is the step's own working set (activations, gradients, loss
temporaries, the optimiser update). glibc is told to serve allocations above 128 kB with mmap
(MALLOC_MMAP_THRESHOLD_) so that freed tensors leave the process instead of staying in the heap, where a previous
step's memory would hide in VmRSS; all configurations run under the same setting.

Departures from a real run: one process, fp32 on CPU, no gradient accumulation, fixed-length completions. On CPU,
TRL's fused head scores every position of the sequence (prompt included; grpo_compact removes that) and runs its
tiles as torch ops over (4096 x 32768) fp32 buffers, whose backward materialises several such tiles: its time and
memory are not those of the Triton kernels on a GPU. The ratios against grpo are therefore CPU ratios.

    python benchmarks/bench_step.py                                   # 8 x 256 completion tokens, 3 rounds
    python benchmarks/bench_step.py --quick        # smoke run: troll, grpo_compact; 1 x 2 x 16 tokens, 1 round, 1 step
Writes benchmarks/results/bench_step.csv (--quick: bench_step-quick.csv) and prints a markdown table.

``--rollout`` measures a rollout batch instead of an optimiser step: troll_old_policy "sampler" (the old policy
recorded during generation, no scoring forward) against "recompute" (benchmarks/_rollout.py says what is timed);
writes benchmarks/results/bench_step_rollout.csv (--quick: bench_step_rollout-quick.csv).

    python benchmarks/bench_step.py --rollout                          # 8 x 256 tokens, 3 rounds x 2 batches
    python benchmarks/bench_step.py --rollout --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _rollout  # noqa: E402
import torch  # noqa: E402
from _report import quick_path, reset_peak, status_kb, write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
CONFIGS = {
    "troll": dict(loss_type="troll", troll_lm_head="chunked"),
    "grpo": dict(loss_type="grpo"),
    "grpo_compact": dict(loss_type="grpo"),
    "troll_dense": dict(loss_type="troll", troll_lm_head="dense"),
}
PROMPTS = [
    "A train leaves at 3:15 pm and travels 210 km at 84 km/h. At what time does it arrive? Think step by step and "
    "give the final answer on its own line.",
    "Sort these words alphabetically and count how many contain the letter 'r': river, apple, carrot, moon, "
    "train, berry, sky. Explain your reasoning briefly, then give the count.",
    "Tom has 3 times as many marbles as Anna. Together they have 64 marbles. How many does Tom have? Show your "
    "work and end with 'Answer: <number>'.",
    "What is the sum of all even numbers from 2 to 40 inclusive? Reason step by step, then state the result.",
]
METRICS = ("troll/projected_frac", "troll/kl_before/max", "troll/kl_after/max", "clip_ratio/region_mean", "entropy")
MMAP_THRESHOLD = "131072"


def load_smollm2():
    """(model, tokenizer) in fp32 through the project's GGUF cache (converted once, then loaded in ~1 s)."""
    from troll.lm.model import load_model, resolve_model

    return load_model(resolve_model("smollm2"))


def make_trainer(model, tok, config: str, args, out_dir: str):
    from datasets import Dataset

    from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer

    targs = TrollGRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        steps_per_generation=args.reuse,
        gradient_accumulation_steps=1,
        max_completion_length=args.completion_len,
        learning_rate=args.lr,
        max_grad_norm=1.0,
        troll_kl_bound=args.eps,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=args.seed,
        **CONFIGS[config],
    )
    tr = TrollGRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=targs,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tok,
    )
    tr.model.train()
    tr.current_gradient_accumulation_steps = 1
    return tr


def optimiser_step(tr, optimizer, inputs) -> None:
    loss = tr.compute_loss(tr.model, inputs)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(tr.model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def make_batch(model, tok, args) -> dict:
    """Prompts x group completions of exactly completion_len sampled tokens, and per-group normalised advantages."""
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in (PROMPTS * args.prompts)[: args.prompts]
    ]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    prompt_ids = enc.input_ids.repeat_interleave(args.group, 0)
    prompt_mask = enc.attention_mask.repeat_interleave(args.group, 0)
    torch.manual_seed(args.seed)
    out = model.generate(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=args.completion_len,
        min_new_tokens=args.completion_len,
        pad_token_id=tok.pad_token_id,
    )
    completion_ids = out[:, prompt_ids.size(1) :]
    rewards = torch.rand(args.prompts, args.group, generator=torch.Generator().manual_seed(args.seed))
    adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": torch.ones_like(completion_ids),
        "advantages": adv.reshape(-1),
    }


def prepare(args, path: Path) -> dict:
    """Build the batch and the old policies at W0, move the weights off-policy (W1), save both; returns facts."""
    model, tok = load_smollm2()
    batch = make_batch(model, tok, args)
    with tempfile.TemporaryDirectory() as out:
        tr = make_trainer(model, tok, "troll", args, out)
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        with torch.no_grad():
            logps, _, _ = tr._get_per_token_logps_and_entropies(model, input_ids, mask, args.completion_len)
            batch["old_per_token_logps"] = logps
            batch.update(tr._troll_capture_old(batch).to_dict())  # troll_old_* as the trainer stores them
        batch["num_items_in_batch"] = batch["completion_mask"].sum() * args.reuse
        tr.loss_type = "grpo"
        optimizer = tr.create_optimizer()
        for group in optimizer.param_groups:
            group["lr"] = args.warmup_lr
        for _ in range(args.warmup):
            optimiser_step(tr, optimizer, batch)
        torch.save({"batch": batch, "state": model.state_dict()}, path)
    return {
        "prompt_len": batch["prompt_ids"].size(1),
        "old_kept_mean": round(float(batch["troll_old_mask"].sum(-1).float().mean()), 2),
    }


def child(args) -> None:
    """One configuration in a fresh process: prints JSON with the step times, the peak memory and metrics."""
    data = torch.load(args.data, weights_only=False)
    model, tok = load_smollm2()
    model.load_state_dict(data["state"])
    inputs = data["batch"]
    del data
    if args.child == "grpo_compact":
        import trl.trainer.utils

        trl.trainer.utils._use_triton = lambda device: True  # the fused forward's "score valid positions only"
    with tempfile.TemporaryDirectory() as out:
        tr = make_trainer(model, tok, args.child, args, out)
        optimizer = tr.create_optimizer()
        optimiser_step(tr, optimizer, inputs)  # untimed: AdamW's moments, kernels, thread pools
        reset_peak()
        base = status_kb("VmRSS")
        optimiser_step(tr, optimizer, inputs)
        peak_mb = (status_kb("VmHWM") - base) / 1024
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            optimiser_step(tr, optimizer, inputs)
            times.append(time.perf_counter() - t0)
        assert tr.troll_lm_head == CONFIGS[args.child].get("troll_lm_head", tr.troll_lm_head)
        metrics = {key: tr._metrics["train"][key][0] for key in METRICS if tr._metrics["train"].get(key)}
    print(json.dumps({"times": times, "peak_mb": peak_mb, "metrics": metrics}))


SHARED = ("prompts", "group", "completion_len", "reuse", "eps", "lr", "seed", "threads")


def run_child(config: str, data: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--child", config, "--data", str(data), "--steps", str(args.steps)]
    for name in SHARED:
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{config} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(runs: dict, facts: dict, args) -> list[dict]:
    med = {c: statistics.median(t for r in rs for t in r["times"]) for c, rs in runs.items()}
    mem = {c: statistics.median(r["peak_mb"] for r in rs) for c, rs in runs.items()}
    rows = []
    for config, rs in runs.items():
        m = rs[0]["metrics"]
        rows.append(
            {
                "config": config,
                "B": args.prompts * args.group,
                "prompt_len": facts["prompt_len"],
                "completion_len": args.completion_len,
                "step_s": round(med[config], 3),
                "step_s_min": round(min(t for r in rs for t in r["times"]), 3),
                "time_vs_grpo": _ratio(med, config, "grpo"),
                "time_vs_compact": _ratio(med, config, "grpo_compact"),
                "peak_mb": round(mem[config], 1),
                "mem_vs_grpo": _ratio(mem, config, "grpo"),
                "mem_vs_compact": _ratio(mem, config, "grpo_compact"),
                "projected_frac": _fmt(m.get("troll/projected_frac")),
                "kl_before_max": _fmt(m.get("troll/kl_before/max")),
                "kl_after_max": _fmt(m.get("troll/kl_after/max")),
                "clipped_frac": _fmt(m.get("clip_ratio/region_mean")),
                "timed_steps": sum(len(r["times"]) for r in rs),
            }
        )
    return rows


def _ratio(values: dict, config: str, base: str):
    return round(values[config] / values[base], 3) if base in values else ""


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4g}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=2, help="distinct prompts in the micro-batch")
    p.add_argument("--group", type=int, default=4, help="completions per prompt (num_generations)")
    p.add_argument("--completion-len", type=int, default=256, help="completion tokens per sequence (all in the loss)")
    p.add_argument("--reuse", type=int, default=4, help="optimiser steps per rollout batch (steps_per_generation)")
    p.add_argument("--warmup", type=int, default=2, help="grpo steps before measuring, to be off-policy")
    p.add_argument("--warmup-lr", type=float, default=1e-5)
    p.add_argument("--lr", type=float, default=1e-6, help="learning rate of the measured steps (paper: 1e-6)")
    p.add_argument("--eps", type=float, default=0.05, help="TROLL's KL bound")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="timed steps per process")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "bench_step.csv")
    p.add_argument("--rollout", action="store_true", help="time a rollout batch, old policy sampler vs recompute")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 x 2 x 16 tokens, 1 round, 1 timed step")
    p.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--child-rollout", choices=_rollout.POLICIES, help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:  # a smoke run: the same step on 1 prompt x 2 completions of 16 tokens, one warm-up step
        args.prompts, args.group, args.completion_len, args.warmup, args.rounds, args.steps = 1, 2, 16, 1, 1, 1
        if args.configs == list(CONFIGS) and not args.rollout:
            args.configs = ["troll", "grpo_compact"]  # the pair docs/benchmarks.md quotes
    if args.child:
        return child(args)
    if args.child_rollout:
        return _rollout.child(args, load_smollm2, PROMPTS)
    out = args.out
    if args.out == RESULTS / "bench_step.csv":  # the default: the rollout and quick runs get their own files
        out = RESULTS / "bench_step_rollout.csv" if args.rollout else out
        out = quick_path(out) if args.quick else out
    if args.rollout:
        rows, header = _rollout.measure(args, __file__)
        return write_results(rows, out, header)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "batch.pt"
        facts = prepare(args, data)
        runs = {c: [] for c in args.configs}
        for r in range(args.rounds):
            for config in args.configs[r % len(args.configs) :] + args.configs[: r % len(args.configs)]:
                runs[config].append(run_child(config, data, args))
                load.append(os.getloadavg()[0])
    rows = summarise(runs, facts, args)
    header = (
        f"torch {torch.__version__}, {args.threads} threads, SmolLM2-135M-Instruct fp32, reuse {args.reuse}, "
        f"eps {args.eps}, lr {args.lr}; old kept tokens/position {facts['old_kept_mean']}; medians of "
        f"{args.rounds} x {args.steps} steps; 1-min load average {min(load):.2f}-{max(load):.2f}"
    )
    write_results(rows, out, header)


if __name__ == "__main__":
    main()
