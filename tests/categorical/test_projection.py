"""The dense KL trust-region projection (docs/method.md) against the float64 reference and its own properties.

Tolerances:
- values vs ``reference.project`` in fp64: 1e-8 absolute (the fast solver stops within 1e-9 relative of the bound,
  the reference bisects to machine precision; the gap measured is ~1e-9 on log-probs);
- feasibility: KL_after <= eps * (1 + 1e-6) in fp64 (the solver aims for [eps (1 - 1e-9), eps]);
- on the bound: |KL_after - eps| / eps < 1e-4 for every projected row.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import drift, gen, peaked_logits
from hypothesis import given, settings
from hypothesis import strategies as st

import troll
from troll.categorical import reference

EPS = 0.05
NEG_INF = float("-inf")


def kl(p_logp: torch.Tensor, q_logp: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim in fp64, written independently of the library (0 log 0 = 0)."""
    p_logp, q_logp = p_logp.double(), q_logp.double()
    p = p_logp.exp()
    return torch.where(p > 0, p * (p_logp - q_logp), torch.zeros_like(p)).sum(-1)


def mixed_rows(g: torch.Generator, rows: int = 6, vocab: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, V) new/old logits in fp64 whose drift grows along the rows, so early rows are inside the region."""
    old = torch.randn(rows, vocab, generator=g, dtype=torch.float64)
    scale = torch.logspace(-2, 0.5, rows, dtype=torch.float64).unsqueeze(-1)
    return old + scale * torch.randn(rows, vocab, generator=g, dtype=torch.float64), old


def finite_where(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def central_diff(fn_row, x: torch.Tensor, h: float = 1e-6, where: torch.Tensor | None = None) -> torch.Tensor:
    """Central finite differences of ``sum_i fn_row(i, x[i])`` over the (selected) entries of the rows ``x`` (N, V).

    Rows are independent, so each difference only re-evaluates its own row.
    """
    grad = torch.zeros_like(x)
    where = torch.ones_like(x, dtype=torch.bool) if where is None else where
    for i, j in where.nonzero().tolist():
        step = torch.zeros_like(x[i])
        step[j] = h
        grad[i, j] = (fn_row(i, x[i] + step) - fn_row(i, x[i] - step)) / (2 * h)
    return grad


# ----------------------------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("lead", "vocab", "scale", "seed"),
    [((6,), 5, 1.0, 0), ((2, 3), 40, 2.0, 1), ((2, 2, 2), 300, 1.5, 2), ((9,), 2, 3.0, 3)],
)
def test_matches_reference_fp64(lead, vocab, scale, seed):
    g = gen(seed)
    old = peaked_logits(*lead, vocab=vocab, g=g, head_max=min(vocab - 1, 6))
    new = drift(old, g, scale)
    out = troll.project(new, old, EPS)
    ref_logp, ref_eta, ref_before, ref_after = reference.project(new, old, EPS)
    assert out.logp.dtype == torch.float64 and out.logp.shape == new.shape and out.eta.shape == lead
    active = ref_eta > 0
    assert active.any() and (~active).any() or vocab == 2, "the case must mix projected and untouched rows"
    torch.testing.assert_close(out.logp, ref_logp, rtol=0, atol=1e-8)
    torch.testing.assert_close(out.eta, ref_eta, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(out.kl_before, ref_before, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.kl_after, ref_after, rtol=0, atol=1e-8 * EPS)


def test_rows_are_independent_of_the_batch():
    """Projecting a row alone or inside a batch gives the same answer (no cross-row coupling in the solver)."""
    g = gen(5)
    old = peaked_logits(5, vocab=30, g=g)
    new = drift(old, g, 1.0)
    full = troll.project(new, old, EPS)
    for i in range(5):
        one = troll.project(new[i : i + 1], old[i : i + 1], EPS)
        torch.testing.assert_close(one.logp[0], full.logp[i], rtol=0, atol=1e-12)
        torch.testing.assert_close(one.eta[0], full.eta[i], rtol=1e-10, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    vocab=st.sampled_from([2, 3, 10, 64, 257]),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.6]),
    head_max=st.integers(1, 20),
    tail=st.sampled_from([(-12.0, -9.0), (-9.0, -6.0), (-5.0, -2.0)]),
    scale=st.sampled_from([0.05, 0.3, 1.0, 3.0]),
    kl_bound=st.sampled_from([0.01, 0.05, 0.2]),
    seed=st.integers(0, 2**31 - 1),
)
def test_bound_holds_on_every_row(lead, vocab, temperature, head_max, tail, scale, kl_bound, seed):
    g = gen(seed)
    old = peaked_logits(*lead, vocab=vocab, g=g, head_max=head_max, tail_log10=tail)
    new = drift(old, g, scale)
    out = troll.project(new / temperature, old / temperature, kl_bound)
    b = torch.log_softmax(old / temperature, -1)
    true_kl = kl(out.logp, b)  # recomputed independently, not the library's own kl_after
    assert torch.isfinite(out.logp).all() and torch.isfinite(out.eta).all()
    assert (true_kl <= kl_bound * (1 + 1e-6)).all(), (true_kl.max(), kl_bound)
    assert (out.kl_after <= kl_bound * (1 + 1e-6)).all()
    torch.testing.assert_close(out.logp.logsumexp(-1), torch.zeros(lead, dtype=torch.float64), rtol=0, atol=1e-12)
    active = out.kl_before > kl_bound
    assert torch.equal(out.eta > 0, active)
    rel = (true_kl[active] - kl_bound).abs() / kl_bound
    assert (rel < 1e-4).all(), rel.max()


def test_identity_inside_region():
    g = gen(7)
    old = peaked_logits(4, 3, vocab=50, g=g)
    new = drift(old, g, 0.01)
    x = new.clone().requires_grad_()
    out = troll.project(x, old, EPS)
    assert (out.kl_before < EPS).all(), "the case must lie inside the trust region"
    assert (out.eta == 0).all()
    assert torch.equal(out.logp, torch.log_softmax(new, -1))
    assert torch.equal(out.kl_after, out.kl_before)
    torch.testing.assert_close(out.kl_before, kl(torch.log_softmax(new, -1), torch.log_softmax(old, -1)))
    w = torch.randn(new.shape, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((out.logp * w).sum(), x)
    y = new.clone().requires_grad_()
    (expected,) = torch.autograd.grad((torch.log_softmax(y, -1) * w).sum(), y)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_projected_rows_land_on_bound(dtype):
    g = gen(8)
    old = peaked_logits(64, vocab=100, g=g, head_max=12)
    new = drift(old, g, 1.0)
    out = troll.project(new.to(dtype), old.to(dtype), EPS)
    active = out.eta > 0
    assert active.sum() > 10
    rel = (out.kl_after[active].double() - EPS).abs() / EPS
    assert (rel < 1e-4).all(), rel.max()
    # and the KL recomputed in fp64 from the returned log-probs agrees
    true_kl = kl(out.logp, torch.log_softmax(old.to(dtype).double(), -1))
    assert ((true_kl[active] - EPS).abs() / EPS < 1e-4).all()


def test_projection_is_the_closest_feasible_distribution():
    """pi minimises KL(p || pi~) among feasible p: random feasible perturbations of pi are never closer to pi~."""
    g = gen(9)
    old = torch.randn(4, 8, generator=g, dtype=torch.float64)
    new = old + 1.5 * torch.randn(4, 8, generator=g, dtype=torch.float64)
    out = troll.project(new, old, EPS)
    a, b = torch.log_softmax(new, -1), torch.log_softmax(old, -1)
    assert (out.eta > 0).all()
    best = kl(out.logp, a)
    n_feasible = 0
    for _ in range(200):
        p = torch.log_softmax(out.logp + 0.05 * torch.randn(out.logp.shape, generator=g, dtype=torch.float64), -1)
        ok = kl(p, b) <= EPS
        n_feasible += int(ok.sum())
        assert (kl(p, a)[ok] >= best[ok] - 1e-12).all()
    assert n_feasible > 50
    # and it beats the other members of the geometric family that satisfy the bound (larger eta)
    for factor in (1.01, 1.5, 3.0):
        z = (a + factor * out.eta.unsqueeze(-1) * b) / (1 + factor * out.eta.unsqueeze(-1))
        assert (kl(torch.log_softmax(z, -1), a) > best).all()


# -------------------------------------------------------------------------------------------- gradients


def test_gradcheck_fp64():
    g = gen(10)
    new, old = mixed_rows(g, rows=4, vocab=5)
    out = troll.project(new, old, EPS)
    assert (out.eta > 0).any() and (out.eta == 0).any()
    proj = torch.randn(new.numel(), 3, generator=g, dtype=torch.float64)

    def fn(x):
        return troll.project(x, old, EPS).logp.reshape(-1) @ proj

    assert torch.autograd.gradcheck(fn, (new.clone().requires_grad_(),), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradient_matches_finite_differences_of_reference():
    g = gen(11)
    new, old = mixed_rows(g, rows=5, vocab=6)
    w = torch.randn(new.shape, generator=g, dtype=torch.float64)
    assert (reference.project(new, old, EPS)[1] > 0).sum() >= 2
    x = new.clone().requires_grad_()
    (grad,) = torch.autograd.grad((troll.project(x, old, EPS).logp * w).sum(), x)
    fd = central_diff(lambda i, y: (reference.project_row(y, old[i], EPS)[0] * w[i]).sum(), new)
    torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-6)


def test_gradient_is_not_the_constant_eta_approximation():
    """Treating eta as a constant drops a term; the closed form must differ from that by a visible amount."""
    g = gen(12)
    old = torch.randn(1, 6, generator=g, dtype=torch.float64)
    new = old + 2.0 * torch.randn(1, 6, generator=g, dtype=torch.float64)
    w = torch.randn(new.shape, generator=g, dtype=torch.float64)
    x = new.clone().requires_grad_()
    out = troll.project(x, old, EPS)
    (grad,) = torch.autograd.grad((out.logp * w).sum(), x)
    eta = out.eta.detach().unsqueeze(-1)
    y = new.clone().requires_grad_()
    z = (torch.log_softmax(y, -1) + eta * torch.log_softmax(old, -1)) / (1 + eta)
    (naive,) = torch.autograd.grad((torch.log_softmax(z, -1) * w).sum(), y)
    assert (grad - naive).abs().max() > 1e-3


# -------------------------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_extremely_peaked_old_policy(dtype):
    """Old puts 1 - 1e-12 on one token; the projection still reaches the bound (and agrees with the reference)."""
    vocab = 8
    tail = math.log(1e-12 / (vocab - 1))  # each of the 7 others gets 1e-12 / 7
    old = torch.full((3, vocab), tail, dtype=torch.float64)
    old[:, 0] = math.log1p(-1e-12)
    new = torch.zeros(3, vocab, dtype=torch.float64)  # uniform
    new[1, 3] = 40.0  # another token at ~1 - 1e-17
    new[2] = torch.linspace(0, 2, vocab, dtype=torch.float64)
    assert torch.softmax(old, -1)[:, 0].sub(1 - 1e-12).abs().max() < 1e-15
    out = troll.project(new.to(dtype), old.to(dtype), EPS)
    assert (out.eta > 0).all() and torch.isfinite(out.logp).all()
    assert ((out.kl_after.double() - EPS).abs() / EPS < 1e-4).all(), out.kl_after
    ref_logp, ref_eta, _, ref_after = reference.project(new, old, EPS)
    tol = 1e-8 if dtype == torch.float64 else 1e-3
    torch.testing.assert_close(out.logp.double(), ref_logp, rtol=0, atol=tol)
    torch.testing.assert_close(out.eta.double(), ref_eta, rtol=tol, atol=tol)


def test_bracket_grows_for_huge_eta():
    """A new policy with enormous log-ratios needs eta far above the paper's bracket [1e-7, 1e2]."""
    old = torch.tensor([[0.0, -10.0, -10.0, -10.0]], dtype=torch.float64)
    new = torch.tensor([[0.0, 1e5, 0.0, 0.0]], dtype=torch.float64)
    out = troll.project(new, old, EPS)
    ref_logp, ref_eta, _, _ = reference.project(new, old, EPS)
    assert ref_eta.item() > 1e3
    assert abs(out.kl_after.item() - EPS) / EPS < 1e-4
    torch.testing.assert_close(out.eta, ref_eta, rtol=1e-6, atol=0)
    torch.testing.assert_close(out.logp, ref_logp, rtol=0, atol=1e-8)


