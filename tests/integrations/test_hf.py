"""The transformers LM-head plumbing shared by the integrations (troll.integrations.hf), on a tiny Llama."""

import pytest
import torch

pytest.importorskip("transformers")

from tiny import tiny_model, tiny_tokenizer  # noqa: E402

from troll.categorical.sparse import sparsify  # noqa: E402
from troll.integrations import hf  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_model(tiny_tokenizer(), seed=3)


def _batch(vocab, b=5, s=9, t=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (b, s), generator=g)
    att = torch.ones_like(ids)
    att[0, :2] = 0  # left padding in the prompt
    return ids, att, ids[:, -t:]


@pytest.mark.parametrize("chunked", [True, False])
def test_capture_old_matches_sparsify_of_the_models_logits(model, chunked):
    ids, att, tokens = _batch(model.config.vocab_size)
    t, temp = tokens.shape[1], 0.7
    old = hf.capture_old(model, ids, att, tokens, temperature=temp, top_k=6, delta=1e-3, chunked=chunked, batch_size=2)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits[:, -(t + 1) : -1].double() / temp
    ref = sparsify(logits, top_k=6, delta=1e-3, include=tokens)
    assert old.ids.shape[:2] == (5, t) and old.vocab_size == model.config.vocab_size
    # Same kept set per row (order may differ between the chunked scan and topk), same values.
    for row in range(5):
        for pos in range(t):
            got = dict(zip(old.ids[row, pos][old.mask[row, pos]].tolist(), old.logp[row, pos][old.mask[row, pos]]))
            want = dict(zip(ref.ids[row, pos][ref.mask[row, pos]].tolist(), ref.logp[row, pos][ref.mask[row, pos]]))
            assert got.keys() == want.keys()
            assert int(tokens[row, pos]) in got
            for k, v in want.items():
                assert abs(float(got[k]) - float(v)) < 1e-4
    assert torch.allclose(old.log_rest.double(), ref.log_rest, atol=1e-3)


def test_final_hidden_and_the_head_reproduce_the_logits(model):
    ids, att, tokens = _batch(model.config.vocab_size)
    t = tokens.shape[1]
    head = hf.output_embeddings(model)
    with torch.no_grad():
        hidden, last = hf.final_hidden(model, ids, att)
        logits = hf.completion_logits(model, ids, att, t, 1.0)
    assert getattr(head, "bias", None) is None and hidden.shape == (5, ids.shape[1], model.config.hidden_size)
    assert torch.allclose(hidden[:, -(t + 1) : -1] @ head.weight.T, logits, atol=1e-5)
    assert last.shape == (5, 1, model.config.vocab_size)  # logits_to_keep=1: the last position only
    assert hf.logits_mismatch(last[:, -1][:1], hidden[:1, -1], head.weight, None) is None
    assert "max deviation" in hf.logits_mismatch(2 * last[:, -1][:1], hidden[:1, -1], head.weight, None)


def test_sparsify_head_through_a_gathering_callback(model):
    """The chunked capture both integrations use: the head's weight comes from ``with_head``, the sampled token is
    kept, and the values equal troll.sparsify of the logits."""
    ids, att, tokens = _batch(model.config.vocab_size)
    t = tokens.shape[1]
    head = hf.output_embeddings(model)
    calls = []

    def with_head(fn, *tensors):
        calls.append(len(tensors))
        return fn(head.weight, None, *tensors)

    with torch.no_grad():
        hidden, _ = hf.final_hidden(model, ids, att)
        logits = hf.completion_logits(model, ids, att, t, 0.5)
    old, entropy = hf.sparsify_head(
        hidden[:, -(t + 1) : -1], tokens, with_head=with_head, temperature=0.5, top_k=5, delta=0.0, return_entropy=True
    )
    ref = sparsify(logits, top_k=5, delta=0.0, include=tokens)
    assert calls == [2] and entropy.shape == tokens.shape
    torch.testing.assert_close(old.token_logp(tokens), ref.token_logp(tokens))
    torch.testing.assert_close(old.log_rest, ref.log_rest, rtol=1e-4, atol=1e-5)
    expected = torch.special.entr(torch.softmax(logits.double(), -1)).sum(-1)
    torch.testing.assert_close(entropy.double(), expected, rtol=1e-4, atol=1e-5)


def test_head_blocker(model):
    assert hf.head_blocker(model) is None
    model.config.logit_scale = 2.0
    try:
        assert "config.logit_scale=2.0" in hf.head_blocker(model)
    finally:
        del model.config.logit_scale


def test_probe_catches_an_unannounced_logit_transform(model):
    head = hf.output_embeddings(model)
    original = model.forward

    def doubled(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = out.logits * 2
        return out

    model.forward = doubled
    try:
        assert "max deviation" in hf.probe_linear_head(model, head)
    finally:
        del model.forward


def test_probe_with_a_gathering_callback_uses_the_weight_it_is_given(model):
    """``with_head`` (a sharded head gathered for the call) supplies the weight; the probe compares against it."""
    head = hf.output_embeddings(model)
    calls = []

    def with_head(fn, scale=1.0):
        calls.append(1)
        return fn(head.weight * scale, getattr(head, "bias", None))

    assert hf.probe_linear_head(model, head, with_head=with_head) is None and calls == [1]
    assert "max deviation" in hf.probe_linear_head(model, head, with_head=lambda fn: with_head(fn, 2.0))


def test_model_without_linear_head():
    class NoHead(torch.nn.Module):
        def get_output_embeddings(self):
            return torch.nn.Identity()

    assert "no linear output embeddings" in hf.head_blocker(NoHead())
    assert hf.output_embeddings(torch.nn.Linear(2, 2)) is None


def test_final_hidden_without_hidden_states_is_a_clear_error():
    class Out:
        hidden_states = None
        logits = torch.zeros(1, 1, 3)

    class Bare(torch.nn.Module):
        def forward(self, **kwargs):
            return Out()

    with pytest.raises(RuntimeError, match="no hidden states"):
        hf.final_hidden(Bare(), torch.ones(1, 2, dtype=torch.long), None)
    with pytest.raises(ValueError, match="batch_size"):
        hf.capture_old(Bare(), *_batch(7)[:3], temperature=1.0, top_k=2, delta=0.0, chunked=False, batch_size=0)


def test_a_wrapper_is_called_and_the_head_read_from_the_model(model):
    class Wrapper(torch.nn.Module):  # like DDP: forwards the call, has no get_output_embeddings
        def __init__(self, inner):
            super().__init__()
            self.inner, self.calls = inner, 0

        def forward(self, **kwargs):
            self.calls += 1
            return self.inner(**kwargs)

    ids, att, tokens = _batch(model.config.vocab_size)
    wrapper = Wrapper(model)
    old = hf.capture_old(
        model, ids, att, tokens, temperature=1.0, top_k=4, delta=0.0, chunked=True, batch_size=5, wrapped=wrapper
    )
    ref = hf.capture_old(model, ids, att, tokens, temperature=1.0, top_k=4, delta=0.0, chunked=True, batch_size=5)
    assert wrapper.calls == 1 and torch.equal(old.ids, ref.ids) and torch.equal(old.logp, ref.logp)
