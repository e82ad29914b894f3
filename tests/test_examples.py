"""The scripts of examples/ run, at a tiny size: the TRL script on a tiny offline model, the TCE study on the toy task.

examples/verl_grpo.sh needs GPUs; tests/integrations/verl/test_verl_example.py composes its overrides instead.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SRC = Path(__file__).resolve().parent.parent / "src"


def test_the_trl_example_trains_with_trolls_loss_on_its_own_data(tmp_path):
    pytest.importorskip("trl")
    from tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tiny_model(tok).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLES / "trl_grpo.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.correct_sum(["7", "the sum is 12.", "no"], answer=["7", "12", "3"]) == [1.0, 1.0, 0.0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = ["--model", str(tmp_path / "model"), "--output-dir", str(tmp_path / "out"), "--kl-bound", "0.01"]
        args += ["--prompts", "8", "--max-steps", "2", "--batch-size", "4", "--steps-per-generation", "2"]
        args += ["--max-completion-length", "8", "--lr", "0.1"]
        last = example.main(args)
    finally:
        torch.set_num_threads(threads)
    assert 0.0 <= last["troll/kl_after/max"] <= 0.01 * (1 + 1e-4)
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_the_tce_example_runs_a_study_on_the_toy_task(tmp_path):
    pytest.importorskip("gymnasium")
    out = tmp_path / "study"
    env = {
        **os.environ,
        "ENV": "toy/viapoint",
        "SEEDS": "1",
        "JOBS": "2",
        "STEPS": "1600",
        "OUT": str(out),
        "TROLL": f"{sys.executable} -m troll.cli",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
    }
    cmd = ["bash", str(EXAMPLES / "tce_study.sh"), "--episodes", "16", "--eval-episodes", "8"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| tce | 1 |" in done.stdout and "| bbrl | 1 |" in done.stdout  # the script prints study.md
    assert (out / "tce" / "seed0" / "summary.json").is_file() and (out / "study.json").is_file()


def test_the_user_env_example_trains_saves_and_loads_in_a_new_process_to_the_same_numbers(tmp_path, monkeypatch):
    """examples/user_env.py through the API (it compares the evaluations itself and exits 1 if they differ), then the
    same env on the command line by module:function, whose run folder TCE.load reads."""
    pytest.importorskip("gymnasium")
    path = os.pathsep.join(filter(None, [str(SRC), str(EXAMPLES), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    cmd = [sys.executable, str(EXAMPLES / "user_env.py"), "--steps", "800", "--out", str(tmp_path / "model.pt")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained 1 iterations" in done.stdout and done.stdout.rstrip().endswith("same numbers")

    from troll.cli import main
    from troll.episodic import TCE
    from troll.runs.files import read_jsonl

    monkeypatch.syspath_prepend(str(EXAMPLES))
    out = tmp_path / "run"
    argv = ["tce", "train", "--env", "user_env:make_point_reach", "--steps", "800", "--episodes", "8",
            "--eval-episodes", "8", "--num-segments", "10", "--policy-epochs", "3", "--critic-epochs", "3",
            "--policy-hidden", "16", "--critic-hidden", "16", "--workers", "0", "--no-progress",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    last = read_jsonl(out / "metrics.jsonl")[-1]
    model = TCE.load(out)
    assert model.config.env == "user_env:make_point_reach" and model.iteration == 2
    assert model.evaluate() == {k.removeprefix("eval/"): v for k, v in last.items() if k.startswith("eval/")}
