"""The verl plug-in (troll.integrations.verl): its version and settings checks, its import structure, the actor
config and LM-head settings, and the entry point (check_config, the Ray runtime env's plug-in, the task runner).

The config checks and the import structure need no verl; everything else is skipped without verl (pytest.importorskip)
and runs in .venv-verl. The loss is in tests/integrations/verl/test_verl_loss.py, the engine and trainer in
tests/integrations/verl/test_verl_engine_outputs.py, an end-to-end step in tests/integrations/verl/test_verl_engine.py.
"""

import importlib
import os
import sys

import pytest
from _verl_batches import _actor_config, _verl

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
    """The shared check (troll.categorical.settings.check_troll_settings) names each key as the Hydra override writes
    it."""
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
    """config <- loss <- engine <- trainer <- main, and plugin <- engine: no module imports one after it; reward (the
    code compute_score) imports none of them."""
    import ast
    from pathlib import Path

    import troll.integrations.verl as package

    order = ["config", "loss", "engine", "trainer", "main"]
    allowed = {name: set(order[:i]) for i, name in enumerate(order)}
    allowed |= {"plugin": {"engine"}, "__init__": {"config"}, "reward": set()}
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


def test_lm_head_setting_is_checked_and_defaults_to_chunked():
    verl_config = _verl("config")
    assert verl_config.troll_lm_head(_actor_config()) == "chunked"
    assert verl_config.troll_lm_head(_actor_config(troll={**TROLL, "lm_head": "dense"})) == "dense"
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.troll\.lm_head='sparse'"):
        verl_config.troll_lm_head(_actor_config(troll={**TROLL, "lm_head": "sparse"}))


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
        (
            "+actor_rollout_ref.actor.troll.lm_head=sparse",
            r"actor_rollout_ref\.actor\.troll\.lm_head='sparse'",
        ),
    ],
)
def test_check_config_names_the_key_to_fix(override, message):
    main = _main()
    with pytest.raises(ValueError, match=message):
        main.check_config(_recipe_config(override))


def test_the_plugin_is_added_to_the_ray_runtime_env(monkeypatch):
    main = _main()
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    config = _recipe_config("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=my.mod")
    main.add_plugin_to_runtime_env(config)
    main.add_plugin_to_runtime_env(config)  # idempotent
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES == "my.mod,troll.integrations.verl.plugin"
    fresh = _recipe_config()
    main.add_plugin_to_runtime_env(fresh)
    assert fresh.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == main.PLUGIN
    # modules named in this process's environment reach the Ray processes too, before the plug-in
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "platform.mod")
    from_env = _recipe_config()
    main.add_plugin_to_runtime_env(from_env)
    assert from_env.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == f"platform.mod,{main.PLUGIN}"


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


_LOAD_AS_RAY_DOES = """
import importlib, sys
from ray import cloudpickle
base = cloudpickle.loads(sys.stdin.buffer.read()).__ray_actor_class__  # the task runner class, as the actor gets it
module = importlib.import_module(base.__module__)
print(getattr(module, base.__qualname__, None) is base, base.run.__globals__ is module.__dict__,
      getattr(getattr(base, "trainer_class", None), "__name__", None))
"""


def test_the_task_runner_reaches_a_ray_actor_as_trolls_class(monkeypatch):
    """Ray ships an actor class to its process with cloudpickle: a class it cannot find by name in its module is sent
    by value, with a private copy of its module's globals (a rebound module name never reaches it). The task runner
    must arrive as troll's own class, by reference, so that its ``run`` builds troll's trainer in the actor's process
    (tests/integrations/verl/test_verl_e2e.py checks the trainer that actually ran)."""
    import subprocess

    import ray
    from ray import cloudpickle

    main = _main()
    seen = {}
    monkeypatch.setattr(main.main_ppo, "run_ppo", lambda config, task_runner_class: seen.update(cls=task_runner_class))
    monkeypatch.setattr(main.main_ppo, "validate_config", lambda **kwargs: None)  # it would load the tokenizer
    main.main.__wrapped__(_recipe_config())  # the entry point without Hydra's command-line parsing
    assert isinstance(seen["cls"], ray.actor.ActorClass)
    shipped = cloudpickle.dumps(seen["cls"].__ray_metadata__.modified_class)  # what Ray exports to the actor process
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_AS_RAY_DOES], input=shipped, capture_output=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    # by reference: the actor imports the module, and run reads the module's own names
    assert done.stdout.decode().split() == ["True", "True", "TrollRayPPOTrainer"]


def test_the_task_runner_builds_the_troll_trainer(monkeypatch):
    """TrollTaskRunner.run hands verl's helpers' results to its trainer_class and runs it."""
    main = _main()
    trainer = importlib.import_module("troll.integrations.verl.trainer")
    seen = {}

    class Probe:
        def __init__(self, **kwargs):
            seen["kwargs"] = sorted(kwargs)

        def init_workers(self):
            seen["init_workers"] = True

        def fit(self):
            seen["fit"] = True

    for name in ("validate_config", "create_rl_sampler", "register"):
        monkeypatch.setattr(trainer, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(trainer, "create_rl_dataset", lambda files, *args, **kwargs: f"dataset of {files}")
    model = type("Model", (), {"tokenizer": "tok", "processor": None})()
    monkeypatch.setattr(trainer, "omega_conf_to_dataclass", lambda config: model)
    runner = main.TrollTaskRunner()
    assert runner.trainer_class is trainer.TrollRayPPOTrainer
    runner.trainer_class = Probe
    monkeypatch.setattr(runner, "init_resource_pool_mgr", lambda config: "pools")
    runner.run(_recipe_config("data.train_files=a.parquet", "data.val_files=b.parquet"))
    assert seen["init_workers"] and seen["fit"]
    assert seen["kwargs"] == sorted(
        [
            "config", "tokenizer", "processor", "role_worker_mapping", "resource_pool_manager",
            "ray_worker_group_cls", "train_dataset", "val_dataset", "collate_fn", "train_sampler",
        ]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.rollout_correction.rollout_is=token", r"algorithm\.rollout_correction\.rollout_is=null"),
        ("algorithm.rollout_correction.rollout_is=sequence", r"algorithm\.rollout_correction\.rollout_is=null"),
        ("algorithm.rollout_correction.bypass_mode=True", r"algorithm\.rollout_correction\.bypass_mode=false"),
    ],
)
def test_rollout_correction_weights_and_bypass_mode_are_refused_at_start(override, message):
    """TROLL's loss has no per-token weight for verl's IS weights, and bypass mode skips the capture of the old
    policy: both are refused before Ray starts (check_config) and again by the trainer before its workers start."""
    main = _main()
    trainer = importlib.import_module("troll.integrations.verl.trainer")
    config = _recipe_config(override)
    with pytest.raises(ValueError, match=message):
        main.check_config(config)
    stub = object.__new__(type("T", (trainer.TrollTrainerMixin, object), {}))
    stub.config = config
    with pytest.raises(ValueError, match=message):
        stub.init_workers()  # before verl's init_workers: the stand-in base has none
    assert main.check_config(_recipe_config(override, "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla")) is None


def test_rejection_sampling_alone_is_allowed():
    """verl's rejection sampling only drops tokens from response_mask, which the TROLL loss honours."""
    main = _main()
    config = _recipe_config(
        "algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=2.0"
    )
    assert main.check_config(config)["level"] == "token"
