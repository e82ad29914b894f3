"""python -m troll.lm.batch_check: a run's TROLL loss on its own batch against the float64 reference."""

from __future__ import annotations

import json

import pytest
import torch

from troll.cli import main as troll_main
from troll.lm import batch_check, tasks

RUN = ["--steps", "4", "--steps-per-rollout", "4", "--heldout", "2", "--eval-every", "0"]
RUN += ["--max-completion-length", "6", "--lr", "0.05", "--no-model"]


class LengthReward(tasks.TaskReward):
    """A training reward the random model can earn: 1 for a completion of odd length (in characters), else 0."""

    def __call__(self, prompts=None, completions=None, **kwargs):
        return [float(len(tasks.completion_text(c)) % 2) for c in completions]


@pytest.fixture
def moving_run(tmp_path, monkeypatch, tiny_model_dir):
    """A 4-step run, one rollout batch, whose policy moves: steps 2 to 4 are off-policy and projected."""
    monkeypatch.setattr(tasks, "TaskReward", LengthReward)

    def run(*extra):
        """RUN and ``extra``, with TROLL's bound at 0.002 unless ``extra`` gives the clip loss's."""
        out = tmp_path / "run"
        bound = [] if "--clip-eps" in extra else ["--kl-bound", "0.002"]
        assert troll_main(["train", "--model", str(tiny_model_dir), "--out", str(out), *RUN, *bound, *extra]) == 0
        return out

    return run


@pytest.mark.parametrize("extra", [(), ("--tail", "renormalize"), ("--loss", "troll_seq")])
def test_a_run_passes_its_own_batch_check(moving_run, tmp_path, capsys, extra):
    out = moving_run(*extra)
    report = tmp_path / "check.json"
    code = batch_check.main([str(out), "--json", str(report)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    r = json.loads(report.read_text())
    assert r["ok"] and r["step"] == 4 and r["off_policy"] and r["rerun_steps_compared"] == 4
    # same seed, one thread: the same batches; steps 1-3 bit for bit, step 4 as the trainer's loss scaled like TRL's log
    assert r["rerun_max_rel_diff"] < 1e-6
    # the check has something to check: the projection is active, the loss and its derivative are not ~0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(row.get("troll/projected_frac", 0) for row in rows) > 0.5
    assert r["projected_positions"] > 0 and abs(r["reference"]) > 1e-3 and abs(r["derivative_reference_fd"]) > 1e-3
    assert abs(r["trained_minus_reference"]) < 1e-5 and r["derivative_rel_diff"] < 1e-4
    assert "ok: the loss of this batch matches" in printed


def test_a_wrong_bound_in_training_is_caught(moving_run, tmp_path, monkeypatch, capsys):
    """Training with a different bound than the run's config says: the rerun still matches the log (same wrong code),
    but the loss no longer matches the reference built from the config."""
    from troll.integrations.trl.trainer import TrollGRPOTrainer

    right = TrollGRPOTrainer._troll_loss_kwargs
    monkeypatch.setattr(TrollGRPOTrainer, "_troll_loss_kwargs", lambda self: right(self) | {"kl_bound": 0.02})
    out = moving_run()
    code = batch_check.main([str(out), "--json", str(tmp_path / "check.json")])
    assert code == 1
    assert "FAILED: trained_minus_reference" in capsys.readouterr().out


def test_completed_old_policy_has_the_buckets_masses():
    """Hand case: V = 6, old keeps {0, 1} (0.5, 0.3; R = 0.2), new keeps {2} and the sampled token is 3, so U =
    {0, 1, 2, 3}; ids 2 and 3 get R / 4 = 0.05 each, ids 4 and 5 share R * 2 / 4 = 0.1 in the new shape (1 : 3)."""
    from troll.categorical.sparse import SparseLogProbs

    new_p = torch.tensor([0.0005, 0.0005, 0.99, 0.001, 0.002, 0.006], dtype=torch.float64)
    old = SparseLogProbs(
        torch.tensor([[[0, 1]]]), torch.tensor([[[0.5, 0.3]]]).log(), torch.ones(1, 1, 2, dtype=bool), 6
    )
    got = batch_check.completed_old_logp(new_p.log().view(1, 1, 6), old, torch.tensor([[3]]), top_k=1, delta=0.0)
    want = torch.tensor([0.5, 0.3, 0.05, 0.05, 0.025, 0.075], dtype=torch.float64)
    torch.testing.assert_close(got[0, 0].exp(), want, rtol=1e-6, atol=0)


def test_bad_input_is_refused(tmp_path, capsys):
    assert batch_check.main([str(tmp_path / "nothing")]) == 2
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "argv", "message"),
    [
        ((), ["--step", "5"], "--step must be between 1 and the run's 4 steps"),
        (("--steps-per-rollout", "1"), [], "ran with --steps-per-rollout 1"),
        (("--loss", "clip", "--clip-eps", "0.2"), [], "trained with --loss clip"),
        ((), ["--json", "no-such-folder/check.json"], "--json: the folder no-such-folder does not exist"),
    ],
)
def test_refusals_come_before_the_rerun(moving_run, capsys, monkeypatch, extra, argv, message):
    out = moving_run(*extra)
    capsys.readouterr()
    monkeypatch.setattr("troll.lm.run.train", lambda *a, **k: pytest.fail("reran despite bad input"))
    assert batch_check.main([str(out), *argv]) == 2
    assert message in capsys.readouterr().err


