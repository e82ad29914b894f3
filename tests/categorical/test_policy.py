"""The dense current policy's fused backward and the one-pass kept set (troll.categorical.policy,
troll.categorical.sparse.kept_ids)."""

from __future__ import annotations

import pytest
import torch

import troll
from troll.categorical.lm_head import ChunkedLMHead
from troll.categorical.policy import CurrentPolicy, DenseLogits, blocked_logsumexp
from troll.categorical.sparse import kept_ids
from troll.categorical.sparse_projection import coarse_support

NEG_INF = float("-inf")


def _logits(n=6, v=40, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = (2.0 * torch.randn(n, v, generator=g)).to(dtype)
    x[1, 3:9] = NEG_INF  # masked vocabulary entries
    x[-2, ::2] = NEG_INF
    return x


def _ids(n, seed=1, v=40):
    """Two candidate lists whose ids repeat within and across them (and padding id 0)."""
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(0, v, (n, 5), generator=g)
    second = torch.cat([first[:, :2], torch.randint(0, v, (n, 3), generator=g)], -1)
    first[:, 0] = first[:, 1]
    return first, second


def _loss(lse, at1, at2, w):
    """A loss that uses lse, both gathers and their products (so every gradient term is non-trivial)."""
    return (w[0] * lse).sum() + (w[1] * at1).sum() + (w[2] * (at2 - lse).exp()).sum() + (at1 * at2).sum() * 0.01


def _weights(n, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, generator=g, dtype=torch.float64), *torch.randn(2, n, 5, generator=g).double()


def test_fused_backward_equals_autograd_in_float64():
    x = _logits()
    ids1, ids2 = _ids(x.shape[0])
    w = _weights(x.shape[0])
    # Reference: plain autograd ops. A gathered -inf (masked id) is made finite so the loss stays finite.
    ref = x.clone().requires_grad_(True)
    lse_r = torch.logsumexp(ref, -1, keepdim=True)
    _loss(lse_r, *(ref.gather(-1, i).nan_to_num(neginf=-50.0) for i in (ids1, ids2)), w).backward()
    fused = x.clone().requires_grad_(True)
    new = DenseLogits(fused)
    lse = new.lse  # read before at(), as the loss does
    at1, at2 = (new.at(i).nan_to_num(neginf=-50.0) for i in (ids1, ids2))
    _loss(lse, at1, at2, w).backward()
    torch.testing.assert_close(lse, lse_r, rtol=0, atol=1e-12)
    torch.testing.assert_close(fused.grad, ref.grad, rtol=1e-12, atol=1e-12)
    assert torch.isfinite(fused.grad).all()
    assert (fused.grad[1, 3:9][~torch.isin(torch.arange(3, 9), torch.cat([ids1[1], ids2[1]]))] == 0).all()


def test_gradcheck_tiny():
    ids1, ids2 = _ids(3, v=7)
    x = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def f(z):
        new = DenseLogits(z)
        return new.at(ids1) - new.lse, new.at(ids2) * new.lse

    assert torch.autograd.gradcheck(f, (x.requires_grad_(True),))


def test_at_alone_still_gets_its_gradient():
    """The logsumexp's backward writes the pending gathers' gradient even when the loss does not use lse."""
    x = _logits(n=5, v=9)
    ids, _ = _ids(5, v=9)
    fused = x.clone().requires_grad_(True)
    DenseLogits(fused).at(ids).sum().backward()
    ref = x.clone().requires_grad_(True)
    ref.gather(-1, ids).sum().backward()
    torch.testing.assert_close(fused.grad, ref.grad, rtol=0, atol=0)


def test_lse_first_read_without_grad_then_with_grad():
    x = _logits(n=4, v=9).clamp_min(-30.0)
    ids, _ = _ids(4, v=9)
    fused = x.clone().requires_grad_(True)
    new = DenseLogits(fused)
    with torch.no_grad():
        assert new.lse.grad_fn is None
    (new.at(ids) - new.lse).sum().backward()
    ref = x.clone().requires_grad_(True)
    (ref.gather(-1, ids) - torch.logsumexp(ref, -1, keepdim=True)).sum().backward()
    torch.testing.assert_close(fused.grad, ref.grad, rtol=1e-12, atol=1e-12)


def test_bf16_computed_in_fp32_and_gradient_in_bf16():
    x32 = _logits(n=300, v=1000, dtype=torch.float32)
    x16 = x32.bfloat16()
    ids1, ids2 = _ids(300, v=1000)
    w = [t.float() for t in _weights(300)]
    ref = x16.float().requires_grad_(True)
    r = DenseLogits(ref)
    _loss(r.lse, *(r.at(i).nan_to_num(neginf=-50.0) for i in (ids1, ids2)), w).backward()
    fused = x16.clone().requires_grad_(True)
    new = DenseLogits(fused)
    assert new.lse.dtype == torch.float32 and new.at(ids1).dtype == torch.float32
    _loss(new.lse, *(new.at(i).nan_to_num(neginf=-50.0) for i in (ids1, ids2)), w).backward()
    assert fused.grad.dtype == torch.bfloat16
    torch.testing.assert_close(fused.grad.float(), ref.grad.bfloat16().float(), rtol=0, atol=0)


def test_blocked_logsumexp_matches_and_has_no_gradient():
    x = torch.randn(1000, 700, dtype=torch.float64).requires_grad_(True)
    lse = blocked_logsumexp(x)
    assert not lse.requires_grad
    torch.testing.assert_close(lse, torch.logsumexp(x.detach(), -1, keepdim=True), rtol=0, atol=1e-12)


def test_troll_loss_gradient_equals_plain_autograd(monkeypatch):
    """troll_loss through the fused DenseLogits equals the same loss through a plain logsumexp + gather."""
    g = torch.Generator().manual_seed(5)
    old_logits = 3 * torch.randn(2, 6, 50, generator=g, dtype=torch.float64)
    logits = old_logits + torch.randn(2, 6, 50, generator=g, dtype=torch.float64)
    logits[0, 2, 10:20] = NEG_INF
    tokens = torch.distributions.Categorical(logits=old_logits).sample()
    old = troll.sparsify(old_logits, top_k=8, delta=1e-3, include=tokens)
    adv, mask = torch.randn(2, 6, generator=g, dtype=torch.float64), torch.ones(2, 6, dtype=torch.bool)

    def grad_of():
        z = logits.clone().requires_grad_(True)
        troll.troll_loss(z, old, tokens, adv, mask, kl_bound=0.02, top_k=8, delta=1e-3).loss.backward()
        return z.grad

    fused = grad_of()

    class Plain:  # the former DenseLogits: autograd's logsumexp and gather
        def __init__(self, x, lse=None):
            self.x, self.vocab_size = x, x.shape[-1]
            self.lse = torch.logsumexp(x, -1, keepdim=True) if lse is None else lse

        def kept(self, top_k, delta):
            return kept_ids(self.x.detach(), self.lse.detach(), top_k, delta)

        def at(self, ids):
            return self.x.gather(-1, ids)

    monkeypatch.setattr(troll.categorical.losses, "DenseLogits", Plain)
    torch.testing.assert_close(fused, grad_of(), rtol=1e-10, atol=1e-12)
    assert fused.abs().sum() > 0


def test_policies_satisfy_the_protocol():
    x = torch.randn(4, 30)
    assert isinstance(DenseLogits(x), CurrentPolicy)
    assert isinstance(ChunkedLMHead(torch.randn(4, 5), torch.randn(30, 5)), CurrentPolicy)


# ------------------------------------------------------------------------------------------ the kept set


def _mixed_rows(n=200, v=3000, flat_frac=0.5, seed=0):
    """Flat rows (mass spread over hundreds of tokens) and peaked rows (a few tokens carry almost everything)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, v, generator=g, dtype=torch.float64)
    peaked = torch.rand(n, generator=g) >= flat_frac
    lift = torch.randint(0, v, (n, 3), generator=g)
    x[peaked] = x[peaked].scatter(1, lift[peaked], 25.0 + torch.randn(int(peaked.sum()), 3, generator=g).double())
    return x, torch.logsumexp(x, -1, keepdim=True)


def _as_sets(ids, mask):
    return [set(r[m].tolist()) for r, m in zip(ids, mask)]


@pytest.mark.parametrize("flat_frac", [0.0, 0.1, 0.5, 1.0])
def test_single_and_two_pass_kept_sets_agree(flat_frac, monkeypatch):
    x, lse = _mixed_rows(flat_frac=flat_frac)
    two = kept_ids(x, lse, 64, 1e-5, probe=0)  # top-16 for all, top-64 for the rows that fall short
    full = kept_ids(x, lse, 64, 1e-5, first_k=64)  # one top-64 pass
    calls = []
    original = torch.Tensor.topk

    def spy(self, k, *a, **kw):
        calls.append((self.shape[0], k))
        return original(self, k, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "topk", spy)
    chosen = kept_ids(x, lse, 64, 1e-5)
    monkeypatch.undo()
    assert _as_sets(*two) == _as_sets(*full) == _as_sets(*chosen)
    assert two[0].shape == full[0].shape == chosen[0].shape
    assert calls[0] == (64, 16)  # the probe
    if flat_frac >= 0.5:  # flat batch: one top-64 pass over every row and nothing else
        assert calls[1:] == [(200, 64)]
    else:
        assert calls[1] == (200, 16)
    if flat_frac > 0:
        assert max(len(s) for s in _as_sets(*chosen)) > 16  # the flat rows needed more than the first pass


def test_coarse_support_takes_any_current_policy():
    x = _logits(n=5, v=30).clamp_min(-30.0)
    old = troll.sparsify(x + 0.3, top_k=6, delta=1e-3)
    dense = coarse_support(DenseLogits(x), old, top_k=6, delta=1e-3)

    class Minimal:  # the four members only
        vocab_size = 30
        lse = torch.logsumexp(x, -1, keepdim=True)

        def kept(self, top_k, delta):
            return kept_ids(x, self.lse, top_k, delta)

        def at(self, ids):
            return x.gather(-1, ids)

    for got, want in zip(coarse_support(Minimal(), old, top_k=6, delta=1e-3), dense):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
