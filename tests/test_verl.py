"""The verl plug-in (troll.integrations.verl): its config checks, loss, engine, trainer mixin and entry point.

The config checks and the import structure need no verl; everything else is skipped without verl (pytest.importorskip)
and runs in .venv-verl.
"""

import importlib
import os
import sys
from types import SimpleNamespace

import pytest

from troll.integrations.verl.config import SUPPORTED_VERL, check_verl_version, troll_settings

TROLL = {"kl_bound": 0.05, "alpha": 1.0, "top_k": 64, "delta": 1e-5}


def _actor(mode="troll", troll=None, agg="token-mean"):
    return {"policy_loss": {"loss_mode": mode}, "loss_agg_mode": agg, "troll": troll}


@pytest.mark.parametrize("version", ["0.7.0", "0.8.3", "0.10.0", "1.0.0"])
def test_unsupported_verl_version_is_a_clear_error(version):
    with pytest.raises(ImportError, match=f"supports verl {SUPPORTED_VERL}, found verl {version}"):
        check_verl_version(version)


@pytest.mark.parametrize("version", ["0.9.0", "0.9.1", "0.9.5.dev0"])
def test_supported_verl_versions_pass(version):
    check_verl_version(version)


def test_stock_loss_modes_are_left_alone():
    for mode in ("vanilla", "gspo", "cispo"):
        assert troll_settings(_actor(mode, troll=None)) is None
    assert troll_settings({"loss_agg_mode": "token-mean"}) is None  # no policy_loss section: verl's vanilla


@pytest.mark.parametrize(("mode", "level"), [("troll", "token"), ("troll_seq", "sequence")])
def test_troll_settings_are_read_and_typed(mode, level):
    settings = troll_settings(_actor(mode, {**TROLL, "top_k": "32"}, agg="seq-mean-token-mean"))
    assert settings == {**TROLL, "top_k": 32, "level": level, "agg": "seq-mean-token-mean"}


def test_omegaconf_config_is_read():
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create(_actor("troll", TROLL))
    assert troll_settings(cfg)["kl_bound"] == 0.05


def test_missing_troll_settings_name_the_keys():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.troll\.kl_bound.*troll\.top_k"):
        troll_settings(_actor("troll", {"alpha": 1.0, "delta": 1e-5}))
    with pytest.raises(ValueError, match=r"troll\.alpha"):
        troll_settings(_actor("troll_seq", None))


def test_bad_troll_values_and_aggregation():
    with pytest.raises(ValueError, match="kl_bound"):
        troll_settings(_actor("troll", {**TROLL, "kl_bound": 0.0}))
    with pytest.raises(ValueError, match="loss_agg_mode='seq-mean-token-sum-norm-x'"):
        troll_settings(_actor("troll", TROLL, agg="seq-mean-token-sum-norm-x"))


def test_troll_settings_messages_name_the_hydra_key():
    """The shared check (troll._checks.check_troll_settings) names each key as the Hydra override writes it."""
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.troll\.kl_bound must be > 0"):
        troll_settings(_actor("troll", {**TROLL, "kl_bound": -1.0}))
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.troll\.top_k must be an integer"):
        troll_settings(_actor("troll", {**TROLL, "top_k": 6.5}))
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.troll\.delta must be in \[0, 1\)"):
        troll_settings(_actor("troll", {**TROLL, "delta": "one"}))  # a string that is no number stays one
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.loss_agg_mode='x' is not supported"):
        troll_settings(_actor("troll", TROLL, agg="x"))


def test_the_package_needs_no_verl_and_its_verl_modules_say_how_to_install_it(monkeypatch):
    """config (the checks) imports without verl; each module that needs verl fails at import with the fix."""
    monkeypatch.setitem(sys.modules, "verl", None)  # as if verl were not installed
    with pytest.raises(ImportError, match=r"pip install 'troll\[verl\]'"):
        check_verl_version()
    for name in ("loss", "engine", "trainer", "main", "plugin"):
        monkeypatch.delitem(sys.modules, f"troll.integrations.verl.{name}", raising=False)
        with pytest.raises(ImportError, match=r"pip install 'troll\[verl\]'"):
            importlib.import_module(f"troll.integrations.verl.{name}")


def test_the_modules_import_in_one_direction():
    """config <- loss <- engine <- trainer <- main, and plugin <- engine: no module imports one after it."""
    import ast
    from pathlib import Path

    import troll.integrations.verl as package

    order = ["config", "loss", "engine", "trainer", "main"]
    allowed = {name: set(order[:i]) for i, name in enumerate(order)} | {"plugin": {"engine"}, "__init__": {"config"}}
    for path in Path(package.__file__).parent.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "troll.integrations.verl":
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                names = [node.module] if isinstance(node, ast.ImportFrom) else []
            found |= {name.rsplit(".", 1)[-1] for name in names if name.startswith("troll.integrations.verl.")}
        assert found <= allowed[path.stem], f"{path.name} imports {sorted(found - allowed[path.stem])}"


