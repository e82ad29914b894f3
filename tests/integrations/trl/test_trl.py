"""TROLL in TRL's GRPOTrainer, on a tiny random Llama and an offline tokenizer (CPU, no hub)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from unittest.mock import patch

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

pytest.importorskip("trl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import trl  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.utils import split_tensor_dict  # noqa: E402

from troll import SparseLogProbs, clip_loss, old_token_logp, project_sparse, troll_loss  # noqa: E402
from troll.categorical.defaults import OLD_PREFIX  # noqa: E402
from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer, check_trl_version  # noqa: E402

OLD_KEYS = tuple(OLD_PREFIX + k for k in ("ids", "logp", "mask", "log_rest", "vocab"))  # SparseLogProbs.to_dict

from conftest import SRC, SUPPORT, check_torchrun, run_script, torchrun  # noqa: E402
from tiny import PROMPTS, reward_letter_a, tiny_dataset, tiny_model, tiny_tokenizer  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Two shared cores: intra-op threads only add contention on these tiny shapes (10x slower measured).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def config(tmp_path, cls=TrollGRPOConfig, **overrides):
    args = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    args.update(overrides)
    return cls(**args)


def trainer(args, cls=TrollGRPOTrainer, seed=0, model=None, **model_kwargs):
    tok = tiny_tokenizer()
    return cls(
        model=tiny_model(tok, seed=seed, **model_kwargs) if model is None else model,
        reward_funcs=reward_letter_a,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tok,
    )


def params(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def logged(tr, key):
    return [entry[key] for entry in tr.state.log_history if key in entry]


# ----------------------------------------------------------------------------------------------- training runs


@pytest.mark.parametrize("loss_type", ["troll", "troll_seq"])
def test_troll_steps_update_every_parameter(tmp_path, loss_type):
    tr = trainer(config(tmp_path, loss_type=loss_type, steps_per_generation=2, max_steps=3))
    before = params(tr.model)
    tr.train()
    after = params(tr.model)
    unchanged = [name for name in before if torch.equal(before[name], after[name])]
    assert not unchanged, f"parameters not updated: {unchanged}"
    assert all(torch.isfinite(torch.tensor(logged(tr, "loss"))))
    for key in ("troll/kl_after/max", "troll/projected_frac", "troll/ratio/mean", "troll/loss/reg", "entropy"):
        assert len(logged(tr, key)) == 3, key


@pytest.mark.parametrize("reuse", [dict(steps_per_generation=4), dict(steps_per_generation=1, num_iterations=4)])
def test_projection_engages_and_bounds_every_token(tmp_path, reuse):
    eps = 0.01
    tr = trainer(config(tmp_path, max_steps=4, learning_rate=0.1, troll_kl_bound=eps, **reuse))
    tr.train()
    # The old policy was captured with the rollout batch and survived TRL's shuffle and split.
    assert all(key in tr._buffered_inputs[0] for key in OLD_KEYS)
    assert max(logged(tr, "troll/projected_frac")) > 0
    assert max(logged(tr, "troll/kl_before/max")) > eps
    assert max(logged(tr, "troll/kl_after/max")) <= eps * (1 + 1e-4)


def test_one_step_per_rollout_batch_is_on_policy(tmp_path):
    # Each batch feeds one optimiser step: no old policy is stored and the projection is the identity.
    tr = trainer(config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=2, learning_rate=0.1))
    tr.train()
    assert not any(key in tr._buffered_inputs[0] for key in OLD_KEYS)
    assert logged(tr, "troll/projected_frac") == [0.0, 0.0]
    assert max(logged(tr, "troll/kl_after/max")) < 1e-8


@pytest.mark.parametrize("overrides", [dict(loss_type="grpo"), dict(loss_type="cispo", steps_per_generation=4)])
def test_trl_loss_types_unchanged(tmp_path, overrides):
    """A TRL loss type on TrollGRPOTrainer is TRL's: same losses and weights as GRPOTrainer, same seed."""
    ours = trainer(config(tmp_path / "ours", max_steps=3, **overrides))
    ours.train()  # construct, then train: construction seeds the RNG that sampling uses
    theirs = trainer(config(tmp_path / "theirs", cls=GRPOConfig, max_steps=3, **overrides), cls=GRPOTrainer)
    theirs.train()
    assert logged(ours, "loss") == logged(theirs, "loss")
    assert not any(key.startswith("troll/") for entry in ours.state.log_history for key in entry)
    for name, value in params(theirs.model).items():
        torch.testing.assert_close(params(ours.model)[name], value, rtol=0, atol=0)


