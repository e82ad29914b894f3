"""Sparse old-policy storage (:mod:`troll.categorical.sparse`): sparsify, merge_ids and kept_ids against
hand-computed cases, and SparseLogProbs packed to and from flat tensors (to_dict / from_dict / cat_sparse). The
projection over a sparse support: test_sparse_projection.py."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import gen, mass_needed, peaked_logits
from hypothesis import given, settings
from hypothesis import strategies as st

import troll
from troll.categorical.sparse import SparseLogProbs, cat_sparse, kept_ids, merge_ids, sparsify

NEG_INF = float("-inf")

# One row over V = 5: token 2 has 0.5, token 0 has 0.3, token 3 has 0.15, token 1 has 0.04, token 4 has 0.01.
PROBS = torch.tensor([0.3, 0.04, 0.5, 0.15, 0.01], dtype=torch.float64)
ORDER = [2, 0, 3, 1, 4]


def hand_row() -> torch.Tensor:
    return (PROBS.log() + 1.7).unsqueeze(0)  # logits: an arbitrary shift must not matter


def kept(sp: troll.SparseLogProbs, row: int = 0) -> list[int]:
    return sp.ids[row][sp.mask[row]].tolist()


# -------------------------------------------------------------------------------------------- sparsify


@pytest.mark.parametrize(
    ("delta", "top_k", "expected"),
    [
        (0.55, 64, [2]),  # mass before token 0 is 0.5 >= 0.45
        (0.25, 64, [2, 0]),  # mass before token 3 is 0.8 >= 0.75
        (0.15, 64, [2, 0, 3]),  # 0.8 < 0.85 keeps token 3; 0.95 stops token 1
        (0.02, 64, [2, 0, 3, 1]),
        (0.005, 64, [2, 0, 3, 1, 4]),
        (0.005, 2, [2, 0]),  # top_k caps the mass rule
        (0.0, 3, [2, 0, 3]),  # delta = 0 keeps exactly top_k
        (0.0, 1, [2]),
        (0.0, 64, [2, 0, 3, 1, 4]),
    ],
)
def test_sparsify_keeps_the_right_ids(delta, top_k, expected):
    sp = troll.sparsify(hand_row(), top_k=top_k, delta=delta)
    assert kept(sp) == expected
    assert sp.ids.shape == (1, len(expected)) and sp.vocab_size == 5
    torch.testing.assert_close(sp.logp[0], PROBS.log()[expected], rtol=0, atol=1e-12)
    rest = 1 - PROBS[expected].sum()
    expected_rest = torch.tensor(math.log(rest) if rest > 1e-12 else NEG_INF, dtype=torch.float64)
    torch.testing.assert_close(sp.log_rest[0], expected_rest, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("include", "expected"),
    [
        (torch.tensor([1]), [2, 0, 1]),  # a sampled id outside the kept set is added
        (torch.tensor([0]), [2, 0]),  # an id already kept is not duplicated
        (torch.tensor([[4, 4, 2, 1]]), [2, 0, 4, 1]),  # several per row, duplicates dropped, first occurrence wins
    ],
)
def test_sparsify_include(include, expected):
    sp = troll.sparsify(hand_row(), top_k=64, delta=0.25, include=include)
    assert kept(sp) == expected
    torch.testing.assert_close(sp.logp[0][sp.mask[0]], PROBS.log()[expected], rtol=0, atol=1e-12)
    torch.testing.assert_close(sp.log_rest[0], (1 - PROBS[expected].sum()).log(), rtol=1e-10, atol=0)


def test_sparsify_trims_to_the_largest_kept_count():
    logits = torch.stack([hand_row()[0], torch.tensor([9.0, 0, 0, 0, 0], dtype=torch.float64)])  # needs 4 and 1
    sp = troll.sparsify(logits, top_k=64, delta=0.02)
    assert sp.ids.shape == (2, 4)
    assert sp.mask.tolist() == [[True] * 4, [True, False, False, False]]
    assert kept(sp, 1) == [0]
    assert torch.isinf(sp.logp[1, 1:]).all() and (sp.logp[1, 1:] < 0).all()  # padding holds -inf


def test_sparsify_padding_holds_id_zero():
    """SparseLogProbs documents that padding entries hold id 0."""
    logits = torch.stack([hand_row()[0], torch.tensor([9.0, 0, 0, 0, 0], dtype=torch.float64)])
    sp = troll.sparsify(logits, top_k=64, delta=0.02)
    assert (sp.ids[~sp.mask] == 0).all(), sp.ids


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_sparsify_values_are_full_vocabulary_log_probs(dtype):
    g = gen(0)
    logits = peaked_logits(3, 4, vocab=500, g=g, head_max=12).to(dtype)
    tok = torch.randint(0, 500, (3, 4), generator=g)  # mostly tail tokens
    sp = troll.sparsify(logits, top_k=16, delta=1e-5, include=tok)
    assert sp.logp.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    full = torch.log_softmax(logits.double(), -1)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    expected = torch.where(sp.mask, full.gather(-1, sp.ids), NEG_INF)
    torch.testing.assert_close(sp.logp.double(), expected, rtol=0, atol=tol)
    # every kept set reaches 1 - delta (or top_k) and contains the sampled id
    assert (sp.mask.sum(-1) >= torch.minimum(mass_needed(logits), torch.tensor(16))).all()
    assert ((sp.ids == tok.unsqueeze(-1)) & sp.mask).any(-1).all()
    # log_rest is the log of the mass outside the ids, summed directly over the other tokens
    outside = torch.ones_like(full, dtype=torch.bool).scatter(-1, torch.where(sp.mask, sp.ids, sp.ids[..., :1]), False)
    expected_rest = torch.where(outside, full, NEG_INF).logsumexp(-1)
    torch.testing.assert_close(
        sp.log_rest.double(), expected_rest, rtol=1e-4 if dtype != torch.float64 else 1e-9, atol=0
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sparsify_log_rest_of_a_very_peaked_row(dtype):
    """One token at 1 - 1e-12: the rest mass is 1e-12, which 1 - sum(p) cannot resolve; log_rest must keep it."""
    vocab = 10
    logits = torch.full((1, vocab), math.log(1e-12 / (vocab - 1)), dtype=torch.float64)
    logits[0, 3] = math.log1p(-1e-12)
    sp = troll.sparsify(logits.to(dtype), top_k=64, delta=1e-5)
    assert kept(sp) == [3]
    assert torch.isfinite(sp.log_rest).all()
    assert sp.log_rest.item() == pytest.approx(math.log(1e-12), abs=1e-5)
    assert sp.logp[0, 0].item() == pytest.approx(-1e-12, abs=1e-15 if dtype == torch.float64 else 1e-7)


def test_sparse_log_probs_indexing():
    g = gen(1)
    sp = troll.sparsify(peaked_logits(4, 3, vocab=50, g=g), top_k=8)
    sub = sp[1:3]
    assert sub.ids.shape == (2, 3, sp.ids.shape[-1]) and sub.log_rest.shape == (2, 3)
    assert torch.equal(sub.logp, sp.logp[1:3]) and torch.equal(sub.log_rest, sp.log_rest[1:3])
    flat = sp.flatten()
    assert flat.ids.shape == (12, sp.ids.shape[-1]) and torch.equal(flat.log_rest, sp.log_rest.reshape(-1))
    # without log_rest the rest mass is recomputed from the kept mass
    no_rest = troll.SparseLogProbs(sp.ids, sp.logp, sp.mask, sp.vocab_size)
    torch.testing.assert_close(no_rest.log_rest_mass(), sp.log_rest, rtol=1e-6, atol=0)


# -------------------------------------------------------------------------------------------- merge / kept ids


def test_merge_ids_hand_case():
    ids = torch.tensor([[5, 3, 5, 7, 3], [1, 1, 1, 1, 1], [0, 9, 8, 9, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 1], [0, 0, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    out_ids, out_mask, src = merge_ids(ids, mask)
    assert out_mask.tolist() == [[True, True, False], [True, False, False], [True, True, True]]
    assert out_ids[out_mask].tolist() == [5, 3, 1, 0, 9, 8]
    assert src[out_mask].tolist() == [0, 1, 2, 0, 1, 2]  # position of the first (unmasked) occurrence


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 10).flatmap(
        lambda m: st.lists(
            st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=m, max_size=m), min_size=1, max_size=4
        )
    )
)
def test_merge_ids_is_an_ordered_union(rows):
    ids = torch.tensor([[i for i, _ in r] for r in rows])
    mask = torch.tensor([[m for _, m in r] for r in rows])
    out_ids, out_mask, src = merge_ids(ids, mask)
    width = max(1, max(len({i for i, m in r if m}) for r in rows))
    assert out_ids.shape == out_mask.shape == src.shape == (len(rows), width)
    for r, row in enumerate(rows):
        first = {}
        for pos, (i, m) in enumerate(row):
            if m and i not in first:
                first[i] = pos
        assert out_ids[r][out_mask[r]].tolist() == list(first)
        assert src[r][out_mask[r]].tolist() == list(first.values())
        assert not out_mask[r][len(first) :].any()


@pytest.mark.parametrize(("top_k", "head_max"), [(64, 40), (24, 40), (8, 6)])
def test_kept_ids_are_the_most_probable(top_k, head_max):
    """Rows needing 1-40 tokens: also those beyond a first top-16 pass get their full kept set."""
    g = gen(6)
    x = peaked_logits(40, vocab=400, g=g, head_max=head_max, head_scale=0.7, dtype=torch.float32)
    need = torch.minimum(mass_needed(x), torch.tensor(top_k))
    assert int(need.max()) > 16 or top_k < 16
    ids, mask = kept_ids(x, x.logsumexp(-1, keepdim=True), top_k, 1e-5)
    assert ids.shape[-1] == int(need.max())
    assert torch.equal(mask.sum(-1), need)
    order = x.double().argsort(-1, descending=True)
    for r in range(40):
        assert set(ids[r][mask[r]].tolist()) == set(order[r, : int(need[r])].tolist())


def test_sparsify_tie_at_the_maximum():
    """Two tokens share the largest logit and top_k = 1 keeps one of them: the rest holds the other's 1/2."""
    logits = torch.tensor([[0.0, 5.0, 5.0, -30.0]], dtype=torch.float64)
    sp = troll.sparsify(logits, top_k=1, delta=0.0)
    p = torch.softmax(logits, -1)[0]
    assert kept(sp) in ([1], [2])
    assert sp.log_rest.item() == pytest.approx(math.log(1 - p[1].item()), abs=1e-12)


