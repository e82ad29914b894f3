"""Helper of tests/categorical/test_distributed.py: TrollGRPOTrainer under DeepSpeed ZeRO-3, run by torchrun (2 CPU
processes, gloo).

accelerate runs DeepSpeed on CPU once its state is built with the gloo backend before the trainer's (the trainer
is told to use that configured state); DeepSpeed then partitions every parameter (persistence threshold 0, so the
LM head too). Inside the trainer's ``train()`` (a callback at on_train_begin, when the DeepSpeed engine exists)
this checks, on a fixed batch whose old policy comes from a perturbed copy of the weights:

- the LM-head path stays "chunked" (no fallback warning) and the head's weight is a released ZeRO-3 partition;
- the old policy captured under ZeRO-3, separately and on TRL's own scoring forward (the backbone hook), equals
  the one of an unsharded copy of the model in this process;
- for "troll" and "troll_seq", the chunked loss of each rank's share equals the dense loss of the unsharded copy,
  and every parameter's full gradient (DeepSpeed's mean over ranks) equals the mean over the ranks' shares of the
  copy's dense gradients; the ZeRO-3 dense path is compared too;
- after the backward the head's weight is released again (the full copy does not outlive the loss).

Then train() runs its one real step (capture on the scoring forward, chunked loss, optimiser step). Rank 0 writes
the deviations to OUT/result.pt. Usage: torchrun --nproc_per_node 2 THIS OUT [--tied]
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _torchrun_trl import GLOBAL_BATCH, fixed_batch  # noqa: E402
from tiny import reward_letter_a, tiny_dataset, tiny_model, tiny_tokenizer  # noqa: E402

from troll import sparsify  # noqa: E402
from troll.categorical.distributed import with_lm_head  # noqa: E402
from troll.categorical.sparse import cat_sparse  # noqa: E402
from troll.integrations import hf  # noqa: E402
from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer  # noqa: E402

DEEPSPEED = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "bf16": {"enabled": False},
    "fp16": {"enabled": False},
}


def reference_old(model, batch, tr) -> dict[str, torch.Tensor]:
    """The old policy of ``batch`` from an unsharded ``model``: its full logits, sparsified (the dense rule)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = hf.completion_logits(model, ids, mask, batch["completion_ids"].size(1), tr.temperature)
        return sparsify(logits, include=batch["completion_ids"], **tr._troll_kept()).to_dict()


