"""The verl plug-in's engine (troll.integrations.verl.engine) and trainer mixin: the outputs of
prepare_model_outputs (the capture, the loss's logits, chunked against dense), the model inputs and the backbone
hook, the engine registration, the captured old policy in the loss's layout, and the mixin's flags. Needs verl:
skipped without it, run in .venv-verl.
"""

from types import SimpleNamespace

import pytest
from _verl_batches import SETTINGS, _actor_config, _engine, _engine_inputs, _hidden_engine_inputs, _verl


def test_engine_capture_equals_sparsify_of_the_models_own_logits():
    import torch

    from troll import sparsify
    from troll.categorical.sparse import SparseLogProbs

    engine = _engine()
    output, args, micro_batch, scaled, rolled = _engine_inputs({"troll_capture": {"top_k": 5, "delta": 1e-3}})
    out = engine.prepare_model_outputs(output, args, micro_batch, None)
    got = SparseLogProbs.from_dict({k: v.values() for k, v in out.items() if k.startswith("troll_old_")})
    assert got.ids.shape == (scaled.shape[0], 6) and "troll_logits" not in out
    tokens = rolled[: scaled.shape[0]]
    ref = sparsify(scaled, top_k=5, delta=1e-3, include=tokens)
    full = torch.log_softmax(scaled, -1)
    for row in range(scaled.shape[0]):
        kept = got.ids[row][got.mask[row]]
        assert sorted(kept.tolist()) == sorted(ref.ids[row][ref.mask[row]].tolist())
        assert tokens[row] in kept
        torch.testing.assert_close(got.logp[row][got.mask[row]], full[row, kept], rtol=0, atol=1e-12)
    # the stock outputs are unchanged: verl's own log-probs of the next tokens at the temperature
    torch.testing.assert_close(out["log_probs"].values(), full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))


def test_engine_returns_scaled_logits_for_the_loss_and_nothing_without_flags():
    import torch

    engine = _engine()
    output, args, micro_batch, scaled, _ = _engine_inputs({"troll_logits": True})
    out = engine.prepare_model_outputs(output, args, micro_batch, None)
    torch.testing.assert_close(out["troll_logits"].values(), scaled, rtol=0, atol=0)
    assert out["troll_logits"].offsets().tolist() == micro_batch["input_ids"].offsets().tolist()
    output, args, micro_batch, _, _ = _engine_inputs({})
    assert set(engine.prepare_model_outputs(output, args, micro_batch, None)) == {"log_probs"}


def test_engine_without_logits_is_a_clear_error():
    engine = _engine()
    output, args, micro_batch, _, _ = _engine_inputs({"troll_logits": True})
    with pytest.raises(ValueError, match="linear LM head"):
        engine.prepare_model_outputs(SimpleNamespace(logits=None), args, micro_batch, None)


@pytest.mark.parametrize("temperatures", [(0.7, 0.7, 0.7), (0.7, 1.0, 1.3)], ids=["one", "per-sample"])
def test_engine_chunked_outputs_equal_the_dense_ones(temperatures):
    import torch

    from troll.categorical.sparse import SparseLogProbs

    flags = {"troll_capture": {"top_k": 5, "delta": 1e-3}, "calculate_entropy": True}
    engine, dense, chunked, args, micro_batch, _, chunked_outputs = _hidden_engine_inputs(flags, temperatures)
    want = engine.prepare_model_outputs(dense, args, micro_batch("dense"), None)
    assert engine._troll_last_path == "dense"
    got = chunked_outputs(chunked, args, micro_batch("chunked"))
    assert engine._troll_last_path == "chunked"
    assert (
        set(got)
        == set(want)
        == {"log_probs", "entropy", *(f"troll_old_{k}" for k in ("ids", "logp", "mask", "log_rest", "vocab"))}
    )
    for key in ("log_probs", "entropy"):
        assert got[key].offsets().tolist() == want[key].offsets().tolist()
        torch.testing.assert_close(got[key].values(), want[key].values(), rtol=0, atol=1e-12)
    old_got, old_want = (
        SparseLogProbs.from_dict({k: v.values() for k, v in out.items() if k.startswith("troll_old_")})
        for out in (got, want)
    )
    for row in range(old_want.ids.shape[0]):
        kept = old_got.ids[row][old_got.mask[row]]
        assert sorted(kept.tolist()) == sorted(old_want.ids[row][old_want.mask[row]].tolist())
        order = [kept.tolist().index(i) for i in old_want.ids[row][old_want.mask[row]].tolist()]
        logp = old_got.logp[row][old_got.mask[row]][order]
        torch.testing.assert_close(logp, old_want.logp[row][old_want.mask[row]], rtol=0, atol=1e-12)
    torch.testing.assert_close(old_got.log_rest, old_want.log_rest, rtol=0, atol=1e-9)


