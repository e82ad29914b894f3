"""The clip-family baselines (PPO/GRPO clip, clip-higher, dual-clip, GSPO, CISPO) on hand-computed tiny cases."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import drift, gen

import troll


def tiny_batch(ratios, adv, *, vocab=3, seed=0):
    """One sequence (1, T, V) of fp64 logits, sampled tokens, and old per-token log-probs chosen so that the
    importance ratio at token t is exactly ``ratios[t]``. Returns logits, old (1, T), tokens, advantages (1, T)."""
    g = gen(seed)
    n = len(ratios)
    logits = torch.randn(1, n, vocab, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, vocab, (1, n), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old = logp - torch.tensor(ratios, dtype=torch.float64).log()
    return logits, old, tokens, torch.tensor([adv], dtype=torch.float64)


def dlogp(logits, tokens):
    """d log pi(o_t) / d logits_t = onehot(o_t) - softmax(logits_t): (B, T, V)."""
    onehot = torch.nn.functional.one_hot(tokens, logits.shape[-1]).double()
    return onehot - torch.softmax(logits.double(), -1)


def grad_of(fn, logits):
    x = logits.clone().requires_grad_()
    out = fn(x)
    (grad,) = torch.autograd.grad(out.loss, x)
    return out, grad


# ---------------------------------------------------------------------------------------------- clip


# per token: (ratio, advantage, loss, gradient flows?)  with eps_low = eps_high = 0.2
CLIP_CASES = [
    (1.1, 1.0, -1.1, True),  # inside the region
    (1.5, 1.0, -1.2, False),  # A > 0 above 1 + eps: clipped
    (0.5, 1.0, -0.5, True),  # A > 0 below 1 - eps: the unclipped term is the max, gradient flows
    (0.5, -1.0, 0.8, False),  # A < 0 below 1 - eps: clipped
    (1.5, -1.0, 1.5, True),  # A < 0 above 1 + eps: unclipped (this is what dual-clip caps)
    (0.9, -2.0, 1.8, True),  # inside, A < 0
]


def test_clip_loss_hand_cases():
    ratios, adv, per_token, flows = zip(*CLIP_CASES)
    logits, old, tokens, adv = tiny_batch(ratios, adv)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    out, grad = grad_of(lambda x: troll.clip_loss(x, old, tokens, adv, mask, eps_low=0.2), logits)
    assert out.loss.item() == pytest.approx(sum(per_token) / len(per_token), abs=1e-12)
    coef = torch.tensor([-a * r if f else 0.0 for r, a, f in zip(ratios, adv[0].tolist(), flows)], dtype=torch.float64)
    expected = coef.reshape(1, -1, 1) * dlogp(logits, tokens) / len(ratios)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)
    m = out.metrics
    assert m["clip/high_frac"].item() == pytest.approx(1 / 6)  # case 2
    assert m["clip/low_frac"].item() == pytest.approx(1 / 6)  # case 4
    assert m["clip/region_frac"].item() == pytest.approx(2 / 6)
    assert m["clip/dual_frac"].item() == 0.0
    assert m["ratio/min"].item() == pytest.approx(0.5) and m["ratio/max"].item() == pytest.approx(1.5)
    assert m["ratio/mean"].item() == pytest.approx(sum(ratios) / 6)


@pytest.mark.parametrize(("eps_high", "expected"), [(None, -1.2), (0.2, -1.2), (0.28, -1.25), (0.3, -1.25)])
def test_clip_higher(eps_high, expected):
    """DAPO clip-higher: r = 1.25 with A = 1 is clipped at 1.2 by eps 0.2 but not by eps_high 0.28."""
    logits, old, tokens, adv = tiny_batch([1.25, 0.7], [1.0, -1.0])
    mask = torch.ones_like(tokens, dtype=torch.bool)
    out = troll.clip_loss(logits, old, tokens, adv, mask, eps_low=0.2, eps_high=eps_high)
    # token 2: A < 0, r = 0.7 < 1 - eps_low: clipped at 0.8 whatever eps_high is
    assert out.loss.item() == pytest.approx((expected + 0.8) / 2, abs=1e-12)
    assert out.metrics["clip/high_frac"].item() == (0.5 if expected == -1.2 else 0.0)


def test_asymmetric_low_clip():
    logits, old, tokens, adv = tiny_batch([0.85, 0.85], [-1.0, 1.0])
    mask = torch.ones_like(tokens, dtype=torch.bool)
    loose = troll.clip_loss(logits, old, tokens, adv, mask, eps_low=0.2, eps_high=0.1)
    tight = troll.clip_loss(logits, old, tokens, adv, mask, eps_low=0.1, eps_high=0.2)
    assert loose.loss.item() == pytest.approx((0.85 - 0.85) / 2, abs=1e-12)
    assert tight.loss.item() == pytest.approx((0.9 - 0.85) / 2, abs=1e-12)  # A < 0 clipped at 1 - 0.1


def test_dual_clip():
    """c = 3 caps the loss of A < 0 tokens at -c A; A > 0 tokens are untouched."""
    cases = [
        (5.0, -1.0, 3.0, False),  # max(5, 1.2) = 5 > 3: capped, no gradient
        (2.0, -2.0, 4.0, True),  # max(4, 2.4) = 4 < 6: unchanged
        (5.0, 1.0, -1.2, False),  # A > 0: ordinary clip
        (0.5, -1.0, 0.8, False),  # A < 0 low clip, below the cap
    ]
    ratios, adv, per_token, flows = zip(*cases)
    logits, old, tokens, adv = tiny_batch(ratios, adv)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    out, grad = grad_of(lambda x: troll.clip_loss(x, old, tokens, adv, mask, dual_clip=3.0), logits)
    assert out.loss.item() == pytest.approx(sum(per_token) / 4, abs=1e-12)
    coef = torch.tensor([-a * r if f else 0.0 for r, a, f in zip(ratios, adv[0].tolist(), flows)], dtype=torch.float64)
    torch.testing.assert_close(grad, coef.reshape(1, -1, 1) * dlogp(logits, tokens) / 4, rtol=0, atol=1e-12)
    assert out.metrics["clip/dual_frac"].item() == pytest.approx(1 / 4)
    no_dual = troll.clip_loss(logits, old, tokens, adv, mask)
    assert no_dual.loss.item() == pytest.approx((5.0 + 4.0 - 1.2 + 0.8) / 4, abs=1e-12)


def test_sequence_level_gspo():
    """GSPO: r_i = exp(mean_t log r_t) over the response tokens of sequence i, clipped like a token ratio."""
    g = gen(1)
    logits = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 4, (2, 3), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    ratios = torch.tensor([[1.3, 0.9, 77.0], [1.5, 1.4, 1.6]], dtype=torch.float64)  # 77 sits under the mask
    old = logp - ratios.log()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    s0 = math.sqrt(1.3 * 0.9)  # 1.0817: inside [0.8, 1.2]
    s1 = (1.5 * 1.4 * 1.6) ** (1 / 3)  # 1.4982: above 1.2, clipped
    out, grad = grad_of(lambda x: troll.clip_loss(x, old, tokens, adv, mask, level="sequence"), logits)
    assert out.loss.item() == pytest.approx((2 * -s0 + 3 * -1.2) / 5, abs=1e-12)
    assert out.metrics["ratio/mean"].item() == pytest.approx((2 * s0 + 3 * s1) / 5, abs=1e-12)
    assert out.metrics["clip/high_frac"].item() == pytest.approx(3 / 5)
    # the GSPO-token gradient of sequence 0: -A s_0 d log pi(o_t) per token; sequence 1 is clipped
    expected = torch.zeros_like(logits)
    expected[0, :2] = -s0 * dlogp(logits, tokens)[0, :2] / 5
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


def test_sparse_old_equals_per_token_old():
    g = gen(2)
    old_logits = torch.randn(3, 4, 50, generator=g, dtype=torch.float64)
    logits = drift(old_logits, g, 0.5)
    tokens = torch.multinomial(torch.softmax(old_logits, -1).reshape(-1, 50), 1, generator=g).reshape(3, 4)
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 4, generator=g) > 0.2
    per_token = torch.log_softmax(old_logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    sparse = troll.sparsify(old_logits, top_k=8, include=tokens)
    for fn, kw in [
        (troll.clip_loss, {"dual_clip": 3.0}),
        (troll.clip_loss, {"level": "sequence"}),
        (troll.cispo_loss, {}),
    ]:
        out_t, grad_t = grad_of(lambda x, fn=fn, kw=kw: fn(x, per_token, tokens, adv, mask, **kw), logits)
        out_s, grad_s = grad_of(lambda x, fn=fn, kw=kw: fn(x, sparse, tokens, adv, mask, **kw), logits)
        torch.testing.assert_close(out_s.loss, out_t.loss, rtol=0, atol=1e-12)
        torch.testing.assert_close(grad_s, grad_t, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------- CISPO


def test_cispo_hand_case():
    """loss_t = -sg(min(r_t, eps_high)) A_t log pi(o_t); gradient -min(r, eps_high) A d log pi, never zeroed."""
    ratios, adv = [0.5, 1.5, 3.0, 4.0], [1.0, -1.0, 2.0, -0.5]
    logits, old, tokens, adv_t = tiny_batch(ratios, adv)
    mask = torch.tensor([[True, True, True, False]])
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)[0].tolist()
    weights = [min(r, 2.0) for r in ratios]
    out, grad = grad_of(lambda x: troll.cispo_loss(x, old, tokens, adv_t, mask, eps_high=2.0), logits)
    expected = sum(-w * a * lp for w, a, lp in zip(weights[:3], adv[:3], logp[:3])) / 3
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    coef = torch.tensor([-w * a for w, a in zip(weights, adv)], dtype=torch.float64) * mask[0]
    torch.testing.assert_close(grad, coef.reshape(1, -1, 1) * dlogp(logits, tokens) / 3, rtol=0, atol=1e-12)
    assert out.metrics["clip/high_frac"].item() == pytest.approx(1 / 3)  # r = 3 > 2 (r = 4 is masked)
    assert out.metrics["ratio/max"].item() == pytest.approx(3.0)


# ---------------------------------------------------------------------------------------------- KL metric


def test_clip_kl_metric_is_not_bounded():
    """Policies far apart: clipping bounds the ratio's gradient, not the KL, which the metric reports."""
    g = gen(3)
    old_logits = torch.randn(2, 5, 6, generator=g, dtype=torch.float64)
    logits = old_logits + 3.0 * torch.randn(2, 5, 6, generator=g, dtype=torch.float64)
    tokens = torch.multinomial(torch.softmax(old_logits, -1).reshape(-1, 6), 1, generator=g).reshape(2, 5)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 5, dtype=torch.bool)
    a, b = torch.log_softmax(logits, -1), torch.log_softmax(old_logits, -1)
    dense_kl = (a.exp() * (a - b)).sum(-1)

    sparse = troll.sparsify(old_logits, top_k=6, delta=0.0)  # the whole vocabulary: the coarse KL is exact
    m = troll.clip_loss(logits, sparse, tokens, adv, mask).metrics
    assert m["kl/max"].item() > 0.05 and m["kl/mean"].item() > 0.05
    assert m["kl/mean"].item() == pytest.approx(dense_kl.mean().item(), rel=1e-9)
    assert m["kl/max"].item() == pytest.approx(dense_kl.max().item(), rel=1e-9)

    per_token = b.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    m = troll.clip_loss(logits, per_token, tokens, adv, mask).metrics
    log_r = per_token - a.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    k3 = log_r.exp() - 1 - log_r
    assert m["kl/mean"].item() == pytest.approx(k3.mean().item(), rel=1e-9)
    assert m["kl/max"].item() > 0.05


