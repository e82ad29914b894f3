"""``python -m troll.integrations.verl.main`` end to end on CPU: whole GRPO steps through Ray, FSDP2 on gloo and a
rollout server (run in .venv-verl; tests/support/_verl_e2e.py says what the CPU needs that a GPU run does not).

Three runs of a tiny random Qwen2 (``_verl_e2e.RUNS``), each a subprocess with its own Ray cluster, started in the
background when the session starts (conftest.py here) so that they overlap the other verl tests:

- ``troll``: 2 trainer processes, token-level TROLL, steps 1-2, a checkpoint at step 2;
- ``resumed``: 2 processes, resumes that checkpoint and runs step 3 with sequence-level TROLL (``troll_seq``);
- ``clip``: 1 process, verl's PPO clip loss (``vanilla``), the baseline, 1 step.

Each step has two mini-batches, so the second one's update starts from a policy the first one moved: its tokens are
off-policy and TROLL projects them. The tests read the exit codes, verl's file logger (the metrics of every step),
the generations verl dumps, the checkpoint folders and the trainer class recorded in the task runner's process.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("verl")

from _verl_e2e import KL_BOUND, RUNS  # noqa: E402


@pytest.fixture(scope="module")
def runs(request):
    """Each run's exit code, wall seconds, output, metrics by step, trainer record and folder; the runs started with
    the session (tests/integrations/verl/conftest.py) and are awaited here."""
    background = getattr(request.config, "_troll_verl_e2e", None)
    assert background is not None, "the end-to-end runs were not started (tests/integrations/verl/conftest.py)"
    results = background.results()
    keys = ["troll/kl_before/max", "troll/kl_after/max", "troll/projected_frac", "training/rollout_probs_diff_max"]
    for name, r in results.items():  # the figures docs/verl.md quotes (pytest -s)
        steps = {step: {k: f"{m[k]:.3g}" for k in keys if k in m} for step, m in r["metrics"].items()}
        print(f"verl e2e {name}: {r['seconds'] and round(r['seconds'], 1)} s, exit {r['code']}, {steps}")
    return results


@pytest.mark.parametrize("name", list(RUNS))
def test_the_run_completes(runs, name):
    run = runs[name]
    assert run["code"] == 0, run["log"][-6000:]
    count, steps, _, resumes = RUNS[name]
    first = RUNS[resumes][1] + 1 if resumes else 1
    assert sorted(run["metrics"]) == list(range(first, steps + 1))


@pytest.mark.parametrize("name", list(RUNS))
def test_the_task_runner_process_runs_trolls_trainer(runs, name):
    """The trainer class that ran init_workers, recorded in the Ray actor's own process (not the driver's)."""
    record = runs[name]["trainer"]
    assert record["trainer"] == "troll.integrations.verl.trainer.TrollRayPPOTrainer"
    assert record["pid"] != os.getpid()


@pytest.mark.parametrize("name", ["troll", "resumed"])
def test_every_token_stays_within_the_kl_bound(runs, name):
    """verl's logged troll/* metrics of every step: the bound holds after the projection, and it was active."""
    steps = runs[name]["metrics"].values()
    for m in steps:
        assert m["troll/kl_after/max"] <= KL_BOUND * (1 + 1e-4)
        assert m["troll/infeasible_frac"] == 0.0
    assert max(m["troll/kl_before/max"] for m in steps) > KL_BOUND
    assert max(m["troll/projected_frac"] for m in steps) > 0


@pytest.mark.parametrize("name", list(RUNS))
def test_the_old_policy_is_the_one_that_sampled(runs, name):
    """The rollout server's probabilities of the sampled tokens equal those of the actor's recomputed old policy
    (verl's ``training/rollout_probs_diff_*``): after every weight sync, and after a resume (measured: 3e-9 at most,
    fp32 on both sides)."""
    for m in runs[name]["metrics"].values():
        assert m["training/rollout_probs_diff_valid"] == 1
        assert m["training/rollout_probs_diff_max"] < 1e-6


@pytest.mark.parametrize("name", list(RUNS))
def test_metrics_are_logged(runs, name):
    _, _, loss, _ = RUNS[name]
    for m in runs[name]["metrics"].values():
        assert {"actor/pg_loss", "critic/score/mean", "response_length/mean", "timing_s/step"} <= set(m)
        troll = {k for k in m if k.startswith("troll/")}
        if loss.startswith("troll"):
            assert {"troll/kl_before/max", "troll/kl_after/max", "troll/projected_frac", "troll/loss/pg"} <= troll
            assert not any(k.startswith("actor/troll/") for k in m)
        else:
            assert not troll and "actor/pg_clipfrac" in m


def test_the_checkpoint_is_saved_and_resumed(runs):
    out = runs["troll"]["out"] / "checkpoints"
    assert (out / "latest_checkpointed_iteration.txt").read_text().strip() == "3"  # verl saves at the last step too
    shards = sorted(p.name for p in (out / "global_step_2" / "actor").glob("model_world_size_2_rank_*.pt"))
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    assert "global_step_2" in runs["resumed"]["log"]  # verl names the checkpoint it loads


def test_the_code_reward_scores_the_code_rows_in_the_run(runs):
    """troll's code reward for verl runs inside the run's reward worker: every code row of the dumped generations
    was run in the sandbox (``scored``), and its score is what the reward gives the same response here."""
    from troll.integrations.verl.reward import compute_score

    rows = [json.loads(line) for p in sorted((runs["troll"]["out"] / "rollouts").glob("*.jsonl"))
            for line in p.read_text().splitlines()]  # fmt: skip
    code = [row for row in rows if row["gts"]]
    assert code and len(code) < len(rows)
    for row in code:
        assert row["scored"] == 1.0
        assert row["score"] == compute_score("code", row["output"], row["gts"])["score"]
