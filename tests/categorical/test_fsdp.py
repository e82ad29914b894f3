"""The chunked LM-head path under FSDP2 (fully_shard): torchrun with 2 CPU processes (gloo) against the
one-process dense float64 reference; and troll.categorical.distributed's handling of unsharded and ZeRO-3 weights."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import SRC, SUPPORT, check_torchrun, run_script

from troll.categorical.distributed import gather_lm_head, is_dtensor, is_zero3_param


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_fsdp2_chunked_matches_dense(tmp_path):
    """fully_shard over 2 processes, the LM head its own (resharded) unit: the chunked loss of each share, the
    hidden states' gradient and every parameter's gathered gradient equal the dense fp64 path in one process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.update(OMP_NUM_THREADS="1", TROLL_TORCHRUN_TIMEOUT="120", HF_HUB_OFFLINE="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    code, err = run_script([*torchrun, str(SUPPORT / "_torchrun_fsdp.py"), str(tmp_path)], env, timeout=150)
    check_torchrun(code, err, tmp_path / "ready")
    result = torch.load(tmp_path / "result.pt")
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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.update(OMP_NUM_THREADS="1", TROLL_TORCHRUN_TIMEOUT="150", HF_HUB_OFFLINE="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    code, err = run_script([*torchrun, str(SUPPORT / "_torchrun_fsdp_trainer.py"), str(tmp_path)], env, timeout=200)
    check_torchrun(code, err, tmp_path / "ready")
    result = torch.load(tmp_path / "result.pt")
    assert result["projected_frac"] > 0
    assert result["loss"] < 1e-5
    assert result["hook_capture"] < 1e-6  # the capture on TRL's scoring forward gathers the sharded head
    grads = [key for key in result if key.startswith("grad/")]
    assert "grad/lm_head.weight" in grads and "grad/model.embed_tokens.weight" in grads
    for key in grads:
        assert result["size/" + key[5:]] > 1e-5, key
        assert result[key] < 1e-4, (key, float(result[key]))


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