def old_deviation(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    assert torch.equal(a["troll_old_ids"], b["troll_old_ids"]) and torch.equal(a["troll_old_mask"], b["troll_old_mask"])
    deviations = []
    for key in ("troll_old_logp", "troll_old_log_rest"):
        x, y = a[key].double(), b[key].double()
        deviations.append(float(torch.where(x == y, 0.0, (x - y).abs()).max()))  # equal infinities agree
    return max(deviations)


class Checks(TrainerCallback):
    """Run at on_train_begin: the comparisons of the module docstring, into ``self.result``."""

    def __init__(self, tr, tok, world: int, rank: int, tied: bool):
        self.tr, self.world, self.rank = tr, world, rank
        # Fresh models loaded with the trainer's weights (a deepcopy would keep forward wrappers that call the
        # original): unsharded, the same initial weights on every rank, and a perturbed "pre-update" copy.
        self.reference, self.old_model = tiny_model(tok, tied=tied), tiny_model(tok, tied=tied)
        for model in (self.reference, self.old_model):
            model.load_state_dict(tr.model.state_dict())
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for param in self.old_model.parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=g))
        self.result: dict[str, torch.Tensor] = {}
        self.batch, _ = fixed_batch(tok, rank, world)
        self.expected_old = reference_old(self.reference, self.batch, tr)
        self.batch_with_old = {**self.batch, **reference_old(self.old_model, self.batch, tr)}
        share = GLOBAL_BATCH // world
        self.shares = [
            {k: v[r * share : (r + 1) * share] if v.dim() > 0 else v for k, v in self.batch_with_old.items()}
            for r in range(world)
        ]
        # The reference, computed before DeepSpeed starts (its backward hooks would see any later backward): the
        # unsharded copy, dense head, each rank's share; ZeRO-3 averages the gradients over ranks.
        tr.current_gradient_accumulation_steps = 1
        tr._troll_head_mode = "dense"
        self.ref_losses, self.ref_grads = {}, {}
        for loss_type in ("troll", "troll_seq"):
            tr.loss_type = loss_type
            self.reference.zero_grad()
            losses = [tr.compute_loss(self.reference, share) for share in self.shares]
            torch.stack(losses).mean().backward()
            self.ref_losses[loss_type] = losses[rank].detach()
            self.ref_grads[loss_type] = {n: p.grad.clone() for n, p in self.reference.named_parameters()}
        tr._troll_head_mode, tr.loss_type = None, "troll"
        tr._metrics["train"].clear()

    def on_train_begin(self, args, state, control, **kwargs):
        import deepspeed
        from deepspeed.utils import safe_get_full_grad

        tr, engine = self.tr, self.tr.model_wrapped
        assert isinstance(engine, deepspeed.DeepSpeedEngine), type(engine)
        head = tr.model.lm_head
        assert head.weight.ds_status.name == "NOT_AVAILABLE" and head.weight.numel() == 0, "not partitioned"
        tr._troll_head_mode = None
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*falls back")  # a fallback to dense would warn
            assert tr.troll_lm_head == "chunked"

        batch, expected = self.batch, self.expected_old
        captured = tr._troll_capture_old(batch).to_dict()
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        tr._troll_pending = []
        with torch.no_grad():
            tr._get_per_token_logps_and_entropies(engine, ids, mask, batch["completion_ids"].size(1), batch_size=4)
        hooked, tr._troll_pending = cat_sparse(tr._troll_pending).to_dict(), None
        result = self.result
        result["capture"] = torch.tensor([old_deviation(captured, expected)], dtype=torch.float64)
        result["hook_capture"] = torch.tensor([old_deviation(hooked, expected)], dtype=torch.float64)

        tr.current_gradient_accumulation_steps = 1
        for loss_type in ("troll", "troll_seq"):
            tr.loss_type = loss_type
            ref_grads = self.ref_grads[loss_type]
            for mode in ("chunked", "dense"):
                tr._troll_head_mode = mode
                loss = tr.compute_loss(engine, self.shares[self.rank])
                engine.backward(loss)
                key = f"{loss_type}/{mode}"
                result[f"{key}/loss"] = (loss.detach() - self.ref_losses[loss_type]).abs().reshape(1).double()
                result[f"{key}/loss_size"] = self.ref_losses[loss_type].abs().reshape(1).double()
                # The full weight gathered for the loss is released after the backward, as after a forward.
                result[f"{key}/head_held"] = torch.tensor([float(head.weight.numel() != 0)], dtype=torch.float64)
                for name, param in engine.module.named_parameters():
                    grad = safe_get_full_grad(param)
                    deviation = (grad - ref_grads[name]).abs().max() / ref_grads[name].abs().max().clamp_min(1e-12)
                    result[f"{key}/grad/{name}"] = deviation.reshape(1).double()
                    result[f"size/{name}"] = ref_grads[name].abs().max().reshape(1).double()
                engine.optimizer.zero_grad()
            result[f"{loss_type}/projected_frac"] = torch.tensor(
                [tr._metrics["train"]["troll/projected_frac"][-1]], dtype=torch.float64
            )
        tr._troll_head_mode = None
        tr._metrics["train"].clear()
        tr.loss_type = "troll"

        # with_lm_head returning a plain tensor that needs a gradient (not a LossOutput): its backward must reach the
        # partitioned weight, gathered again, as the loss's does. The same input on every rank, so the mean over
        # ranks is the one-process gradient 2 (h W.T).T h of sum((h W.T)^2).
        hidden = torch.randn(3, head.weight.ds_shape[1], generator=torch.Generator().manual_seed(2))
        logits = with_lm_head(head, lambda w, b, h: h @ w.T, hidden)
        engine.backward(logits.square().sum())
        full = self.reference.lm_head.weight.detach()
        expected = 2 * (hidden @ full.T).T @ hidden
        grad = safe_get_full_grad(head.weight)
        result["tensor_result/logits"] = ((logits.detach() - hidden @ full.T).abs().max()).reshape(1).double()
        result["tensor_result/grad"] = ((grad - expected).abs().max() / expected.abs().max()).reshape(1).double()
        result["tensor_result/head_held"] = torch.tensor([float(head.weight.numel() != 0)], dtype=torch.float64)
        engine.optimizer.zero_grad()


def main(out: Path, tied: bool) -> None:
    torch.set_num_threads(1)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    # accelerate picks no backend for DeepSpeed on a machine without GPUs; the trainer takes this state instead.
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    # DeepSpeed's CPU backend compiles a shared-memory kernel at start-up (a C++ build of minutes on a busy 2-core
    # machine, in every fresh environment) that only its inference_all_reduce uses; training reduces through
    # torch.distributed (gloo here) either way, so the build is skipped.
    ds_torch = importlib.import_module("deepspeed.comm.torch")  # the submodule (the package's .torch is torch)
    assert callable(ds_torch.build_shm_op), "DeepSpeed's start-up moved: revisit this helper"
    ds_torch.build_shm_op = lambda: None
    from accelerate import PartialState

    PartialState(backend="gloo")
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "ready").touch()
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
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        accelerator_config={"use_configured_state": True},
        deepspeed=DEEPSPEED,
    )
    tok = tiny_tokenizer()
    tr = TrollGRPOTrainer(
        model=tiny_model(tok, tied=tied),
        reward_funcs=reward_letter_a,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tok,
    )
    checks = Checks(tr, tok, world, rank, tied)
    tr.add_callback(checks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr.train()
    result = checks.result
    result["fallback_warnings"] = torch.tensor([float(sum("falls back" in str(w.message) for w in caught))])
    logs = [entry for entry in tr.state.log_history if "troll/kl_after/max" in entry]
    result["train_steps_logged"] = torch.tensor([float(len(logs))])
    result["train_kl_after_max"] = torch.tensor([logs[-1]["troll/kl_after/max"] if logs else float("nan")])
    for value in result.values():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    if rank == 0:
        torch.save(result, out / "result.pt")


if __name__ == "__main__":
    faulthandler.dump_traceback_later(float(os.environ.get("TROLL_TORCHRUN_TIMEOUT", "240")), exit=True)
    main(Path(sys.argv[1]), "--tied" in sys.argv[2:])
    # With DeepSpeed installed (transformers and accelerate import it), the interpreter's exit can abort in native
    # code ("terminate called without an active exception") after all the work is done: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
