"""verl-shaped inputs for the verl plug-in's unit tests (tests/integrations/verl/test_verl_config.py,
tests/integrations/verl/test_verl_loss.py, tests/integrations/verl/test_verl_engine_outputs.py): the module loader that
skips without verl, the actor config, no-padding micro-batches with a captured old policy and their padded reference,
and a tiny Llama's packed logits and hidden states as verl's FSDP engine hands them to ``prepare_model_outputs``.

Nothing here imports verl at import time (each builder imports what it needs), so the test modules import this one in
the main environment too, where their verl-needing tests are skipped.
"""

import importlib
from types import SimpleNamespace

import pytest

SETTINGS = {"kl_bound": 0.05, "alpha": 1.0, "top_k": 6, "delta": 1e-3}
PROMPT_LENS, RESPONSE_LENS, VOCAB = [2, 3, 1], [3, 1, 4], 40


def _verl(module: str = "config"):
    """``troll.integrations.verl.<module>``; the test is skipped without verl."""
    pytest.importorskip("verl")
    import torch

    torch.set_num_threads(1)
    return importlib.import_module(f"troll.integrations.verl.{module}")


def _actor_config(mode="troll", troll=None, agg="token-mean", **extra):
    from _verl_cpu import actor_config

    return actor_config(mode, SETTINGS if troll is None else troll, agg, **extra)


def _nested(rows, lens):
    """A jagged nested tensor of per-sequence row blocks, built the way verl's padding utilities build them."""
    import torch

    return torch.nested.as_nested_tensor(list(rows.split(list(lens))), layout=torch.jagged)


