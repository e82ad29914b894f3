"""troll_old_policy="sampler": the old policy recorded at generation (HF generate, a rollout_func), on the tiny Llama.

The evidence test (the sampler's top-K equals the recomputed one to float32 noise, and so does the loss) prints its
figures with ``pytest -s``. vLLM's path runs in its own environment (tests/integrations/trl/test_trl_vllm.py).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl")

from tiny import PROMPTS  # noqa: E402

from troll import SparseLogProbs, troll_loss  # noqa: E402
from troll.integrations.sampler import fit_length, sparse_from_topk  # noqa: E402

from .test_trl import OLD_KEYS, config, logged, trainer  # noqa: E402

EPS = 0.01


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rows(tr, n_prompts=2):
    return [{"prompt": p} for p in PROMPTS[:n_prompts] for _ in range(tr.num_generations)]


def scored_batch(tr):
    tr.model.train()
    return tr._generate_and_score_completions(rows(tr))


def dense(old: SparseLogProbs) -> torch.Tensor:
    """(B, T, V) fp64 probabilities at the kept ids, 0 elsewhere."""
    p = torch.zeros(*old.ids.shape[:-1], old.vocab_size, dtype=torch.float64)
    return p.scatter_add(-1, old.ids, torch.where(old.mask, old.logp.double().exp(), 0.0))


def perturbed_logits(tr, inputs, scale=0.05):
    """(B, T, V) logits of the policy after a random step away from the sampler's weights."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in tr.model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
        return tr._troll_logits(tr.model, inputs).double()


def test_sampler_top_k_equals_recompute_and_so_does_the_loss(tmp_path):
    """Same batch, same weights: the old policy the generation recorded and the one a no-grad forward recomputes
    agree to float32 noise (kept ids, their log-probs, the tail), and the TROLL loss from each is the same."""
    tr = trainer(config(tmp_path, troll_old_policy="sampler", steps_per_generation=2))
    inputs = scored_batch(tr)
    sampled, recomputed = SparseLogProbs.from_dict(inputs), tr._troll_capture_old(inputs)
    mask = inputs["completion_mask"].bool()
    assert torch.equal(dense(sampled)[mask] > 0, dense(recomputed)[mask] > 0)  # the same kept ids
    prob_diff = float((dense(sampled) - dense(recomputed))[mask].abs().max())
    rest_diff = float((sampled.log_rest - recomputed.log_rest)[mask].abs().max())
    assert prob_diff < 1e-6 and rest_diff < 1e-5
    logits = perturbed_logits(tr, inputs)
    tokens, adv = inputs["completion_ids"], inputs["advantages"]
    kw = dict(kl_bound=EPS, top_k=tr.args.troll_top_k, delta=tr.args.troll_delta)
    ours, theirs = (
        troll_loss(logits, sampled, tokens, adv, mask, **kw),
        troll_loss(logits, recomputed, tokens, adv, mask, **kw),
    )
    assert float(ours.metrics["projected_frac"]) > 0.5  # the projection is engaged on most tokens
    loss_diff = float((ours.loss - theirs.loss).abs())
    torch.testing.assert_close(ours.loss, theirs.loss, rtol=1e-6, atol=1e-9)
    for key in ("kl_before/mean", "kl_after/max", "eta/mean", "ratio/mean"):
        torch.testing.assert_close(ours.metrics[key], theirs.metrics[key], rtol=1e-5, atol=1e-9)
    print(f"\nsampler vs recompute: max |p| diff {prob_diff:.2e}, max |log_rest| diff {rest_diff:.2e}, loss diff "
          f"{loss_diff:.2e} (loss {float(theirs.loss):.6f})")  # fmt: skip


def test_sampler_skips_trls_old_log_prob_forward(tmp_path):
    """With the TROLL loss types nothing else reads TRL's old log-probs: no scoring forward runs, and the batch's
    old_per_token_logps are the sampler's own at the sampled tokens."""
    tr = trainer(config(tmp_path, troll_old_policy="sampler", steps_per_generation=2, troll_lm_head="dense"))
    calls = []
    hook = tr.model.register_forward_pre_hook(lambda *_: calls.append(1))
    generated = []
    tr.model.generate = _counting(tr.model.generate, generated)
    inputs = scored_batch(tr)
    hook.remove()
    assert all(key in inputs for key in OLD_KEYS)
    steps = inputs["completion_ids"].shape[1]
    assert len(calls) == sum(generated) and sum(generated) >= steps  # the generation's forwards only
    old = SparseLogProbs.from_dict(inputs)
    mask = inputs["completion_mask"].bool()
    expected = old.token_logp(inputs["completion_ids"]).float()
    torch.testing.assert_close(inputs["old_per_token_logps"][mask], expected[mask])


