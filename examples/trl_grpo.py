"""GRPO with TROLL's trust region in place of the clipped ratio, in Hugging Face TRL: a complete script.

``TrollGRPOTrainer`` is TRL's ``GRPOTrainer`` with two more loss types, ``"troll"`` (token level) and ``"troll_seq"``
(sequence level); ``TrollGRPOConfig`` is ``GRPOConfig`` with the ``troll_*`` settings (docs/trl.md). The rest is a
plain TRL script: its own dataset (sums of two small numbers, generated here) and its own reward (1 for the right
number in the completion). The trust region acts from the second optimiser step on each rollout batch, so
``steps_per_generation`` > 1.

    pip install "troll[trl]"
    python examples/trl_grpo.py --model HuggingFaceTB/SmolLM2-135M-Instruct --output-dir runs/trl-grpo

Any causal LM of the Hub or a local folder works as ``--model``. The script prints the last logged TROLL metrics
(``troll/kl_after/max`` stays at or below ``--kl-bound``) and saves the model to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import random
import re

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer


def addition_dataset(n: int, seed: int) -> Dataset:
    """``n`` one-turn questions "What is a + b?" with a, b in 0..9, and the answer in their own column."""
    rng = random.Random(seed)
    pairs = [(rng.randint(0, 9), rng.randint(0, 9)) for _ in range(n)]
    prompts = [[{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}] for a, b in pairs]
    return Dataset.from_dict({"prompt": prompts, "answer": [str(a + b) for a, b in pairs]})


def correct_sum(completions, answer, **kwargs) -> list[float]:
    """1.0 where the first number in the completion is the answer, else 0.0 (TRL passes dataset columns by name)."""
    rewards = []
    for completion, want in zip(completions, answer, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        found = re.search(r"-?\d+", text)
        rewards.append(float(found is not None and found.group() == want))
    return rewards


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="a Hub id or a local folder")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--loss-type", default="troll", help="troll, troll_seq, or any TRL loss type (grpo, dapo, ...)")
    p.add_argument("--kl-bound", type=float, default=0.05, help="TROLL's per-token KL bound (troll_kl_bound)")
    p.add_argument("--prompts", type=int, default=256, help="size of the generated dataset")
    p.add_argument("--max-steps", type=int, default=32, help="optimiser steps")
    p.add_argument("--batch-size", type=int, default=8, help="completions per optimiser step")
    p.add_argument("--num-generations", type=int, default=4, help="completions per prompt (a GRPO group)")
    p.add_argument("--steps-per-generation", type=int, default=4, help="optimiser steps per rollout batch")
    p.add_argument("--max-completion-length", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Train, save the model and return the last logged TROLL metrics."""
    args = parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = TrollGRPOConfig(
        output_dir=args.output_dir,
        loss_type=args.loss_type,
        troll_kl_bound=args.kl_bound,
        steps_per_generation=args.steps_per_generation,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
    )
    trainer = TrollGRPOTrainer(
        model=model,
        reward_funcs=correct_sum,
        args=config,
        train_dataset=addition_dataset(args.prompts, args.seed),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    last = {k: v for entry in trainer.state.log_history for k, v in entry.items() if k.startswith(("troll/", "reward"))}
    print({k: round(v, 4) for k, v in sorted(last.items()) if isinstance(v, float)})
    return last


if __name__ == "__main__":
    main()
