"""The options of a ``troll train`` run (troll.lm.options): one name per bound, from the flag to config.json, and
the run folders and studies saved before the bounds had their names still load as the same runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from troll.lm import study
from troll.lm.options import LOSSES, RunOptions, UsageError, check_values, saved_options


@pytest.mark.parametrize(
    ("loss", "name"), [("troll", "kl_bound"), ("troll_seq", "kl_bound"), ("grpo", "clip_eps"), ("cispo", "cispo_cap")]
)
def test_an_old_config_keeps_its_bound_under_the_losss_name(tmp_path, loss, name):
    """config.json of a run written with ``"eps"``: the value becomes the loss's own field, and nothing else."""
    old = {**RunOptions(loss=loss).resolved().to_json(), "eps": 0.125}
    for key in ("kl_bound", "clip_eps", "cispo_cap"):
        old.pop(key)
    (tmp_path / "config.json").write_text(json.dumps({"command": "train", "options": old}))
    opts = saved_options(tmp_path)
    assert getattr(opts, name) == 0.125 and opts.bound == 0.125
    assert [k for k in ("kl_bound", "clip_eps", "cispo_cap") if getattr(opts, k) is not None] == [name]
    assert "eps" not in opts.to_json() and opts.to_json()[name] == 0.125


def test_a_run_records_its_bound_under_its_own_name():
    opts = RunOptions(loss="grpo").resolved()
    assert (opts.kl_bound, opts.clip_eps, opts.cispo_cap) == (None, LOSSES["grpo"].bound, None)
    assert RunOptions(kl_bound=0.2).resolved().to_json()["kl_bound"] == 0.2
    with pytest.raises(UsageError, match="--clip-eps sets the clip range .* --loss troll takes --kl-bound"):
        check_values(RunOptions(loss="troll", clip_eps=0.2))
    with pytest.raises(UsageError, match="--cispo-cap must be a finite number > 0 .* got 0"):
        check_values(RunOptions(loss="cispo", cispo_cap=0))


def test_an_old_study_spec_loads_as_the_same_grid():
    """A study's config.json saved with the base's ``eps`` (TROLL's bound), ``clip_eps`` beside the base and the
    sweep key ``eps``."""
    base = {**RunOptions(steps=2).to_json(), "eps": 0.1}
    for key in ("kl_bound", "clip_eps", "cispo_cap"):
        base.pop(key)
    old = {"base": base, "losses": ["troll", "grpo:eps=0.3"], "seeds": [0], "sweep_key": "eps",
           "sweep_values": [0.1, 0.2], "clip_eps": 0.25}  # fmt: skip
    spec = study.StudySpec.from_json(old)
    assert (spec.base.kl_bound, spec.base.clip_eps, spec.sweep_key) == (0.1, 0.25, "kl_bound")
    cells = {(c.value, c.arm): c.options for c in study.plan(spec, Path("st"))}
    assert cells[0.2, "troll"].kl_bound == 0.2 and cells[0.2, "grpo:eps=0.3"].clip_eps == 0.3


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
