"""Helper of tests/integrations/verl/test_verl_engine.py: TROLL through verl 0.9's real actor (TrainingWorker + FSDP2
engine) on CPU.

Run under torchrun (gloo) with 1 or 2 processes; each process is one verl data-parallel rank, as in a Ray worker
group. Every rank builds verl's ``TrainingWorker`` the way ``ActorRolloutRefWorker.init_model`` does, on a tiny
random Qwen2 saved in MODEL_DIR, after ``troll.integrations.verl.engine.register`` (so the engine is TrollFSDPEngine and
the worker's ``ppo_loss`` is troll's). The CPU platform comes from tests/support/_verl_cpu.py (``VERL_PLATFORM=cpu``).

The trainer side is verl's own: ``TrollRayPPOTrainer`` (troll.integrations.verl.trainer) with the config composed
from verl's ``ppo_trainer.yaml`` and the overrides of docs/verl.md (RECIPE), whose worker group is this process's
worker (``compute_log_prob`` -> ``infer_batch``, ``update_actor`` -> ``train_mini_batch``, as in
``ActorRolloutRefWorker``), wrapped by the mixin.

1. compute_log_prob: verl's ``RayPPOTrainer._compute_old_log_prob`` on the rank's share of a left/right-padded
   DataProto, through the mixin; the captured old policy is compared with ``troll.sparsify`` of an unsharded copy's
   own logits at the rollout temperature (ids, log-probs, the sampled token kept).
2. update_policy: verl's ``RayPPOTrainer._update_actor`` twice (two PPO epochs over one rollout batch: the first
   on-policy, the second off-policy, so the projection engages) with SGD (no momentum, no weight decay, no
   clipping), so that the step is ``-lr * grad`` and the gathered parameter change gives verl's gradient. The
   reference is ``troll.troll_loss`` on the unsharded copy, over the whole global batch, with the same stored old
   policy.
3. verl's KL-to-reference loss (low_var_kl) and entropy bonus added to TROLL, against the same terms written out.
4. a stock loss mode ("vanilla") through TrollFSDPEngine and troll's ``ppo_loss`` against a second worker on verl's
   own FSDPEngineWithLMHead and ``verl.workers.utils.losses.ppo_loss``, from the same weights.

Rank 0 writes the measured deviations to OUT/result-<LM_HEAD>.json. Usage:
torchrun --standalone --nproc_per_node N tests/support/_torchrun_verl_engine.py MODEL_DIR OUT LM_HEADS
(LM_HEADS: "chunked", "dense" or both, comma-separated: the actor's troll.lm_head, one after the other)
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VERL_PLATFORM", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _verl_cpu  # noqa: E402  (registers the CPU platform before verl resolves it)
from tensordict import TensorDict  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.model import compute_position_id_with_mask  # noqa: E402
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig  # noqa: E402
from verl.workers.engine.base import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402
from verl.workers.utils.losses import ppo_loss as verl_ppo_loss  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from troll import sparsify, troll_loss  # noqa: E402
from troll.integrations.verl.engine import register  # noqa: E402
from troll.integrations.verl.loss import old_policy_from_batch, troll_ppo_loss  # noqa: E402
from troll.integrations.verl.main import check_config  # noqa: E402
from troll.integrations.verl.trainer import TrollRayPPOTrainer  # noqa: E402

TEMPERATURE, LR = 0.7, 0.5
TROLL = {"kl_bound": 0.002, "alpha": 1.0, "top_k": 6, "delta": 1e-3}
PROMPT_LENS, RESPONSE_LENS = [5, 3, 4, 2], [6, 2, 4, 5]
P, R = max(PROMPT_LENS), max(RESPONSE_LENS)


def training_worker(model_dir: str):
    """verl's TrainingWorker for the actor, built the way ActorRolloutRefWorker.init_model builds it (fp32, SGD)."""
    import verl.workers.engine_workers as engine_workers

    model_config = HFModelConfig(
        path=model_dir, use_remove_padding=True, override_config={"attn_implementation": "sdpa"}
    )
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",
        forward_only=False,
        use_remove_padding=True,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=1,
        infer_micro_batch_size_per_gpu=1,
        mixed_precision=fp32,
        use_torch_compile=False,
    )
    optim = FSDPOptimizerConfig(lr=LR, optimizer="SGD", weight_decay=0.0, clip_grad=1e9)
    config = engine_workers.TrainingWorkerConfig(
        model_type="language_model",
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optim,
        checkpoint_config=None,
    )
    worker = engine_workers.TrainingWorker(config)
    worker.reset()
    return worker


def full_state(worker) -> dict[str, torch.Tensor]:
    """The worker's parameters, gathered from their FSDP2 shards (a collective: every rank calls it)."""
    state = worker.engine.module.state_dict()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}


