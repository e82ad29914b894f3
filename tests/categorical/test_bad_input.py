"""Bad input raises a ValueError whose message names the offending argument."""

from __future__ import annotations

import pytest
import torch
from conftest import gen

import troll

B, T, V = 2, 3, 7


def batch():
    g = gen(0)
    old_logits = torch.randn(B, T, V, generator=g)
    logits = old_logits + torch.randn(B, T, V, generator=g)
    tokens = torch.randint(0, V, (B, T), generator=g)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(B, T, dtype=torch.bool)
    return logits, troll.sparsify(old_logits, include=tokens), tokens, adv, mask


LOSSES = [troll.troll_loss, troll.clip_loss, troll.cispo_loss]


def with_value(t: torch.Tensor, value: float) -> torch.Tensor:
    t = t.clone()
    t[1, 2, 3] = value
    return t


# ---------------------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize(
    ("field", "bad", "match"),
    [
        ("tokens", torch.zeros(B, T + 1, dtype=torch.long), "tokens"),
        ("tokens", torch.zeros(B * T, dtype=torch.long), "tokens"),
        ("mask", torch.ones(B + 1, T, dtype=torch.bool), "mask"),
        ("mask", torch.ones(B, dtype=torch.bool), "mask"),
        ("advantages", torch.ones(B + 1), "advantages"),
        ("advantages", torch.ones(B, T + 1), "advantages"),
        ("advantages", torch.ones(B, T, 1), "advantages"),
    ],
)
def test_loss_shape_mismatch(loss, field, bad, match):
    logits, old, tokens, adv, mask = batch()
    args = {"tokens": tokens, "advantages": adv, "mask": mask, field: bad}
    with pytest.raises(ValueError, match=match):
        loss(logits, old, args["tokens"], args["advantages"], args["mask"])


@pytest.mark.parametrize("loss", LOSSES)
def test_logits_must_be_three_dimensional(loss):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match=r"logits must be \(B, T, V\)"):
        loss(logits.reshape(B * T, V), old, tokens, adv, mask)


@pytest.mark.parametrize("loss", LOSSES)
def test_old_sparse_rows_mismatch(loss):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match=r"old\.ids"):
        loss(logits, old[:1], tokens, adv, mask)


@pytest.mark.parametrize("loss", LOSSES)
def test_old_vocab_mismatch(loss):
    logits, _, tokens, adv, mask = batch()
    old = troll.sparsify(torch.randn(B, T, V + 2))
    with pytest.raises(ValueError, match=r"old\.vocab_size"):
        loss(logits, old, tokens, adv, mask)


def test_troll_loss_needs_sparse_old():
    logits, _, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="old must be a SparseLogProbs"):
        troll.troll_loss(logits, torch.zeros(B, T), tokens, adv, mask)


@pytest.mark.parametrize("loss", [troll.clip_loss, troll.cispo_loss])
def test_per_token_old_shape_mismatch(loss):
    logits, _, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="old"):
        loss(logits, torch.zeros(B, T + 1), tokens, adv, mask)


def test_project_shape_mismatch():
    with pytest.raises(ValueError, match="old_logits"):
        troll.project(torch.randn(3, V), torch.randn(3, V + 1), 0.05)
    with pytest.raises(ValueError, match="old_logits"):
        troll.project(torch.randn(3, V), torch.randn(2, 3, V), 0.05)
    with pytest.raises(ValueError, match="new_logits.*vocabulary"):
        troll.project(torch.randn(3, 1), torch.randn(3, 1), 0.05)


def test_project_sparse_shape_mismatch():
    logits = torch.randn(B, T, V)
    old = troll.sparsify(logits)
    with pytest.raises(ValueError, match=r"old\.ids"):
        troll.project_sparse(logits, old[:1], 0.05)
    with pytest.raises(ValueError, match=r"old\.vocab_size"):
        troll.project_sparse(logits, troll.sparsify(torch.randn(B, T, V + 1)), 0.05)
    with pytest.raises(ValueError, match="include"):
        troll.project_sparse(logits, old, 0.05, include=torch.zeros(B, T + 1, dtype=torch.long))