def _micro_batch(seed=0, *, global_info=None):
    """A verl-shaped no-padding micro-batch: packed logits (N, V) over prompt + response, the old policy captured
    from perturbed logits, and the padded reference tensors for troll.troll_loss."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    from troll.integrations.verl.engine import capture_rows

    gen = torch.Generator().manual_seed(seed)
    seq_lens = [p + r for p, r in zip(PROMPT_LENS, RESPONSE_LENS)]
    n = sum(seq_lens)
    logits = (2 * torch.randn(n, VOCAB, generator=gen, dtype=torch.float64)).requires_grad_()
    old_logits = logits.detach() + 0.3 * torch.randn(n, VOCAB, generator=gen, dtype=torch.float64)
    bsz, tmax = len(seq_lens), max(RESPONSE_LENS)
    # packed row of response token j of sequence b: the logit before it, start + prompt_len - 1 + j
    starts = [sum(seq_lens[:b]) for b in range(bsz)]
    rows = [[starts[b] + PROMPT_LENS[b] - 1 + j for j in range(RESPONSE_LENS[b])] for b in range(bsz)]
    flat_rows = torch.tensor([r for rs in rows for r in rs])
    responses = torch.randint(0, VOCAB, (len(flat_rows),), generator=gen)
    adv = torch.randn(len(flat_rows), generator=gen, dtype=torch.float64)
    old = capture_rows(old_logits[flat_rows], responses, top_k=SETTINGS["top_k"], delta=SETTINGS["delta"])
    prompts = torch.randint(0, VOCAB, (sum(PROMPT_LENS),), generator=gen)
    data = TensorDict(
        {
            "prompts": _nested(prompts, PROMPT_LENS),
            "responses": _nested(responses, RESPONSE_LENS),
            "response_mask": _nested(torch.ones(len(responses), dtype=torch.long), RESPONSE_LENS),
            "advantages": _nested(adv, RESPONSE_LENS),
            **{k: _nested(v, RESPONSE_LENS) for k, v in old.items()},
        },
        batch_size=[bsz],
    )
    info = {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None, **(global_info or {})}
    tu.assign_non_tensor(data, **info)
    # the padded reference batch
    index = torch.zeros(bsz, tmax, dtype=torch.long)
    mask = torch.zeros(bsz, tmax, dtype=torch.bool)
    for b, rs in enumerate(rows):
        index[b, : len(rs)], mask[b, : len(rs)] = torch.tensor(rs), True
    pos = torch.zeros(bsz, tmax, dtype=torch.long)
    pos[mask] = torch.arange(len(responses))
    ref = {"index": index, "mask": mask, "pos": pos, "tokens": torch.where(mask, responses[pos], 0)}
    ref["adv"] = torch.where(mask, adv[pos], 0.0)
    ref["old_flat"] = old
    return logits, data, ref


def _reference_old(ref):
    import torch

    from troll.categorical.sparse import SparseLogProbs

    old, pos, mask = ref["old_flat"], ref["pos"], ref["mask"]
    fields = {k: old[f"troll_old_{k}"][pos] for k in ("ids", "logp", "mask", "log_rest")}
    m = fields["mask"] & mask.unsqueeze(-1)
    logp = torch.where(m, fields["logp"], float("-inf"))
    return SparseLogProbs(fields["ids"], logp, m, VOCAB, torch.where(mask, fields["log_rest"], 0.0))


def _engine_inputs(flags, pad_size=2, temperature=0.7):
    """A tiny fp64 Llama's logits packed the way FSDPEngineWithLMHead's remove-padding path packs them."""
    import torch
    from tensordict import TensorDict
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.dataset_utils import DatasetPadMode

    config = LlamaConfig(
        vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).double()
    lens = [4, 6, 3]
    ids = torch.randint(0, 300, (sum(lens),), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = torch.cat([model(input_ids=seq.unsqueeze(0)).logits[0] for seq in ids.split(lens)])
    packed = torch.cat([logits, torch.zeros(pad_size, 300, dtype=logits.dtype)])  # the packing pad rows
    rolled = torch.roll(torch.cat([ids, torch.zeros(pad_size, dtype=ids.dtype)]), shifts=-1)
    output_args = {
        "input_ids_rmpad_rolled": rolled,
        "temperature_rmpad": torch.full((len(rolled),), temperature, dtype=logits.dtype),
        "pad_size": pad_size,
        "temperature_is_one": False,
    }
    offsets = torch.tensor([0, *lens]).cumsum(0)
    micro_batch = TensorDict({"input_ids": torch.nested.nested_tensor_from_jagged(ids, offsets)}, batch_size=[3])
    tu.assign_non_tensor(micro_batch, use_remove_padding=True, pad_mode=DatasetPadMode.NO_PADDING, **flags)
    return SimpleNamespace(logits=packed.unsqueeze(0)), output_args, micro_batch, logits / temperature, rolled


def _engine():
    verl_engine = _verl("engine")
    engine = object.__new__(verl_engine.TrollFSDPEngine)  # prepare_model_outputs needs no model, only these flags
    engine.use_ulysses_sp = False
    return engine


def _hidden_engine_inputs(flags, temperatures=(0.7, 0.7, 0.7), pad_size=2):
    """A tiny fp64 Llama's final hidden states and full logits, packed as the remove-padding path packs them, and
    an engine on that model: the chunked path's inputs next to the dense path's."""
    _verl()
    import torch
    from tensordict import TensorDict
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.dataset_utils import DatasetPadMode
    from verl.utils.torch_functional import entropy_from_logits

    config = LlamaConfig(
        vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).double()
    lens = [4, 6, 3]
    ids = torch.randint(0, 300, (sum(lens),), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        hidden = torch.cat([model.model(input_ids=seq.unsqueeze(0)).last_hidden_state[0] for seq in ids.split(lens)])
    pad_rows = torch.randn(pad_size, 16, dtype=hidden.dtype, generator=torch.Generator().manual_seed(5))
    hidden = torch.cat([hidden, pad_rows])  # the packing pad rows (the model's states at pad tokens)
    logits = model.lm_head(hidden).detach()
    rolled = torch.roll(torch.cat([ids, torch.zeros(pad_size, dtype=ids.dtype)]), shifts=-1)
    temps = torch.cat([torch.full((n,), t, dtype=torch.float32) for n, t in zip(lens, temperatures)])
    temps = torch.cat([temps, torch.ones(pad_size, dtype=torch.float32)])  # verl pads the temperatures with 1
    output_args = {
        "input_ids_rmpad_rolled": rolled,
        "temperature_rmpad": temps,
        "pad_size": pad_size,
        "temperature_is_one": False,
    }
    offsets = torch.tensor([0, *lens]).cumsum(0)

    def micro_batch(lm_head):
        td = TensorDict({"input_ids": torch.nested.nested_tensor_from_jagged(ids, offsets)}, batch_size=[3])
        tu.assign_non_tensor(td, use_remove_padding=True, pad_mode=DatasetPadMode.NO_PADDING, **flags)
        tu.assign_non_tensor(td, troll_lm_head=lm_head)
        return td

    engine = _engine()
    engine.module = model
    engine.engine_config = SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False)
    engine.compute_entropy_from_logits = entropy_from_logits
    dense = SimpleNamespace(logits=logits.unsqueeze(0))
    chunked = SimpleNamespace(logits=logits[-1:].unsqueeze(0))

    def chunked_outputs(output, args, micro_batch, hook=True):
        """compute_log_prob: the backbone hook kept the hidden states; the update: the model returned them."""
        if hook:
            engine._troll_hidden = hidden.unsqueeze(0)
        else:
            output = SimpleNamespace(logits=output.logits, hidden_states=(None, hidden.unsqueeze(0)))
        return engine.prepare_model_outputs(output, args, micro_batch, None)

    return engine, dense, chunked, output_args, micro_batch, hidden[:-pad_size], chunked_outputs
