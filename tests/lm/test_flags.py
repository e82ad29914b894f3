"""The flags of ``troll train``, ``compare`` and ``study`` (troll.lm.flags): each bound has its loss family's
name, and ``--eps`` (the sweep key ``eps=``, an arm's ``eps=``) still works with a warning naming the new flag."""

from __future__ import annotations

import pytest
from conftest import run_cli


@pytest.mark.parametrize(
    "argv, new",
    [
        (["train", "--eps", "0.07"], "--kl-bound"),
        (["train", "--loss", "grpo", "--eps", "0.07"], "--clip-eps"),
        (["train", "--loss", "cispo", "--eps", "0.07"], "--cispo-cap"),
        (["compare", "--eps", "0.07"], "--kl-bound"),
        (["study", "--eps", "0.07"], "--kl-bound"),
        (["study", "--sweep", "eps=0.07,0.1"], "kl-bound="),
        (["study", "--losses", "troll:eps=0.07,grpo"], "kl-bound="),
        (["study", "--losses", "troll,clip:eps=0.3"], "clip-eps="),
    ],
)
def test_eps_still_works_with_a_warning_naming_the_new_flag(tmp_path, capsys, argv, new):
    """--eps (and the sweep key eps=, an arm's eps=) keep working for one release; the warning says where the value
    went. The run is stopped before it loads anything by a bad --steps, after the options were read."""
    pytest.importorskip("reasoning_gym")
    code, err = run_cli(capsys, *argv, "--steps", "0", "--out", str(tmp_path / "o"))
    assert "is deprecated and will be removed in the next release" in err and f"went to {new}" in err, err
    assert code == 2 and "--steps must be" in err and not (tmp_path / "o").exists()


def test_the_new_flags_set_the_same_option(tmp_path):
    from troll.cli import build_parser
    from troll.lm.flags import options_from_args, train_bound

    for argv, name in [(["--kl-bound", "0.07"], "kl_bound"), (["--eps", "0.07"], "kl_bound"),
                       (["--loss", "grpo", "--clip-eps", "0.07"], "clip_eps"),
                       (["--loss", "cispo", "--eps", "0.07"], "cispo_cap")]:  # fmt: skip
        args = build_parser().parse_args(["train", *argv, "--out", str(tmp_path / "o")])
        train_bound(args)
        opts = options_from_args(args)
        assert getattr(opts, name) == 0.07 and opts.bound == 0.07 and not hasattr(args, "eps")


def test_the_flag_table_is_made_from_the_options_fields():
    """Every RunOptions field but the loss, its bounds and the folder (each command's own flags) has a run flag, in
    the fields' order, of the field's type, whose help names the field's default."""
    import dataclasses

    from troll.lm.flags import RUN_ARGS
    from troll.lm.options import RunOptions

    fields = [f for f in dataclasses.fields(RunOptions) if f.name not in {"loss", "kl_bound", "clip_eps", "cispo_cap",
                                                                            "out"}]  # fmt: skip
    assert [flag for flag, _, _ in RUN_ARGS] == ["--" + f.name.replace("_", "-") for f in fields]
    kinds = dict((flag, kind) for flag, kind, _ in RUN_ARGS)
    assert (kinds["--steps"], kinds["--lr"], kinds["--system"], kinds["--heldout-samples"]) == (int, float, str, int)
    for (flag, _, text), f in zip(RUN_ARGS, fields):
        assert "{default}" not in text
        if f.default is not None:
            assert f"(default: {f.default})" in text or f"(default: {f.default};" in text, flag
    assert "0.7 for code tasks" in dict((flag, text) for flag, _, text in RUN_ARGS)["--temperature"]
