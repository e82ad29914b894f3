"""The LM head's weight when it is sharded (:mod:`troll.categorical.distributed`). The chunked path under FSDP2
(fully_shard) and under DeepSpeed ZeRO-3, TrollGRPOTrainer's too, run by torchrun with 2 CPU processes (gloo) against
a one-process dense reference (tests/support/_torchrun_fsdp.py, _torchrun_fsdp_trainer.py and
_torchrun_zero3_trainer.py); and in one process the handling of unsharded and ZeRO-3 weights (gather_lm_head,
call_in_forward, with_lm_head)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import SRC, SUPPORT, check_torchrun, run_script, torchrun

from troll.categorical.distributed import (
    call_in_forward,
    full_shape,
    gather_lm_head,
    is_dtensor,
    is_zero3_param,
    with_lm_head,
)
from troll.categorical.sparse import SparseLogProbs
from troll.output import LossOutput


def _two_processes(script: str, args: list[str], *, process_timeout: int, timeout: int) -> dict:
    """``tests/support/<script>`` under torchrun on 2 gloo processes (one thread each, offline), the result.pt it
    leaves in ``args[0]``; skipped where torchrun cannot start its process group, failed on any other error."""
    out = Path(args[0])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.update(OMP_NUM_THREADS="1", TROLL_TORCHRUN_TIMEOUT=str(process_timeout), HF_HUB_OFFLINE="1")
    code, err = run_script([*torchrun(2, out / "torchrun"), str(SUPPORT / script), *args], env, timeout=timeout)
    check_torchrun(code, err, out / "ready")
    return torch.load(out / "result.pt")


# ---------------------------------------------------------------- FSDP2 (fully_shard)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_fsdp2_chunked_matches_dense(tmp_path):
    """fully_shard over 2 processes, the LM head its own (resharded) unit: the chunked loss of each share, the
    hidden states' gradient and every parameter's gathered gradient equal the dense fp64 path in one process."""
    result = _two_processes("_torchrun_fsdp.py", [str(tmp_path)], process_timeout=120, timeout=150)
    assert result["projected_frac"] > 0  # the projection engaged
    assert result["loss"] < 1e-12
    assert result["hidden"] < 1e-12
    grads = [key for key in result if key.startswith("grad/")]
    assert "grad/lm_head.weight" in grads and len(grads) > 10
    for key in grads:
        assert result["size/" + key[5:]] > 1e-5, key  # a gradient that is there to compare
        assert result[key] < 1e-10, (key, float(result[key]))


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_fsdp2_trainer_keeps_chunked(tmp_path):
    """TrollGRPOTrainer on a fully_shard model over 2 processes: "chunked" is kept (no fallback), the old policy is
    captured through the gathered head, and the chunked loss and gradients equal the dense path's (fp32)."""
    pytest.importorskip("trl")
    result = _two_processes("_torchrun_fsdp_trainer.py", [str(tmp_path)], process_timeout=150, timeout=200)
    assert result["projected_frac"] > 0
    assert result["loss"] < 1e-5
    assert result["hook_capture"] < 1e-6  # the capture on TRL's scoring forward gathers the sharded head
    grads = [key for key in result if key.startswith("grad/")]
    assert "grad/lm_head.weight" in grads and "grad/model.embed_tokens.weight" in grads
    for key in grads:
        assert result["size/" + key[5:]] > 1e-5, key
        assert result[key] < 1e-4, (key, float(result[key]))


# ---------------------------------------------------------------- DeepSpeed ZeRO-3


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_zero3_trainer_keeps_chunked(tmp_path, tied):
    """ZeRO-3 partitions every parameter (the LM head too; tied: it is also the input embedding). The trainer keeps
    "chunked" with no fallback warning; the old policy captured through the partitioned head (separately, and on
    TRL's scoring forward) equals an unsharded model's; each rank's chunked loss equals the unsharded dense loss of
    its share, every parameter's full gradient the mean of the shares' dense gradients; the gathered head is
    released after the backward; and a real train() step goes through."""
    pytest.importorskip("trl")
    pytest.importorskip("deepspeed")
    args = [str(tmp_path)] + (["--tied"] if tied else [])
    result = _two_processes("_torchrun_zero3_trainer.py", args, process_timeout=150, timeout=200)
    assert result["fallback_warnings"] == 0
    assert result["capture"] < 1e-5 and result["hook_capture"] < 1e-5
    for loss_type in ("troll", "troll_seq"):
        assert result[f"{loss_type}/projected_frac"] > 0  # the old policy is off: the projection engaged
        for mode in ("chunked", "dense"):
            key = f"{loss_type}/{mode}"
            assert result[f"{key}/loss_size"] > 1e-3
            assert result[f"{key}/loss"] < 1e-6 * result[f"{key}/loss_size"]
            assert result[f"{key}/head_held"] == 0
            grads = [k for k in result if k.startswith(f"{key}/grad/")]
            assert f"{key}/grad/model.embed_tokens.weight" in grads and len(grads) >= 19
            assert tied or f"{key}/grad/lm_head.weight" in grads
            for k in grads:
                assert result["size/" + k[len(key) + 6 :]] > 1e-6, k  # a gradient that is there to compare
                assert result[k] < 2e-6, (k, float(result[k]))
    # A plain tensor result of with_lm_head (not a LossOutput) carries its gradient back to the partition.
    assert result["tensor_result/logits"] < 1e-5 and result["tensor_result/grad"] < 1e-5
    assert result["tensor_result/head_held"] == 0
    assert result["train_steps_logged"] >= 1 and torch.isfinite(result["train_kl_after_max"])
    losses = [float(result[k] / result[k + "_size"]) for k in result if k.endswith("/loss")]
    grads = [float(result[k]) for k in result if "/grad/" in k and not k.startswith("size/")]
    print(  # the figures docs/trl.md quotes (pytest -s)
        f"ZeRO-3 {'tied' if tied else 'untied'} vs one unsharded process: capture max |d log p| "
        f"{float(max(result['capture'], result['hook_capture'])):.2g}, loss max relative difference "
        f"{max(losses):.2g}, gradient max relative difference {max(grads):.2g}"
    )


