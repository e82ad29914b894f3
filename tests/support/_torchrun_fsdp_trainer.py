"""Helper of tests/categorical/test_distributed.py: TrollGRPOTrainer's loss on a model sharded by FSDP2, run under
torchrun (gloo, CPU).

accelerate does not apply its FSDP plugin on CPU (AcceleratorState switches to DistributedType.FSDP only for
multi-GPU-like device types; on MULTI_CPU the plugin is ignored and train() wraps the model in DDP), so the model is
sharded here with fully_shard (each decoder layer, the LM head, the root) and the trainer's own methods run on it:
the LM-head path resolves to "chunked" without a fallback warning, the old policy is captured through the gathered
head, and on a fixed batch the chunked loss and gradients (gathered from the shards) equal the dense path's on the
same FSDP2 model. Rank 0 writes the deviations to OUT/result.pt. Usage: torchrun --nproc_per_node 2 THIS OUT
"""

from __future__ import annotations

import faulthandler
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.tensor import distribute_tensor  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _torchrun_trl import fixed_batch, make_trainer  # noqa: E402

from troll.categorical.sparse import cat_sparse  # noqa: E402


def loss_and_grads(tr, batch, mode):
    tr.args.troll_lm_head, tr._troll_head_mode = mode, None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to dense would warn
        assert tr.troll_lm_head == mode
    # The probe's no-grad forward leaves the root unsharded; zero_grad must then see the sharded parameters (in
    # training the trainer zeroes after the optimiser step, when the root is resharded).
    tr.model.reshard()
    tr.model.zero_grad()
    loss = tr.compute_loss(tr.model, batch)
    loss.backward()
    grads = {
        n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for n, p in tr.model.named_parameters()
    }
    return loss.detach(), grads


def main(out: Path) -> None:
    torch.set_num_threads(1)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "ready").touch()
    tr, tok = make_trainer(out, world)
    from torch.distributed.fsdp import fully_shard

    for layer in tr.model.model.layers:
        fully_shard(layer)
    fully_shard(tr.model.lm_head)
    fully_shard(tr.model)
    tr.model.train()
    batch, mine = fixed_batch(tok, rank, world)
    batch.update(tr._troll_capture_old(batch).to_dict())
    assert type(tr.model.lm_head.weight).__name__ == "DTensor"
    # The capture that rides on TRL's own no-grad scoring forward (a hook on the backbone) gathers the sharded
    # head too, and equals the separate capture.
    assert tr.troll_lm_head == "chunked"
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    tr._troll_pending = []
    with torch.no_grad():
        tr._get_per_token_logps_and_entropies(tr.model, ids, mask, batch["completion_ids"].shape[1], batch_size=4)
    hooked, tr._troll_pending = cat_sparse(tr._troll_pending).to_dict(), None
    hook_dev = max(float((hooked[k].double() - batch[k].double()).abs().max()) for k in hooked)
    tr.model.reshard()  # the root stays unsharded after its forward; perturb the shards, the source of truth
    with torch.no_grad():  # move away from the old policy (same noise on every rank, each adds its shard)
        g = torch.Generator().manual_seed(1)
        for param in tr.model.parameters():
            noise = 0.05 * torch.randn(param.shape, generator=g)
            param.add_(distribute_tensor(noise, param.device_mesh, param.placements))
    local = {k: v[mine] if v.dim() > 0 else v for k, v in batch.items()}
    tr.current_gradient_accumulation_steps = 1
    tr.loss_type = "troll"
    chunk_loss, chunk_grads = loss_and_grads(tr, local, "chunked")
    dense_loss, dense_grads = loss_and_grads(tr, local, "dense")
    result = {"loss": (chunk_loss - dense_loss).abs().reshape(1).double()}
    result["hook_capture"] = torch.tensor([hook_dev], dtype=torch.float64)
    for name, grad in dense_grads.items():
        deviation = (chunk_grads[name] - grad).abs().max() / grad.abs().max().clamp_min(1e-12)
        result[f"grad/{name}"] = deviation.reshape(1).double()
        result[f"size/{name}"] = grad.abs().max().reshape(1).double()  # the comparison is not vacuous
    for value in result.values():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    result["projected_frac"] = torch.tensor([tr._metrics["train"]["troll/projected_frac"][-1]], dtype=torch.float64)
    if rank == 0:
        torch.save(result, out / "result.pt")


if __name__ == "__main__":
    faulthandler.dump_traceback_later(float(os.environ.get("TROLL_TORCHRUN_TIMEOUT", "240")), exit=True)
    main(Path(sys.argv[1]))
    # With DeepSpeed installed (transformers and accelerate import it), the interpreter's exit can abort in native
    # code ("terminate called without an active exception") after all the work is done: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