# ------------------------------------------------------------------------------- one batch, TROLL vs TRL's losses


def first_micro_batch(tr):
    """The first micro-batch TRL's _prepare_inputs hands to the loss: generated, scored, shuffled and split."""
    tr.model.train()
    tr._step = 0
    rows = [{"prompt": p} for p in PROMPTS[:2] for _ in range(tr.num_generations)]
    return tr._prepare_inputs(rows * tr.args.steps_per_generation)


def loss_and_grads(tr, inputs, loss_type, level="token"):
    tr.loss_type, tr.importance_sampling_level = loss_type, level
    tr.model.zero_grad()
    loss = tr.compute_loss(tr.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("troll", "agg", "trl_loss", "level"),
    [
        ("troll", None, "dapo", "token"),
        ("troll_seq", None, "grpo", "sequence"),
        ("troll_seq", "token-mean", "dapo", "sequence"),  # the paper's GSPO aggregation (troll gspo_tm)
    ],
)
@pytest.mark.parametrize("steps", [dict(gradient_accumulation_steps=2), dict(steps_per_generation=2)])
def test_ratio_one_matches_trl_normalisation(tmp_path, troll, agg, trl_loss, level, steps):
    """Before any update the ratio is 1 and nothing is clipped or projected: TROLL's loss and gradient must equal
    TRL's "dapo" ("troll"), GSPO-"grpo" ("troll_seq") and GSPO-"dapo" ("troll_seq" with token-mean), which checks the
    aggregation and the scaling for gradient accumulation, steps_per_generation and num_items_in_batch. The
    steps_per_generation=2 case uses the stored old policy (TRL's old log-probs for the clip loss)."""
    tr = trainer(config(tmp_path, loss_type=troll, troll_agg=agg, **steps))
    tr.current_gradient_accumulation_steps = tr.args.gradient_accumulation_steps
    inputs = first_micro_batch(tr)
    assert ("troll_old_ids" in inputs) == (tr.args.steps_per_generation > tr.args.gradient_accumulation_steps)
    ours, our_grads = loss_and_grads(tr, inputs, troll)
    theirs, their_grads = loss_and_grads(tr, inputs, trl_loss, level)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    assert our_grads.keys() == their_grads.keys()
    for name, grad in their_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-7)
    metrics = tr._metrics["train"]
    assert metrics["troll/ratio/max"][-1] == pytest.approx(1, abs=1e-5)
    assert metrics["troll/projected_frac"][-1] == 0


def stored_old(inputs):
    """The old policy a batch carries (the wire format is SparseLogProbs.to_dict)."""
    return SparseLogProbs.from_dict(inputs)


def test_stored_old_policy_is_aligned_after_shuffle_and_split(tmp_path):
    tr = trainer(config(tmp_path, steps_per_generation=2))
    inputs = first_micro_batch(tr)
    for chunk in [inputs, *split_tensor_dict(inputs, 2)]:
        fresh = tr._troll_capture_old(chunk)
        # Compared where a near-tie swapping two kept ids under rounding cannot matter: at the sampled tokens
        # (always kept) and the mass outside the kept ids.
        stored, recomputed = stored_old(chunk), fresh
        tokens = chunk["completion_ids"]
        torch.testing.assert_close(old_token_logp(stored, tokens), old_token_logp(recomputed, tokens))
        torch.testing.assert_close(stored.log_rest, recomputed.log_rest)


