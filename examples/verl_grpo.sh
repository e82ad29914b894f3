#!/usr/bin/env bash
# GRPO with TROLL's trust region in place of PPO's clip, with verl 0.9 on one GPU node (docs/verl.md).
#
# A GSM8K GRPO run of verl's usual shape, launched through troll's entry point (verl's main_ppo with TROLL's engine,
# loss and trainer switched in; no fork), with TROLL's overrides: the eleven lines from `actor._target_` to
# `model.use_remove_padding` (docs/verl.md lists what each does). Everything else is plain verl: change the model,
# data, batch sizes or rollout engine as in any verl run. Needs a GPU node: verl 0.9 has no CPU platform.
#
#   pip install 'troll[verl]' vllm      # troll with verl >=0.9,<0.10, and a rollout engine
#   # DATA: a folder with verl's GSM8K train.parquet and test.parquet (verl's examples/data_preprocess/gsm8k.py)
#   MODEL=Qwen/Qwen2.5-0.5B-Instruct DATA=~/data/gsm8k N_GPUS=8 bash examples/verl_grpo.sh trainer.total_epochs=1
#
# Extra arguments are passed on as further Hydra overrides. Multi-node: start Ray on every node and add
# trainer.nnodes=<n> (docs/verl.md, "Multi-node").
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
N_GPUS=${N_GPUS:-8}

python -m troll.integrations.verl.main \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor._target_=troll.integrations.verl.config.TrollFSDPActorConfig \
    actor_rollout_ref.actor.policy_loss.loss_mode=troll \
    actor_rollout_ref.actor.strategy=fsdp2 \
    +actor_rollout_ref.actor.troll.kl_bound=0.05 \
    +actor_rollout_ref.actor.troll.alpha=1.0 \
    +actor_rollout_ref.actor.troll.top_k=64 \
    +actor_rollout_ref.actor.troll.delta=1e-5 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.use_remove_padding=True \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes=1 \
    trainer.logger='["console"]' \
    trainer.project_name=troll \
    trainer.experiment_name=gsm8k-troll \
    trainer.total_epochs=15 \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    "$@"
