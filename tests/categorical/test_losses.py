"""The TROLL loss (docs/method.md) against the float64 dense reference, hand-written aggregations and its limits."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import drift, gen, peaked_logits

import troll
from troll.categorical import reference

EPS = 0.05
METRIC_KEYS = {
    "kl_share/old_top8",
    "kl_share/support",
    "kl_share/rest",
    "kl_before/mean",
    "kl_before/max",
    "kl_after/mean",
    "kl_after/max",
    "projected_frac",
    "infeasible_frac",
    "old_excluded_frac",
    "eta/mean",
    "eta/max",
    "support/mean",
    "ratio/mean",
    "ratio/min",
    "ratio/max",
    "loss/pg",
    "loss/reg",
}


def make_batch(bsz=3, seq=4, vocab=6, *, seed=0, scale=1.5, adv_2d=False, dtype=torch.float64):
    """Logits, old logits, sampled tokens, advantages and a mask with holes (the 2nd sequence is empty)."""
    g = gen(seed)
    old = torch.randn(bsz, seq, vocab, generator=g, dtype=torch.float64)
    new = drift(old, g, scale)
    tokens = torch.multinomial(torch.softmax(old, -1).reshape(-1, vocab), 1, generator=g).reshape(bsz, seq)
    shape = (bsz, seq) if adv_2d else (bsz,)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    mask = torch.ones(bsz, seq, dtype=torch.bool)
    mask[0, -1] = False
    if bsz > 1:
        mask[1] = False
    if bsz > 2:
        mask[2, 1] = False
    return new.to(dtype), old, tokens, adv, mask


def full(logits, old_logits, tokens, adv, mask, **kw):
    """troll_loss over the whole vocabulary (top_k = V, delta = 0 on both sides): no sparsity approximation."""
    vocab = logits.shape[-1]
    old = troll.sparsify(old_logits, top_k=vocab, delta=0.0)
    return troll.troll_loss(logits, old, tokens, adv, mask, top_k=vocab, delta=0.0, kl_bound=EPS, **kw)


# ------------------------------------------------------------------------------------------ vs reference


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("agg", troll.AGGREGATIONS)
@pytest.mark.parametrize("adv_2d", [False, True])
def test_full_support_matches_reference(level, agg, adv_2d):
    new, old, tokens, adv, mask = make_batch(adv_2d=adv_2d, seed=1)
    out = full(new, old, tokens, adv, mask, level=level, agg=agg, alpha=0.7)
    ref = reference.troll_loss(new, old, tokens, adv, mask, kl_bound=EPS, alpha=0.7, level=level, agg=agg)
    assert out.loss.dtype == torch.float64 and out.loss.dim() == 0
    assert 0 < float(out.metrics["projected_frac"]) < 1  # the batch mixes projected and untouched tokens
    torch.testing.assert_close(out.loss, ref, rtol=0, atol=1e-8)


def test_full_support_matches_reference_max_len():
    new, old, tokens, adv, mask = make_batch(seed=2)
    out = full(new, old, tokens, adv, mask, agg="seq-mean-token-sum-norm", max_len=11)
    ref = reference.troll_loss(new, old, tokens, adv, mask, kl_bound=EPS, agg="seq-mean-token-sum-norm", max_len=11)
    torch.testing.assert_close(out.loss, ref, rtol=0, atol=1e-8)


def test_sparse_loss_close_to_reference_on_peaked_rows():
    """Default K = 64, delta = 1e-5 on realistically peaked rows of V = 2000 against the dense fp64 reference.
    Measured |difference| 7.5e-8 (fp64) and 1.2e-7 (fp32 logits); the tolerance is 2e-6."""
    g = gen(3)
    old = peaked_logits(2, 4, vocab=2000, g=g, head_max=20)
    new = drift(old, g, 1.5)
    tokens = torch.multinomial(torch.softmax(old, -1).reshape(-1, 2000), 1, generator=g).reshape(2, 4)
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    mask = torch.ones(2, 4, dtype=torch.bool)
    ref = reference.troll_loss(new, old, tokens, adv, mask, kl_bound=EPS)
    for dtype in (torch.float64, torch.float32):
        sp_old = troll.sparsify(old.to(dtype), include=tokens)
        out = troll.troll_loss(new.to(dtype), sp_old, tokens, adv, mask, kl_bound=EPS)
        assert 0 < float(out.metrics["projected_frac"])
        assert abs(out.loss.item() - ref.item()) < 2e-6


def central_diff(fn, x: torch.Tensor, h: float = 1e-6, where: torch.Tensor | None = None) -> torch.Tensor:
    """Central finite differences of the scalar ``fn`` at the entries of ``x`` selected by ``where`` (else 0)."""
    grad = torch.zeros_like(x)
    flat, out = x.reshape(-1), grad.reshape(-1)
    sel = range(flat.numel()) if where is None else where.reshape(-1).nonzero().flatten().tolist()
    for i in sel:
        step = torch.zeros_like(flat)
        step[i] = h
        out[i] = (fn((flat + step).reshape(x.shape)) - fn((flat - step).reshape(x.shape))) / (2 * h)
    return grad


@pytest.mark.parametrize(
    ("level", "agg", "adv_2d", "alpha"),
    [
        ("token", "token-mean", True, 1.0),
        ("token", "seq-mean-token-mean", False, 0.0),
        # GSPO-token with per-sequence advantages has exactly the GSPO gradient, i.e. the reference's
        ("sequence", "seq-mean-token-mean", False, 1.0),
        ("sequence", "token-mean", False, 0.0),
    ],
)
def test_gradient_matches_finite_differences_of_reference(level, agg, adv_2d, alpha):
    new, old, tokens, adv, mask = make_batch(3, 3, 4, seed=4, scale=2.0, adv_2d=adv_2d)
    kw = dict(level=level, agg=agg, alpha=alpha)
    x = new.clone().requires_grad_()
    out = full(x, old, tokens, adv, mask, **kw)
    frac = float(out.metrics["projected_frac"])
    assert 0 < frac < 1, frac
    (grad,) = torch.autograd.grad(out.loss, x)
    # The regression term is KL(pi~ || sg(pi)): differentiate the reference with pi frozen at the current point.
    frozen = reference.project(new, old, EPS)[0]

    def ref_loss(y):
        pg = reference.troll_loss(y, old, tokens, adv, mask, kl_bound=EPS, level=level, agg=agg, alpha=0.0)
        a = torch.log_softmax(y, -1)
        reg = (a.exp() * (a - frozen)).sum(-1)
        return pg + alpha * reference.aggregate(reg, mask, agg)

    assert ref_loss(new).item() == pytest.approx(
        reference.troll_loss(new, old, tokens, adv, mask, kl_bound=EPS, level=level, agg=agg, alpha=alpha).item()
    )
    # padding positions get exactly zero gradient; differentiate the reference at the response positions only
    assert (grad[~mask] == 0).all()
    fd = central_diff(ref_loss, new, where=mask.unsqueeze(-1).expand_as(new))
    assert fd.abs().max() > 1e-2
    torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------------ aggregation


VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("agg", "max_len", "expected"),
    [
        ("token-mean", None, (1 + 2 + 7 + 8 + 9) / 5),
        ("seq-mean-token-mean", None, ((1 + 2) / 2 + (7 + 8 + 9) / 3) / 2),  # the empty sequence is skipped
        ("seq-mean-token-sum", None, ((1 + 2) + (7 + 8 + 9)) / 2),
        ("seq-mean-token-sum-norm", None, 27 / (3 * 3)),  # B * T
        ("seq-mean-token-sum-norm", 10, 27 / (3 * 10)),  # B * max_len
    ],
)
def test_aggregate_by_hand(agg, max_len, expected):
    out = troll.aggregate(VALUES, MASK, agg, max_len=max_len)
    assert out.item() == pytest.approx(expected, rel=1e-15)
    assert reference.aggregate(VALUES, MASK, agg, max_len).item() == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("agg", troll.AGGREGATIONS)
def test_aggregate_gradient_by_hand(agg):
    """d agg / d v: the weight each token gets, written out per mode."""
    v = VALUES.clone().requires_grad_()
    (grad,) = torch.autograd.grad(troll.aggregate(v, MASK, agg), v)
    m = MASK.double()
    counts = m.sum(-1, keepdim=True)
    expected = {
        "token-mean": m / 5,
        "seq-mean-token-mean": m / counts.clamp_min(1) / 2,
        "seq-mean-token-sum": m / 2,
        "seq-mean-token-sum-norm": m / 9,
    }[agg]
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("agg", troll.AGGREGATIONS)
def test_loss_is_pg_plus_alpha_reg_with_one_aggregation(agg):
    """loss = agg(pg) + alpha agg(reg), both terms per token computed here from the dense projection by hand."""
    new, old, tokens, adv, mask = make_batch(seed=5, adv_2d=True)
    out = full(new, old, tokens, adv, mask, agg=agg, alpha=2.5)
    proj = troll.project(new, old, EPS)
    a, b = torch.log_softmax(new, -1), torch.log_softmax(old, -1)
    tok = tokens.unsqueeze(-1)
    pg = -adv * (proj.logp.gather(-1, tok) - b.gather(-1, tok)).squeeze(-1).exp()
    reg = (a.exp() * (a - proj.logp)).sum(-1)
    m = mask.double()
    bsz, seq = mask.shape

    def agg_by_hand(v):
        if agg == "token-mean":
            return (v * m).sum() / m.sum()
        if agg == "seq-mean-token-sum-norm":
            return (v * m).sum() / (bsz * seq)
        per_seq = [(v[i] * m[i]).sum() / (m[i].sum() if agg == "seq-mean-token-mean" else 1) for i in range(bsz)]
        kept = [s for s, row in zip(per_seq, mask) if row.any()]
        return sum(kept) / len(kept)

    torch.testing.assert_close(out.metrics["loss/pg"], agg_by_hand(pg), rtol=0, atol=1e-9)
    torch.testing.assert_close(out.metrics["loss/reg"], agg_by_hand(reg), rtol=0, atol=1e-9)
    assert float(out.metrics["loss/reg"]) > 1e-4
    torch.testing.assert_close(out.loss, agg_by_hand(pg) + 2.5 * agg_by_hand(reg), rtol=0, atol=1e-9)


# ------------------------------------------------------------------------------------------ limits


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("agg", troll.AGGREGATIONS)
def test_all_masked_batch(level, agg):
    new, old, tokens, adv, _ = make_batch(seed=6)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    tokens = tokens.clone()
    tokens[0, 0] = 10**6  # ids under mask == False are never looked at
    x = new.float().clone().requires_grad_()
    out = troll.troll_loss(x, troll.sparsify(old), tokens, adv, mask, level=level, agg=agg)
    assert out.loss.item() == 0.0
    (grad,) = torch.autograd.grad(out.loss, x)
    assert torch.isfinite(grad).all() and (grad == 0).all()
    assert all(torch.isfinite(v).all() for v in out.metrics.values())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_inactive_trust_region_is_the_plain_policy_gradient(dtype):
    """old == new (one optimiser step per batch): reg = 0, ratio = 1, loss = -mean(A) and the gradient is
    -A grad log pi(o_t) / N, on the default sparse support."""
    g = gen(7)
    logits = peaked_logits(3, 5, vocab=300, g=g, head_max=10, dtype=dtype)
    tokens = torch.multinomial(torch.softmax(logits.double(), -1).reshape(-1, 300), 1, generator=g).reshape(3, 5)
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 5, generator=g) > 0.3
    old = troll.sparsify(logits, include=tokens)
    x = logits.clone().requires_grad_()
    out = troll.troll_loss(x, old, tokens, adv, mask)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert float(out.metrics["loss/reg"]) == 0.0 and float(out.metrics["projected_frac"]) == 0.0
    assert float(out.metrics["eta/max"]) == 0.0
    expected = -(adv * mask).sum() / mask.sum()
    assert abs(out.loss.item() - expected.item()) < tol
    assert abs(float(out.metrics["ratio/min"]) - 1) < tol and abs(float(out.metrics["ratio/max"]) - 1) < tol
    (grad,) = torch.autograd.grad(out.loss, x)
    y = logits.double().clone().requires_grad_()
    logp = torch.log_softmax(y, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    (expected_grad,) = torch.autograd.grad(-(adv * logp * mask).sum() / mask.sum(), y)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=0, atol=tol)


def test_metrics_present_and_sane():
    new, old, tokens, adv, mask = make_batch(4, 6, 40, seed=8, scale=1.0)
    out = troll.troll_loss(new, troll.sparsify(old, top_k=8, include=tokens), tokens, adv, mask, top_k=8)
    m = out.metrics
    assert set(m) == METRIC_KEYS
    assert all(v.dim() == 0 and not v.requires_grad and torch.isfinite(v) for v in m.values())
    assert 0 < float(m["projected_frac"]) < 1
    assert float(m["kl_after/max"]) <= EPS * (1 + 1e-6)
    assert float(m["kl_before/max"]) > EPS  # some tokens were projected ...
    assert float(m["kl_after/mean"]) <= float(m["kl_before/mean"])  # ... and the projection only lowers KL
    assert float(m["eta/max"]) > 0 and 0 <= float(m["eta/mean"]) <= float(m["eta/max"])
    assert 1 <= float(m["support/mean"]) <= 2 * 8 + 1
    assert float(m["ratio/min"]) <= float(m["ratio/mean"]) <= float(m["ratio/max"])
    # with the whole vocabulary as support, projected_frac is the share of response tokens the reference projects
    m = full(new, old, tokens, adv, mask).metrics
    ref_eta = reference.project(new, old, EPS)[1]
    assert float(m["projected_frac"]) == pytest.approx(float(((ref_eta > 0) & mask).sum() / mask.sum()), abs=1e-12)
    assert float(m["eta/max"]) == pytest.approx(float(ref_eta[mask].max()), rel=1e-7)
    assert float(m["kl_before/max"]) == pytest.approx(float(reference.project(new, old, EPS)[2][mask].max()), rel=1e-9)


def test_alpha_zero_drops_the_regression():
    new, old, tokens, adv, mask = make_batch(seed=9)
    out0 = full(new, old, tokens, adv, mask, alpha=0.0)
    out1 = full(new, old, tokens, adv, mask, alpha=1.0)
    assert float(out1.metrics["loss/reg"]) > 0
    torch.testing.assert_close(out0.loss, out0.metrics["loss/pg"], rtol=0, atol=0)
    torch.testing.assert_close(out1.loss - out0.loss, out1.metrics["loss/reg"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits(dtype):
    """bf16/fp16 logits are computed in fp32; against fp64 on the same rounded logits the loss agrees to 1e-6
    (measured 4e-8 bf16, 2e-8 fp16) and the gradient to 1e-2 of its largest entry (measured 1.7e-3 bf16, whose
    8-bit mantissa rounds the gradient itself, and 2.7e-4 fp16)."""
    g = gen(10)
    old = peaked_logits(2, 5, vocab=500, g=g, head_max=10)
    new = drift(old, g, 1.0).to(dtype)
    tokens = torch.multinomial(torch.softmax(old, -1).reshape(-1, 500), 1, generator=g).reshape(2, 5)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 5, dtype=torch.bool)
    sp_old = troll.sparsify(old.to(dtype), include=tokens)
    x = new.clone().requires_grad_()
    out = troll.troll_loss(x, sp_old, tokens, adv, mask)
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    (grad,) = torch.autograd.grad(out.loss, x)
    assert grad.dtype == dtype and torch.isfinite(grad.float()).all()
    y = new.double().clone().requires_grad_()
    ref = troll.troll_loss(y, troll.sparsify(old.to(dtype).double(), include=tokens), tokens, adv, mask)
    assert float(ref.metrics["projected_frac"]) > 0
    assert abs(out.loss.item() - ref.loss.item()) < 1e-6
    (ref_grad,) = torch.autograd.grad(ref.loss, y)
    assert (grad.double() - ref_grad).abs().max() <= 1e-2 * ref_grad.abs().max()


def test_old_token_logp():
    """Stored value where the old policy kept the sampled id, else its share of the unkept mass."""
    probs = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04], dtype=torch.float64)
    old = troll.sparsify(probs.log().reshape(1, 1, 5), top_k=2, delta=0.0)  # keeps 0, 1; 0.2 left for 3 tokens
    for tok, expected in [(0, 0.5), (1, 0.3), (2, 0.2 / 3), (4, 0.2 / 3)]:
        out = troll.old_token_logp(old, torch.tensor([[tok]]))
        assert out.dtype == torch.float64
        assert out.item() == pytest.approx(math.log(expected), abs=1e-12)
    per_token = torch.tensor([[-0.25]], dtype=torch.float32)
    assert troll.old_token_logp(per_token, torch.tensor([[3]])).dtype == torch.float64


# Robustness reproducers: padding, a token the old policy excludes, a token the new policy bans, an undetached old.

ALL_LOSSES = [troll.troll_loss, troll.clip_loss, troll.cispo_loss]
NEG = float("-inf")


def _loss_and_grad(loss_fn, logits, *args):
    x = logits.clone().requires_grad_()
    out = loss_fn(x, *args)
    (grad,) = torch.autograd.grad(out.loss, x)
    return out, grad


@pytest.mark.parametrize("loss_fn", ALL_LOSSES)
def test_padding_with_masked_vocab_entry_is_finite(loss_fn):
    """D1: logit 0 is -inf and a padded position: the padded position must not reach the arithmetic. The loss
    equals the loss of the unpadded first position alone."""
    x = torch.randn(1, 2, 5, generator=gen(1))
    x[..., 0] = NEG
    tok, mask = torch.tensor([[1, 3]]), torch.tensor([[True, False]])
    out, grad = _loss_and_grad(loss_fn, x, troll.sparsify(x, include=tok), tok, torch.tensor([1.0]), mask)
    alone, grad_alone = _loss_and_grad(
        loss_fn, x[:, :1], troll.sparsify(x[:, :1], include=tok[:, :1]), tok[:, :1], torch.tensor([1.0]), mask[:, :1]
    )
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    assert out.loss.item() == pytest.approx(alone.loss.item(), abs=1e-6)
    torch.testing.assert_close(grad[:, :1], grad_alone)
    assert (grad[:, 1] == 0).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("loss_fn", ALL_LOSSES)
def test_token_the_old_policy_excludes_is_dropped_and_counted(loss_fn, include):
    """D2: the old policy gives the sampled token probability 0 (sampler and old policy disagree). The token is
    dropped from the loss (loss 0, gradient 0 for a batch of one such token) and old_excluded_frac says so."""
    new = torch.randn(1, 2, 5, generator=gen(2))
    old = new.clone()
    old[0, 0, 2] = NEG
    t = torch.tensor([[2, 1]])
    sparse = troll.sparsify(old, include=t if include else None)
    out, grad = _loss_and_grad(loss_fn, new, sparse, t, torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool))
    ref, ref_grad = _loss_and_grad(
        loss_fn,
        new[:, 1:],
        troll.sparsify(old[:, 1:], include=t[:, 1:]),
        t[:, 1:],
        torch.tensor([1.0]),
        torch.ones(1, 1, dtype=torch.bool),
    )
    assert out.metrics["old_excluded_frac"].item() == 0.5
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-6)
    assert (grad[:, 0] == 0).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(grad[:, 1:], ref_grad)


@pytest.mark.parametrize("loss_fn", ALL_LOSSES)
def test_token_the_new_policy_bans_is_finite(loss_fn):
    """D3: the current policy bans a sampled token: ratio 0, a finite loss and gradient (cispo gave 0 * -inf)."""
    x = torch.randn(1, 2, 6, generator=gen(3))
    t = torch.tensor([[2, 3]])
    y = x.clone()
    y[0, 0, 2] = NEG
    args = (troll.sparsify(x, include=t), t, torch.tensor([1.0]), torch.ones(1, 2).bool())
    out, grad = _loss_and_grad(loss_fn, y, *args)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
    assert out.metrics["ratio/min"].item() == 0.0


@pytest.mark.parametrize("loss_fn", [troll.clip_loss, troll.cispo_loss])
def test_tensor_old_is_detached(loss_fn):
    """D6: old per-token log-probs computed in the same graph must not carry gradient: the gradient equals the
    one with an explicitly detached old."""
    x = torch.randn(1, 3, 6, generator=gen(4), dtype=torch.float64).requires_grad_()
    t = torch.tensor([[1, 2, 3]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    old_attached = torch.log_softmax(x, -1).gather(-1, t.unsqueeze(-1)).squeeze(-1) - 0.1  # in the graph of x
    (g1,) = torch.autograd.grad(loss_fn(x, old_attached, t, torch.tensor([1.0]), mask).loss, x)
    (g2,) = torch.autograd.grad(loss_fn(x, old_attached.detach(), t, torch.tensor([1.0]), mask).loss, x)
    torch.testing.assert_close(g1, g2)
    assert g1.abs().max() > 0.01


def test_infeasible_rows_are_reported_in_the_metrics():
    """D4: a one-hot new policy against a flat old one cannot reach KL <= eps; troll_loss reports the row in
    infeasible_frac (1 of 2 response tokens) and stays finite."""
    old = torch.zeros(1, 2, 6)
    new = old.clone()
    new[0, 0, 1:] = NEG  # row 0: one-hot on token 0 -> KL >= log 6 against the flat old policy
    t = torch.tensor([[0, 3]])
    out, grad = _loss_and_grad(
        troll.troll_loss,
        new,
        troll.sparsify(old, include=t),
        t,
        torch.tensor([1.0]),
        torch.ones(1, 2, dtype=torch.bool),
    )
    assert out.metrics["infeasible_frac"].item() == 0.5
    assert out.metrics["kl_after/max"].item() == pytest.approx(math.log(6), rel=1e-6)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()


@pytest.mark.parametrize("loss_fn", [troll.troll_loss, troll.clip_loss])
def test_sequence_level_with_a_banned_token_has_a_zero_gradient(loss_fn):
    """Found by the property tests: at level="sequence" a token the current policy bans made the GSPO weight
    exp(-inf - (-inf)) = NaN. Its sequence's weight is now 0 (log s = -inf), with a zero gradient: exactly 0 for
    the policy-gradient term, and for TROLL's regression to its own projection 0 up to rounding."""
    x = torch.randn(1, 2, 5, generator=gen(5))
    t = torch.tensor([[0, 1]])
    y = x.clone()
    y[0, 0, 0] = NEG
    args = (troll.sparsify(x, include=t), t, torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool))
    z = y.clone().requires_grad_()
    pg_only = {"alpha": 0.0} if loss_fn is troll.troll_loss else {}
    out = loss_fn(z, *args, level="sequence", **pg_only)
    (grad,) = torch.autograd.grad(out.loss, z)
    assert out.loss.item() == 0.0
    assert torch.equal(grad, torch.zeros_like(grad))
    out = loss_fn(z, *args, level="sequence")
    (grad,) = torch.autograd.grad(out.loss, z)
    assert torch.isfinite(out.loss) and grad.abs().max() < 1e-12


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("drift_scale", [0.0, 3.0])  # on-policy, and far enough off-policy that the projection acts
def test_a_small_step_moves_the_sampled_token_with_the_sign_of_its_advantage(level, drift_scale):
    """The defect this guards against is a flipped sign anywhere between the advantage and the logits: a small
    gradient-descent step on the policy-gradient term (alpha = 0) must raise the projected log pi(o_t) of every
    token with A_t > 0 and lower it where A_t < 0, as the clip loss does for the unprojected one. (The regression
    term pulls pi~ towards pi whatever the advantage, so it is left out here.)"""
    g = gen(31)
    old_logits = torch.randn(2, 6, 12, generator=g, dtype=torch.float64)
    logits = (old_logits + drift_scale * torch.randn(2, 6, 12, generator=g, dtype=torch.float64)).requires_grad_()
    tokens = torch.randint(0, 12, (2, 6), generator=g)
    adv = torch.tensor([[1.0], [-1.0]], dtype=torch.float64).expand(2, 6)
    mask = torch.ones(2, 6, dtype=torch.bool)
    old = troll.sparsify(old_logits, top_k=12, delta=0.0, include=tokens)

    def troll_logp(x):  # the projected log-prob of each sampled token
        proj = troll.project_sparse(x, old, 0.05, top_k=12, delta=0.0, include=tokens)
        return proj.logp[..., :-1].gather(-1, (proj.ids == tokens[..., None]).long().argmax(-1, keepdim=True))[..., 0]

    def clip_logp(x):
        return torch.log_softmax(x, -1).gather(-1, tokens[..., None])[..., 0]

    cases = {
        "troll": (
            lambda x: troll.troll_loss(x, old, tokens, adv, mask, kl_bound=0.05, alpha=0.0, level=level),
            troll_logp,
        ),
        "clip": (lambda x: troll.clip_loss(x, old, tokens, adv, mask, eps_low=10.0, level=level), clip_logp),
    }
    for name, (loss_fn, logp_fn) in cases.items():
        out = loss_fn(logits)
        (grad,) = torch.autograd.grad(out.loss, logits)
        with torch.no_grad():
            moved = logp_fn(logits - 1e-4 * grad) - logp_fn(logits)
        assert (moved[0] > 0).all() and (moved[1] < 0).all(), (name, moved)
        if drift_scale > 0 and name == "troll":
            assert out.metrics["projected_frac"] > 0.5  # the case exercises the projection's gradient


