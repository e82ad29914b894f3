"""examples/verl_grpo.sh names real verl config keys and passes troll's checks (composed, not run: it needs GPUs)."""

from __future__ import annotations

import importlib
import shlex
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("verl")

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "verl_grpo.sh"
ENTRY = "python -m troll.integrations.verl.main"


def overrides() -> list[str]:
    """The script's Hydra overrides, its shell variables at their defaults and no extra arguments."""
    text = SCRIPT.read_text()
    command = text[text.index(ENTRY) + len(ENTRY) :].split('"$@"')[0].replace("\\\n", " ")
    values = {"$MODEL": "Qwen/Qwen2.5-0.5B-Instruct", "$DATA": "/data/gsm8k", "$N_GPUS": "8"}
    for name, value in values.items():
        command = command.replace(name, value)
    assert "$" not in command.replace("'", ""), "a shell variable this test does not know: give it a value above"
    return shlex.split(command)


def test_the_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_the_overrides_compose_with_verls_config_and_pass_trolls_checks():
    from _verl_cpu import RECIPE, compose

    args = overrides()
    missing = [line for line in RECIPE if line not in args]
    assert not missing, f"examples/verl_grpo.sh lacks the tested recipe's {missing}"
    config = compose(args)  # Hydra refuses a key verl's ppo_trainer.yaml does not have (without a leading +)
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.algorithm.adv_estimator == "grpo"
    main = importlib.import_module("troll.integrations.verl.main")
    settings = main.check_config(config)
    want = {"kl_bound": 0.05, "alpha": 1.0, "top_k": 64, "delta": 1e-5, "level": "token", "agg": "token-mean"}
    assert settings == want
