"""Helper of tests/integrations/trl/test_trl.py::test_two_processes_match_one: called in-process, or run under torchrun.

Every process builds the same tiny model and the same fixed global batch of 8 sequences, captures the old policy,
perturbs the weights (so the projection engages), then computes the TROLL losses on its share of the batch.
Rank 0 saves the process-mean loss, the process-mean gradients (what DDP applies) and the logged metrics to
OUT/result.pt, which must not depend on the number of processes. Finally one real DDP training step runs.
Usage: torchrun --standalone --nproc_per_node 2 tests/support/_torchrun_trl.py OUT
"""

from __future__ import annotations

import faulthandler
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny import reward_letter_a, tiny_dataset, tiny_model, tiny_tokenizer  # noqa: E402

from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer  # noqa: E402

GLOBAL_BATCH = 8


def fixed_batch(tok, rank: int, world: int) -> tuple[dict, slice]:
    g = torch.Generator().manual_seed(0)
    b, p, t = GLOBAL_BATCH, 5, 6
    prompt_ids = torch.randint(5, len(tok), (b, p), generator=g)
    prompt_mask = torch.ones(b, p, dtype=torch.long)
    prompt_mask[[1, 4], :2] = 0  # left padding
    prompt_ids[prompt_mask == 0] = tok.pad_token_id
    completion_ids = torch.randint(5, len(tok), (b, t), generator=g)
    lengths = torch.tensor([6, 3, 5, 1, 6, 2, 4, 6])
    completion_mask = (torch.arange(t) < lengths[:, None]).long()
    completion_ids[completion_mask == 0] = tok.pad_token_id
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(b, generator=g),
        "num_items_in_batch": completion_mask.sum(),
    }
    share = GLOBAL_BATCH // world
    return batch, slice(rank * share, (rank + 1) * share)


def mean_over_processes(x: torch.Tensor, world: int) -> torch.Tensor:
    x = x.detach().clone()
    if world > 1:
        dist.all_reduce(x)
    return x / world


def make_trainer(out: Path, world: int):
    """(TrollGRPOTrainer, tokenizer): the tiny model, one step, the global batch split over ``world`` processes."""
    args = TrollGRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=GLOBAL_BATCH // world,
        num_generations=4,
        max_completion_length=6,
        steps_per_generation=2,
        max_steps=1,
        learning_rate=1e-2,
        troll_kl_bound=1e-3,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        ddp_backend="gloo" if world > 1 else None,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    tok = tiny_tokenizer()
    tr = TrollGRPOTrainer(
        model=tiny_model(tok),
        reward_funcs=reward_letter_a,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tok,
    )
    return tr, tok


def main(out: Path) -> None:
    torch.set_num_threads(1)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    tr, tok = make_trainer(out, world)
    assert tr.accelerator.num_processes == world
    if world > 1:
        dist.barrier()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "ready").touch()

    batch, mine = fixed_batch(tok, rank, world)
    tr.model.train()
    batch.update(tr._troll_capture_old(batch).to_dict())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in tr.model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=g))
    local = {k: v[mine] if v.dim() > 0 else v for k, v in batch.items()}
    tr.current_gradient_accumulation_steps = 1
    result = {}
    for loss_type in ("troll", "troll_seq"):
        tr.loss_type = loss_type
        tr._metrics["train"].clear()
        tr.model.zero_grad()
        loss = tr.compute_loss(tr.model, local)
        loss.backward()
        result[f"{loss_type}/loss"] = mean_over_processes(loss, world)
        for name, param in tr.model.named_parameters():
            result[f"{loss_type}/grad/{name}"] = mean_over_processes(param.grad, world)
        for key, values in tr._metrics["train"].items():
            result[f"{loss_type}/metric/{key}"] = torch.tensor(values[-1], dtype=torch.float64)
    tr.model.zero_grad()

    tr.train()  # one real step: generation, old-policy capture, DDP backward, metric gathering
    losses = [entry["loss"] for entry in tr.state.log_history if "loss" in entry]
    assert losses and all(math.isfinite(x) for x in losses), losses
    if rank == 0:
        torch.save(result, out / "result.pt")


if __name__ == "__main__":
    # Never outlive the test: a hung collective dumps the stacks and exits.
    faulthandler.dump_traceback_later(float(os.environ.get("TROLL_TORCHRUN_TIMEOUT", "240")), exit=True)
    main(Path(sys.argv[1]))
    # With DeepSpeed installed (transformers and accelerate import it), the interpreter's exit can abort in native
    # code ("terminate called without an active exception") after all the work is done: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