def test_sparsify_include_shape_mismatch():
    with pytest.raises(ValueError, match="include"):
        troll.sparsify(torch.randn(B, T, V), include=torch.zeros(B, T + 1, dtype=torch.long))


def test_sparse_log_probs_fields_mismatch():
    with pytest.raises(ValueError, match="SparseLogProbs"):
        troll.SparseLogProbs(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4), torch.ones(2, 3, dtype=bool), V)


# ---------------------------------------------------------------------------------------------- hyper-parameters


@pytest.mark.parametrize("bad", [0.0, -0.05, float("nan")])
def test_kl_bound_must_be_positive(bad):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="kl_bound"):
        troll.troll_loss(logits, old, tokens, adv, mask, kl_bound=bad)
    with pytest.raises(ValueError, match="kl_bound"):
        troll.project(logits, logits, bad)
    with pytest.raises(ValueError, match="kl_bound"):
        troll.project_sparse(logits, old, bad)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_top_k(bad):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="top_k"):
        troll.sparsify(logits, top_k=bad)
    with pytest.raises(ValueError, match="top_k"):
        troll.troll_loss(logits, old, tokens, adv, mask, top_k=bad)
    with pytest.raises(ValueError, match="top_k"):
        troll.project_sparse(logits, old, 0.05, top_k=bad)


@pytest.mark.parametrize("bad", [-1e-5, 1.0, 1.5, float("nan")])
def test_delta(bad):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="delta"):
        troll.sparsify(logits, delta=bad)
    with pytest.raises(ValueError, match="delta"):
        troll.troll_loss(logits, old, tokens, adv, mask, delta=bad)
    with pytest.raises(ValueError, match="delta"):
        troll.project_sparse(logits, old, 0.05, delta=bad)


@pytest.mark.parametrize("bad", [-0.1, float("nan")])
def test_alpha(bad):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="alpha"):
        troll.troll_loss(logits, old, tokens, adv, mask, alpha=bad)


@pytest.mark.parametrize("loss", LOSSES)
def test_agg_name(loss):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="agg"):
        loss(logits, old, tokens, adv, mask, agg="token_mean")
    with pytest.raises(ValueError, match="agg"):
        troll.aggregate(torch.ones(B, T), mask, "mean")


@pytest.mark.parametrize("loss", [troll.troll_loss, troll.clip_loss])
def test_level_name(loss):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="level"):
        loss(logits, old, tokens, adv, mask, level="seq")


def test_clip_hyper_parameters():
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="eps_low"):
        troll.clip_loss(logits, old, tokens, adv, mask, eps_low=0.0)
    with pytest.raises(ValueError, match="eps_high"):
        troll.clip_loss(logits, old, tokens, adv, mask, eps_high=-0.2)
    with pytest.raises(ValueError, match="dual_clip"):
        troll.clip_loss(logits, old, tokens, adv, mask, dual_clip=1.0)
    with pytest.raises(ValueError, match="eps_high"):
        troll.cispo_loss(logits, old, tokens, adv, mask, eps_high=0.0)


def test_max_len():
    with pytest.raises(ValueError, match="max_len"):
        troll.aggregate(torch.ones(B, T), torch.ones(B, T, dtype=torch.bool), "seq-mean-token-sum-norm", max_len=0)


# ---------------------------------------------------------------------------------------------- values


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("loss", LOSSES)
def test_nan_or_posinf_logits(loss, value):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="logits contains NaN or \\+inf"):
        loss(with_value(logits, value), old, tokens, adv, mask)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_posinf_in_project_and_sparsify(value):
    logits = torch.randn(B, T, V)
    with pytest.raises(ValueError, match="new_logits"):
        troll.project(with_value(logits, value), logits, 0.05)
    with pytest.raises(ValueError, match="old_logits"):
        troll.project(logits, with_value(logits, value), 0.05)
    with pytest.raises(ValueError, match="logits"):
        troll.sparsify(with_value(logits, value))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_posinf_in_project_sparse(value):
    logits = torch.randn(B, T, V)
    with pytest.raises(ValueError, match="logits"):
        troll.project_sparse(with_value(logits, value), troll.sparsify(logits), 0.05)