def _tied_batch():
    """Two positions over V = 40 whose current policy has ids 5-14 tied at the cut of K = 6: the kept set holds the
    four largest ids and two of the ten tied ones. The old policy keeps six other ids, so the projection is active."""
    from troll.categorical.sparse import sparsify

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 2, 40, generator=gen, dtype=torch.float64) * 0.3 - 1
    logits[..., 30:34] = torch.tensor([3.0, 2.8, 2.6, 2.4], dtype=torch.float64)
    logits[..., 5:15] = 1.0
    old_logits = torch.randn(1, 2, 40, generator=gen, dtype=torch.float64) * 0.3 - 1
    old_logits[..., 20:26] = torch.tensor([3.0, 2.5, 2.2, 2.0, 1.8, 1.5], dtype=torch.float64)
    tokens = torch.tensor([[30, 21]])
    old = sparsify(old_logits, top_k=6, delta=1e-5, include=tokens)
    kwargs = dict(kl_bound=0.05, alpha=1.0, top_k=6, delta=1e-5, level="token", agg="token-mean", max_len=2)
    kwargs |= dict(tail="bucket", fill=1e-12)
    return logits, old, tokens, torch.tensor([0.7], dtype=torch.float64), kwargs


def test_the_completion_follows_the_librarys_choice_among_tied_ids(monkeypatch):
    """Which of the tied ids are kept decides the rest bucket's implied old policy, hence the loss's gradient: the
    reference must complete the old policy on the library's choice (the 4.9e-5 derivative gap of one map cell came
    from SmolLM2 ids with equal logits at the cut). Completing on another choice of tied ids moves the derivative
    beyond the tolerance, so the check can fail; a set that is no kept set is refused."""
    logits, old, tokens, adv, kwargs = _tied_batch()
    mask = torch.ones(1, 2, dtype=torch.bool)
    r = batch_check.check_logits(logits, old, tokens, adv, mask, kwargs)
    assert r["projected_positions"] == 2 and abs(r["derivative_reference_fd"]) > 1e-3
    assert abs(r["dense_minus_reference"]) < 1e-9 and r["derivative_rel_diff"] < 1e-7

    chosen = batch_check._library_kept(logits, 6, 1e-5)
    tied = set(range(5, 15))
    assert all(len(tied & set(row)) == 2 for row in chosen[0])  # the cut splits the tie
    others = [[[j for j in row if j not in tied] + sorted(tied - set(row))[:2] for row in chosen[0]]]
    monkeypatch.setattr(batch_check, "_library_kept", lambda *a: others)
    assert batch_check.check_logits(logits, old, tokens, adv, mask, kwargs)["derivative_rel_diff"] > 1e-4

    not_kept = [[[j for j in row if j not in tied] + [0, 1] for row in chosen[0]]]  # ids below the tie
    with pytest.raises(RuntimeError, match="not a kept set"):
        batch_check.completed_old_logp(logits, old, tokens, top_k=6, delta=1e-5, new_kept=not_kept)
