"""The verl plug-in's loss (troll.integrations.verl.loss) on verl-shaped no-padding micro-batches: the captured old
policy rows, troll_ppo_loss against troll.troll_loss, verl_scale against verl's agg_loss, the global batch
normalisation, the stock loss modes and the errors. Needs verl: skipped without it, run in .venv-verl.
"""

import pytest
from _verl_batches import (
    PROMPT_LENS,
    RESPONSE_LENS,
    SETTINGS,
    VOCAB,
    _actor_config,
    _micro_batch,
    _nested,
    _reference_old,
    _verl,
)


def test_capture_rows_equal_sparsify_with_the_sampled_token():
    _verl()
    import torch

    from troll import sparsify
    from troll.categorical.sparse import SparseLogProbs
    from troll.integrations.verl.engine import capture_rows, capture_width

    logits = 3 * torch.randn(7, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tokens = logits.argmin(-1)  # the least likely token: kept only because it was sampled
    rows = capture_rows(logits, tokens, top_k=4, delta=1e-3)
    assert rows["troll_old_ids"].shape == (7, capture_width(4))
    got = SparseLogProbs.from_dict(rows)
    ref = sparsify(logits, top_k=4, delta=1e-3, include=tokens)
    assert (got.ids == tokens.unsqueeze(-1)).logical_and(got.mask).any(-1).all()
    for b in range(7):
        kept = got.ids[b][got.mask[b]]
        want = ref.ids[b][ref.mask[b]]
        assert sorted(kept.tolist()) == sorted(want.tolist())
        full = torch.log_softmax(logits[b], -1)
        torch.testing.assert_close(got.logp[b][got.mask[b]], full[kept], rtol=0, atol=1e-12)
        assert torch.isneginf(got.logp[b][~got.mask[b]]).all()


@pytest.mark.parametrize("mode", ["troll", "troll_seq"])
def test_troll_ppo_loss_matches_troll_loss_on_a_verl_micro_batch(mode):
    verl_loss = _verl("loss")
    import torch

    from troll import troll_loss

    logits, data, ref = _micro_batch()
    config = _actor_config(mode)
    loss, metrics = verl_loss.troll_ppo_loss(config, {"troll_logits": _nested(logits, [3 + 2, 4, 5])}, data)
    (grad,) = torch.autograd.grad(loss, logits)

    leaf = logits.detach().clone().requires_grad_()
    padded = torch.where(ref["mask"].unsqueeze(-1), leaf[ref["index"]], 0.0)
    level = "token" if mode == "troll" else "sequence"
    settings = {**SETTINGS, "level": level, "agg": "token-mean"}
    want = troll_loss(padded, _reference_old(ref), ref["tokens"], ref["adv"], ref["mask"], **settings)
    (want_grad,) = torch.autograd.grad(want.loss, leaf)
    torch.testing.assert_close(loss, want.loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-8, atol=1e-12)
    assert grad.abs().sum() > 0
    assert metrics["troll/kl_after/max"].values[0] <= SETTINGS["kl_bound"] * (1 + 1e-6)
    assert metrics["troll/kl_before/max"].values[0] > SETTINGS["kl_bound"]  # the bound was active somewhere
    assert not torch.isnan(grad).any()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize(
    "info",
    [
        {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None, "loss_scale_factor": None},
        {"dp_size": 4, "batch_num_tokens": 37, "global_batch_size": 11, "loss_scale_factor": 9},
    ],
)
def test_verl_scale_matches_verls_agg_loss(agg, info):
    _verl()
    import torch
    from verl.trainer.ppo.core_algos import agg_loss

    from troll.categorical.batch import aggregate
    from troll.integrations.verl.loss import verl_scale

    gen = torch.Generator().manual_seed(2)
    values = torch.randn(4, 6, dtype=torch.float64, generator=gen)
    mask = torch.rand(4, 6, generator=gen) > 0.4
    mask[2] = False  # an empty sequence
    factor, max_len = verl_scale(agg, mask, **info)
    got = factor * aggregate(values, mask, agg, max_len=max_len)
    want = agg_loss(values, mask.double(), agg, **info)
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-6, atol=1e-12)