def global_batch(vocab: int) -> dict[str, torch.Tensor]:
    """A rollout batch as verl's trainer holds it: prompts left-padded, responses right-padded."""
    g = torch.Generator().manual_seed(0)
    bsz = len(PROMPT_LENS)
    prompts, responses = torch.zeros(bsz, P, dtype=torch.long), torch.zeros(bsz, R, dtype=torch.long)
    attention = torch.zeros(bsz, P + R, dtype=torch.long)
    for b, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        prompts[b, P - p :] = torch.randint(4, vocab, (p,), generator=g)
        responses[b, :r] = torch.randint(4, vocab, (r,), generator=g)
        attention[b, P - p : P + r] = 1
    response_mask = attention[:, P:].clone()
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention,
        "position_ids": compute_position_id_with_mask(attention),
        "response_mask": response_mask,
        "advantages": torch.randn(bsz, R, generator=g) * response_mask,
    }


def no_padding(batch: dict, rows: slice, **extra) -> TensorDict:
    """This rank's share of the batch in verl's no-padding layout (the trainer's left_right_2_no_padding)."""
    td = TensorDict({k: v[rows] for k, v in {**batch, **extra}.items()}, batch_size=[batch["prompts"][rows].shape[0]])
    return left_right_2_no_padding(td)


def reference_logits(model, batch: dict) -> torch.Tensor:
    """(B, R, V) logits / temperature at the positions that predict each response token, zero after a response."""
    rows = []
    for b in range(batch["prompts"].shape[0]):
        seq = batch["input_ids"][b][batch["attention_mask"][b].bool()]
        logits = model(input_ids=seq.unsqueeze(0)).logits[0] / TEMPERATURE
        rows.append(logits[PROMPT_LENS[b] - 1 : PROMPT_LENS[b] - 1 + RESPONSE_LENS[b]])
    return torch.stack([torch.nn.functional.pad(r, (0, 0, 0, R - r.shape[0])) for r in rows])


def update_batch(batch: dict, rows: slice, old_global: dict) -> TensorDict:
    """This rank's share of an update batch (no-padding layout), flagged as RayPPOTrainer._update_actor flags it."""
    bsz = batch["prompts"].shape[0]
    td = no_padding(batch, rows, **old_global)
    tu.assign_non_tensor(
        td,
        calculate_entropy=False,
        global_batch_size=bsz,
        mini_batch_size=bsz,
        epochs=1,
        seed=1,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
        temperature=TEMPERATURE,
    )
    return td


def overrides_for(model_dir: str, lm_head: str) -> list[str]:
    """The recipe with this test's settings and sizes (one mini-batch of the 4 sequences, one PPO epoch per call)."""
    troll = [f"+actor_rollout_ref.actor.troll.{k}={v}" for k, v in {**TROLL, "lm_head": lm_head}.items()]
    return [
        *[o for o in _verl_cpu.RECIPE if not o.startswith("+actor_rollout_ref.actor.troll.")],
        *troll,
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={len(PROMPT_LENS)}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.shuffle=False",
        "actor_rollout_ref.rollout.n=1",
        f"actor_rollout_ref.rollout.temperature={TEMPERATURE}",
    ]


def trainer_for(worker, config):
    """TrollRayPPOTrainer without Ray: its worker group is the worker itself, as ActorRolloutRefWorker wires it."""

    class Group:
        compute_log_prob = staticmethod(worker.infer_batch)
        update_actor = staticmethod(worker.train_mini_batch)

    trainer = object.__new__(TrollRayPPOTrainer)  # __init__ builds Ray pools, datasets and rollout managers
    trainer.config = config
    trainer.actor_rollout_wg = Group()
    trainer._troll_wrap_workers()  # what the mixin's init_workers does after verl's
    return trainer


def capture_check(old: dict, logits: torch.Tensor, batch: dict, rows: slice) -> dict:
    mismatched, worst, sampled_missing = 0, 0.0, 0
    for i, b in enumerate(range(len(PROMPT_LENS))[rows]):
        n = RESPONSE_LENS[b]
        want = sparsify(logits[b, :n], top_k=TROLL["top_k"], delta=TROLL["delta"], include=batch["responses"][b, :n])
        full = torch.log_softmax(logits[b, :n], -1)
        for j in range(n):
            keep = old["troll_old_mask"][i, j].bool()
            ids = old["troll_old_ids"][i, j][keep]
            mismatched += sorted(ids.tolist()) != sorted(want.ids[j][want.mask[j]].tolist())
            sampled_missing += int(batch["responses"][b, j] not in ids)
            worst = max(worst, (old["troll_old_logp"][i, j][keep] - full[j, ids]).abs().max().item())
            worst = max(worst, abs(old["old_log_probs"][i, j].item() - full[j, batch["responses"][b, j]].item()))
    return {"rows_mismatched": mismatched, "logp_max_abs": worst, "sampled_missing": sampled_missing}