def test_verls_import_of_the_plugin_meets_no_half_imported_module():
    """With the plug-in in VERL_USE_EXTERNAL_MODULES (as in every Ray worker), the first import of verl imports the
    plug-in: importing the trainer first still completes, with the engine registered."""
    _verl()
    from conftest import run_script

    code = (
        "import troll.integrations.verl.trainer\n"
        "from verl.workers.engine.base import EngineRegistry\n"
        "engine = EngineRegistry._engines['language_model']['fsdp2']['cuda']\n"
        "assert engine.__name__ == 'TrollFSDPEngine', engine\n"
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "troll.integrations.verl.plugin", "OMP_NUM_THREADS": "1"}
    status, err = run_script([sys.executable, "-c", code], env, timeout=120)
    assert status == 0, err[-3000:]


def test_the_actor_config_class_is_the_hydra_target():
    config = _verl("config")
    from hydra.utils import get_class

    assert get_class(config.ACTOR_CONFIG) is config.TrollFSDPActorConfig
    assert type(_actor_config()) is config.TrollFSDPActorConfig


# ---- verl's engine output and loss (need verl: run in .venv-verl) ----

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

    from troll.sparse import SparseLogProbs

    old, pos, mask = ref["old_flat"], ref["pos"], ref["mask"]
    fields = {k: old[f"troll_old_{k}"][pos] for k in ("ids", "logp", "mask", "log_rest")}
    m = fields["mask"] & mask.unsqueeze(-1)
    logp = torch.where(m, fields["logp"], float("-inf"))
    return SparseLogProbs(fields["ids"], logp, m, VOCAB, torch.where(mask, fields["log_rest"], 0.0))


def test_capture_rows_equal_sparsify_with_the_sampled_token():
    _verl()
    import torch

    from troll import sparsify
    from troll.integrations.verl.engine import capture_rows, capture_width
    from troll.sparse import SparseLogProbs

    logits = 3 * torch.randn(7, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tokens = logits.argmin(-1)  # the least likely token: kept only because it was sampled
    rows = capture_rows(logits, tokens, top_k=4, delta=1e-3)
    assert rows["troll_old_ids"].shape == (7, capture_width(4))
    got = SparseLogProbs.from_dict(rows)
    ref = sparsify(logits, top_k=4, delta=1e-3, include=tokens)
    assert (got.ids == tokens.unsqueeze(-1)).logical_and(got.mask).any(-1).all()
    for b in range(7):
        kept = got.ids[b][got.mask[b]]
        want = ref.ids[b][ref.mask[b]]
        assert sorted(kept.tolist()) == sorted(want.tolist())
        full = torch.log_softmax(logits[b], -1)
        torch.testing.assert_close(got.logp[b][got.mask[b]], full[kept], rtol=0, atol=1e-12)
        assert torch.isneginf(got.logp[b][~got.mask[b]]).all()


@pytest.mark.parametrize("mode", ["troll", "troll_seq"])
def test_troll_ppo_loss_matches_troll_loss_on_a_verl_micro_batch(mode):
    verl_loss = _verl("loss")
    import torch

    from troll import troll_loss

    logits, data, ref = _micro_batch()
    config = _actor_config(mode)
    loss, metrics = verl_loss.troll_ppo_loss(config, {"troll_logits": _nested(logits, [3 + 2, 4, 5])}, data)
    (grad,) = torch.autograd.grad(loss, logits)

    leaf = logits.detach().clone().requires_grad_()
    padded = torch.where(ref["mask"].unsqueeze(-1), leaf[ref["index"]], 0.0)
    level = "token" if mode == "troll" else "sequence"
    settings = {**SETTINGS, "level": level, "agg": "token-mean"}
    want = troll_loss(padded, _reference_old(ref), ref["tokens"], ref["adv"], ref["mask"], **settings)
    (want_grad,) = torch.autograd.grad(want.loss, leaf)
    torch.testing.assert_close(loss, want.loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-8, atol=1e-12)
    assert grad.abs().sum() > 0
    assert metrics["troll/kl_after/max"].values[0] <= SETTINGS["kl_bound"] * (1 + 1e-6)
    assert metrics["troll/kl_before/max"].values[0] > SETTINGS["kl_bound"]  # the bound was active somewhere
    assert not torch.isnan(grad).any()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize(
    "info",
    [
        {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None, "loss_scale_factor": None},
        {"dp_size": 4, "batch_num_tokens": 37, "global_batch_size": 11, "loss_scale_factor": 9},
    ],
)
def test_verl_scale_matches_verls_agg_loss(agg, info):
    _verl()
    import torch
    from verl.trainer.ppo.core_algos import agg_loss

    from troll.batch import aggregate
    from troll.integrations.verl.loss import verl_scale

    gen = torch.Generator().manual_seed(2)
    values = torch.randn(4, 6, dtype=torch.float64, generator=gen)
    mask = torch.rand(4, 6, generator=gen) > 0.4
    mask[2] = False  # an empty sequence
    factor, max_len = verl_scale(agg, mask, **info)
    got = factor * aggregate(values, mask, agg, max_len=max_len)
    want = agg_loss(values, mask.double(), agg, **info)
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-6, atol=1e-12)