def test_capture_rides_on_trls_old_log_prob_forward(tmp_path):
    """One no-grad forward per rollout batch: TROLL's old policy is read off TRL's own old-log-prob forward, which
    returns the same log-probs bit for bit as without the capture, and the capture equals a separate one."""
    tr = trainer(config(tmp_path, steps_per_generation=2))
    tr.model.train()
    assert tr.troll_lm_head == "chunked"  # resolved (its probe is a forward of its own) before counting
    calls = []  # TRL's fused-head scoring forwards, and the hidden-state forwards a separate capture would add
    hook = tr.model.register_forward_pre_hook(
        lambda _, args, kwargs: calls.append(
            "fused" if kwargs.get("fused_lm_head") else kwargs.get("output_hidden_states")
        ),
        with_kwargs=True,
    )
    with patch.object(tr, "_troll_capture_old", side_effect=AssertionError("a second forward ran")):
        inputs = tr._generate_and_score_completions([{"prompt": p} for p in PROMPTS[:2] for _ in range(8)])
    hook.remove()
    size = tr.args.per_device_train_batch_size
    assert calls.count("fused") == -(-inputs["completion_ids"].shape[0] // size)
    assert -1 not in calls and True not in calls
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    t = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        plain, _, _ = tr._get_per_token_logps_and_entropies(tr.model, ids, mask, t, batch_size=size)
    assert torch.equal(plain, inputs["old_per_token_logps"])
    separate = tr._troll_capture_old(inputs).to_dict()
    for key in OLD_KEYS:
        assert torch.equal(inputs[key], separate[key]), key


# ---------------------------------------------------------------------------------------------- checkpoints


def test_resume_from_checkpoint_continues(tmp_path):
    straight = trainer(config(tmp_path / "a", loss_type="troll", steps_per_generation=2, max_steps=4))
    straight.train()
    first = trainer(config(tmp_path / "b", steps_per_generation=2, max_steps=4, save_strategy="steps", save_steps=2))
    first.train()
    resumed = trainer(config(tmp_path / "b", steps_per_generation=2, max_steps=4), seed=1)
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-2"))
    assert resumed.state.global_step == 4
    # The history up to the checkpoint is restored; the steps after it repeat the uninterrupted run's.
    assert [e["step"] for e in resumed.state.log_history if "loss" in e] == [1, 2, 3, 4]
    assert logged(resumed, "loss") == pytest.approx(logged(straight, "loss"), rel=1e-5)
    for name, value in params(straight.model).items():
        torch.testing.assert_close(params(resumed.model)[name], value, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(troll_kl_bound=0.0), "troll_kl_bound=0.05"),
        (dict(troll_kl_bound=-0.1), "troll_kl_bound must be > 0"),
        (dict(troll_alpha=-1.0), "troll_alpha=1.0"),
        (dict(troll_top_k=0), "troll_top_k=64"),
        (dict(troll_top_k=2.5), "integer"),
        (dict(troll_delta=1.0), r"\[0, 1\)"),
        (dict(troll_agg="mean"), "token-mean"),
        (dict(beta=0.04), "set beta=0.0"),
        (dict(importance_sampling_level="sequence"), "loss_type='troll_seq'"),
        (dict(entropy_coef=0.01), "entropy_coef=0.0"),
        (dict(top_entropy_quantile=0.2), "top_entropy_quantile=1.0"),
        (dict(off_policy_mask_threshold=0.5), "off_policy_mask_threshold=None"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(temperature=float("nan")), "temperature must be > 0"),
        (dict(troll_tail="uniform"), "troll_tail='uniform' is not supported; choose one of 'bucket', 'renormalize'"),
        (dict(troll_fill=0.0), r"troll_fill must lie in \(0, 1e-3\]"),
        (dict(troll_fill=0.5), r"troll_fill must lie in \(0, 1e-3\]"),
        (dict(troll_measure_kl="yes"), "troll_measure_kl must be True or False"),
    ],
)
def test_bad_config_says_how_to_fix(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        config(tmp_path, **overrides)


def test_trl_loss_types_ignore_troll_only_restrictions(tmp_path):
    args = config(tmp_path, loss_type="grpo", beta=0.04, importance_sampling_level="sequence")
    assert args.loss_type == "grpo"


def test_troll_loss_type_needs_troll_config(tmp_path):
    with pytest.raises(TypeError, match="TrollGRPOConfig"):
        trainer(config(tmp_path, cls=GRPOConfig, loss_type="troll"))


def test_unsupported_trl_version_fails_at_construction(tmp_path, monkeypatch):
    check_trl_version("1.16.3")
    for bad in ("1.15.2", "1.17.0", "2.0.0"):
        with pytest.raises(RuntimeError, match="pip install"):
            check_trl_version(bad)
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(RuntimeError, match=r"TRL >=1.16,<1.17, but TRL 1.17.0 is installed"):
        trainer(config(tmp_path))


def test_import_without_trl_is_guarded():
    code = (
        "import sys; sys.modules['trl'] = None\n"
        "import troll, troll.integrations\n"
        "try:\n"
        "    import troll.integrations.trl\n"
        "except ImportError as e:\n"
        "    assert 'pip install troll[trl]' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------------------- two processes


def test_two_processes_match_one(tmp_path):
    """torchrun, 2 CPU processes (gloo): loss, gradient and metrics of a fixed batch split over the processes
    equal those of this process on the whole batch; then one real DDP training step runs. (First-step losses of
    real runs cannot agree: each process samples its completions with its own seed.)"""
    script = str(SUPPORT / "_torchrun_trl.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.update(OMP_NUM_THREADS="1", TROLL_TORCHRUN_TIMEOUT="240")
    import _torchrun_trl

    _torchrun_trl.main(tmp_path / "one")
    code, err = run_script([*torchrun(2, tmp_path / "torchrun"), script, str(tmp_path / "two")], env)
    check_torchrun(code, err, tmp_path / "two" / "ready")
    one, two = torch.load(tmp_path / "one" / "result.pt"), torch.load(tmp_path / "two" / "result.pt")
    assert one["troll/metric/troll/projected_frac"] > 0  # the projection engaged on the fixed batch
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-6, msg=key)


# ------------------------------------------------------------------------------- LM head: chunked against dense


def use_head(tr, mode):
    """Switch the trainer's LM-head path (resolved again, as on first use)."""
    tr.args.troll_lm_head, tr._troll_head_mode = mode, None
    assert tr.troll_lm_head == mode


def perturb(model, scale, seed=1):
    """Move the weights away from the captured old policy, so that the projection engages."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=g, dtype=param.dtype))


def test_default_lm_head_is_chunked(tmp_path):
    args = config(tmp_path)
    assert args.troll_lm_head == "chunked"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert trainer(args).troll_lm_head == "chunked"
    assert not [w for w in caught if "troll_lm_head" in str(w.message)]


def test_bad_lm_head_says_how_to_fix(tmp_path):
    with pytest.raises(ValueError, match="troll_lm_head='chunked'.*troll_lm_head='dense'"):
        config(tmp_path, troll_lm_head="fused")


@pytest.mark.parametrize(
    ("loss_type", "tied", "steps"),
    [
        ("troll", False, dict(steps_per_generation=2)),
        ("troll_seq", True, dict(steps_per_generation=2)),
        ("troll", True, dict(gradient_accumulation_steps=2)),  # no stored old policy: old = current
    ],
)
def test_chunked_matches_dense(tmp_path, loss_type, tied, steps):
    """Same batch, same weights, float64: the chunked LM head gives the dense path's loss, gradients (a tied
    embedding's included) and logged metrics (TRL's entropy included)."""
    args = config(tmp_path, loss_type=loss_type, troll_kl_bound=0.01, **steps)
    tr = trainer(args, tied=tied, dtype=torch.float64)
    tr.current_gradient_accumulation_steps = tr.args.gradient_accumulation_steps
    inputs = first_micro_batch(tr)
    assert ("troll_old_ids" in inputs) == ("steps_per_generation" in steps)
    perturb(tr.model, 0.05)
    results = {}
    for mode in ("chunked", "dense"):
        use_head(tr, mode)
        tr._metrics["train"].clear()
        loss, grads = loss_and_grads(tr, inputs, loss_type)
        results[mode] = loss, grads, {key: values[-1] for key, values in tr._metrics["train"].items()}
    (loss, grads, metrics), (ref_loss, ref_grads, ref_metrics) = results["chunked"], results["dense"]
    torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=1e-12)
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    assert grads.keys() == ref_grads.keys() == {name for name, _ in tr.model.named_parameters()}
    assert ref_grads[head].abs().max() > 0
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)
    assert metrics.keys() == ref_metrics.keys() and "entropy" in metrics
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    if "troll_old_ids" in inputs:
        assert ref_metrics["troll/projected_frac"] > 0  # the trust region is active: the comparison is not trivial


def dense_view(old: SparseLogProbs) -> torch.Tensor:
    """(B, T, V) kept log-probs, -inf elsewhere: independent of the order of the kept ids and of padding."""
    full = old.logp.new_full((*old.ids.shape[:-1], old.vocab_size), float("-inf"))
    return full.scatter_reduce(-1, old.ids.long(), old.logp.masked_fill(~old.mask, float("-inf")), "amax")


def test_chunked_capture_matches_dense(tmp_path):
    tr = trainer(config(tmp_path, steps_per_generation=2), tied=True, dtype=torch.float64)
    inputs = first_micro_batch(tr)
    captured = {}
    for mode in ("chunked", "dense"):
        use_head(tr, mode)
        captured[mode] = tr._troll_capture_old(inputs)
    chunked, dense = captured["chunked"], captured["dense"]
    assert chunked.ids.shape == dense.ids.shape and chunked.ids.dtype == dense.ids.dtype == torch.int64
    torch.testing.assert_close(dense_view(chunked), dense_view(dense), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(chunked.log_rest, dense.log_rest, rtol=1e-9, atol=1e-12)


def test_chunked_path_saves_no_logits(tmp_path):
    """Autograd keeps no tensor over the vocabulary at more than one position per sequence (the dense path does)."""
    tr = trainer(config(tmp_path, steps_per_generation=2))
    tr.current_gradient_accumulation_steps = 1
    inputs = first_micro_batch(tr)
    vocab, bsz = tr.model.config.vocab_size, inputs["completion_ids"].size(0)
    weights = {p.untyped_storage().data_ptr() for p in tr.model.parameters()}  # a view of W.T is (H, V)
    found = {}
    for mode in ("chunked", "dense"):
        use_head(tr, mode)
        shapes = found[mode] = []

        def pack(t, shapes=shapes):
            if t.untyped_storage().data_ptr() not in weights:
                shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            tr.compute_loss(tr.model, inputs)
        shapes[:] = [s for s in shapes if s and s[-1] == vocab and math.prod(s) > bsz * vocab]
    assert found["dense"]  # the check sees (B, T, V) tensors where they exist
    assert not found["chunked"]


def test_lm_head_gradient_reaches_ddp(tmp_path):
    """Through DDP (one gloo process, find_unused_parameters=False): the hidden states come from the wrapped
    forward and the untied LM head's weight is used outside it. Its gradient must reach DDP's hooks (else the second
    forward raises "Expected to have finished reduction") and equal the unwrapped model's."""
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group yet")
    tr = trainer(config(tmp_path, steps_per_generation=2))
    tr.current_gradient_accumulation_steps = 1
    inputs = first_micro_batch(tr)
    perturb(tr.model, 0.05)
    _, expected = loss_and_grads(tr, inputs, "troll")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    wrapped = None
    try:
        wrapped = DistributedDataParallel(tr.model)
        for _ in range(2):
            tr.model.zero_grad()
            tr.compute_loss(wrapped, inputs).backward()
    finally:
        # DDP's reducer holds the process group: freed after destroy_process_group, at the function's exit, the gloo
        # group's destructor once waited forever on its threads (seen once in a fresh clone's make test)
        del wrapped
        dist.destroy_process_group()
    assert tr.troll_lm_head == "chunked"
    for name, param in tr.model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-5, atol=1e-8, msg=name)


