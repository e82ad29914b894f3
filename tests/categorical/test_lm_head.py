"""The chunked LM head (:mod:`troll.categorical.lm_head`) against the dense path on the materialised logits: values,
all gradients, metrics.

Shapes cross chunk edges on purpose: V is not a multiple of the chunk size, chunks are narrower than top_k, and
some rows are padding (mask False).
"""

import math

import pytest
import torch

import troll
from troll.categorical.lm_head import ChunkedLMHead, _LMHeadFn
from troll.categorical.policy import DenseLogits

B, T, H, V = 3, 5, 6, 37


def make_inputs(dtype=torch.float64, *, vocab=V, seed=0, bias=True, spread=0.6):
    """hidden (B, T, H), weight (V, H), bias, a perturbed old hidden, sampled tokens, advantages and a ragged mask."""
    g = torch.Generator().manual_seed(seed)
    hidden = (1.5 * torch.randn(B, T, H, generator=g, dtype=torch.float64)).to(dtype)
    weight = torch.randn(vocab, H, generator=g, dtype=torch.float64).to(dtype)
    b = torch.randn(vocab, generator=g, dtype=torch.float64).to(dtype) if bias else None
    old_hidden = hidden + spread * torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    adv = torch.randn(B, generator=g, dtype=torch.float64).to(dtype)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    mask[2, 1:] = False
    return hidden, weight, b, old_hidden, tokens, adv, mask


def logits_of(hidden, weight, bias, temperature):
    z = hidden @ weight.T
    return (z if bias is None else z + bias) / temperature


def grads(fn, *tensors):
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    out.loss.backward()
    return out, [None if t is None else t.grad for t in leaves]


def compare_losses(dtype, *, temperature, top_k, delta, chunk_size, bias=True, rtol, atol, **kw):
    hidden, weight, b, old_hidden, tokens, adv, mask = make_inputs(dtype, bias=bias)
    old = troll.sparsify(logits_of(old_hidden, weight, b, temperature), top_k=top_k, delta=delta, include=tokens)
    opts = dict(kl_bound=0.05, top_k=top_k, delta=delta, **kw)

    def dense(h, w, bb):
        return troll.troll_loss(logits_of(h, w, bb, temperature), old, tokens, adv, mask, **opts)

    def chunked(h, w, bb):
        return troll.troll_loss_from_hidden(
            h, w, old, tokens, adv, mask, bias=bb, temperature=temperature, chunk_size=chunk_size, **opts
        )

    ref, ref_grads = grads(dense, hidden, weight, b)
    out, out_grads = grads(chunked, hidden, weight, b)
    assert out.loss.dtype == ref.loss.dtype
    torch.testing.assert_close(out.loss, ref.loss, rtol=rtol, atol=atol)
    for name, r, o in zip(("hidden", "weight", "bias"), ref_grads, out_grads):
        assert (r is None) == (o is None), name
        if r is not None:
            torch.testing.assert_close(o, r, rtol=rtol, atol=atol, msg=lambda m, n=name: f"grad {n}: {m}")
    for key in ref.metrics:
        torch.testing.assert_close(out.metrics[key], ref.metrics[key], rtol=rtol, atol=atol)
    return ref


@pytest.mark.parametrize(
    "temperature, top_k, delta, chunk_size, bias",
    [
        (1.0, 8, 1e-3, 5, True),  # chunk narrower than top_k, V = 37 = 7 * 5 + 2
        (0.7, 4, 1e-5, 11, False),
        (1.3, 64, 0.0, 16, True),  # top_k > V: the whole vocabulary is kept, no rest category
        (1.0, 6, 1e-2, 1, True),  # one column a chunk
        (1.0, 6, 1e-4, None, True),  # the default chunk size
    ],
)
def test_loss_matches_dense_float64(temperature, top_k, delta, chunk_size, bias):
    ref = compare_losses(
        torch.float64,
        temperature=temperature,
        top_k=top_k,
        delta=delta,
        chunk_size=chunk_size,
        bias=bias,
        rtol=1e-10,
        atol=1e-12,
    )
    assert ref.metrics["projected_frac"] > 0  # the trust region is active somewhere, so the test is not trivial


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_loss_matches_dense_aggregations(agg):
    compare_losses(
        torch.float64, temperature=1.0, top_k=8, delta=1e-3, chunk_size=7, agg=agg, max_len=6, rtol=1e-10, atol=1e-12
    )


