"""The projection over a sparse support plus a rest bucket (:mod:`troll.categorical.sparse_projection`,
docs/method.md): the coarse support against hand-computed cases, and project_sparse against the dense projection."""

from __future__ import annotations

import pytest
import torch
from conftest import drift, gen, peaked_logits
from hypothesis import given, settings
from hypothesis import strategies as st

import troll
from troll.categorical.policy import DenseLogits
from troll.categorical.sparse_projection import coarse_support

EPS = 0.05
NEG_INF = float("-inf")

# One row over V = 5: token 2 has 0.5, token 0 has 0.3, token 3 has 0.15, token 1 has 0.04, token 4 has 0.01.
PROBS = torch.tensor([0.3, 0.04, 0.5, 0.15, 0.01], dtype=torch.float64)


def hand_row() -> torch.Tensor:
    return (PROBS.log() + 1.7).unsqueeze(0)  # logits: an arbitrary shift must not matter


# -------------------------------------------------------------------------------------------- coarse support


def test_coarse_support_hand_case():
    """Old (V = 7) keeps tokens 2, 0 (mass 0.8); its unkept 0.2 is shared by the 5 others. New keeps token 1 and the
    sampled token 4 is included: U = [2, 0, 1, 4] and the rest {3, 5, 6} has 3 old shares."""
    old_p = torch.tensor([0.3, 0.04, 0.5, 0.1, 0.03, 0.02, 0.01], dtype=torch.float64)
    old = troll.sparsify(old_p.log().unsqueeze(0), top_k=2, delta=0.0)
    new_p = torch.tensor([0.05, 0.8, 0.02, 0.01, 0.02, 0.04, 0.06], dtype=torch.float64)
    new = DenseLogits(new_p.log().unsqueeze(0) - 3.0)
    ids, mask, a, b = coarse_support(new, old, top_k=1, delta=0.0, extra=torch.tensor([[4]]))
    assert ids.tolist() == [[2, 0, 1, 4]] and mask.tolist() == [[True] * 5]
    share = 0.2 / 5
    expected_b = torch.tensor([0.5, 0.3, share, share, 3 * share], dtype=torch.float64).log()
    expected_a = torch.tensor([0.02, 0.05, 0.8, 0.02, 0.01 + 0.04 + 0.06], dtype=torch.float64).log()
    torch.testing.assert_close(b[0], expected_b, rtol=0, atol=1e-12)
    torch.testing.assert_close(a[0], expected_a, rtol=0, atol=1e-12)


def test_coarse_support_without_rest():
    old = troll.sparsify(hand_row(), top_k=64, delta=0.25)
    new = DenseLogits(torch.zeros(1, 5, dtype=torch.float64))
    ids, mask, a, b = coarse_support(new, old, top_k=5, delta=0.0)
    assert sorted(ids[0].tolist()) == [0, 1, 2, 3, 4]
    assert mask[0, -1].item() is False and a[0, -1].item() == NEG_INF and b[0, -1].item() == NEG_INF
    torch.testing.assert_close(a.exp().sum(-1), torch.ones(1, dtype=torch.float64))
    torch.testing.assert_close(b.exp().sum(-1), torch.ones(1, dtype=torch.float64))


# -------------------------------------------------------------------------------------------- projection


def full_support(new: torch.Tensor, old: torch.Tensor, **kw) -> troll.SparseProjection:
    vocab = new.shape[-1]
    sp_old = troll.sparsify(old, top_k=vocab, delta=0.0)
    return troll.project_sparse(new, sp_old, EPS, top_k=vocab, delta=0.0, **kw)


