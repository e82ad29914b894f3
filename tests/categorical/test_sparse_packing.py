"""SparseLogProbs packing to and from flat tensors (to_dict / from_dict / cat_sparse)."""

import pytest
import torch

from troll.categorical.sparse import SparseLogProbs, cat_sparse, sparsify


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