def _trainer_update(trainer, batch) -> dict:
    """verl's RayPPOTrainer._update_actor (through the mixin); the metrics it would log."""
    return trainer._update_actor(batch).meta_info["metrics"]


def gather_rows(local: dict) -> dict:
    """Every rank's rows of ``local`` (B_local, ...) tensors, in rank order."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    return {k: torch.cat([p[k] for p in parts]) for k in local}


def measure(model_dir: str, lm_head: str, rank: int, world: int) -> dict:
    """Steps 1-4 above with the actor's ``troll.lm_head=lm_head``; the result rank 0 writes."""
    import verl.workers.engine_workers as engine_workers
    from verl import DataProto
    from verl.utils.config import omega_conf_to_dataclass

    register(devices=("cpu",))  # again for each head: step 4 puts verl's own engine in the table
    assert engine_workers.ppo_loss is troll_ppo_loss
    config = _verl_cpu.compose(overrides_for(model_dir, lm_head))
    settings = check_config(config)
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)  # as ActorRolloutRefWorker.init_model
    worker = training_worker(model_dir)
    worker.set_loss_fn(partial(engine_workers.ppo_loss, config=actor_config))  # what init_model installs
    trainer = trainer_for(worker, config)
    result = {"engine": type(worker.engine).__name__, "world": world, "actor_config": type(actor_config).__name__}
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch = global_batch(reference.config.vocab_size)
    share = len(PROMPT_LENS) // world
    rows = slice(rank * share, (rank + 1) * share)
    # meta_info as RayPPOTrainer.fit sets it after the rollout
    tokens = batch["attention_mask"][rows].sum(-1).tolist()
    meta = {"temperature": TEMPERATURE, "global_token_num": tokens}
    local = DataProto.from_single_dict({k: v[rows] for k, v in batch.items()}, meta_info=meta)

    # 1. compute_log_prob through verl's _compute_old_log_prob and the mixin
    old_proto, _ = trainer._compute_old_log_prob(local)
    result["paths"] = {"capture": worker.engine._troll_last_path}
    old_local = {k: old_proto.batch[k] for k in old_proto.batch.keys() if k.startswith("troll_old_")}
    old_local["old_log_probs"] = old_proto.batch["old_log_probs"]
    with torch.no_grad():
        logits0 = reference_logits(reference, batch)
    capture = capture_check(old_local, logits0, batch, rows)
    caps = [None] * world
    dist.all_gather_object(caps, capture)
    result["capture"] = {
        "rows_mismatched": sum(c["rows_mismatched"] for c in caps),
        "sampled_missing": sum(c["sampled_missing"] for c in caps),
        "logp_max_abs": max(c["logp_max_abs"] for c in caps),
        "fields": sorted(old_proto.batch.keys()),
    }
    old_global = gather_rows(old_local)  # the reference needs the whole batch's old policy

    # 2. update_policy: verl's _update_actor, twice over the same rollout batch, each checked against troll_loss
    local = local.union(old_proto)
    mask = batch["response_mask"].bool()
    old = old_policy_from_batch(old_global, mask)
    steps = []
    for _ in range(2):
        before = full_state(worker)
        reference.load_state_dict(before)
        reference.zero_grad()
        logits = reference_logits(reference, batch)
        ref = troll_loss(logits, old, batch["responses"], batch["advantages"], mask, **settings)
        ref.loss.backward()
        metrics = _trainer_update(trainer, local)
        result["paths"]["update"] = worker.engine._troll_last_path
        after = full_state(worker)
        grads = {k: p.grad for k, p in reference.named_parameters()}
        # norm-wise over all parameters: a norm weight near 1 loses ~1e-7/LR to fp32 rounding of its step
        diff = sum((((before[k] - after[k]) / LR - g) ** 2).sum() for k, g in grads.items()).sqrt()
        rel = (diff / sum((g**2).sum() for g in grads.values()).sqrt()).item()
        steps.append(
            {
                "loss": float(metrics["actor/loss"][0]),
                "loss_ref": ref.loss.item(),
                "grad_rel": rel,
                "params_changed": sum(int(not torch.equal(before[k], after[k])) for k in before),
                "params": len(before),
                "kl_after_max": max(float(v) for v in metrics["troll/kl_after/max"]),
                "kl_before_max": max(float(v) for v in metrics["troll/kl_before/max"]),
                "projected_frac": max(float(v) for v in metrics["troll/projected_frac"]),
                "ref_kl_after_max": ref.metrics["kl_after/max"].item(),
                "metric_keys": sorted(metrics),
            }
        )
    result["update"] = steps

    # 2b. verl's KL-to-reference loss and entropy bonus on top of TROLL, as ppo_loss adds them. The chunked head
    # gives the KL loss's log-probs with their gradient; an entropy bonus needs the dense one (the mixin falls back
    # with a warning), so the chunked run checks the KL loss alone.
    coef = 0.01 if lm_head == "dense" else 0.0
    extras = {"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl", "entropy_coeff": coef}
    extra_overrides = [f"actor_rollout_ref.actor.{k}={v}" for k, v in extras.items()]
    config_extra = _verl_cpu.compose(overrides_for(model_dir, lm_head) + extra_overrides)
    worker_extra = training_worker(model_dir)
    actor_extra = omega_conf_to_dataclass(config_extra.actor_rollout_ref.actor)
    worker_extra.set_loss_fn(partial(engine_workers.ppo_loss, config=actor_extra))
    g = torch.Generator().manual_seed(5)
    ref_logp = old_global["old_log_probs"] + 0.3 * torch.randn(old_global["old_log_probs"].shape, generator=g)
    local_extra = local.union(DataProto.from_single_dict({"ref_log_prob": ref_logp[rows]}))
    before = full_state(worker_extra)
    reference.load_state_dict(before)
    reference.zero_grad()
    logits = reference_logits(reference, batch)
    ref = troll_loss(logits, old, batch["responses"], batch["advantages"], mask, **settings)
    full = torch.log_softmax(logits, -1)
    logp = full.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(full.exp() * full).sum(-1)
    kl = (ref_logp - logp).clamp(-20, 20)
    kld = (kl.exp() - kl - 1).clamp(-10, 10)  # verl's low_var_kl (k3), written out
    token_mean = lambda x: (x * mask).sum() / mask.sum()  # noqa: E731
    total = ref.loss + 0.1 * token_mean(kld) - coef * token_mean(entropy)
    total.backward()
    metrics = _trainer_update(trainer_for(worker_extra, config_extra), local_extra)
    result["paths"]["extras"] = worker_extra.engine._troll_last_path
    after = full_state(worker_extra)
    grads = {k: p.grad for k, p in reference.named_parameters()}
    diff = sum((((before[k] - after[k]) / LR - g) ** 2).sum() for k, g in grads.items()).sqrt()
    result["extras"] = {
        "loss": float(metrics["actor/loss"][0]),
        "loss_ref": total.item(),
        "kl_loss": float(metrics["actor/kl_loss"][0]) if "actor/kl_loss" in metrics else None,
        "kl_loss_ref": token_mean(kld).item(),
        "entropy_loss": float(metrics["actor/entropy_loss"][0]) if "actor/entropy_loss" in metrics else None,
        "entropy_loss_ref": token_mean(entropy).item(),
        "grad_rel": (diff / sum((g**2).sum() for g in grads.values()).sqrt()).item(),
    }

    result["stock"] = stock_check(model_dir, batch, rows, old_global)
    return result