def test_troll_ppo_loss_uses_the_global_batch_normalisation():
    verl_loss = _verl("loss")
    import torch

    info = {"dp_size": 2, "batch_num_tokens": 20, "global_batch_size": 6}
    logits, data, _ = _micro_batch(global_info=info)
    local_logits, local_data, _ = _micro_batch()
    out = {"troll_logits": _nested(logits, [5, 4, 5])}
    loss, metrics = verl_loss.troll_ppo_loss(_actor_config(), out, data)
    local, _ = verl_loss.troll_ppo_loss(_actor_config(), {"troll_logits": _nested(local_logits, [5, 4, 5])}, local_data)
    torch.testing.assert_close(loss, local * sum(RESPONSE_LENS) / 20 * 2)
    assert metrics["actor/pg_loss"].aggregation.name == "SUM"


def test_stock_loss_mode_goes_to_verls_ppo_loss():
    verl_loss = _verl("loss")
    import torch
    from verl.workers.utils.losses import ppo_loss

    _, data, _ = _micro_batch()
    gen = torch.Generator().manual_seed(3)
    lens = [p + r for p, r in zip(PROMPT_LENS, RESPONSE_LENS)]
    log_probs = _nested(-torch.rand(sum(lens), generator=gen, dtype=torch.float64), lens)
    data["old_log_probs"] = _nested(-torch.rand(sum(RESPONSE_LENS), generator=gen, dtype=torch.float64), RESPONSE_LENS)
    got, got_metrics = verl_loss.troll_ppo_loss(_actor_config("vanilla"), {"log_probs": log_probs}, data.clone())
    want, want_metrics = ppo_loss(_actor_config("vanilla"), {"log_probs": log_probs}, data.clone())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert set(got_metrics) == set(want_metrics) and not any(k.startswith("troll/") for k in got_metrics)


def test_troll_ppo_loss_errors_are_clear():
    verl_loss = _verl("loss")
    logits, data, _ = _micro_batch()
    out = {"troll_logits": _nested(logits, [5, 4, 5])}
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.troll\.kl_bound"):
        verl_loss.troll_ppo_loss(_actor_config(troll={"alpha": 1.0, "top_k": 4, "delta": 0.0}), dict(out), data)
    with pytest.raises(KeyError, match="troll_logits"):
        verl_loss.troll_ppo_loss(_actor_config(), {}, data)
    with pytest.raises(KeyError, match="ref_log_prob"):
        verl_loss.troll_ppo_loss(_actor_config(use_kl_loss=True), dict(out), data)
    with pytest.raises(KeyError, match="troll_old_"):
        verl_loss.troll_ppo_loss(_actor_config(), dict(out), data.exclude("troll_old_logp"))
    # the loss takes what it needs out of model_output: verl keeps every micro-batch's outputs until the mini-batch
    # ends, and the (tokens, V) logits must not stay there
    verl_loss.troll_ppo_loss(_actor_config(), out, data)
    assert "troll_logits" not in out


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


def test_engine_capture_equals_sparsify_of_the_models_own_logits():
    import torch

    from troll import sparsify
    from troll.sparse import SparseLogProbs

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


@pytest.mark.parametrize("temperatures", [(0.7, 0.7, 0.7), (0.7, 1.0, 1.3)], ids=["one", "per-sample"])
def test_engine_chunked_outputs_equal_the_dense_ones(temperatures):
    import torch

    from troll.sparse import SparseLogProbs

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