def _counting(generate, counts):
    def wrapped(*args, **kwargs):
        out = generate(*args, **kwargs)
        counts.append(out.shape[1] - kwargs["input_ids"].shape[1])  # one forward per generated token
        return out

    return wrapped


def test_trl_loss_types_measure_kl_to_the_sampler_and_keep_their_forward(tmp_path):
    """troll_measure_kl with the sampler: TRL's loss keeps its own old log-probs (its scoring forward runs), the KL
    is logged against the sampler's old policy."""
    args = config(tmp_path, loss_type="dapo", troll_measure_kl=True, troll_old_policy="sampler", steps_per_generation=2)
    tr = trainer(args)
    inputs = scored_batch(tr)
    old, mask = SparseLogProbs.from_dict(inputs), inputs["completion_mask"].bool()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        trl_old, _, _ = tr._get_per_token_logps_and_entropies(
            tr.model, ids, att, ids.shape[1] - inputs["prompt_ids"].shape[1]
        )
    assert torch.equal(inputs["old_per_token_logps"], trl_old)  # TRL's forward, not the sampler's values
    torch.testing.assert_close(old.token_logp(inputs["completion_ids"]).float()[mask], trl_old[mask], atol=1e-5, rtol=0)
    tr.train()
    assert len(logged(tr, "troll/kl_before/max")) == tr.args.max_steps


@pytest.mark.parametrize("reuse", [dict(steps_per_generation=4), dict(steps_per_generation=1)])
def test_sampler_training_keeps_the_bound(tmp_path, reuse):
    """A real train(): the old policy is the sampler's (also with one step per rollout batch, where it is the
    trainer's weights again, so the projection stays idle), the bound holds at every step."""
    tr = trainer(
        config(tmp_path, troll_old_policy="sampler", max_steps=4, learning_rate=0.1, troll_kl_bound=EPS, **reuse)
    )
    tr.train()
    assert all(key in tr._buffered_inputs[0] for key in OLD_KEYS)
    assert max(logged(tr, "troll/kl_after/max")) <= EPS * (1 + 1e-4)
    assert logged(tr, "troll/old_excluded_frac") == [0.0] * 4
    if reuse["steps_per_generation"] == 4:
        assert max(logged(tr, "troll/projected_frac")) > 0
    else:
        assert max(logged(tr, "troll/kl_before/max")) < 1e-6


def test_truncated_sampling_records_the_full_distribution(tmp_path):
    """top_k / top_p truncate what generate samples from, not what the recorder keeps: the trust region is around
    the temperature-scaled full distribution, as with the recomputed old policy (docs/trl.md)."""
    tr = trainer(config(tmp_path, troll_old_policy="sampler", steps_per_generation=2, top_k=3, top_p=0.9))
    inputs = scored_batch(tr)
    sampled, recomputed = SparseLogProbs.from_dict(inputs), tr._troll_capture_old(inputs)
    mask = inputs["completion_mask"].bool()
    assert int(sampled.mask.sum(-1)[mask].min()) > 3  # more than the 3 ids the sampler could draw from
    torch.testing.assert_close(dense(sampled)[mask], dense(recomputed)[mask], rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------------- rollout_func


def hf_rollout(trainer_, prompts, *, k, breaker=None):
    """A rollout_func in vLLM's format: per position the top-k log-probs of softmax(logits / T) and their ids, plus
    the sampled token when it ranks lower. ``breaker(out)`` may spoil the output (the bad-input tests)."""
    tok = trainer_.processing_class
    model = trainer_.accelerator.unwrap_model(trainer_.model)
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        gen = model.generate(**enc, do_sample=True, max_new_tokens=trainer_.max_completion_length, output_scores=True,
                             return_dict_in_generate=True, temperature=trainer_.temperature, top_k=0, top_p=1.0,
                             pad_token_id=tok.pad_token_id)  # fmt: skip
    new = gen.sequences[:, enc["input_ids"].shape[1] :]
    logp = torch.log_softmax(torch.stack(gen.scores, 1).float(), -1)  # scores after the temperature warper
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "logprob_token_ids": []}
    for i in range(len(prompts)):
        ids = new[i].tolist()
        if tok.eos_token_id in ids:
            ids = ids[: ids.index(tok.eos_token_id) + 1]
        lps, tids = [], []
        for t, token in enumerate(ids):
            top = logp[i, t].topk(k)
            entries = dict(zip(top.indices.tolist(), top.values.tolist()))
            entries.setdefault(token, float(logp[i, t, token]))
            tids.append(list(entries))
            lps.append(list(entries.values()))
        out["prompt_ids"].append(enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist())
        out["completion_ids"].append(ids)
        out["logprobs"].append(lps)
        out["logprob_token_ids"].append(tids)
    return breaker(out) if breaker else out