def test_dr_grpo_constant_shorter_than_the_sequences_is_refused():
    values, mask = torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.bool)
    assert troll.aggregate(values, mask, "seq-mean-token-sum-norm", max_len=4) == pytest.approx(6 / 8)
    with pytest.raises(ValueError, match="max_len=1 is shorter than the sequences"):
        troll.aggregate(values, mask, "seq-mean-token-sum-norm", max_len=1)


# ------------------------------------------------------------------------------ the paper's sparse representation


def flat_batch(seed: int, vocab: int = 12):
    """Flat rows (every token above 1e-3) so that a small cap K binds, as on a real small model."""
    g = gen(seed)
    old = 0.5 * torch.randn(2, 3, vocab, generator=g, dtype=torch.float64)
    new = old + 0.6 * torch.randn(2, 3, vocab, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, vocab, (2, 3), generator=g)
    adv = torch.randn(2, generator=g, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    return new, old, tokens, adv, mask


def test_renormalize_equals_the_dense_projection_at_full_support():
    new, old, tokens, adv, mask = make_batch(3, 4, 9, seed=11, scale=2.0)
    dense = reference.troll_loss(new, old, tokens, adv, mask, kl_bound=EPS)
    for tail in ("bucket", "renormalize"):
        out = full(new, old, tokens, adv, mask, tail=tail)
        torch.testing.assert_close(out.loss, dense, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("top_k", [3, 5])
def test_renormalize_matches_its_reference_when_the_cap_binds(top_k):
    new, old, tokens, adv, mask = flat_batch(top_k)
    kw = dict(kl_bound=EPS, top_k=top_k, delta=1e-5)
    old_sparse = troll.sparsify(old, top_k=top_k, delta=1e-5, include=tokens)
    x = new.clone().requires_grad_()
    out = troll.troll_loss(x, old_sparse, tokens, adv, mask, tail="renormalize", alpha=0.0, **kw)
    assert float(out.metrics["projected_frac"]) > 0
    ref = reference.troll_loss_renormalized(new, old, tokens, adv, mask, alpha=0.0, **kw)
    torch.testing.assert_close(out.loss, ref, rtol=1e-9, atol=1e-11)
    (grad,) = torch.autograd.grad(out.loss, x)

    def ref_loss(y):
        return reference.troll_loss_renormalized(y, old, tokens, adv, mask, alpha=0.0, **kw)

    torch.testing.assert_close(grad, central_diff(ref_loss, new), rtol=1e-5, atol=1e-7)
    with_reg = troll.troll_loss(new, old_sparse, tokens, adv, mask, tail="renormalize", **kw).loss
    ref_reg = reference.troll_loss_renormalized(new, old, tokens, adv, mask, **kw)
    # The regression term is large here (the old policy's fill of 1e-12 on ids only the new policy kept makes
    # KL(pi~ || pi) ~8) and as sensitive to eta as the solver's 1e-9 tolerance allows.
    torch.testing.assert_close(with_reg, ref_reg, rtol=1e-7, atol=1e-11)


def test_the_tail_modes_differ_when_the_cap_binds():
    """The rest bucket keeps the true tail mass, the paper's mode rescales it away: with K = 3 of 12 flat tokens the
    two losses differ at the first digit, and both stay within the bound."""
    new, old, tokens, adv, mask = flat_batch(0)
    old_sparse = troll.sparsify(old, top_k=3, delta=1e-5, include=tokens)
    outs = {t: troll.troll_loss(new, old_sparse, tokens, adv, mask, top_k=3, tail=t) for t in ("bucket", "renormalize")}
    assert abs(float(outs["bucket"].loss - outs["renormalize"].loss)) > 1e-2
    for out in outs.values():
        assert float(out.metrics["kl_after/max"]) <= EPS * (1 + 1e-6)
    assert float(outs["renormalize"].metrics["kl_share/rest"]) == 0  # no rest category in the paper's mode


def test_renormalize_chunked_equals_dense():
    new, old, tokens, adv, mask = flat_batch(2, vocab=40)
    g = gen(3)
    hidden = torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    weight = torch.randn(40, 8, generator=g, dtype=torch.float64)
    old_sparse = troll.sparsify(old, top_k=6, delta=1e-5, include=tokens)
    kw = dict(kl_bound=EPS, top_k=6, tail="renormalize")
    dense = troll.troll_loss(hidden @ weight.T, old_sparse, tokens, adv, mask, **kw)
    chunked = troll.troll_loss_from_hidden(hidden, weight, old_sparse, tokens, adv, mask, chunk_size=7, **kw)
    torch.testing.assert_close(chunked.loss, dense.loss, rtol=1e-10, atol=1e-12)


def test_kl_shares_by_hand():
    """At full support (no rest) the shares are the old policy's top-8 tokens' and the other tokens' terms of
    KL(pi~ || pi_old) over the projected tokens, computed here from the softmax directly."""
    new, old, tokens, adv, mask = make_batch(2, 3, 20, seed=5, scale=3.0)
    out = full(new, old, tokens, adv, mask)
    a, b = torch.log_softmax(new, -1), torch.log_softmax(old, -1)
    terms = a.exp() * (a - b)
    top8 = torch.zeros_like(terms, dtype=torch.bool).scatter_(-1, b.topk(8).indices, True)
    share = (terms * top8).sum(-1) / terms.sum(-1)
    projected = mask & (terms.sum(-1) > EPS)
    assert projected.any()
    torch.testing.assert_close(out.metrics["kl_share/old_top8"], share[projected].mean(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.metrics["kl_share/support"], 1 - share[projected].mean(), rtol=1e-9, atol=1e-12)
    assert float(out.metrics["kl_share/rest"]) == 0


def test_bad_tail_is_named():
    new, old, tokens, adv, mask = make_batch()
    old_sparse = troll.sparsify(old, include=tokens)
    with pytest.raises(ValueError, match="tail='rest' is not supported"):
        troll.troll_loss(new, old_sparse, tokens, adv, mask, tail="rest")
    with pytest.raises(ValueError, match="fill must lie in"):
        troll.troll_loss(new, old_sparse, tokens, adv, mask, tail="renormalize", fill=0.0)