def test_kept_ids_matches_sparsify():
    g = gen(2)
    x = peaked_logits(20, vocab=300, g=g, head_max=15, dtype=torch.float32)
    ids, mask = kept_ids(x, x.logsumexp(-1, keepdim=True), 8, 1e-5)
    sp = troll.sparsify(x, top_k=8, delta=1e-5)
    assert torch.equal(torch.where(mask, ids, -1), torch.where(sp.mask, sp.ids, -1))
    assert torch.equal(mask.sum(-1), torch.minimum(mass_needed(x), torch.tensor(8)))


# -------------------------------------------------------------------------------------------- packing


def _sparse(b, t, v, seed, top_k):
    g = torch.Generator().manual_seed(seed)
    return sparsify(torch.randn(b, t, v, generator=g) * 3, top_k=top_k, delta=0.0)


def test_to_dict_from_dict_round_trip_and_slicing():
    old = _sparse(4, 3, 11, 0, 5)
    packed = old.to_dict("p_")
    assert set(packed) == {"p_ids", "p_logp", "p_mask", "p_log_rest", "p_vocab"}
    # A container slicing every entry along dim 0 (as DataProto does) must give the sliced distribution.
    sliced = SparseLogProbs.from_dict({k: v[1:3] for k, v in packed.items()}, "p_")
    ref = old[1:3]
    assert sliced.vocab_size == 11
    for a, b in ((sliced.ids, ref.ids), (sliced.logp, ref.logp), (sliced.mask, ref.mask)):
        assert torch.equal(a, b)
    assert torch.equal(sliced.log_rest, ref.log_rest)


