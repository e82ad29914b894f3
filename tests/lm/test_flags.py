"""The flags of ``troll train``, ``compare`` and ``study`` (troll.lm.flags): each bound has its loss family's
name, and ``eps`` is no name of any: the flag is unknown, the sweep key and an arm's key are refused naming the
loss's own."""

from __future__ import annotations

import pytest
from conftest import run_cli


@pytest.mark.parametrize("command", ["train", "compare", "study"])
def test_eps_is_no_flag(tmp_path, capsys, command):
    with pytest.raises(SystemExit) as exit_:
        run_cli(capsys, command, "--eps", "0.07", "--out", str(tmp_path / "o"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unrecognized arguments: --eps 0.07" in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sweep", "eps=0.07,0.1"], "--sweep: unknown key 'eps'; sweep one of: "),
        (["--losses", "troll:eps=0.07,grpo"], "--losses troll:eps=0.07: 'eps=0.07' is not KEY=VALUE"),
        (["--losses", "troll,clip:eps=0.3"], "--losses clip:eps=0.3: 'eps=0.3' is not KEY=VALUE"),
    ],
)
def test_an_eps_key_is_refused_naming_the_losss_own(tmp_path, capsys, argv, message):
    """The sweep key and an arm's key ``eps=``: the message names the key and the bound's name to write instead."""
    code, err = run_cli(capsys, "study", *argv, "--out", str(tmp_path / "o"))
    assert code == 2 and message in err, err
    if argv[0] == "--sweep":
        assert "A loss's bound is swept as kl-bound=... (the TROLL losses') or clip-eps=..." in err
    else:
        assert "(e.g. clip:clip-eps=0.2)" in err if "clip:" in argv[1] else "(e.g. troll:kl-bound=0.2)" in err
    assert not (tmp_path / "o").exists()


def test_the_flags_set_their_own_option(tmp_path):
    from troll.cli import build_parser
    from troll.lm.flags import options_from_args

    for argv, name in [(["--kl-bound", "0.07"], "kl_bound"), (["--loss", "grpo", "--clip-eps", "0.07"], "clip_eps"),
                       (["--loss", "cispo", "--cispo-cap", "0.07"], "cispo_cap")]:  # fmt: skip
        opts = options_from_args(build_parser().parse_args(["train", *argv, "--out", str(tmp_path / "o")]))
        assert getattr(opts, name) == 0.07 and opts.bound == 0.07


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