def test_fully_masked_row():
    logits = torch.randn(B, T, V)
    logits[0, 1] = float("-inf")
    with pytest.raises(ValueError, match="new_logits"):
        troll.project(logits, torch.randn(B, T, V), 0.05)
    with pytest.raises(ValueError, match="logits"):
        troll.sparsify(logits)
    _, old, tokens, adv, mask = batch()
    for loss in LOSSES:
        with pytest.raises(ValueError, match="logits"):
            loss(logits, old, tokens, adv, mask)


def test_neg_inf_logits_are_allowed():
    logits, old, tokens, adv, mask = batch()
    logits = logits.clone()
    logits[..., 0] = float("-inf")
    tokens = tokens.clamp_min(1)
    out = troll.troll_loss(logits, old, tokens, adv, mask)
    assert torch.isfinite(out.loss)


def test_nan_advantages():
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="advantages"):
        troll.troll_loss(logits, old, tokens, torch.tensor([1.0, float("nan")]), mask)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("bad_id", [V, -1, 10**6])
def test_token_ids_outside_vocabulary(loss, bad_id):
    logits, old, tokens, adv, mask = batch()
    tokens = tokens.clone()
    tokens[0, 1] = bad_id
    with pytest.raises(ValueError, match="tokens"):
        loss(logits, old, tokens, adv, mask)
    # the same id under mask == False (padding) is never looked at
    mask = mask.clone()
    mask[0, 1] = False
    out = loss(logits, old, tokens, adv, mask)
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("loss", LOSSES)
def test_token_ids_must_be_integers(loss):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="tokens"):
        loss(logits, old, tokens.float(), adv, mask)


def test_include_ids_outside_vocabulary():
    logits = torch.randn(B, T, V)
    with pytest.raises(ValueError, match="include"):
        troll.sparsify(logits, include=torch.full((B, T), V))
    with pytest.raises(ValueError, match="include"):
        troll.project_sparse(logits, troll.sparsify(logits), 0.05, include=torch.full((B, T), -1))


def test_integer_logits():
    with pytest.raises(ValueError, match="floating-point"):
        troll.sparsify(torch.zeros(B, T, V, dtype=torch.long))


# ------------------------------------------------------------------------- robustness: hand-built batches and masks

INF = float("inf")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"kl_bound": True}, "kl_bound"),
        ({"kl_bound": INF}, "kl_bound"),
        ({"kl_bound": "0.05"}, "kl_bound"),
        ({"kl_bound": None}, "kl_bound"),
        ({"alpha": True}, "alpha"),
        ({"alpha": INF}, "alpha"),
        ({"alpha": "1"}, "alpha"),
        ({"alpha": None}, "alpha"),
        ({"top_k": True}, "top_k"),
        ({"delta": True}, "delta"),
        ({"max_len": 2.5, "agg": "seq-mean-token-sum-norm"}, "max_len"),
        ({"max_len": 2.5}, "max_len"),
        ({"max_len": True, "agg": "seq-mean-token-sum-norm"}, "max_len"),
    ],
)
def test_troll_hyper_parameters_name_the_argument(kw, match):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match=match):
        troll.troll_loss(logits, old, tokens, adv, mask, **kw)


@pytest.mark.parametrize("bad", [True, INF, 0.0, "1", None])
def test_temperature_is_checked(bad):
    hidden, weight = torch.randn(B, T, 4), torch.randn(V, 4)
    with pytest.raises(ValueError, match="temperature"):
        troll.sparsify_from_hidden(hidden, weight, temperature=bad)