def test_to_dict_fills_missing_log_rest_from_kept_mass():
    logp = torch.tensor([[0.5, 0.25]]).log()
    s = SparseLogProbs(torch.tensor([[1, 2]]), logp, torch.tensor([[True, True]]), 4)
    rest = SparseLogProbs.from_dict(s.to_dict()).log_rest
    assert torch.allclose(rest.double(), torch.tensor([0.25], dtype=torch.float64).log())


def test_from_dict_missing_key_and_mixed_vocab():
    packed = _sparse(2, 2, 7, 1, 3).to_dict()
    with pytest.raises(KeyError, match="troll_old_mask"):
        SparseLogProbs.from_dict({k: v for k, v in packed.items() if k != "troll_old_mask"})
    packed["troll_old_vocab"][0, 0] = 8
    with pytest.raises(ValueError, match="one vocabulary size"):
        SparseLogProbs.from_dict(packed)


def test_cat_pads_k_and_keeps_values():
    a, b = _sparse(2, 3, 13, 2, 2), _sparse(1, 3, 13, 3, 6)
    assert a.ids.shape[-1] == 2 and b.ids.shape[-1] == 6
    c = cat_sparse([a, b])
    assert c.ids.shape == (3, 3, 6)
    assert torch.equal(c.ids[:2, :, :2], a.ids) and not c.mask[:2, :, 2:].any()
    assert torch.equal(c.ids[:2, :, 2:], torch.zeros(2, 3, 4, dtype=torch.long))
    assert torch.isneginf(c.logp[:2, :, 2:]).all()
    assert torch.equal(c.logp[2:], b.logp) and torch.equal(c.log_rest[:2], a.log_rest)
    # Along dim 1 (time), too.
    assert cat_sparse([a, a[:, :1]], dim=1).ids.shape == (2, 4, 2)


def test_cat_bad_input():
    with pytest.raises(ValueError, match="empty"):
        cat_sparse([])
    with pytest.raises(ValueError, match="vocab_size"):
        cat_sparse([_sparse(1, 1, 5, 0, 2), _sparse(1, 1, 6, 0, 2)])
    with pytest.raises(ValueError, match="dim 2"):
        cat_sparse([_sparse(1, 1, 5, 0, 2)], dim=2)