def stock_check(model_dir: str, batch: dict, rows: slice, old_global: dict) -> dict:
    """Step 4: a stock loss mode through troll's engine and loss equals verl's own engine and ppo_loss."""
    import verl.workers.engine_workers as engine_workers

    vanilla = _verl_cpu.actor_config("vanilla", TROLL)
    stock_td = lambda: update_batch(batch, rows, old_global)  # noqa: E731
    ours = training_worker(model_dir)
    ours.set_loss_fn(partial(engine_workers.ppo_loss, config=vanilla))
    table = EngineRegistry._engines["language_model"]
    for backend in ("fsdp", "fsdp2"):
        table[backend]["cpu"] = FSDPEngineWithLMHead
    stock = training_worker(model_dir)
    stock.set_loss_fn(partial(verl_ppo_loss, config=vanilla))
    got, want = ours.train_mini_batch(stock_td()), stock.train_mini_batch(stock_td())
    got_m, want_m = tu.get(got, "metrics"), tu.get(want, "metrics")
    got_state, want_state = full_state(ours), full_state(stock)
    return {
        "engines": [type(ours.engine).__name__, type(stock.engine).__name__],
        "loss": [float(got_m["loss"][0]), float(want_m["loss"][0])],
        "params_equal": all(torch.equal(got_state[k], want_state[k]) for k in want_state),
        "troll_metrics": sorted(k for k in got_m if k.startswith("troll/")),
    }


def main() -> None:
    model_dir, out_dir, heads = sys.argv[1], Path(sys.argv[2]), sys.argv[3].split(",")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for lm_head in heads:  # one launch for both heads: each rank's start-up (verl's import) is most of its time
        result = measure(model_dir, lm_head, rank, world)
        if rank == 0:
            (out_dir / f"result-{lm_head}.json").write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    # Leave without the interpreter's finalization: everything this script checks is written by now. A rank of this
    # script has aborted once in about 40 launches ("terminate called without an active exception", SIGABRT), which is
    # how Gloo's worker threads fail when tensors they still hold are freed while the interpreter is torn down.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