def test_engine_chunked_loss_outputs_and_probe():
    import torch

    verl_loss = _verl("loss")
    engine, _, chunked, args, micro_batch, hidden, chunked_outputs = _hidden_engine_inputs({"troll_logits": True})
    out = chunked_outputs(chunked, args, micro_batch("chunked"), hook=False)
    assert "troll_logits" not in out and engine._troll_hidden is None
    torch.testing.assert_close(out[verl_loss.TROLL_HIDDEN].values(), hidden, rtol=0, atol=0)
    out = chunked_outputs(chunked, args, micro_batch("chunked"))
    assert engine._troll_hidden is None  # the hook's hidden states are handed on, not kept
    torch.testing.assert_close(out[verl_loss.TROLL_HIDDEN].values(), hidden, rtol=0, atol=0)
    head = out[verl_loss.TROLL_HEAD]
    assert head.module is engine.module.lm_head and head.temperature == pytest.approx(0.7)
    # the hook kept no hidden states (a backbone without last_hidden_state): refused, with the setting to change
    with torch.no_grad(), pytest.raises(ValueError, match="no last_hidden_state.*troll.lm_head=dense"):
        engine.prepare_model_outputs(chunked, args, micro_batch("chunked"), None)
    with pytest.raises(ValueError, match="returned no hidden_states.*troll.lm_head=dense"):  # the update's
        engine.prepare_model_outputs(chunked, args, micro_batch("chunked"), None)
    # a config that announces a logit soft-cap is refused before any computation
    engine.module.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping.*troll.lm_head=dense"):
        chunked_outputs(chunked, args, micro_batch("chunked"))
    engine.module.config.final_logit_softcapping = None
    # logits that are not hidden @ weight.T (a soft-cap, a scale) are caught on the row the model returned
    chunked.logits = chunked.logits * 1.5
    with pytest.raises(ValueError, match="not last_hidden_state @ weight.T.*troll.lm_head=dense"):
        chunked_outputs(chunked, args, micro_batch("chunked"))


def test_engine_inputs_keep_only_the_last_hidden_state_without_gradient(monkeypatch):
    """compute_log_prob (no grad): logits of one position, no output_hidden_states; the backbone hook keeps the
    last hidden state of the flagged forward only. The update (grad): output_hidden_states=True (FSDP2's backward
    needs the hidden states among the forward's outputs). Unflagged micro-batches are left as verl builds them."""
    _verl()
    import torch
    from tensordict import TensorDict
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    config = LlamaConfig(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 50, (1, 7))
    monkeypatch.setattr(FSDPEngineWithLMHead, "prepare_model_inputs", lambda self, mb: ({"input_ids": ids}, {}))
    engine = _engine()
    engine.module = model

    def micro_batch(**flags):
        td = TensorDict({}, batch_size=[1])
        tu.assign_non_tensor(td, use_remove_padding=True, **flags)
        return td

    flagged = micro_batch(troll_capture={"top_k": 4, "delta": 1e-3}, troll_lm_head="chunked")
    with torch.no_grad():
        inputs, _ = engine.prepare_model_inputs(flagged)
        assert inputs == {"input_ids": ids, "logits_to_keep": 1}
        out = model(**inputs)
        kept = engine._troll_hidden
        assert out.logits.shape == (1, 1, 50) and out.hidden_states is None
        torch.testing.assert_close(kept, model.model(input_ids=ids).last_hidden_state, rtol=0, atol=0)
        assert engine._troll_hidden is kept  # the second, unflagged forward did not replace it
        assert engine.prepare_model_inputs(micro_batch())[0] == {"input_ids": ids}
        assert engine._troll_hidden is None  # reset for every micro-batch
        model(input_ids=ids)
        assert engine._troll_hidden is None
    update = micro_batch(troll_logits=True, troll_lm_head="chunked")
    inputs, _ = engine.prepare_model_inputs(update)
    assert inputs == {"input_ids": ids, "logits_to_keep": 1, "output_hidden_states": True}
    engine.prepare_model_inputs(flagged)  # the hook is registered once
    assert len(model.model._forward_hooks) == 1