KINDS = ["same", "old-masks-more", "old-masks-more-slack", "new-masks-more"]


def _masked_case(kind: str, g: torch.Generator):
    """(rows, V) fp64 logits with -inf entries; a mix of active and inactive rows."""
    new, old = mixed_rows(g, rows=6, vocab=7)
    if kind == "same":
        new[:, [1, 4]] = NEG_INF
        old[:, [1, 4]] = NEG_INF
    elif kind.startswith("old-masks-more"):
        # new has mass where old has none: KL before is inf and every row goes through the solver. With a large
        # drift the bound binds on the common support (eta > 0); with a small one new restricted to the common
        # support is already feasible, so the solution is that restriction (eta -> 0, the constraint is slack).
        if kind == "old-masks-more":
            new = old + 2.0 * torch.randn(old.shape, generator=g, dtype=torch.float64)
        else:
            new = old + 0.05 * torch.randn(old.shape, generator=g, dtype=torch.float64)
        old[:, 2] = NEG_INF
        new[:, 2] = new[:, 0] - 3.0
    elif kind == "new-masks-more":  # old keeps a little mass on a token the new policy has banned
        new[:, 5] = NEG_INF
        old[:, 5] = old.max(-1).values - 8.0
    return new, old


@pytest.mark.parametrize("kind", KINDS)
def test_masked_vocabulary_values(kind):
    new, old = _masked_case(kind, gen(13))
    out = troll.project(new, old, EPS)
    ref_logp, ref_eta, _, ref_after = reference.project(new, old, EPS)
    assert not torch.isnan(out.logp).any() and torch.isfinite(out.eta).all() and torch.isfinite(out.kl_after).all()
    assert torch.equal(torch.isfinite(out.logp), torch.isfinite(ref_logp))
    torch.testing.assert_close(finite_where(out.logp), finite_where(ref_logp), rtol=0, atol=1e-8)
    torch.testing.assert_close(out.kl_after, ref_after, rtol=0, atol=1e-8 * EPS)
    assert (kl(out.logp, torch.log_softmax(old, -1)) <= EPS * (1 + 1e-6)).all()
    # a token that either side excludes stays excluded after the projection
    projected = out.kl_before > EPS
    excluded = torch.isinf(old) & projected.unsqueeze(-1) | torch.isinf(new)
    assert torch.isinf(out.logp[excluded]).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_masked_vocabulary_gradients_finite(kind, dtype):
    new, old = _masked_case(kind, gen(14))
    x = new.to(dtype).clone().requires_grad_()
    out = troll.project(x, old.to(dtype), EPS)
    w = torch.randn(new.shape, generator=gen(0), dtype=torch.float64).to(out.logp.dtype)
    # differentiate through the finite entries, and through the probabilities (exp(-inf) = 0) of all entries
    loss = (finite_where(out.logp) * w).sum() + (out.logp.exp() * w).sum()
    (grad,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(grad).all()
    assert (grad[torch.isinf(new)] == 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_masked_vocabulary_gradient_matches_reference(kind):
    new, old = _masked_case(kind, gen(15))
    w = torch.randn(new.shape, generator=gen(1), dtype=torch.float64)
    x = new.clone().requires_grad_()
    (grad,) = torch.autograd.grad((finite_where(troll.project(x, old, EPS).logp) * w).sum(), x)
    fd = central_diff(
        lambda i, y: (finite_where(reference.project_row(y, old[i], EPS)[0]) * w[i]).sum(), new, where=~new.isinf()
    )
    torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-6)


def test_infeasible_row_is_reported():
    """If the new policy bans tokens that carry more than 1 - exp(-eps) of the old mass, no feasible pi exists
    (pi must vanish there); the row may violate the bound but kl_after must say so, and nothing is NaN."""
    old = torch.zeros(1, 4, dtype=torch.float64)
    new = torch.tensor([[0.0, 0.0, NEG_INF, NEG_INF]], dtype=torch.float64)  # old mass 1/2 on banned tokens
    out = troll.project(new, old, EPS)
    assert not torch.isnan(out.logp).any()
    assert out.kl_after.item() == pytest.approx(kl(out.logp, torch.log_softmax(old, -1)).item(), rel=1e-12)
    assert out.kl_after.item() >= math.log(2) - 1e-12  # the least KL any pi supported on {0, 1} can have


@pytest.mark.parametrize(("dtype", "tol"), [(torch.bfloat16, 5e-5), (torch.float16, 5e-5)])
def test_low_precision_inputs(dtype, tol):
    """bf16 / fp16 logits are projected in fp32. Against fp64 on the *same rounded* inputs the log-probs of tokens
    with p > 1e-4 agree to ``tol`` (measured 8e-6 for both: the fp32 solver stops within 1e-5 of the bound) and eta
    to 1e-4 (measured 5e-5). The bound holds to 1e-5 relative."""
    g = gen(16)
    old = peaked_logits(8, 4, vocab=200, g=g, head_max=10).to(dtype)
    new = drift(old.double(), g, 1.0).to(dtype)
    x = new.clone().requires_grad_()
    out = troll.project(x, old, EPS)
    assert out.logp.dtype == torch.float32 and out.eta.dtype == torch.float32
    ref = troll.project(new.double(), old.double(), EPS)
    assert (ref.eta > 0).sum() > 5
    big = ref.logp > math.log(1e-4)
    torch.testing.assert_close(out.logp.double()[big], ref.logp[big], rtol=0, atol=tol)
    torch.testing.assert_close(out.eta.double(), ref.eta, rtol=1e-3, atol=1e-4)
    assert (kl(out.logp, torch.log_softmax(old.double(), -1)) <= EPS * (1 + 1e-5)).all()
    (grad,) = torch.autograd.grad(out.logp.exp()[..., :5].sum(), x)
    assert grad.dtype == dtype and torch.isfinite(grad.float()).all()


def test_infeasible_reproducer_is_flagged_at_the_least_kl_point():
    """D4: a new policy that bans half the old mass. The row cannot meet the bound: it ends at the old policy
    restricted to the new support (KL = log 2, the least possible) and :func:`troll.infeasible` flags it."""
    out = troll.project(torch.tensor([[0.0, 0.0, NEG_INF, NEG_INF]]), torch.zeros(1, 4), EPS)
    assert out.kl_after.item() == pytest.approx(math.log(2), rel=1e-6)
    torch.testing.assert_close(out.logp[0, :2], torch.full((2,), -math.log(2)))
    assert troll.infeasible(out.kl_after, EPS).tolist() == [True]
    ok = troll.project(torch.tensor([[0.0, 0.0, 0.0, NEG_INF]]), torch.tensor([[0.0, 0.0, 0.0, -6.0]]), EPS)
    assert troll.infeasible(ok.kl_after, EPS).tolist() == [False]  # the banned token holds ~0.8% < 1 - e^-eps


@pytest.mark.parametrize("excess", [7e-4, 1e-5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_row_just_above_an_unreachable_bound_is_flagged(excess, dtype):
    """Found by hypothesis: a one-hot new policy whose least reachable KL is the bound times (1 + 7e-4). No
    projection can move it, so it stays above the bound: infeasible() must say so (its tolerance was once 1e-3)."""
    kl_bound = 1.0
    least = kl_bound * (1 + excess)  # -log old p(token 1): the KL of every policy the new one allows
    p1 = math.exp(-least)
    old = torch.tensor([[math.log((1 - p1) / 2), math.log(p1), math.log((1 - p1) / 2)]], dtype=torch.float64)
    out = troll.project(torch.tensor([[NEG_INF, 0.0, NEG_INF]], dtype=dtype), old.to(dtype), kl_bound)
    assert out.kl_after.item() == pytest.approx(least, rel=1e-6)
    assert troll.infeasible(out.kl_after, kl_bound).tolist() == [True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [1e-4, 1e-6, 1e-7])
def test_small_bounds_hold_in_low_precision(dtype, eps):
    """D5: the dense solve runs in fp64 whatever the input dtype; the KL of the returned (renormalised) log-probs,
    recomputed in fp64, meets the bound (fp32 solving gave 1.0014, 1.11 and 2.4 times eps)."""
    g = gen(21)
    old = (torch.randn(32, 100, generator=g) * 3).to(dtype)
    new = (old.double() + torch.randn(32, 100, generator=g, dtype=torch.float64)).to(dtype)
    out = troll.project(new, old, eps)
    assert out.logp.dtype == torch.float32 and bool((out.eta > 0).all())
    after = kl(torch.log_softmax(out.logp.double(), -1), torch.log_softmax(old.double(), -1))
    assert bool((after <= eps).all()) and bool((after >= eps * (1 - 1e-2)).all())


def test_disjoint_supports_are_left_unchanged_and_flagged():
    """Found by the property tests: new and old policies with no token in common. No pi on the path exists (its
    log-probs were NaN); the row is returned unchanged with kl_after = inf, flagged, and the gradient is
    log_softmax's."""
    new = torch.tensor([[NEG_INF, 0.275], [0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[1.541, NEG_INF], [0.0, 0.0]], dtype=torch.float64)
    out = troll.project(new, old, 1.0)
    torch.testing.assert_close(out.logp[0], torch.tensor([NEG_INF, 0.0], dtype=torch.float64))
    assert out.kl_after[0].item() == math.inf and troll.infeasible(out.kl_after, 1.0).tolist() == [True, False]
    w = torch.tensor([[0.0, 2.0], [1.0, -1.0]], dtype=torch.float64)
    (grad,) = torch.autograd.grad((torch.where(out.logp > NEG_INF, out.logp, 0.0) * w).sum(), new)
    assert torch.isfinite(grad).all() and grad[0].abs().max() == 0  # log pi = [-inf, 0] does not move


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bounds_below_fp32_resolution_are_solved_not_refused(dtype):
    """A bound below ~4e-14 made the fp32 output margin exceed the bound (math domain error); it now solves, finite."""
    g = gen(3)
    new, old = torch.randn(4, 7, generator=g).to(dtype), torch.randn(4, 7, generator=g).to(dtype)
    for bound in (1e-14, 1e-20):
        proj = troll.project(new, old, bound)
        assert torch.isfinite(proj.logp).all() and torch.isfinite(proj.kl_after).all()
        assert (proj.kl_after < 1e-9).all()  # as close as fp32 log-probs get