# ---------------------------------------------------------------- one process: unsharded and ZeRO-3 weights


def test_gather_plain_weight_is_identity():
    weight, bias = torch.randn(5, 3, requires_grad=True), torch.randn(5)
    w, b = gather_lm_head(weight, bias)
    assert w is weight and b is bias
    assert gather_lm_head(weight) == (weight, None)
    assert not is_dtensor(weight) and not is_zero3_param(weight)


def test_gather_zero3_weight_is_refused():
    weight = torch.nn.Parameter(torch.randn(5, 3))
    weight.ds_id, weight.ds_status = 0, "NOT_AVAILABLE"  # what DeepSpeed ZeRO-3 attaches to a partition
    assert is_zero3_param(weight)
    with pytest.raises(ValueError, match="ZeRO-3.*with_lm_head"):
        gather_lm_head(weight)


class _FakeZero3Head(torch.nn.Module):
    """A linear head whose weight looks like a ZeRO-3 partition (``ds_id``, ``ds_status``, ``ds_shape``): empty
    outside its own forward, filled by a pre-forward hook and emptied by a post-forward hook, as ZeRO-3 does."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.full = weight
        self.weight = torch.nn.Parameter(torch.empty(0))
        self.weight.ds_id, self.weight.ds_status, self.weight.ds_shape = 0, "NOT_AVAILABLE", tuple(weight.shape)
        self.calls = []
        self.register_forward_pre_hook(self._gather)
        self.register_forward_hook(self._release)

    @staticmethod
    def _gather(module, args):
        module.calls.append(len(args))
        module.weight.data = module.full.clone()

    @staticmethod
    def _release(module, args, output):
        module.weight.data = torch.empty(0)


def test_call_in_forward_runs_inside_the_hooks_and_restores_forward():
    full = torch.randn(7, 3, dtype=torch.float64)
    head = _FakeZero3Head(full)
    hidden = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert full_shape(head.weight) == (7, 3) and head.weight.numel() == 0
    out = call_in_forward(head, lambda m, h: LossOutput((h @ m.weight.T).square().sum(), {"n": 1}), hidden)
    assert isinstance(out, LossOutput) and out.metrics == {"n": 1}
    assert head.calls == [1]  # one forward call, the hidden states passed as its input
    torch.testing.assert_close(out.loss, (hidden @ full.T).square().sum())
    assert "forward" not in head.__dict__ and head.weight.numel() == 0
    # A result without a gradient comes back untouched, and an error restores the forward too.
    copied = call_in_forward(head, lambda m: m.weight.detach().clone())
    torch.testing.assert_close(copied, full)
    # A tensor that needs a gradient is the module's output, so that ZeRO-3's output hook sees it; one inside a
    # container would bypass the hooks and is refused.
    seen = []
    handle = head.register_forward_hook(lambda module, args, output: seen.append(output))
    logits = call_in_forward(head, lambda m, h: h @ m.weight.T, hidden)
    handle.remove()
    torch.testing.assert_close(logits, hidden @ full.T)
    assert logits.requires_grad and seen[0][0] is logits
    for boxed in (
        lambda m, h: {"logits": h @ m.weight.T},
        lambda m, h: LossOutput((h @ m.weight.T).sum(), {"row": h @ m.weight.T}),  # a metric with a gradient
        lambda m, h: SparseLogProbs(torch.zeros(2, 1, dtype=torch.long), h @ m.weight[:1].T, torch.ones(2, 1) > 0, 7),
    ):
        with pytest.raises(TypeError, match="return that tensor itself"):
            call_in_forward(head, boxed, hidden)
    assert "forward" not in head.__dict__
    with pytest.raises(RuntimeError, match="boom"):
        call_in_forward(head, lambda m: (_ for _ in ()).throw(RuntimeError("boom")))
    assert "forward" not in head.__dict__


def test_with_lm_head_plain_weight_is_used_directly():
    head = torch.nn.Linear(3, 5, dtype=torch.float64)
    hidden = torch.randn(4, 3, dtype=torch.float64)
    weight, bias, seen = with_lm_head(head, lambda w, b, h: (w, b, h), hidden)
    assert weight is head.weight and bias is head.bias and seen is hidden
    assert full_shape(head.weight) == (5, 3)