@pytest.mark.parametrize("loss_fn", [troll.clip_loss, troll.cispo_loss])
def test_kl_metric_uses_the_callers_top_k_and_delta(loss_fn):
    """The kl metric is the sparse-support KL with the caller's top_k / delta (it hard-coded 64 and 1e-5): with
    top_k = V it equals the dense KL(pi~ || pi_old) in fp64; with top_k = 1 it is the coarser bucketed value."""
    g = torch.Generator().manual_seed(11)
    old_logits = torch.randn(2, 3, 9, generator=g, dtype=torch.float64)
    logits = old_logits + torch.randn(2, 3, 9, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 9, (2, 3), generator=g)
    old = troll.sparsify(old_logits, top_k=9, delta=0.0)
    mask = torch.ones(2, 3, dtype=torch.bool)
    p = torch.log_softmax(logits, -1)
    dense = (p.exp() * (p - torch.log_softmax(old_logits, -1))).sum(-1)
    full = loss_fn(logits, old, tokens, torch.ones(2), mask, top_k=9, delta=0.0).metrics
    assert full["kl/mean"].item() == pytest.approx(dense.mean().item(), rel=1e-10)
    coarse = loss_fn(logits, troll.sparsify(old_logits, top_k=1, delta=0.0), tokens, torch.ones(2), mask, top_k=1)
    assert coarse.metrics["kl/mean"].item() < dense.mean().item()
    with pytest.raises(ValueError, match="top_k"):
        loss_fn(logits, old, tokens, torch.ones(2), mask, top_k=0)