def test_softcapped_logits_fall_back_to_dense(tmp_path):
    model = tiny_model(tiny_tokenizer())
    model.config.final_logit_softcapping = 30.0  # as Gemma 2 (a Llama ignores it; the config check does not)
    tr = trainer(config(tmp_path), model=model)
    with pytest.warns(UserWarning, match=r"final_logit_softcapping=30\.0.*troll_lm_head='dense'"):
        assert tr.troll_lm_head == "dense"


def test_probe_catches_an_unannounced_logit_transform(tmp_path):
    model = tiny_model(tiny_tokenizer())
    model.lm_head.register_forward_hook(lambda module, args, out: 2 * out)
    tr = trainer(config(tmp_path, steps_per_generation=2, max_steps=1), model=model)
    with pytest.warns(UserWarning, match="not last_hidden_state @ weight.T"):
        tr.train()  # resolved at the first capture; then the dense path trains
    assert tr.troll_lm_head == "dense" and all(math.isfinite(x) for x in logged(tr, "loss"))


# ------------------------------------------------------------------ the clip baselines and the KL they reach


def dense_policy(tr, inputs):
    """(B, T, V) log-probs of the completion tokens at the sampling temperature, from a plain forward of the model
    (not the trainer's paths): the independent side of the comparisons below."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    t = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        logits = tr.model(input_ids=ids, attention_mask=mask).logits[:, -(t + 1) : -1]
    return torch.log_softmax(logits.double() / tr.temperature, -1)


def masked(values, mask):
    return float(values[mask].mean()), float(values[mask].max())


@pytest.mark.parametrize("support", ["full", "default"])
def test_measured_kl_of_a_trl_loss(tmp_path, support):
    """troll_measure_kl on TRL's "dapo" with a dual clip (the paper's clip baseline): the logged KL(pi || pi_old)
    equals one computed independently from the model's logits, and TRL's loss and gradients are unchanged.

    "full": every token kept (top_k = V, delta = 0), so the sparse support is the vocabulary and the KL is the dense
    KL, by hand from the logits before and after the weights move. "default" (64 tokens, delta 1e-5): the same
    support through troll.project_sparse on the dense logits (TROLL's KL before projection)."""
    rule = dict(troll_top_k=400, troll_delta=0.0) if support == "full" else {}
    base = dict(loss_type="dapo", delta=10.0, steps_per_generation=2, temperature=0.7, **rule)
    tr = trainer(config(tmp_path, troll_measure_kl=True, **base), dtype=torch.float64)
    tr.current_gradient_accumulation_steps = 1
    inputs = first_micro_batch(tr)
    before = dense_policy(tr, inputs)
    old = stored_old(inputs)
    perturb(tr.model, 0.05)
    after = dense_policy(tr, inputs)
    mask = inputs["completion_mask"].bool()
    tr._metrics["train"].clear()
    loss, grads = loss_and_grads(tr, inputs, "dapo")
    logged_kl = {key: tr._metrics["train"][f"troll/kl_before/{key}"][-1] for key in ("mean", "max")}
    if support == "full":
        assert bool(old.mask.all()) and old.ids.shape[-1] == tr.model.config.vocab_size
        kl = (after.exp() * (after - before)).sum(-1)
    else:
        logits = after * 1.0  # log-probs are logits of the same distribution
        kl = project_sparse(logits, old, 0.05, top_k=64, delta=1e-5, include=inputs["completion_ids"]).kl_before
    mean, top = masked(kl, mask)
    assert top > 0.05  # the weights moved far enough for the comparison to mean something
    assert logged_kl["mean"] == pytest.approx(mean, rel=1e-9, abs=1e-12)
    assert logged_kl["max"] == pytest.approx(top, rel=1e-9, abs=1e-12)
    shares = [tr._metrics["train"][f"troll/kl_share/{key}"][-1] for key in ("old_top8", "support", "rest")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-9)  # the tokens over the bound split their KL three ways
    # TRL's loss is TRL's: the same value and gradients without the measurement, to the bit
    tr.args.troll_measure_kl = False
    plain, plain_grads = loss_and_grads(tr, inputs, "dapo")
    assert torch.equal(loss, plain)
    for name, grad in plain_grads.items():
        assert torch.equal(grads[name], grad), name


def test_measuring_leaves_trls_training_bit_identical(tmp_path):
    """The paper's clip baseline trained with the measurement on: TRL's logged losses and final weights equal
    GRPOTrainer's, to the bit; the KL is logged at every optimiser step, 0 on the first of each rollout batch."""
    clip = dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, delta=10.0, steps_per_generation=2, max_steps=4)
    ours = trainer(config(tmp_path / "ours", troll_measure_kl=True, learning_rate=0.05, **clip))
    ours.train()
    theirs = trainer(config(tmp_path / "theirs", cls=GRPOConfig, learning_rate=0.05, **clip), cls=GRPOTrainer)
    theirs.train()
    assert logged(ours, "loss") == logged(theirs, "loss")
    for name, value in params(theirs.model).items():
        assert torch.equal(params(ours.model)[name], value), name
    kl = logged(ours, "troll/kl_before/max")
    assert len(kl) == 4 and kl[0] < 1e-6 and kl[2] < 1e-6  # steps 1 and 3 are on-policy
    assert kl[1] > 1e-4 and kl[3] > 1e-4
    assert not any(key.startswith("troll/kl_after") for entry in ours.state.log_history for key in entry)