def rollout_trainer(tmp_path, breaker=None, k=64, **overrides):
    args = config(tmp_path, troll_old_policy="sampler", steps_per_generation=2, **overrides)
    tr = trainer(args)
    tr.rollout_func = lambda prompts, t: hf_rollout(t, prompts, k=k, breaker=breaker)
    return tr


def test_rollout_func_top_k_becomes_the_old_policy(tmp_path):
    tr = rollout_trainer(tmp_path)
    inputs = scored_batch(tr)
    sampled, recomputed = SparseLogProbs.from_dict(inputs), tr._troll_capture_old(inputs)
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(dense(sampled)[mask], dense(recomputed)[mask], rtol=0, atol=1e-6)
    torch.testing.assert_close(sampled.log_rest[mask], recomputed.log_rest[mask], rtol=1e-4, atol=1e-5)
    # TRL's sampling_per_token_logps are the sampled tokens' log-probs (B, T), not the top-K lists
    sampling = inputs["sampling_per_token_logps"]
    assert sampling.shape == mask.shape
    torch.testing.assert_close(sampling[mask], sampled.token_logp(inputs["completion_ids"]).float()[mask])


def _drop_key(out):
    out.pop("logprob_token_ids")
    return out


def _nan_first(out):
    out["logprobs"][0][0][0] = float("nan")
    return out


def _positive(out):
    out["logprobs"][1][0][0] = 0.5
    return out


def _outside(out):
    out["logprob_token_ids"][0][1][0] = 10**6
    return out


def _short_sequence(out):
    out["logprobs"][0] = out["logprobs"][0][:-1]
    return out


@pytest.mark.parametrize(
    ("breaker", "k", "match"),
    [
        (_drop_key, 64, "return 'logprob_token_ids' beside 'logprobs'"),
        (None, 8, r"fewer than troll_top_k=64.*logprobs=64"),
        (_nan_first, 64, r"logprobs\[0\]\[0\].*finite and <= 0"),
        (_positive, 64, r"logprobs\[1\]\[0\].*finite and <= 0"),
        (_outside, 64, r"logprob_token_ids\[0\]\[1\].*outside the model's vocabulary"),
        (_short_sequence, 64, r"logprobs\[0\] has \d+ positions.*completion 0 has"),
    ],
)
def test_rollout_func_bad_log_probs_name_the_field(tmp_path, breaker, k, match):
    tr = rollout_trainer(tmp_path, breaker=breaker, k=k)
    with pytest.raises(ValueError, match=match):
        scored_batch(tr)


# -------------------------------------------------------------------------------------------- sparse_from_topk


def test_sparse_from_topk_keeps_by_the_mass_rule_plus_the_sampled_token():
    # One position: probabilities 0.6, 0.3, 0.05 at ids 7, 3, 9 (given in any order), sampled id 9, V = 12.
    lp = [[[math.log(0.3), math.log(0.6), math.log(0.05)]]]
    ids = [[[3, 7, 9]]]
    old = sparse_from_topk(lp, ids, [[9]], vocab_size=12, top_k=2, delta=0.05)
    kept = {int(i): float(p) for i, p, m in zip(old.ids[0, 0], old.logp[0, 0].exp(), old.mask[0, 0]) if m}
    assert kept == pytest.approx({7: 0.6, 3: 0.3, 9: 0.05})  # top 2 by mass (0.9 < 0.95 at 2, cap), plus sampled
    assert float(old.log_rest[0, 0].exp()) == pytest.approx(0.05)
    loose = sparse_from_topk(lp, ids, [[7]], vocab_size=12, top_k=2, delta=0.5)
    assert loose.mask.sum() == 1 and float(loose.log_rest.exp()) == pytest.approx(0.4)  # 0.6 >= 1 - 0.5


