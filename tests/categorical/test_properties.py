"""Property tests (hypothesis) of the projection's robustness: on random shapes, dtypes, -inf patterns, padding
and bounds from 1e-8 to 10, every row either meets the bound (recomputed in fp64 from the returned log-probs) or
is reported as infeasible, and every loss and gradient is finite. Budget: well under a minute for the file."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import troll

DTYPES = [torch.float32, torch.bfloat16, torch.float64]
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BOUND_TOL = 1e-6  # relative slack on the recomputed KL (the fp64 solver stops within 1e-9)


@st.composite
def problems(draw, *, lead_dims: int):
    """(new, old, eps, seed): logits of shape (lead..., V) with random -inf patterns (at least one finite entry per
    row), a scale up to 10 so that rows range from flat to one-hot, and a bound log-uniform in [1e-8, 10]."""
    shape = tuple(draw(st.integers(1, 4)) for _ in range(lead_dims)) + (draw(st.integers(2, 12)),)
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    dtype = draw(st.sampled_from(DTYPES))
    scale_new, scale_old = draw(st.floats(0.1, 10.0)), draw(st.floats(0.1, 10.0))
    old = torch.randn(shape, generator=g, dtype=torch.float64) * scale_old
    new = old + torch.randn(shape, generator=g, dtype=torch.float64) * scale_new
    for x, p in ((new, draw(st.floats(0.0, 0.7))), (old, draw(st.floats(0.0, 0.7)))):
        banned = torch.rand(shape, generator=g) < p
        banned[..., 0] &= ~banned[..., 1:].all(-1)  # keep one entry per row
        x.masked_fill_(banned, float("-inf"))
    eps = 10 ** draw(st.floats(-8.0, 1.0))
    return new.to(dtype), old.to(dtype), eps, g


def recomputed_kl(logp: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """KL(pi || pi_old) in fp64 from returned log-probs (renormalised: fp32 sums to 1 only within ~1e-7)."""
    p_logp = torch.log_softmax(logp.double(), -1)
    q_logp = torch.log_softmax(old.double(), -1)
    p = p_logp.exp()
    return torch.where(p > 0, p * (p_logp - q_logp), 0.0).sum(-1)


@SETTINGS
@given(problems(lead_dims=1))
def test_dense_projection_meets_the_bound_or_reports(problem):
    new, old, eps, _ = problem
    x = new.clone().requires_grad_()
    out = troll.project(x, old, eps)
    after = recomputed_kl(out.logp.detach(), old)
    flagged = troll.infeasible(out.kl_after, eps)
    assert bool((flagged | (after <= eps * (1 + BOUND_TOL))).all()), (after / eps, flagged)
    # ... and a flagged row is one whose bound no policy on the new support reaches: the least KL there,
    # -log(old mass on the tokens the new policy allows), is above the bound.
    allowed = torch.where(new.double() > -math.inf, torch.softmax(old.double(), -1), 0.0).sum(-1)
    least = -torch.log(allowed)
    assert bool((~flagged | (least > eps * (1 - 1e-6))).all()), (least / eps, flagged)
    assert not torch.isnan(out.logp).any()
    (grad,) = torch.autograd.grad(torch.where(out.logp > -math.inf, out.logp, 0.0).sum(), x)
    assert torch.isfinite(grad.double()).all()


@st.composite
def batches(draw):
    new, old, eps, g = draw(problems(lead_dims=2))
    bsz, seq, vocab = new.shape
    tokens = torch.randint(0, vocab, (bsz, seq), generator=g)
    new_ok = new[..., 0] > float("-inf")  # a token the new policy allows in about half the draws
    tokens = torch.where(new_ok & (torch.rand(bsz, seq, generator=g) < 0.5), 0, tokens)
    mask = torch.rand(bsz, seq, generator=g) < draw(st.floats(0.0, 1.0))
    adv = torch.randn(bsz, generator=g) if draw(st.booleans()) else torch.randn(bsz, seq, generator=g)
    return new, old, tokens, adv, mask, eps


@pytest.mark.parametrize("loss_fn", [troll.troll_loss, troll.clip_loss, troll.cispo_loss])
@SETTINGS
@given(batch=batches(), level=st.sampled_from(["token", "sequence"]), agg=st.sampled_from(troll.AGGREGATIONS))
def test_losses_are_finite(loss_fn, batch, level, agg):
    """Padding over -inf logits, sampled tokens either policy bans, any bound: loss, gradient, metrics finite."""
    new, old, tokens, adv, mask, eps = batch
    x = new.clone().requires_grad_()
    sparse = troll.sparsify(old, include=tokens, top_k=4)
    kw = {"agg": agg}
    if loss_fn is troll.troll_loss:
        kw |= {"kl_bound": eps, "level": level, "top_k": 4}
    elif loss_fn is troll.clip_loss:
        kw |= {"level": level}
    out = loss_fn(x, sparse, tokens, adv, mask, **kw)
    (grad,) = torch.autograd.grad(out.loss, x)
    assert torch.isfinite(out.loss) and torch.isfinite(grad.double()).all()
    assert all(torch.isfinite(v) for v in out.metrics.values()), out.metrics
    assert bool((grad[~mask] == 0).all())  # padding never reaches the gradient


@SETTINGS
@given(batch=batches())
def test_troll_loss_rows_meet_the_bound_or_are_reported(batch):
    """Per row of the sparse support (the same projection troll_loss runs): within the bound, or infeasible; and the
    loss's kl_after/max exceeds the bound only if infeasible_frac says some row is infeasible."""
    new, old, tokens, adv, mask, eps = batch
    sparse = troll.sparsify(old, include=tokens, top_k=4)
    proj = troll.project_sparse(new, sparse, eps, top_k=4, include=tokens)
    after = recomputed_kl(proj.logp, proj.old_logp)
    assert bool((troll.infeasible(proj.kl_after, eps) | (after <= eps * (1 + BOUND_TOL))).all())
    m = troll.troll_loss(new, sparse, tokens, adv, mask, kl_bound=eps, top_k=4).metrics
    if m["kl_after/max"] > eps * (1 + 1e-3):
        assert m["infeasible_frac"] > 0
