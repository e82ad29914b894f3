"""The options of a ``troll train`` run (troll.lm.options): one name per bound, from the flag to config.json; saved
options with a key that is no option (the bounds' old name ``eps``) are refused, never dropped."""

from __future__ import annotations

import json

import pytest

from troll.lm import study
from troll.lm.options import LOSSES, RunOptions, UsageError, check_values, saved_options


def test_saved_options_with_an_unknown_key_are_refused(tmp_path):
    """config.json of a run holding ``"eps"`` (the bounds' name before they had one each): refused naming the key,
    not loaded with the bound dropped."""
    old = {**RunOptions(loss="troll").resolved().to_json(), "eps": 0.125}
    (tmp_path / "config.json").write_text(json.dumps({"command": "train", "options": old}))
    with pytest.raises(UsageError, match="the saved options hold 'eps', no option of a run; the options are: agg, "):
        saved_options(tmp_path)
    assert RunOptions.from_json(RunOptions(kl_bound=0.125).to_json()).kl_bound == 0.125


def test_a_run_records_its_bound_under_its_own_name():
    opts = RunOptions(loss="grpo").resolved()
    assert (opts.kl_bound, opts.clip_eps, opts.cispo_cap) == (None, LOSSES["grpo"].bound, None)
    assert RunOptions(kl_bound=0.2).resolved().to_json()["kl_bound"] == 0.2
    with pytest.raises(UsageError, match="--clip-eps sets the clip range .* --loss troll takes --kl-bound"):
        check_values(RunOptions(loss="troll", clip_eps=0.2))
    with pytest.raises(UsageError, match="--cispo-cap must be a finite number > 0 .* got 0"):
        check_values(RunOptions(loss="cispo", cispo_cap=0))


def test_a_study_spec_with_an_unknown_key_is_refused(tmp_path):
    """A study's config.json whose shared options hold ``"eps"``: --resume names the folder and the key."""
    base = {**RunOptions(steps=2).to_json(), "eps": 0.1}
    spec = {"base": base, "losses": ["troll"], "seeds": [0], "sweep_key": None, "sweep_values": []}
    (tmp_path / "config.json").write_text(json.dumps({"command": "study", "spec": spec}))
    with pytest.raises(UsageError, match="holds a damaged study spec .*the saved options hold 'eps'"):
        study.load_spec(tmp_path)


def test_options_are_checked_when_made_and_when_copied():
    """No RunOptions holds a bad value: the constructor refuses it naming the flag, and so does a copy made with
    ``dataclasses.replace`` (no caller has to remember to check)."""
    import dataclasses

    with pytest.raises(UsageError, match="--lr must be"):
        RunOptions(lr=float("nan"))
    with pytest.raises(UsageError, match="--top-k"):
        RunOptions(top_k=0)
    ok = RunOptions(loss="grpo", clip_eps=0.3)
    with pytest.raises(UsageError, match="--clip-eps must be a finite number > 0 .* got -1"):
        dataclasses.replace(ok, clip_eps=-1.0)
    with pytest.raises(UsageError, match="--kl-bound sets .* --loss grpo takes --clip-eps"):
        dataclasses.replace(ok, kl_bound=0.1)


def test_shared_options_check_each_value_and_leave_the_loss_to_each_run():
    """``loss=None``: the options a comparison or study shares may hold every family's bound and option at once, each
    value checked; :func:`for_loss` makes each loss's run, checked as such."""
    from troll.lm.options import for_loss

    shared = RunOptions(loss=None, kl_bound=0.07, clip_eps=0.3, agg="token-mean", clip_eps_high=0.28)
    with pytest.raises(UsageError, match="--clip-eps must be a finite number > 0 .* got 0"):
        RunOptions(loss=None, clip_eps=0.0)
    with pytest.raises(UsageError, match="--kl-bound"):
        RunOptions(loss=None, kl_bound=-0.1)
    troll = for_loss(shared, "troll", seed=3)
    assert (troll.loss, troll.kl_bound, troll.clip_eps, troll.agg, troll.clip_eps_high, troll.seed) == (
        "troll", 0.07, None, "token-mean", None, 3)  # fmt: skip
    grpo = for_loss(shared, "grpo")
    assert (grpo.kl_bound, grpo.clip_eps, grpo.agg, grpo.clip_eps_high) == (None, 0.3, None, 0.28)
    with pytest.raises(UsageError, match="--dual-clip 1.1 must exceed 1 \\+ the upper clip range"):
        for_loss(RunOptions(loss=None, dual_clip=1.1), "clip")
    assert study.StudySpec(RunOptions(steps=2), ["troll"], [0]).base.loss is None  # a base never has a loss


def test_the_kl_penalty_to_the_starting_model_is_for_the_losses_other_than_troll():
    """``--beta``: TRL's weight of the KL penalty to the starting model, 0 by default (a config.json written before the
    option existed reads as 0, what those runs used). Refused for a TROLL loss and when no loss of a comparison takes
    it; a comparison's TROLL arm runs without it, its clip arm with it; the model card says which."""
    from troll.lm.card import optimisation_section
    from troll.lm.checks import check_used
    from troll.lm.options import for_loss

    assert RunOptions().beta == 0.0
    old = {k: v for k, v in RunOptions(loss="clip").to_json().items() if k != "beta"}
    assert RunOptions.from_json(old).beta == 0.0
    assert RunOptions(loss="clip", beta=0.04).beta == 0.04
    with pytest.raises(UsageError, match="--beta 0.04: troll takes no KL penalty .* Drop --beta or pick another"):
        RunOptions(loss="troll", beta=0.04)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="--beta must be a finite number from 0"):
            RunOptions(loss="clip", beta=bad)
    shared = RunOptions(loss=None, beta=0.04)
    assert (for_loss(shared, "troll").beta, for_loss(shared, "clip").beta, for_loss(shared, "grpo").beta) == (
        0.0, 0.04, 0.04)  # fmt: skip
    check_used(shared, ["troll", "clip"])
    with pytest.raises(UsageError, match="--beta concerns the losses other than TROLL's, and --losses has none"):
        check_used(shared, ["troll", "troll_seq"])

    class Facts:
        optimizer = "adamw"

    with_kl = optimisation_section(RunOptions(loss="clip", beta=0.04).resolved(), Facts())
    assert "a KL penalty to the starting model, weight beta = 0.04" in with_kl
    assert "no reference-model KL (beta = 0)" in optimisation_section(RunOptions(loss="clip").resolved(), Facts())
