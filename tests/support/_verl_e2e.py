"""The CPU end-to-end verl runs: a tiny model and dataset on disk, and the command line of ``python -m
troll.integrations.verl.main`` that trains on them through Ray, FSDP2 on gloo and the transformers rollout; run as a
script, ``make verl-demo`` (a saved model, e.g. SmolLM2-135M, and a table of each step's metrics).

What a GPU run would not need, and why (docs/verl.md, "End to end on CPU"): ``VERL_PLATFORM=cpu`` and
:mod:`_verl_cpu_plugin` in every process (a CPU platform, plain gloo, the ``hf`` rollout), ``VERL_ENGINE_DEVICE=cuda``
(verl registers its FSDP engines for cuda and npu only; every tensor stays on the CPU), logical GPUs for Ray, fp32,
no torch.compile, sdpa attention, one agent-loop worker and one reward worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parent.parent
KL_BOUND = 2e-4  # small enough that each step's second mini-batch is projected (lr 1e-2 moves the policy more)
# per trainer process and step: prompts, samples a prompt (GRPO's group); lengths in tokens
TEST_SIZE = {"prompts": 2, "samples": 2, "prompt_length": 48, "response_length": 8, "lr": 1e-2, "kl_bound": KL_BOUND,
             "top_k": 16}  # fmt: skip
DEMO_SIZE = {"prompts": 4, "samples": 4, "prompt_length": 128, "response_length": 96, "lr": 1e-5, "kl_bound": 0.05,
             "top_k": 64}  # fmt: skip
CODE_TESTS = json.dumps({"kind": "stdio", "cases": [{"input": "1 2\n", "expected": "3\n"}]})


def write_model(folder: Path) -> Path:
    """A tiny random Qwen2 (hidden 32, 2 layers, untied head) with the offline tokenizer, saved as a model folder."""
    import torch
    from tiny import tiny_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_data(folder: Path, rows: int = 16) -> tuple[Path, Path]:
    """(train, val) parquet files in verl's RL layout: chat prompts, half of them code rows with stdio tests."""
    import pandas as pd
    from tiny import PROMPTS

    records = []
    for i in range(rows):
        code = i % 2 == 0
        text = "write a program that adds two numbers" if code else PROMPTS[i % len(PROMPTS)]
        records.append({
            "data_source": "code" if code else "letters",
            "prompt": [{"role": "user", "content": text}],
            "ability": "code" if code else "text",
            "reward_model": {"style": "rule", "ground_truth": CODE_TESTS if code else ""},
            "extra_info": {"index": i},
        })  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    train, val = folder / "train.parquet", folder / "val.parquet"
    pd.DataFrame(records).to_parquet(train)
    pd.DataFrame(records[:2]).to_parquet(val)
    return train, val


def overrides(model: Path, train: Path, val: Path, out: Path, *, procs: int, steps: int, loss: str,
              **size) -> list[str]:  # fmt: skip
    """The Hydra overrides of one run: GRPO, ``procs`` trainer processes, ``steps`` steps in all (a resumed run
    continues from the last checkpoint in ``out``), a checkpoint every 2 steps, ``loss`` a verl loss_mode. ``size``
    overrides :data:`TEST_SIZE`'s keys (:data:`DEMO_SIZE`: the SmolLM2 demo's)."""
    size = {**TEST_SIZE, **size}
    troll = [
        "actor_rollout_ref.actor._target_=troll.integrations.verl.config.TrollFSDPActorConfig",
        f"+actor_rollout_ref.actor.troll.kl_bound={size['kl_bound']}",
        "+actor_rollout_ref.actor.troll.alpha=1.0",
        f"+actor_rollout_ref.actor.troll.top_k={size['top_k']}",
        "+actor_rollout_ref.actor.troll.delta=1e-5",
    ]
    reward = SUPPORT / "_verl_reward.py"
    prompts = size["prompts"] * procs  # a step's prompts; two mini-batches of half of them each
    return [
        *(troll if loss.startswith("troll") else []),
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"data.train_batch_size={prompts}",
        f"data.max_prompt_length={size['prompt_length']}",
        f"data.max_response_length={size['response_length']}",
        "data.dataloader_num_workers=0",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        # fp32 throughout: verl's FSDP engine computes in bf16 unless mixed_precision says otherwise
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.actor.use_torch_compile=False",
        f"actor_rollout_ref.actor.optim.lr={size['lr']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts // 2}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={size['samples']}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={reward}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={procs}",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        f"trainer.rollout_data_dir={out / 'rollouts'}",
        f"+ray_kwargs.ray_init.num_gpus={procs}",
        "+ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.include_dashboard=False",
    ]