def test_register_replaces_the_fsdp_language_model_engine(monkeypatch):
    verl_engine = _verl("engine")
    import verl.workers.engine_workers as workers
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.utils.losses import ppo_loss

    monkeypatch.setattr(workers, "ppo_loss", workers.ppo_loss)  # restored after the test
    table = EngineRegistry._engines["language_model"]
    for backend in ("fsdp", "fsdp2"):
        monkeypatch.setitem(table, backend, dict(table[backend]))
    assert workers.ppo_loss is ppo_loss
    verl_engine.register(devices=("cuda", "npu", "cpu"))
    for backend in ("fsdp", "fsdp2"):
        for device in ("cuda", "npu", "cpu"):
            assert table[backend][device] is verl_engine.TrollFSDPEngine
    assert workers.ppo_loss is verl_engine.troll_ppo_loss


def test_captured_old_policy_reaches_the_loss_layout():
    """Engine capture -> padded (B, T_resp, K) as a trainer stores it -> the loss's SparseLogProbs, at the response
    positions only, equal sparsify of the logits that predict each response token."""
    verl_trainer, verl_loss = _verl("trainer"), _verl("loss")
    import torch
    from tensordict import TensorDict

    from troll import sparsify

    engine = _engine()
    output, args, micro_batch, scaled, rolled = _engine_inputs({"troll_capture": {"top_k": 5, "delta": 1e-3}})
    out = TensorDict(engine.prepare_model_outputs(output, args, micro_batch, None), batch_size=[3])
    prompt_lens, response_lens = [2, 3, 1], [2, 3, 2]  # the sequences are 4, 6, 3 tokens long
    ids = micro_batch["input_ids"].values()
    prompts, responses = [], []
    for b, seq in enumerate(ids.split([4, 6, 3])):
        prompts.append(seq[: prompt_lens[b]])
        responses.append(seq[prompt_lens[b] :])
    batch_td = TensorDict(
        {
            "prompts": torch.nested.as_nested_tensor(prompts, layout=torch.jagged),
            "responses": torch.nested.as_nested_tensor(responses, layout=torch.jagged),
        },
        batch_size=[3],
    )
    padded = verl_trainer.old_policy_to_padded(out, batch_td)
    assert padded["troll_old_ids"].shape == (3, 3, 6)
    mask = torch.zeros(3, 3, dtype=torch.bool)
    for b, n in enumerate(response_lens):
        mask[b, :n] = True
    old = verl_loss.old_policy_from_batch(padded, mask)
    starts = [0, 4, 10]
    for b in range(3):
        for j in range(response_lens[b]):
            row = starts[b] + prompt_lens[b] - 1 + j
            assert rolled[row] == responses[b][j]
            ref = sparsify(scaled[row], top_k=5, delta=1e-3, include=rolled[row])
            kept = old.ids[b, j][old.mask[b, j]]
            assert sorted(kept.tolist()) == sorted(ref.ids[ref.mask].tolist())
            assert responses[b][j] in kept
    assert not old.mask[~mask].any() and torch.isneginf(old.logp[~mask]).all()
    with pytest.raises(KeyError, match="troll_capture"):
        verl_trainer.old_policy_to_padded(out.exclude("troll_old_ids"), batch_td)


