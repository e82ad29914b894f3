"""The LM-head part of one verl update micro-batch: verl's stock loss vs TROLL with the dense and the chunked head.

Run with the verl environment (``.venv-verl/bin/python benchmarks/bench_verl_head.py``; make test builds it). What
is measured is everything after the backbone in one micro-batch of verl 0.9's update, on CPU, through the real
code: the model's LM head (all positions for "dense", one for "chunked", as ``TrollFSDPEngine`` asks the model),
``TrollFSDPEngine.prepare_model_outputs`` (verl's own output code inside), ``troll_ppo_loss`` (for "vanilla":
verl's ``ppo_loss``, the PPO clip baseline) and the backward to the hidden states and the head's weight. The
backbone is left out (the same in all three); its final hidden states are a random leaf tensor.

Inputs are flat-tailed like a real model at temperature 1: a SmolLM2-135M-sized head (576 x 49152) with weights
of std 0.02 over hidden states of std 1 gives near-uniform rows, so the old policy keeps all top_k = 64 ids plus
the sampled one. The old policy is captured by the engine itself from perturbed hidden states.

Peak memory: each method runs in a fresh subprocess; VmHWM is reset after the inputs exist (benchmarks/_report.py),
so the peak is the measured work's own. Times are medians of --repeats runs after that first (memory) run.

    .venv-verl/bin/python benchmarks/bench_verl_head.py                    # 4 x (128 + 384) tokens, ~2 min
    .venv-verl/bin/python benchmarks/bench_verl_head.py --quick            # smoke run: 1 x (64 + 192), 1 x 1
Writes benchmarks/results/verl_head.csv (--quick: verl_head-quick.csv) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from _report import quick_path, reset_peak, status_kb, write_results  # noqa: E402

METHODS = ("vanilla", "troll_dense", "troll_chunked")
TROLL = {"kl_bound": 0.05, "alpha": 1.0, "top_k": 64, "delta": 1e-5}


def actor_config(mode: str, lm_head: str):
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    cfg = {
        "_target_": "troll.integrations.verl.config.TrollFSDPActorConfig",
        "strategy": "fsdp",
        "ppo_mini_batch_size": 4,
        "ppo_micro_batch_size_per_gpu": 4,
        "rollout_n": 1,
        "use_dynamic_bsz": False,
        "loss_agg_mode": "token-mean",
        "policy_loss": {"_target_": "verl.workers.config.PolicyLossConfig", "loss_mode": mode},
        "troll": {**TROLL, "lm_head": lm_head},
    }
    return omega_conf_to_dataclass(OmegaConf.create(cfg))


class Head(torch.nn.Module):
    """Stands in for the model around the LM head: ``get_output_embeddings`` is all the engine reads."""

    def __init__(self, hidden_size: int, vocab: int, seed: int):
        super().__init__()
        self.lm_head = torch.nn.Linear(hidden_size, vocab, bias=False)
        with torch.no_grad():
            self.lm_head.weight.normal_(0, 0.02, generator=torch.Generator().manual_seed(seed))

    def get_output_embeddings(self):
        return self.lm_head


def nested(values, lens):
    return torch.nested.as_nested_tensor(list(values.split(list(lens))), layout=torch.jagged)


def build(args):
    """(engine, micro_batch, output_args, hidden leaf, head module): one verl micro-batch, old policy captured."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.dataset_utils import DatasetPadMode
    from verl.utils.torch_functional import entropy_from_logits

    from troll.integrations.verl.engine import TrollFSDPEngine

    gen = torch.Generator().manual_seed(args.seed)
    b, p, r = args.batch, args.prompt, args.response
    lens = [p + r] * b
    n = sum(lens)
    model = Head(args.hidden, args.vocab, args.seed)
    engine = object.__new__(TrollFSDPEngine)
    engine.module, engine.use_ulysses_sp = model, False
    engine.engine_config = types.SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False)
    engine.compute_entropy_from_logits = entropy_from_logits
    ids = torch.randint(0, args.vocab, (n,), generator=gen)
    rolled = torch.roll(ids, -1)
    output_args = {
        "input_ids_rmpad_rolled": rolled,
        "temperature_rmpad": torch.ones(n),
        "pad_size": 0,
        "temperature_is_one": True,
    }
    offsets = torch.tensor([0, *lens]).cumsum(0)
    responses = torch.stack([ids[o + p : o + p + r] for o in offsets[:-1].tolist()])
    micro = TensorDict(
        {
            "input_ids": torch.nested.nested_tensor_from_jagged(ids, offsets),
            "prompts": nested(torch.stack([ids[o : o + p] for o in offsets[:-1].tolist()]).reshape(-1), [p] * b),
            "responses": nested(responses.reshape(-1), [r] * b),
            "response_mask": nested(torch.ones(b * r, dtype=torch.long), [r] * b),
            "advantages": nested(torch.randn(b * r, generator=gen), [r] * b),
        },
        batch_size=[b],
    )
    tu.assign_non_tensor(micro, use_remove_padding=True, pad_mode=DatasetPadMode.NO_PADDING, calculate_entropy=False)
    tu.assign_non_tensor(micro, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    # The old policy, captured by the engine (dense rule, from perturbed states) as compute_log_prob would.
    old_hidden = torch.randn(n, args.hidden, generator=gen)
    tu.assign_non_tensor(micro, troll_capture={"top_k": TROLL["top_k"], "delta": TROLL["delta"]}, troll_lm_head="dense")
    with torch.no_grad():
        out = engine.prepare_model_outputs(
            types.SimpleNamespace(logits=model.lm_head(old_hidden).unsqueeze(0)), output_args, micro, None
        )
    tu.assign_non_tensor(micro, troll_capture=None)
    for key, value in out.items():
        padded = torch.nested.to_padded_tensor(value, 0.0 if value.dtype.is_floating_point else 0)
        if key == "log_probs":
            key, padded = "old_log_probs", padded[:, p - 1 : p - 1 + r]
        else:
            padded = padded[:, p - 1 : p - 1 + r]
        micro[key] = nested(padded.reshape(b * r, *padded.shape[2:]), [r] * b)
    hidden = (old_hidden + 0.1 * torch.randn(n, args.hidden, generator=gen)).requires_grad_()
    return engine, micro, output_args, hidden, model


def child(args) -> None:
    from verl.utils import tensordict_utils as tu

    from troll.integrations.verl.loss import troll_ppo_loss

    torch.set_num_threads(args.threads)
    engine, micro, output_args, hidden, model = build(args)
    engine._troll_last_path = None  # the capture in build() ran the dense path
    lm_head = "chunked" if args.child == "troll_chunked" else "dense"
    config = actor_config("vanilla" if args.child == "vanilla" else "troll", lm_head)
    tu.assign_non_tensor(micro, troll_logits=args.child != "vanilla", troll_lm_head=lm_head)
    exact = reset_peak()
    base = status_kb("VmRSS")
    times, peak, loss = [], None, None
    for i in range(args.repeats + 1):
        hidden.grad = model.lm_head.weight.grad = None
        t0 = time.perf_counter()
        if lm_head == "chunked":
            output = types.SimpleNamespace(
                logits=model.lm_head(hidden[-1:]).unsqueeze(0), hidden_states=(hidden.unsqueeze(0),)
            )
        else:
            output = types.SimpleNamespace(logits=model.lm_head(hidden).unsqueeze(0))
        model_output = engine.prepare_model_outputs(output, output_args, micro, None)
        loss, metrics = troll_ppo_loss(config, model_output, micro)
        loss.backward()
        del output, model_output
        elapsed = time.perf_counter() - t0
        if i == 0:
            peak = status_kb("VmHWM")
        else:
            times.append(elapsed)
    assert engine._troll_last_path == (None if args.child == "vanilla" else lm_head)
    kept = float(micro["troll_old_mask"].values().sum(-1).float().mean())
    result = {"peak_mb": (peak - base) / 1024, "times": times, "loss": float(loss), "exact": exact, "kept": kept}
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--response", type=int, default=384)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds over the methods")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "verl_head.csv")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 x (64 + 192) tokens, 1 round x 1 repeat")
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        args.batch, args.prompt, args.response, args.repeats, args.rounds = 1, 64, 192, 1, 1
        args.out = quick_path(args.out) if args.out == Path(__file__).parent / "results" / "verl_head.csv" else args.out
    runs = {m: [] for m in METHODS}
    for _ in range(args.rounds):
        for method in METHODS:
            opts = [f"--{k}={getattr(args, k)}" for k in ("batch", "prompt", "response", "hidden", "vocab")]
            opts += [f"--{k}={getattr(args, k)}" for k in ("repeats", "threads", "seed")]
            proc = subprocess.run(
                [sys.executable, __file__, "--child", method, *opts], capture_output=True, text=True, env=os.environ
            )
            if proc.returncode != 0:
                sys.exit(f"{method} failed:\n{proc.stderr[-3000:]}")
            runs[method].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base_time = statistics.median(t for r in runs["vanilla"] for t in r["times"])
    base_peak = statistics.median(r["peak_mb"] for r in runs["vanilla"])
    rows = []
    for method, results in runs.items():
        time_s = statistics.median(t for r in results for t in r["times"])
        peak = statistics.median(r["peak_mb"] for r in results)
        rows.append(
            {
                "method": method,
                "tokens": args.batch * (args.prompt + args.response),
                "H": args.hidden,
                "V": args.vocab,
                "time_s": round(time_s, 3),
                "time_vs_vanilla": round(time_s / base_time, 2),
                "peak_mb": round(peak, 1),
                "peak_vs_vanilla": round(peak / base_peak, 2),
                "old_kept_mean": round(results[0]["kept"], 1),
                "loss": f"{results[0]['loss']:.6g}",
            }
        )
    header = (
        f"verl update micro-batch after the backbone ({args.batch} x ({args.prompt} + {args.response}) tokens, "
        f"H={args.hidden}, V={args.vocab}, fp32, {args.threads} thread(s), medians of {args.rounds} alternating "
        f"rounds x {args.repeats} repeats; peak = VmHWM - VmRSS of the first run, exact={runs['vanilla'][0]['exact']})"
    )
    write_results(rows, args.out, header)


if __name__ == "__main__":
    main()