def environment(out: Path, name: str) -> dict[str, str]:
    """The run's environment: the CPU plug-in in every process, one thread each, the metrics and trainer record in
    ``out`` (``metrics-<name>.jsonl``, ``trainer-<name>.json``)."""
    path = os.pathsep.join([str(SUPPORT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "VERL_USE_EXTERNAL_MODULES": "_verl_cpu_plugin",
        "VERL_FILE_LOGGER_PATH": str(out / f"metrics-{name}.jsonl"),
        "TROLL_VERL_TRAINER_RECORD": str(out / f"trainer-{name}.json"),
        "RAY_DEDUP_LOGS": "0",
        # Ray starts one idle worker a logical CPU for the first driver; verl's actors start their own processes
        "RAY_prestart_worker_first_driver": "0",
    }


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "troll.integrations.verl.main", *args]


def start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """``python -m troll.integrations.verl.main args`` in its own session, its output in ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(command(*args), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float) -> int:
    """The run's exit code; on timeout its whole session (Ray's processes too) is killed and the code is -9."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -9


def metrics(path: Path) -> dict[int, dict]:
    """verl's file logger: step -> the metrics logged at that step."""
    return {row["step"]: row["data"] for row in map(json.loads, path.read_text().splitlines())}


# The end-to-end tests' runs: name -> (trainer processes, steps in all, loss_mode, the run it resumes)
RUNS = {
    "troll": (2, 2, "troll", None),
    "clip": (1, 1, "vanilla", None),
    "resumed": (2, 3, "troll_seq", "troll"),
}
TIMEOUT = 600  # seconds a run may take


class Runs:
    """:data:`RUNS` in the background: ``troll`` and ``clip`` side by side, then ``resumed`` once ``troll`` is done.

    Started when the test session starts (tests/integrations/verl/conftest.py), so that their minutes of process
    start-up overlap the other verl tests; :meth:`results` waits for them. Each run's output is in ``root``.
    """

    def __init__(self, root: Path):
        self.root, self.procs, self.began, self.done = root, {}, {}, {}
        self.thread = threading.Thread(target=self._schedule, daemon=True)

    def start(self) -> None:
        self.model = write_model(self.root / "model")
        self.train, self.val = write_data(self.root / "data")
        self.thread.start()

    def folder(self, name: str) -> Path:
        return self.root / (RUNS[name][3] or name)  # a resumed run continues in the folder of the run it resumes

    def _launch(self, name: str) -> None:
        count, steps, loss, _ = RUNS[name]
        out = self.folder(name)
        out.mkdir(exist_ok=True)
        args = overrides(self.model, self.train, self.val, out, procs=count, steps=steps, loss=loss)
        self.began[name] = time.monotonic()
        self.procs[name] = start(args, environment(out, name), out / f"{name}.log")

    def _wait(self, name: str) -> None:
        code = finish(self.procs[name], TIMEOUT)
        self.done[name] = (code, time.monotonic() - self.began[name])

    def _schedule(self) -> None:
        try:
            self._launch("troll")
            self._launch("clip")
            self._wait("troll")
            self._launch("resumed")
            self._wait("clip")
            self._wait("resumed")
        finally:
            self.kill()

    def kill(self) -> None:
        """End every run still going (its whole session: Ray's processes too)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    def results(self) -> dict[str, dict]:
        """Each run's exit code, wall seconds, output, metrics by step, trainer record and folder."""
        self.thread.join(TIMEOUT * len(RUNS))
        out = {}
        for name in RUNS:
            code, seconds = self.done.get(name, (None, None))
            folder = self.folder(name)
            log = folder / f"{name}.log"
            out[name] = {
                "code": code,
                "seconds": seconds,
                "log": log.read_text() if log.exists() else "(not started)",
                "metrics": metrics(folder / f"metrics-{name}.jsonl") if code == 0 else {},
                "trainer": json.loads((folder / f"trainer-{name}.json").read_text()) if code == 0 else {},
                "out": folder,
            }
        return out


def demo(argv: list[str] | None = None) -> int:
    """``make verl-demo``: one run of ``python -m troll.integrations.verl.main`` on a saved model, then a table of the
    logged metrics of each step."""
    import argparse

    parser = argparse.ArgumentParser(description=demo.__doc__)
    parser.add_argument("--model", type=Path, required=True, help="a model folder (save_pretrained)")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the run")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--loss", default="troll")
    args = parser.parse_args(argv)
    if args.out.exists():
        parser.error(f"--out {args.out} exists; give a new folder")
    args.out.mkdir(parents=True)
    train, val = write_data(args.out / "data")
    cli = overrides(args.model, train, val, args.out, procs=args.procs, steps=args.steps, loss=args.loss, **DEMO_SIZE)
    began = time.monotonic()
    code = finish(start(cli, environment(args.out, "demo"), args.out / "demo.log"), timeout=4 * 3600)
    print(f"exit code {code} after {time.monotonic() - began:.0f} s; log: {args.out / 'demo.log'}")
    keys = ["critic/score/mean", "troll/kl_before/max", "troll/kl_after/max", "troll/projected_frac",
            "training/rollout_probs_diff_max", "response_length/mean", "timing_s/step"]  # fmt: skip
    if code == 0:
        print("| step | " + " | ".join(keys) + " |")
        for step, m in sorted(metrics(args.out / "metrics-demo.jsonl").items()):
            print(f"| {step} | " + " | ".join(f"{m[k]:.4g}" if k in m else "-" for k in keys) + " |")
    return code


if __name__ == "__main__":
    sys.exit(demo())