def test_full_support_equals_dense_projection():
    g = gen(3)
    old = peaked_logits(3, 4, vocab=12, g=g, head_max=6)
    new = drift(old, g, 2.0)
    x = new.clone().requires_grad_()
    sp = full_support(x, old)
    dense = troll.project(new, old, EPS)
    assert (dense.eta > 0).any() and (dense.eta == 0).any()
    assert sp.mask[..., :-1].all() and not sp.mask[..., -1].any()  # the rest category is dropped
    logp = torch.empty_like(new).scatter(-1, sp.ids, sp.logp[..., :-1].detach())
    torch.testing.assert_close(logp, dense.logp, rtol=0, atol=1e-10)
    for name in ("eta", "kl_before", "kl_after"):
        torch.testing.assert_close(getattr(sp, name), getattr(dense, name), rtol=1e-10, atol=1e-12)
    # the gradients agree too
    w = torch.randn(new.shape, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((sp.logp[..., :-1] * w.gather(-1, sp.ids)).sum(), x)
    y = new.clone().requires_grad_()
    (expected,) = torch.autograd.grad((troll.project(y, old, EPS).logp * w).sum(), y)
    torch.testing.assert_close(grad, expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("include", [None, 5])
def test_uniform_tails_make_the_sparse_projection_exact(include):
    """When both policies are uniform outside U and the old one over all its unkept tokens, the rest bucket
    is exact and the sparse projection equals the dense one, with a heavy tail (27% of the old mass)."""
    old = torch.tensor([[3.0, 2.0] + [0.0] * 10], dtype=torch.float64)  # keeps {0, 1} with top_k = 2
    new = torch.tensor([[0.5, -1.0, 2.5, 2.0, 1.5] + [0.3] * 7], dtype=torch.float64)  # keeps {2, 3, 4}
    new = torch.cat([new, new + torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0] + [-2.0] * 7)])
    old = old.expand(2, 12)
    inc = None if include is None else torch.tensor([include, include])
    x = new.clone().requires_grad_()
    sp = troll.project_sparse(x, troll.sparsify(old, top_k=2, delta=0.0), EPS, top_k=3, delta=0.0, include=inc)
    dense = troll.project(new, old, EPS)
    assert (dense.eta > 0).all() and sp.mask[..., -1].all()
    assert sorted(sp.ids[0].tolist()) == ([0, 1, 2, 3, 4] if include is None else [0, 1, 2, 3, 4, 5])
    width = sp.ids.shape[-1]
    torch.testing.assert_close(sp.logp[..., :width], dense.logp.gather(-1, sp.ids), rtol=0, atol=1e-10)
    outside = torch.ones_like(new, dtype=torch.bool).scatter(-1, sp.ids, False)
    rest = torch.where(outside, dense.logp, NEG_INF).logsumexp(-1)
    torch.testing.assert_close(sp.logp[..., -1], rest, rtol=0, atol=1e-10)
    for name in ("eta", "kl_before", "kl_after"):
        torch.testing.assert_close(getattr(sp, name), getattr(dense, name), rtol=1e-9, atol=1e-12)
    # gradients of a loss on the support agree with the dense ones
    w = torch.randn(2, width, generator=gen(5), dtype=torch.float64)
    (grad,) = torch.autograd.grad((sp.logp[..., :width] * w).sum(), x)
    y = new.clone().requires_grad_()
    (expected,) = torch.autograd.grad((troll.project(y, old, EPS).logp.gather(-1, sp.ids) * w).sum(), y)
    torch.testing.assert_close(grad, expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("vocab", "seed"), [(2000, 0), (3000, 1), (5000, 2)])
