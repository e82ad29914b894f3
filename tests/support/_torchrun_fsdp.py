"""Helper of tests/categorical/test_distributed.py: the chunked TROLL loss under FSDP2 (fully_shard), run under
torchrun.

Every process builds the same tiny fp64 Llama, captures the old policy of a fixed global batch of 4 sequences,
perturbs the weights (so the projection engages), and keeps an unsharded copy as the reference. Then it shards the
model with fully_shard (each decoder layer, the LM head as its own unit, the root), runs the model's own forward on
its share of the batch, gathers the head with troll.categorical.distributed.gather_lm_head and computes
troll_loss_from_hidden with chunks that cross the vocabulary (C = 64 of ~300 ids). The reference is the dense
troll.troll_loss on the unsharded copy's full logits, one share at a time, in this same process. Rank 0 writes
the largest deviations (loss, hidden gradient, every parameter's gathered gradient) to OUT/result.pt.
Usage: torchrun --standalone --nproc_per_node 2 tests/support/_torchrun_fsdp.py OUT
"""

from __future__ import annotations

import copy
import faulthandler
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny import tiny_model, tiny_tokenizer  # noqa: E402

from troll import sparsify, troll_loss, troll_loss_from_hidden  # noqa: E402
from troll.categorical.distributed import gather_lm_head, is_dtensor  # noqa: E402

GLOBAL_BATCH, SEQ = 4, 8
LOSS = dict(kl_bound=1e-3, top_k=16, delta=1e-4)


def fixed_batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (GLOBAL_BATCH, SEQ), generator=g)
    mask = (torch.arange(SEQ - 1) < torch.tensor([7, 3, 5, 6])[:, None]).long()
    return ids, mask, torch.randn(GLOBAL_BATCH, generator=g, dtype=torch.float64)


def dense(model, ids, old, mask, adv):
    """(loss, hidden (B, T, H) with retained grad): the one-process dense path on full fp64 logits."""
    out = model(input_ids=ids, output_hidden_states=True)
    hidden = out.hidden_states[-1][:, :-1]
    hidden.retain_grad()
    logits = hidden @ model.lm_head.weight.T
    return troll_loss(logits, old, ids[:, 1:], adv, mask, **LOSS), hidden


def main(out: Path) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "ready").touch()
    model = tiny_model(tiny_tokenizer(), dtype=torch.float64)
    ids, mask, adv = fixed_batch(model.config.vocab_size)
    with torch.no_grad():
        old = sparsify(model(input_ids=ids).logits[:, :-1], include=ids[:, 1:], top_k=16, delta=1e-4)
        g = torch.Generator().manual_seed(1)
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=g, dtype=param.dtype))
    ref = copy.deepcopy(model)
    share = GLOBAL_BATCH // world
    parts = [slice(r * share, (r + 1) * share) for r in range(world)]
    ref_losses, ref_hidden = [], []
    for s in parts:  # the mean over ranks of each share's loss: what FSDP's averaged gradients optimise
        loss, hidden = dense(ref, ids[s], old[s], mask[s], adv[s])
        (loss.loss / world).backward()
        ref_losses.append(loss)
        ref_hidden.append(hidden.grad * world)

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model.lm_head)
    fully_shard(model)
    mine = parts[rank]
    hidden = model(input_ids=ids[mine], output_hidden_states=True, logits_to_keep=1).hidden_states[-1][:, :-1]
    hidden.retain_grad()
    assert is_dtensor(model.lm_head.weight)  # resharded after its forward: the case the gather exists for
    weight, bias = gather_lm_head(model.lm_head.weight, model.lm_head.bias)
    tokens = ids[mine, 1:]
    loss = troll_loss_from_hidden(hidden, weight, old[mine], tokens, adv[mine], mask[mine], chunk_size=64, **LOSS)
    loss.loss.backward()

    result = {
        "loss": (loss.loss - ref_losses[rank].loss).abs(),
        "hidden": (hidden.grad - ref_hidden[rank]).abs().max(),
        "projected_frac": ref_losses[rank].metrics["projected_frac"],
    }
    for (name, param), (_, ref_param) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        grad = param.grad.full_tensor()  # a collective: every rank takes part
        result[f"grad/{name}"] = (grad - ref_param.grad).abs().max() / ref_param.grad.abs().max().clamp_min(1e-12)
        result[f"size/{name}"] = ref_param.grad.abs().max()  # the comparison is not vacuous
    result = {key: value.detach().reshape(1).double() for key, value in result.items()}
    for value in result.values():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    if rank == 0:
        torch.save(result, out / "result.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    # Never outlive the test: a hung collective dumps the stacks and exits.
    faulthandler.dump_traceback_later(float(os.environ.get("TROLL_TORCHRUN_TIMEOUT", "120")), exit=True)
    main(Path(sys.argv[1]))
    # With DeepSpeed installed (transformers and accelerate import it), the interpreter's exit can abort in native
    # code ("terminate called without an active exception") after all the work is done: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
