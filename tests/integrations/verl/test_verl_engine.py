"""TROLL through verl 0.9's real actor and trainer methods on CPU (run in .venv-verl; skipped without verl).

tests/support/_torchrun_verl_engine.py runs under torchrun with 1 and 2 processes (gloo, FSDP2 sharded across them),
with the chunked LM head (troll.lm_head=chunked, the default) and then the dense one in the same launch. It builds
verl's TrainingWorker with TrollFSDPEngine, and drives it through verl's own ``RayPPOTrainer._compute_old_log_prob``
and ``_update_actor`` (as ``TrollRayPPOTrainer``, with the config composed from verl's ppo_trainer.yaml and
docs/verl.md's overrides). The reference is troll's own float32 functions on an unsharded copy of the same model.
These tests read what it measured.
"""

import ast
import os

import pytest
from _verl_e2e import write_model  # a tiny random Qwen2 (verl's CPU actor tests use one)
from conftest import ROOT, SRC, SUPPORT, run_script, torchrun

SCRIPT = SUPPORT / "_torchrun_verl_engine.py"


_LAUNCHES: dict[int, tuple[int, str, object]] = {}  # processes -> (exit code, stderr, result folder)


def _launch(procs: int, tmp_path_factory):
    """One torchrun launch of ``procs`` processes that measures both LM heads, one after the other (a rank's start-up,
    verl's import, is most of its time); cached for the module."""
    if procs not in _LAUNCHES:
        model = write_model(tmp_path_factory.mktemp("qwen2"))
        out = tmp_path_factory.mktemp(f"verl-engine-{procs}")
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "VERL_PLATFORM": "cpu",
            "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        }
        command = [*torchrun(procs, out / "torchrun"), str(SCRIPT), str(model), str(out), "chunked,dense"]
        _LAUNCHES[procs] = (*run_script(command, env, timeout=300), out)
    return _LAUNCHES[procs]


@pytest.fixture(
    scope="module",
    params=[(1, "chunked"), (2, "chunked"), (1, "dense"), (2, "dense")],
    ids=["1proc-chunked", "2proc-chunked", "1proc-dense", "2proc-dense"],
)
def run(request, tmp_path_factory):
    pytest.importorskip("verl")
    import json

    procs, lm_head = request.param
    code, err, out = _launch(procs, tmp_path_factory)
    assert code == 0, err[-3000:]
    result = {**json.loads((out / f"result-{lm_head}.json").read_text()), "lm_head": lm_head}
    update, extras = result["update"], result["extras"]
    print(  # the figures docs/verl.md quotes (pytest -s)
        f"verl {procs} proc {lm_head}: capture {result['capture']['rows_mismatched']} rows differ, max |d log p| "
        f"{result['capture']['logp_max_abs']:.2g}; "
        + "; ".join(
            f"epoch {i + 1} loss {u['loss']:.8f} vs {u['loss_ref']:.8f}, gradient {u['grad_rel']:.2g}"
            for i, u in enumerate(update)
        )
        + f"; with KL loss {extras['loss']:.8f} vs {extras['loss_ref']:.8f}, gradient {extras['grad_rel']:.2g}"
    )
    return result


def test_the_actor_runs_on_trolls_engine_and_config(run):
    assert run["engine"] == "TrollFSDPEngine"
    assert run["actor_config"] == "TrollFSDPActorConfig"


def test_the_lm_head_path_is_the_configured_one(run):
    """troll.lm_head=chunked: the capture, the update and verl's KL loss run from the hidden states, never the
    (tokens, V) logits; dense: from the model's logits."""
    assert run["paths"] == {"capture": run["lm_head"], "update": run["lm_head"], "extras": run["lm_head"]}


def test_compute_log_prob_returns_the_sparse_old_policy(run):
    cap = run["capture"]
    assert {"troll_old_ids", "troll_old_logp", "troll_old_mask", "troll_old_log_rest", "troll_old_vocab"} <= set(
        cap["fields"]
    )
    assert "old_log_probs" in cap["fields"]  # verl's own output is still there
    assert cap["rows_mismatched"] == 0  # the same kept ids as troll.sparsify of the model's own logits / T
    assert cap["sampled_missing"] == 0  # the sampled token is always kept
    assert cap["logp_max_abs"] < 1e-5  # fp32 log-probs, packed varlen forward vs one sequence at a time


@pytest.mark.parametrize("step", [0, 1], ids=["on-policy", "off-policy"])
def test_update_policy_gives_troll_losss_loss_and_gradients(run, step):
    s = run["update"][step]
    assert s["loss"] == pytest.approx(s["loss_ref"], rel=1e-5, abs=1e-7)
    assert s["grad_rel"] < 1e-5  # |verl's step / lr - troll_loss's gradient| / |gradient|, all parameters


def test_every_row_stays_within_the_kl_bound(run):
    bound = 0.002
    on, off = run["update"]
    assert on["projected_frac"] == 0.0 and on["kl_before_max"] < 1e-10  # ratio 1: nothing to project
    assert off["kl_before_max"] > bound and off["projected_frac"] > 0.5  # the second epoch is off-policy
    assert off["kl_after_max"] <= bound * (1 + 1e-6)
    assert off["kl_after_max"] == pytest.approx(off["ref_kl_after_max"], rel=1e-6)


def test_kl_loss_and_entropy_bonus_are_added_as_verl_adds_them(run):
    e = run["extras"]
    assert e["kl_loss"] == pytest.approx(e["kl_loss_ref"], rel=1e-5)
    if run["lm_head"] == "dense":  # the chunked run checks the KL loss alone (entropy_coeff=0)
        assert e["entropy_loss"] == pytest.approx(e["entropy_loss_ref"], rel=1e-5)
    assert e["loss"] == pytest.approx(e["loss_ref"], rel=1e-5, abs=1e-7)
    assert e["grad_rel"] < 1e-5


def test_parameters_change(run):
    for s in run["update"]:
        assert s["params_changed"] == s["params"] > 0


def test_troll_metrics_reach_verls_logger_under_troll(run):
    keys = run["update"][1]["metric_keys"]
    assert {"troll/kl_after/max", "troll/projected_frac", "troll/infeasible_frac", "actor/pg_loss"} <= set(keys)
    assert not any(k.startswith("actor/troll/") for k in keys)


def test_a_stock_loss_mode_is_unaffected(run):
    stock = run["stock"]
    assert stock["engines"] == ["TrollFSDPEngine", "FSDPEngineWithLMHead"]
    assert stock["loss"][0] == stock["loss"][1]
    assert stock["params_equal"]  # bit for bit after one step
    assert stock["troll_metrics"] == []


def test_docs_list_the_overrides_the_run_used():
    tree = ast.parse((SUPPORT / "_verl_cpu.py").read_text())
    recipe = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "RECIPE"
    )
    docs = (ROOT / "docs" / "verl.md").read_text()
    missing = [line for line in recipe if line not in docs]
    assert not missing, f"docs/verl.md does not list {missing}"