def test_trainer_mixin_sets_flags_and_keeps_the_captured_old_policy():
    """The mixin's contract on a stand-in base (init_workers sets actor_rollout_wg; _compute_old_log_prob calls
    compute_log_prob on a no-padding batch and returns (DataProto, mfu)); tests/integrations/verl/test_verl_engine.py
    runs it on verl's real RayPPOTrainer methods."""
    verl_trainer = _verl("trainer")
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    engine = _engine()
    output, args, micro_batch, _, _ = _engine_inputs({})
    ids = micro_batch["input_ids"].values().split([4, 6, 3])
    batch_td = TensorDict(
        {
            "prompts": torch.nested.as_nested_tensor([s[:2] for s in ids], layout=torch.jagged),
            "responses": torch.nested.as_nested_tensor([s[2:] for s in ids], layout=torch.jagged),
        },
        batch_size=[3],
    )

    class Group:
        def compute_log_prob(self, td):
            self.capture = tu.get_non_tensor_data(td, "troll_capture", None)
            tu.assign_non_tensor(micro_batch, troll_capture=self.capture)  # the worker splits td into micro-batches
            return TensorDict(engine.prepare_model_outputs(output, args, micro_batch, None), batch_size=[3])

        def update_actor(self, td):
            return tu.get_non_tensor_data(td, "troll_logits", False)

    class Trainer:
        config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(actor=_actor_config()))

        def init_workers(self):
            self.actor_rollout_wg = Group()

        def _compute_old_log_prob(self, batch):
            self.actor_rollout_wg.compute_log_prob(batch_td)
            return SimpleNamespace(batch=TensorDict({}, batch_size=[3])), 0.5

    class TrollTrainer(verl_trainer.TrollTrainerMixin, Trainer):
        pass

    trainer = TrollTrainer()
    trainer.init_workers()
    old, mfu = trainer._compute_old_log_prob(None)
    assert trainer.actor_rollout_wg.capture == {"top_k": SETTINGS["top_k"], "delta": SETTINGS["delta"]}
    assert mfu == 0.5
    assert trainer.actor_rollout_wg.update_actor(TensorDict({}, batch_size=[3])) is True
    want = verl_trainer.old_policy_to_padded(Group().compute_log_prob(batch_td), batch_td)
    for key, value in want.items():
        torch.testing.assert_close(old.batch[key], value, rtol=0, atol=0)
    assert old.batch["troll_old_ids"].shape == (3, 4, SETTINGS["top_k"] + 1)
    # verl's reference pass through the LoRA actor (ref_in_actor) is not a capture: no flags, the capture kept
    ref_td = TensorDict({}, batch_size=[3])
    tu.assign_non_tensor(ref_td, no_lora_adapter=True)
    last = trainer.actor_rollout_wg.last
    trainer.actor_rollout_wg._group.compute_log_prob = lambda td: tu.get_non_tensor_data(td, "troll_capture", None)
    assert trainer.actor_rollout_wg.compute_log_prob(ref_td) is None and trainer.actor_rollout_wg.last is last
    Trainer._compute_old_log_prob = lambda self, batch: (SimpleNamespace(batch={}), 0.0)  # no capture call
    with pytest.raises(RuntimeError, match="nothing was captured"):
        trainer._compute_old_log_prob(None)


@pytest.mark.parametrize(
    ("extra", "lm_head", "logprob_grad"),
    [
        ({}, "chunked", False),
        ({"use_kl_loss": True}, "chunked", True),
        ({"troll": {**SETTINGS, "lm_head": "dense"}}, "dense", False),
        ({"entropy_coeff": 0.01}, "dense", False),
        ({"strategy": "fsdp"}, "dense", False),
    ],
    ids=["default", "kl-loss", "dense", "entropy-bonus", "fsdp1"],
)
def test_mixin_sets_the_lm_head_flags(extra, lm_head, logprob_grad):
    """The update's flags: troll.lm_head (default chunked); log-probs with a gradient for verl's KL loss; an entropy
    bonus, and FSDP1 (untested with the chunked head), fall back to the dense head with a warning."""
    verl_trainer = _verl("trainer")
    import warnings

    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    troll = extra.pop("troll", None)

    class Group:
        def update_actor(self, td):
            return {k: tu.get_non_tensor_data(td, k, None) for k in ("troll_lm_head", "troll_logprob_grad")}

    trainer = object.__new__(verl_trainer.TrollTrainerMixin)
    trainer.config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(actor=_actor_config(troll=troll, **extra)))
    trainer.actor_rollout_wg = Group()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer._troll_wrap_workers()
    fell_back = [w for w in caught if "falls back to dense" in str(w.message)]
    assert len(fell_back) == int("entropy_coeff" in extra or "strategy" in extra)
    flags = trainer.actor_rollout_wg.update_actor(TensorDict({}, batch_size=[1]))
    assert flags == {"troll_lm_head": lm_head, "troll_logprob_grad": logprob_grad}