def test_loss_matches_dense_float32():
    compare_losses(torch.float32, temperature=0.9, top_k=8, delta=1e-3, chunk_size=5, rtol=2e-4, atol=2e-5)


def test_sequence_level_matches_dense():
    compare_losses(
        torch.float64, temperature=1.0, top_k=8, delta=1e-3, chunk_size=5, level="sequence", rtol=1e-10, atol=1e-12
    )


def test_head_matches_dense_logits():
    """lse, kept ids (as sets) and at(ids) of the stand-in equal DenseLogits on the materialised logits."""
    hidden, weight, b, *_ = make_inputs()
    h = hidden.reshape(-1, H)
    dense = DenseLogits(logits_of(h, weight, b, 0.8))
    head = ChunkedLMHead(h, weight, b, 0.8, chunk_size=4)
    for top_k, delta in ((10, 1e-2), (3, 0.0), (50, 1e-6)):
        d_ids, d_mask = dense.kept(top_k, delta)
        c_ids, c_mask = head.kept(top_k, delta)
        assert c_ids.shape == d_ids.shape
        torch.testing.assert_close(c_mask, d_mask)
        for row in range(h.shape[0]):
            assert set(c_ids[row][c_mask[row]].tolist()) == set(d_ids[row][d_mask[row]].tolist())
    ids = torch.randint(0, V, (h.shape[0], 9))
    torch.testing.assert_close(head.at(ids), dense.at(ids))
    torch.testing.assert_close(head.lse, dense.lse)


def test_lse_before_at():
    """Reading lse first (no ids yet) gives the same value and gradient as the dense path."""
    hidden, weight, b, *_ = make_inputs()
    h = hidden.reshape(-1, H).requires_grad_(True)
    ChunkedLMHead(h, weight, b, chunk_size=6).lse.sum().backward()
    ref = h.detach().clone().requires_grad_(True)
    DenseLogits(logits_of(ref, weight, b, 1.0)).lse.sum().backward()
    torch.testing.assert_close(h.grad, ref.grad)


@pytest.mark.parametrize("bias, outputs", [(True, "both"), (False, "both"), (True, "lse"), (True, "at")])
def test_gradcheck_function(bias, outputs):
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    ids = torch.tensor([[0, 6, 3], [2, 2, 5], [1, 4, 0], [6, 5, 3]])  # a repeated id in row 1

    def fn(h, w, bb):
        lse, at = _LMHeadFn.apply(h, w, bb, ids, 0.8, 3)  # chunk 3 over V = 7: two full chunks and one column
        return {"both": (lse, at), "lse": lse, "at": at}[outputs]  # one unused output: its gradient is None

    assert torch.autograd.gradcheck(fn, (hidden, weight, b))


def sparsify_both(dtype, *, top_k, delta, chunk_size, include=True, temperature=0.9, seed=0):
    hidden, weight, b, _, tokens, *_ = make_inputs(dtype, seed=seed)
    inc = tokens if include else None
    ref = troll.sparsify(logits_of(hidden, weight, b, temperature), top_k=top_k, delta=delta, include=inc)
    out = troll.sparsify_from_hidden(
        hidden, weight, bias=b, temperature=temperature, top_k=top_k, delta=delta, include=inc, chunk_size=chunk_size
    )
    return ref, out