@pytest.mark.parametrize("bad", [-2, 0, 2.5, True])
def test_chunk_size_is_checked(bad):
    hidden, weight = torch.randn(B, T, 4), torch.randn(V, 4)
    with pytest.raises(ValueError, match="chunk_size"):
        troll.sparsify_from_hidden(hidden, weight, chunk_size=bad)


@pytest.mark.parametrize("loss", LOSSES)
def test_fractional_mask_is_refused_and_int_mask_accepted(loss):
    logits, old, tokens, adv, mask = batch()
    half = mask.float() * 0.5
    with pytest.raises(ValueError, match="mask must be boolean"):
        loss(logits, old, tokens, adv, half)
    ref = loss(logits, old, tokens, adv, mask).loss
    assert loss(logits, old, tokens, adv, mask.long()).loss.item() == ref.item()


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("field", ["tokens", "advantages", "mask"])
def test_python_lists_are_refused_with_the_fix(loss, field):
    logits, old, tokens, adv, mask = batch()
    args = {"tokens": tokens, "advantages": adv, "mask": mask}
    args[field] = args[field].tolist()
    with pytest.raises(ValueError, match=rf"{field} must be a torch.Tensor.*torch.tensor\({field}\)"):
        loss(logits, old, args["tokens"], args["advantages"], args["mask"])


@pytest.mark.parametrize("loss", LOSSES)
def test_meta_tensors_are_refused(loss):
    logits, old, tokens, adv, mask = batch()
    with pytest.raises(ValueError, match="logits is on the meta device"):
        loss(logits.to("meta"), old, tokens, adv, mask)
    with pytest.raises(ValueError, match="tokens is on the meta device"):
        loss(logits, old, tokens.to("meta"), adv, mask)


def _hand_built(**change):
    _, old, _, _, _ = batch()
    fields = dict(ids=old.ids, logp=old.logp, mask=old.mask, vocab_size=V, log_rest=old.log_rest) | change
    return troll.SparseLogProbs(**fields)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda o: {"ids": o.ids + V}, r"old\.ids.*outside the vocabulary"),
        (lambda o: {"ids": o.ids - V}, r"old\.ids.*outside the vocabulary"),
        (lambda o: {"ids": o.ids[..., :0], "logp": o.logp[..., :0], "mask": o.mask[..., :0]}, "K = 0"),
        (lambda o: {"logp": torch.full_like(o.logp, float("nan"))}, r"old\.logp holds NaN"),
        (lambda o: {"logp": o.logp + 0.4, "log_rest": None}, r"old\.logp is not normalised"),
        (lambda o: {"log_rest": torch.zeros(B, T)}, r"old\.log_rest is inconsistent"),
        (lambda o: {"mask": o.mask.float()}, r"old\.mask must be a bool"),
    ],
)
def test_hand_built_sparse_log_probs_are_validated(loss, change, match):
    logits, old, tokens, adv, mask = batch()
    bad = _hand_built(**change(old))
    with pytest.raises(ValueError, match=match):
        loss(logits, bad, tokens, adv, mask)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"loss_type": "trol"}, r"loss_type='trol' is not a known loss type; did you mean loss_type='troll'\?"),
        ({"loss_type": "dapo2"}, r"did you mean loss_type='dapo'\?"),
        ({"troll_kl_bound": INF}, "troll_kl_bound must be > 0 and finite"),
        ({"troll_kl_bound": "0.05"}, "troll_kl_bound"),
        ({"troll_alpha": INF}, "troll_alpha must be >= 0 and finite"),
        ({"troll_alpha": None}, "troll_alpha"),
        ({"troll_delta": float("nan")}, "troll_delta"),
    ],
)
def test_trl_config_rejects_typos_and_infinities(tmp_path, kw, match):
    pytest.importorskip("trl")
    from troll.integrations.trl import TrollGRPOConfig

    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4)
    with pytest.raises(ValueError, match=match):
        TrollGRPOConfig(**base, num_generations=4, **kw)
    assert TrollGRPOConfig(**base, num_generations=4, loss_type="cispo").loss_type == "cispo"