def test_sparse_k64_close_to_dense_on_peaked_rows(vocab, seed, dtype):
    """K = 64, delta = 1e-5 on realistically peaked rows (tail mass 1e-9..1e-6, heads of 1-20 tokens) vs the dense
    fp64 projection. Measured worst cases over these seeds and both dtypes: |p_sparse - p_dense| on the support
    5.2e-6, |log pi| at the sampled token 6.7e-6, |eta| 3.7e-5, |kl_before| 5.5e-6, |kl_after| 2.9e-6. The
    tolerances below are ~10x that: the error comes from the unkept mass (<= delta) and the uniform-tail model."""
    g = gen(seed)
    old = peaked_logits(64, vocab=vocab, g=g, head_max=20)
    new = drift(old, g, 1.0)
    tok = torch.multinomial(torch.softmax(old, -1), 1, generator=g).squeeze(-1)
    sp_old = troll.sparsify(old.to(dtype), top_k=64, delta=1e-5, include=tok)
    sp = troll.project_sparse(new.to(dtype), sp_old, EPS, top_k=64, delta=1e-5, include=tok)
    dense = troll.project(new, old, EPS)
    assert sp.ids.shape[-1] <= 2 * 64 + 1 and sp.logp.dtype == torch.float64
    assert 5 < int((dense.eta > 0).sum()) < 64
    m = sp.mask[..., :-1]
    at = dense.logp.gather(-1, sp.ids)
    p_err = torch.where(m, sp.logp[..., :-1].exp() - at.exp(), 0.0).abs().max()
    assert p_err < 5e-5
    slot = (sp.ids == tok.unsqueeze(-1)).long().argmax(-1, keepdim=True)
    torch.testing.assert_close(
        sp.logp.gather(-1, slot).squeeze(-1), dense.logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1), rtol=0, atol=1e-4
    )
    torch.testing.assert_close(sp.eta, dense.eta, rtol=0, atol=5e-4)
    torch.testing.assert_close(sp.kl_before, dense.kl_before, rtol=0, atol=5e-5)
    torch.testing.assert_close(sp.kl_after, dense.kl_after, rtol=0, atol=3e-5)
    # the rest bucket holds the projected mass outside U, which is small
    rest_dense = 1 - at.exp().where(m, 0.0).sum(-1)
    torch.testing.assert_close(sp.logp[..., -1].exp(), rest_dense, rtol=0, atol=5e-5)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 8),
    vocab=st.sampled_from([3, 20, 300, 2000]),
    top_k=st.sampled_from([1, 2, 8, 64]),
    delta=st.sampled_from([0.0, 1e-5, 1e-2]),
    head_max=st.integers(1, 20),
    scale=st.sampled_from([0.1, 1.0, 3.0]),
    tail_token=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_sparse_bound_holds_on_every_row(rows, vocab, top_k, delta, head_max, scale, tail_token, seed):
    g = gen(seed)
    old = peaked_logits(rows, vocab=vocab, g=g, head_max=head_max)
    new = drift(old, g, scale)
    tok = torch.randint(0, vocab, (rows,), generator=g) if tail_token else old.argmax(-1)
    sp_old = troll.sparsify(old, top_k=top_k, delta=delta, include=tok)
    sp = troll.project_sparse(new, sp_old, EPS, top_k=top_k, delta=delta, include=tok)
    assert torch.isfinite(sp.eta).all() and not torch.isnan(sp.logp).any()
    assert ((sp.ids == tok.unsqueeze(-1)) & sp.mask[..., :-1]).any(-1).all()
    torch.testing.assert_close(sp.logp.logsumexp(-1), torch.zeros(rows, dtype=torch.float64), rtol=0, atol=1e-12)
    p = sp.logp.exp()
    true_kl = torch.where(p > 0, p * (sp.logp - sp.old_logp), 0.0).sum(-1)  # over the coarse categories
    assert (true_kl <= EPS * (1 + 1e-6)).all(), true_kl.max()
    assert (sp.kl_after <= EPS * (1 + 1e-6)).all()
    active = sp.eta > 0
    assert ((true_kl[active] - EPS).abs() / EPS < 1e-4).all()
    # new_logp and old_logp are normalised coarse distributions
    for t in (sp.new_logp, sp.old_logp):
        torch.testing.assert_close(t.logsumexp(-1), torch.zeros(rows, dtype=torch.float64), rtol=0, atol=1e-9)


def test_sparse_gradient_reaches_every_logit():
    """Through the full-vocabulary logsumexp, a loss on the support moves the logits outside it too."""
    g = gen(4)
    old = peaked_logits(4, vocab=200, g=g, head_max=4)
    new = drift(old, g, 2.0).requires_grad_()
    sp_old = troll.sparsify(old, top_k=8, delta=1e-5)
    sp = troll.project_sparse(new, sp_old, EPS, top_k=8, delta=1e-5)
    loss = sp.logp[..., 0].sum()
    (grad,) = torch.autograd.grad(loss, new)
    assert torch.isfinite(grad).all()
    outside = torch.ones_like(new, dtype=torch.bool).scatter(-1, sp.ids, False)
    assert (grad[outside] != 0).float().mean() > 0.9


def test_project_sparse_refuses_a_hand_built_old_policy_that_is_not_normalised():
    """A hand-built SparseLogProbs whose kept mass exceeds 1 (raw logits passed as log-probs) is refused, naming it."""
    logits = torch.randn(3, 10, generator=gen(5), dtype=torch.float64)
    old = troll.sparsify(logits, top_k=4, delta=0.0)
    bad = troll.SparseLogProbs(old.ids, logits.gather(-1, old.ids), old.mask, 10)  # raw logits, not log-probs
    with pytest.raises(ValueError, match="old.logp"):
        troll.project_sparse(logits, bad, 0.05)
    troll.project_sparse(logits, old, 0.05)  # the well-formed one passes