def test_troll_ppo_loss_uses_the_global_batch_normalisation():
    verl_loss = _verl("loss")
    import torch

    info = {"dp_size": 2, "batch_num_tokens": 20, "global_batch_size": 6}
    logits, data, _ = _micro_batch(global_info=info)
    local_logits, local_data, _ = _micro_batch()
    out = {"troll_logits": _nested(logits, [5, 4, 5])}
    loss, metrics = verl_loss.troll_ppo_loss(_actor_config(), out, data)
    local, _ = verl_loss.troll_ppo_loss(_actor_config(), {"troll_logits": _nested(local_logits, [5, 4, 5])}, local_data)
    torch.testing.assert_close(loss, local * sum(RESPONSE_LENS) / 20 * 2)
    assert metrics["actor/pg_loss"].aggregation.name == "SUM"


def test_stock_loss_mode_goes_to_verls_ppo_loss():
    verl_loss = _verl("loss")
    import torch
    from verl.workers.utils.losses import ppo_loss

    _, data, _ = _micro_batch()
    gen = torch.Generator().manual_seed(3)
    lens = [p + r for p, r in zip(PROMPT_LENS, RESPONSE_LENS)]
    log_probs = _nested(-torch.rand(sum(lens), generator=gen, dtype=torch.float64), lens)
    data["old_log_probs"] = _nested(-torch.rand(sum(RESPONSE_LENS), generator=gen, dtype=torch.float64), RESPONSE_LENS)
    got, got_metrics = verl_loss.troll_ppo_loss(_actor_config("vanilla"), {"log_probs": log_probs}, data.clone())
    want, want_metrics = ppo_loss(_actor_config("vanilla"), {"log_probs": log_probs}, data.clone())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert set(got_metrics) == set(want_metrics) and not any(k.startswith("troll/") for k in got_metrics)


def test_troll_ppo_loss_errors_are_clear():
    verl_loss = _verl("loss")
    logits, data, _ = _micro_batch()
    out = {"troll_logits": _nested(logits, [5, 4, 5])}
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.troll\.kl_bound"):
        verl_loss.troll_ppo_loss(_actor_config(troll={"alpha": 1.0, "top_k": 4, "delta": 0.0}), dict(out), data)
    with pytest.raises(KeyError, match="troll_logits"):
        verl_loss.troll_ppo_loss(_actor_config(), {}, data)
    with pytest.raises(KeyError, match="ref_log_prob"):
        verl_loss.troll_ppo_loss(_actor_config(use_kl_loss=True), dict(out), data)
    with pytest.raises(KeyError, match="troll_old_"):
        verl_loss.troll_ppo_loss(_actor_config(), dict(out), data.exclude("troll_old_logp"))
    # the loss takes what it needs out of model_output: verl keeps every micro-batch's outputs until the mini-batch
    # ends, and the (tokens, V) logits must not stay there
    verl_loss.troll_ppo_loss(_actor_config(), out, data)
    assert "troll_logits" not in out


def test_rollout_correction_weights_are_refused_not_dropped():
    """verl's ppo_loss multiplies its per-token surrogate by ``rollout_is_weights`` (TIS/MIS); the TROLL loss has no
    such weight, so a batch that carries them is an error naming the setting, never trained on without them."""
    verl_loss = _verl("loss")
    import torch

    logits, data, _ = _micro_batch()
    data["rollout_is_weights"] = _nested(torch.full((sum(RESPONSE_LENS),), 2.0, dtype=torch.float64), RESPONSE_LENS)
    with pytest.raises(ValueError, match=r"algorithm\.rollout_correction\.rollout_is=null"):
        verl_loss.troll_ppo_loss(_actor_config(), {"troll_logits": _nested(logits, [5, 4, 5])}, data)