def test_trl_dual_clip_and_clip_higher_equal_clip_loss(tmp_path):
    """TRL's "dapo" with epsilon_high (clip-higher) and delta (dual clip) is troll.clip_loss with eps_high and
    dual_clip, token-mean, scaled as TRL scales "dapo" (the micro-batch token mean times its tokens over the generation
    batch's tokens per step), on a batch where the clip, the high clip and the dual clip all act."""
    args = config(tmp_path, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, delta=1.5, steps_per_generation=2)
    tr = trainer(args, dtype=torch.float64)
    tr.current_gradient_accumulation_steps = 1
    inputs = first_micro_batch(tr)
    perturb(tr.model, 0.2)
    theirs, _ = loss_and_grads(tr, inputs, "dapo")
    logp = dense_policy(tr, inputs)
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"]
    out = clip_loss(logp, inputs["old_per_token_logps"], inputs["completion_ids"], adv, mask, eps_low=0.2,
                    eps_high=0.28, dual_clip=1.5)  # fmt: skip
    assert out.metrics["clip/dual_frac"] > 0 and out.metrics["clip/high_frac"] > 0 and out.metrics["clip/low_frac"] > 0
    scale = mask.sum() / (inputs["num_items_in_batch"] / tr.args.steps_per_generation)
    # TRL's fused LM head scores in fp32 even for this fp64 model: agreement to fp32 rounding
    torch.testing.assert_close(theirs, (out.loss * scale).to(theirs.dtype), rtol=1e-6, atol=1e-9)