def test_sparse_from_topk_pads_past_each_completion_and_fits_trls_length():
    lp = [[[-0.1, -3.0]], [[-0.2, -2.0], [-0.5, -1.0]]]
    ids = [[[1, 2]], [[1, 3], [2, 1]]]
    old = sparse_from_topk(lp, ids, [[1], [3, 2]], vocab_size=5, top_k=2, delta=0.0)
    assert old.ids.shape[:2] == (2, 2) and not bool(old.mask[0, 1].any()) and float(old.log_rest[0, 1]) == 0.0
    longer = fit_length(old, 4)
    assert longer.ids.shape[:2] == (2, 4) and not bool(longer.mask[:, 2:].any())
    assert fit_length(old, 1).ids.shape[:2] == (2, 1)


@pytest.mark.parametrize(
    ("lp", "ids", "match"),
    [
        ([[[-0.1, -0.1]]], [[[1, 1]]], "repeats a token id"),
        ([[[-0.01, -0.02]]], [[[1, 2]]], r"add up to .* > 1"),
        ([[[-0.1, -3.0]]], [[[1, 2, 3]]], r"has 2 entries but .* has 3"),
        ([[[-0.1, None]]], [[[1, 2]]], "finite and <= 0"),
        ([[[-0.5, -1.0]]], [[[1, 2]]], "does not contain the sampled token"),
    ],
)
def test_sparse_from_topk_rejects_bad_values(lp, ids, match):
    with pytest.raises(ValueError, match=match):
        sparse_from_topk(lp, ids, [[4]] if "sampled" in match else [[1]], vocab_size=5, top_k=2, delta=0.0)


# ------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(troll_old_policy="engine"), "troll_old_policy='engine' is not supported"),
        (dict(repetition_penalty=1.2), "set repetition_penalty=1.0"),
        (dict(use_vllm=True, top_p=0.9), r"top_p=0.9 with use_vllm=True.*trl#6789"),
        (dict(use_vllm=True, min_p=0.1), r"min_p=0.1 with use_vllm=True"),
        (dict(use_vllm=True, generation_kwargs={"top_k": 50}), r"top_k=50 with use_vllm=True"),
        (dict(use_vllm=True, troll_top_k=64), r"troll_top_k <= 20"),
    ],
)
def test_sampler_refuses_what_it_cannot_make_right(tmp_path, overrides, match):
    overrides.setdefault("troll_old_policy", "sampler")
    if overrides.get("use_vllm"):
        overrides["vllm_importance_sampling_correction"] = False  # refused with the TROLL loss types anyway
    with pytest.raises(ValueError, match=match):
        config(tmp_path, **overrides)


def test_sampler_with_tools_is_refused_before_training(tmp_path):
    """The tool loop splices tool tokens into the completions after generation; the check runs in __init__ (TRL
    first checks that the chat template renders tools, which the tiny one does not, hence the direct call)."""
    tr = trainer(config(tmp_path, troll_old_policy="sampler", steps_per_generation=2))
    tr.tools = [len]
    with pytest.raises(ValueError, match="does not support tools or environment_factory"):
        tr._troll_check_sampler()


# --------------------------------------------------------------------------------- one KL rule


@pytest.mark.parametrize("tail", ["bucket", "renormalize"])
def test_kl_metric_is_the_losss_kl(tail):
    """troll.categorical.losses.sparse_kl_metrics (what troll_measure_kl logs) and the TROLL loss share one support rule
    (troll.categorical.losses.loss_support): on a batch with projected tokens and one sampled id the old policy
    excludes, the
    metric's kl_before and kl_share equal the loss's."""
    from conftest import drift, gen, peaked_logits

    from troll import sparsify
    from troll.categorical.losses import sparse_kl_metrics
    from troll.categorical.policy import DenseLogits

    g = gen(3)
    old_logits = peaked_logits(3, 5, vocab=50, g=g)
    logits = drift(old_logits, g)
    tokens = torch.distributions.Categorical(logits=old_logits).sample()
    old_logits[0, 1, tokens[0, 1]] = float("-inf")  # the old policy excludes a sampled id: both must drop it
    old = sparsify(old_logits, top_k=6, delta=1e-5, include=tokens)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 4] = False
    rule = dict(kl_bound=0.05, top_k=6, delta=1e-5, tail=tail, fill=1e-12)
    out = troll_loss(logits, old, tokens, torch.randn(3, generator=g), mask, **rule)
    metric = sparse_kl_metrics(DenseLogits(logits.reshape(15, -1)), old, tokens, mask, **rule)
    assert float(out.metrics["old_excluded_frac"]) > 0 and float(out.metrics["projected_frac"]) > 0
    assert metric.keys() == {k for k in out.metrics if k.startswith(("kl_before/", "kl_share/"))}
    for key, value in metric.items():
        torch.testing.assert_close(value, out.metrics[key], rtol=1e-12, atol=1e-15, msg=key)