def assert_sparse_equal(out, ref, *, rtol, atol):
    assert out.ids.shape == ref.ids.shape and out.vocab_size == ref.vocab_size
    assert out.logp.dtype == ref.logp.dtype
    torch.testing.assert_close(out.mask.sum(-1), ref.mask.sum(-1))
    flat_out, flat_ref = out.flatten(), ref.flatten()
    for r in range(flat_ref.ids.shape[0]):
        o = dict(zip(flat_out.ids[r][flat_out.mask[r]].tolist(), flat_out.logp[r][flat_out.mask[r]].tolist()))
        e = dict(zip(flat_ref.ids[r][flat_ref.mask[r]].tolist(), flat_ref.logp[r][flat_ref.mask[r]].tolist()))
        assert set(o) == set(e), f"row {r}"
        for i in e:
            assert math.isclose(o[i], e[i], rel_tol=rtol, abs_tol=atol), (r, i, o[i], e[i])
    assert torch.all(out.logp[~out.mask] == float("-inf"))
    torch.testing.assert_close(out.log_rest, ref.log_rest, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "top_k, delta, chunk_size, include",
    [(8, 1e-3, 5, True), (4, 1e-5, 11, False), (64, 0.0, 16, True), (6, 1e-2, None, True)],
)
def test_sparsify_matches_dense_float64(top_k, delta, chunk_size, include):
    ref, out = sparsify_both(torch.float64, top_k=top_k, delta=delta, chunk_size=chunk_size, include=include)
    assert_sparse_equal(out, ref, rtol=1e-12, atol=1e-12)


def test_sparsify_returns_the_entropy_of_the_same_pass():
    hidden, weight, b, _, tokens, *_ = make_inputs(torch.float64, seed=3)
    logp = torch.log_softmax(logits_of(hidden, weight, b, 0.9), -1)
    expected = -(logp.exp() * logp).sum(-1)
    kwargs = dict(bias=b, temperature=0.9, top_k=8, delta=1e-3, include=tokens, chunk_size=5)
    sparse, entropy = troll.sparsify_from_hidden(hidden, weight, return_entropy=True, **kwargs)
    torch.testing.assert_close(entropy, expected, rtol=1e-12, atol=1e-12)
    assert_sparse_equal(sparse, troll.sparsify_from_hidden(hidden, weight, **kwargs), rtol=0, atol=0)


def test_sparsify_matches_dense_float32():
    ref, out = sparsify_both(torch.float32, top_k=8, delta=1e-3, chunk_size=5)
    assert_sparse_equal(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_peaked_row_keeps_its_tail(dtype):
    """A row at 1 - 1e-12 (with the maximum in a late chunk): log_rest is log(1e-12), not log(0) or noise."""
    vocab, tail = 40, 1e-12
    weight = torch.eye(vocab, dtype=dtype)  # H = V: hidden holds the logits themselves
    hidden = torch.zeros(2, vocab, dtype=dtype)
    hidden[0, 33] = math.log((vocab - 1) * (1 - tail) / tail)  # the other 39 share 1e-12
    hidden[1] = torch.linspace(0, 3, vocab, dtype=dtype)
    ref = troll.sparsify(hidden @ weight.T, top_k=4, delta=1e-5)
    out = troll.sparsify_from_hidden(hidden, weight, top_k=4, delta=1e-5, chunk_size=7)
    assert_sparse_equal(out, ref, rtol=1e-5, atol=1e-9)
    assert out.ids[0, 0] == 33 and int(out.mask[0].sum()) == 1
    assert math.isclose(float(out.log_rest[0]), math.log(tail), rel_tol=1e-5)
    assert math.isclose(float(out.logp[0, 0]), math.log1p(-tail), abs_tol=1e-15)


def test_peaked_rows_in_the_loss():
    """Very peaked old and new rows (tail 1e-12) keep finite values and gradients equal to the dense path."""
    vocab = 40
    g = torch.Generator().manual_seed(3)
    weight = torch.eye(vocab, dtype=torch.float64)
    hidden = torch.randn(1, 4, vocab, generator=g, dtype=torch.float64)
    hidden[0, :, 5] = math.log((vocab - 1) * 1e12)
    old_hidden = hidden.clone()
    old_hidden[0, :, 5] -= 28.0  # the old policy is far less sure: the projection is strongly active
    tokens = torch.full((1, 4), 5)
    adv, mask = torch.ones(1), torch.ones(1, 4, dtype=torch.bool)
    old = troll.sparsify_from_hidden(old_hidden, weight, top_k=8, include=tokens, chunk_size=9)

    def dense(h):
        return troll.troll_loss(h @ weight.T, old, tokens, adv, mask, top_k=8)

    def chunked(h):
        return troll.troll_loss_from_hidden(h, weight, old, tokens, adv, mask, top_k=8, chunk_size=9)

    ref, (ref_grad,) = grads(dense, hidden)
    out, (out_grad,) = grads(chunked, hidden)
    assert torch.isfinite(out.loss) and torch.isfinite(out_grad).all()
    assert out.metrics["projected_frac"] == 1
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out_grad, ref_grad, rtol=1e-8, atol=1e-12)