def test_tail_reaches_the_troll_loss(tmp_path):
    """troll_tail="renormalize" (the paper's sparse representation) is what the trainer's loss computes: equal to
    troll.troll_loss with tail="renormalize" on the dense logits, and different from the rest bucket where the cap
    binds (a random model spreads its mass over far more than 64 tokens)."""
    args = config(tmp_path, steps_per_generation=2, troll_tail="renormalize", troll_kl_bound=0.01)
    tr = trainer(args, dtype=torch.float64)
    tr.current_gradient_accumulation_steps = 1
    inputs = first_micro_batch(tr)
    perturb(tr.model, 0.05)
    ours, _ = loss_and_grads(tr, inputs, "troll")
    logp, mask = dense_policy(tr, inputs), inputs["completion_mask"].bool()
    scale = mask.sum() / (inputs["num_items_in_batch"] / tr.args.steps_per_generation)
    expected = {
        tail: troll_loss(logp, stored_old(inputs), inputs["completion_ids"], inputs["advantages"], mask,
                         kl_bound=0.01, tail=tail).loss * scale
        for tail in ("renormalize", "bucket")
    }  # fmt: skip
    torch.testing.assert_close(ours, expected["renormalize"].to(ours.dtype), rtol=1e-9, atol=1e-12)
    assert abs(float(expected["renormalize"] - expected["bucket"])) > 1e-6