@pytest.mark.parametrize("bad", [True, INF, "0.05", None])
def test_projection_bounds_name_the_argument(bad):
    logits, old, _, _, _ = batch()
    with pytest.raises(ValueError, match="kl_bound must be > 0 and a finite number"):
        troll.project(logits, logits, bad)
    with pytest.raises(ValueError, match="kl_bound"):
        troll.project_sparse(logits, old, bad)


def test_hand_built_old_policy_with_repeated_ids_or_missing_mass_is_refused():
    """Repeated kept ids (mass counted twice) and a whole-vocabulary row whose mass is short of 1 are refused."""
    logits = torch.randn(1, 2, 4, dtype=torch.float64)
    tokens, adv, mask = torch.tensor([[1, 2]]), torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool)
    full = troll.sparsify(logits, top_k=4, delta=0.0)
    short = troll.SparseLogProbs(full.ids, full.logp - 2.0, full.mask, 4)  # sums to e^-2 over all 4 ids
    with pytest.raises(ValueError, match="keeps every id of the vocabulary but its probabilities sum to less than 1"):
        troll.troll_loss(logits, short, tokens, adv, mask)
    ids = torch.tensor([[[1, 1, 2], [0, 3, 2]]])
    logp = torch.log(torch.tensor([[[0.4, 0.4, 0.1], [0.3, 0.3, 0.3]]], dtype=torch.float64))
    repeated = troll.SparseLogProbs(ids, logp, torch.ones_like(ids, dtype=torch.bool), 4)
    with pytest.raises(ValueError, match="repeats an id"):
        troll.troll_loss(logits, repeated, tokens, adv, mask)
    padded = troll.SparseLogProbs(ids, logp, torch.tensor([[[True, False, True], [True, True, True]]]), 4)
    troll.troll_loss(logits, padded, tokens, adv, mask)  # a repeat in a padded slot is no repeat


def test_old_token_logp_checks_its_arguments():
    logits = torch.randn(2, 3, 6, dtype=torch.float64)
    old = troll.sparsify(logits, top_k=2, delta=0.0)
    tokens = torch.tensor([[0, 1, 5], [2, 3, 4]])
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    kept = (old.ids == tokens[..., None]).any(-1)
    torch.testing.assert_close(troll.old_token_logp(old, tokens)[kept], expected[kept])
    with pytest.raises(ValueError, match="tokens holds ids outside the vocabulary"):
        troll.old_token_logp(old, torch.tensor([[0, 1, 6], [2, 3, 4]]))
    with pytest.raises(ValueError, match="tokens must be a torch.Tensor"):
        troll.old_token_logp(old, [[0, 1, 5], [2, 3, 4]])
    with pytest.raises(ValueError, match="old.ids"):
        troll.old_token_logp(old, tokens[:1])


def test_infeasible_flags_nan_and_checks_the_bound():
    assert troll.infeasible(torch.tensor([float("nan"), 0.05, 0.06]), 0.05).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="kl_bound"):
        troll.infeasible(torch.tensor([0.1]), -1.0)


def test_eta_metrics_leave_out_infeasible_rows():
    """One row that bans the old policy's whole mode is infeasible; its eta (~1e26) must not swamp eta/mean."""
    old_logits = torch.tensor([[[5.0, 0.0, 0.0, 0.0], [0.0, 0.3, 0.0, 0.0]]], dtype=torch.float64)
    logits = torch.tensor([[[float("-inf"), 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]]], dtype=torch.float64)
    tokens = torch.tensor([[1, 1]])
    out = troll.troll_loss(
        logits,
        troll.sparsify(old_logits, top_k=4, delta=0.0),
        tokens,
        torch.tensor([1.0]),
        torch.ones(1, 2, dtype=bool),
    )
    assert out.metrics["infeasible_frac"] == 0.5
    assert 0 < out.metrics["eta/max"] < 100 and torch.isfinite(out.loss)