def test_no_vocabulary_sized_tensor_is_saved():
    """Autograd keeps nothing of size N x V (the dense path saves the logits and more)."""
    hidden, weight, b, old_hidden, tokens, adv, mask = make_inputs(vocab=300)
    old = troll.sparsify_from_hidden(old_hidden, weight, bias=b, top_k=8, include=tokens)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    numel = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: numel.append(t.numel()) or t, lambda t: t):
        troll.troll_loss_from_hidden(hidden, weight, old, tokens, adv, mask, bias=b, top_k=8, chunk_size=64)
    big = [n for n in numel if n >= B * T * 300 and n != weight.numel()]
    assert numel and not big


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(weight=torch.zeros(V, H + 1)), "weight must be"),
        (dict(bias=torch.zeros(V + 1)), "bias has shape"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(chunk_size=0), "chunk_size must be"),
        (dict(tokens=torch.full((B, T), V)), "outside the vocabulary"),
    ],
)
def test_validation(change, match):
    hidden, weight, b, old_hidden, tokens, adv, mask = make_inputs()
    old = troll.sparsify(logits_of(old_hidden, weight, b, 1.0), top_k=4, include=tokens)
    kw = dict(weight=weight, bias=b, temperature=1.0, tokens=tokens, chunk_size=None) | change
    with pytest.raises(ValueError, match=match):
        troll.troll_loss_from_hidden(
            hidden,
            kw["weight"],
            old,
            kw["tokens"],
            adv,
            mask,
            bias=kw["bias"],
            temperature=kw["temperature"],
            chunk_size=kw["chunk_size"],
        )


@pytest.mark.parametrize("where", ["hidden", "weight", "bias"])
def test_nan_is_reported(where):
    """NaN anywhere in the LM head reaches the scan's logsumexp and is reported, by both entry points."""
    hidden, weight, b, old_hidden, tokens, adv, mask = make_inputs()
    old = troll.sparsify(logits_of(old_hidden, weight, b, 1.0), top_k=4, include=tokens)
    {"hidden": hidden[1, 2], "weight": weight[7], "bias": b[7:8]}[where][0] = float("nan")
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        troll.troll_loss_from_hidden(hidden, weight, old, tokens, adv, mask, bias=b, top_k=4)
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        troll.sparsify_from_hidden(hidden, weight, bias=b, top_k=4)


def test_padding_over_a_masked_vocabulary_entry_is_finite():
    """On the chunked path: bias[0] = -inf masks token 0 (the id padding is replaced by); the padded
    positions must not reach the arithmetic. Loss and gradients are finite and equal the dense loss's."""
    hidden, weight, b, old_hidden, tokens, adv, mask = make_inputs()
    b = b.clone()
    b[0] = float("-inf")
    tokens = torch.where(tokens == 0, 1, tokens)
    old = troll.sparsify(logits_of(old_hidden, weight, b, 1.0), top_k=4, include=tokens)

    def chunked(h, w):
        return troll.troll_loss_from_hidden(h, w, old, tokens, adv, mask, bias=b, top_k=4, chunk_size=5)

    def dense(h, w):
        return troll.troll_loss(logits_of(h, w, b, 1.0), old, tokens, adv, mask, top_k=4)

    out, (gh, gw) = grads(chunked, hidden, weight)
    ref, (rh, rw) = grads(dense, hidden, weight)
    assert torch.isfinite(out.loss) and torch.isfinite(gh).all() and torch.isfinite(gw).all()
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(gh, rh)
    torch.testing.assert_close(gw, rw)