def test_lm_head_setting_is_checked_and_defaults_to_chunked():
    verl_config = _verl("config")
    assert verl_config.troll_lm_head(_actor_config()) == "chunked"
    assert verl_config.troll_lm_head(_actor_config(troll={**TROLL, "lm_head": "dense"})) == "dense"
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.troll\.lm_head='sparse'"):
        verl_config.troll_lm_head(_actor_config(troll={**TROLL, "lm_head": "sparse"}))


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
    compute_log_prob on a no-padding batch and returns (DataProto, mfu)); tests/test_verl_engine.py runs it on
    verl's real RayPPOTrainer methods."""
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


# ---- the entry point (troll.integrations.verl.main) ----


def _main():
    _verl()
    return importlib.import_module("troll.integrations.verl.main")


def _recipe_config(*extra):
    from _verl_cpu import RECIPE, compose

    return compose([*RECIPE, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", *extra])


def test_check_config_reads_the_recipe():
    main = _main()
    settings = main.check_config(_recipe_config())
    want = {"kl_bound": 0.05, "alpha": 1.0, "top_k": 64, "delta": 1e-5}
    assert settings == {**want, "level": "token", "agg": "token-mean"}
    seq = main.check_config(_recipe_config("actor_rollout_ref.actor.policy_loss.loss_mode=troll_seq"))
    assert seq["level"] == "sequence"
    assert main.check_config(_recipe_config("actor_rollout_ref.actor.policy_loss.loss_mode=vanilla")) is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor_rollout_ref.actor._target_=verl.workers.config.FSDPActorConfig", r"actor\._target_=troll\.integr"),
        ("actor_rollout_ref.model.use_remove_padding=False", r"model\.use_remove_padding=True"),
        ("actor_rollout_ref.actor.strategy=megatron", r"actor\.strategy=fsdp or fsdp2"),
        ("distillation.enabled=True", r"distillation\.enabled=False"),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", r"ulysses_sequence_parallel_size=1"),
        ("actor_rollout_ref.model.use_fused_kernels=True", r"model\.use_fused_kernels=False"),
        ("actor_rollout_ref.actor.troll.top_k=null", r"actor_rollout_ref\.actor\.troll\.top_k"),
        ("+actor_rollout_ref.actor.troll.lm_head=sparse", r"actor_rollout_ref\.actor\.troll\.lm_head='sparse'"),
    ],
)
def test_check_config_names_the_key_to_fix(override, message):
    main = _main()
    with pytest.raises(ValueError, match=message):
        main.check_config(_recipe_config(override))


def test_the_plugin_is_added_to_the_ray_runtime_env():
    main = _main()
    config = _recipe_config("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=my.mod")
    main.add_plugin_to_runtime_env(config)
    main.add_plugin_to_runtime_env(config)  # idempotent
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES == "my.mod,troll.integrations.verl.plugin"
    fresh = _recipe_config()
    main.add_plugin_to_runtime_env(fresh)
    assert fresh.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == main.PLUGIN


def test_trainer_class_puts_the_mixin_before_verls_trainer():
    trainer = _verl("trainer")
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    mro = trainer.TrollRayPPOTrainer.__mro__
    assert mro.index(trainer.TrollTrainerMixin) < mro.index(RayPPOTrainer)


def test_entry_point_rejects_a_bad_config_before_ray_starts():
    _verl()
    from conftest import run_script

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "troll.integrations.verl.main",
        "actor_rollout_ref.actor.policy_loss.loss_mode=troll",
        "+actor_rollout_ref.actor.troll.kl_bound=0.05",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    ]
    code, err = run_script(cmd, env, timeout=120)
    assert code != 0
    assert "actor_rollout_ref.actor._target_=troll.integrations.verl.config.TrollFSDPActorConfig" in err
    assert "Started a local Ray instance" not in err and "TaskRunner" not in err  # Ray never started


def test_task_runner_builds_the_troll_trainer(monkeypatch):
    """verl's v0 TaskRunner.run builds ``RayPPOTrainer`` by its module-level name; TrollTaskRunner rebinds it."""
    main = _main()
    from verl.trainer import main_ppo_v0

    seen = {}
    base = main_ppo_v0.TaskRunner.__ray_actor_class__
    monkeypatch.setattr(base, "run", lambda self, config: seen.setdefault("trainer", main_ppo_v0.RayPPOTrainer))
    monkeypatch.setattr(main_ppo_v0, "RayPPOTrainer", main_ppo_v0.RayPPOTrainer)  # restored after the test
    monkeypatch.setattr(main, "register", lambda: seen.setdefault("registered", True))
    runner = main.TrollTaskRunner.__ray_actor_class__
    runner.run(object.__new__(runner), None)
    assert seen == {"registered": True, "trainer": main.TrollRayPPOTrainer}
