"""The verl plug-in: the tested-version guard and the TROLL settings of a verl actor config.

The config checks need no verl; the import test runs only where verl is installed (pytest.importorskip).
"""

import importlib
import sys

import pytest

from troll.integrations._verl_config import SUPPORTED_VERL, check_verl_version, troll_settings

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


def test_import_needs_a_supported_verl():
    sys.modules.pop("troll.integrations.verl", None)
    try:
        import verl  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"pip install 'troll\[verl\]'"):
            importlib.import_module("troll.integrations.verl")
        return
    module = importlib.import_module("troll.integrations.verl")
    assert module.troll_settings is troll_settings
