"""Stale rollouts: TROLL around the policy that sampled ("sampler") vs the recomputed one, and the clip baseline.

docs/results.md, "Stale rollouts".

Async RL systems generate with weights one or more rollout batches old. This study emulates that on one CPU: a
``rollout_func`` generates each rollout batch from the weights the trainer had one rollout batch earlier (the first
batch from the initial weights) and returns, per completion position, the top-K log-probs of that stale policy at
the sampling temperature (vLLM's format). Three methods on the same task, seeds and settings:

    troll-sampler    TROLL, troll_old_policy="sampler": the trust region is around the stale policy that sampled
    troll-recompute  TROLL, troll_old_policy="recompute": around the trainer's weights when the batch is scored
    clip-tis         the paper's clip baseline (TRL "dapo", eps 0.2, dual clip 10) with TRL's importance-sampling
                     correction (vllm_importance_sampling_correction, TRL's default mode and cap) against the
                     stale sampler's log-probs

Reported per run: held-out greedy accuracy after training (before: once per seed, the same initial weights for all
methods) and, at every optimiser step, KL(pi_theta || pi_sampler) of the current weights over TROLL's sparse
support (troll.categorical.losses.sparse_kl_metrics), mean and max over the loss tokens; for TROLL also the logged
kl_after/max, the projected policy's KL to its own old policy (for troll-sampler: to the sampler, where the bound
must hold). Paired differences over seeds with 95% t-intervals (troll.study.stats.paired).

Departures: TRL's importance-sampling correction runs only with use_vllm=True, so clip-tis builds the trainer
without vLLM and then sets ``use_vllm`` with a stand-in engine whose sync_weights does nothing (generation is the
rollout_func's); the correction itself is TRL's code. Small settings for a 2-core CPU (one thread, SmolLM2-135M).

    python experiments/stale_rollouts.py --out studies/stale          # resumable: finished runs are kept
    python experiments/stale_rollouts.py --out studies/stale --report # the table from what has finished
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

METHODS = ("troll-sampler", "troll-recompute", "clip-tis")
PREFIX = "study_sampler_"


class StaleRollout:
    """A rollout_func generating from the weights one rollout batch old; keeps its last output (``last``)."""

    def __init__(self, model, *, top_k: int, nested: bool, fresh: bool = False):
        self.lag = copy.deepcopy(model).eval()
        self.top_k, self.nested, self.fresh, self.last = top_k, nested, fresh, None

    @torch.no_grad()
    def __call__(self, prompts, trainer):
        tok = trainer.processing_class
        if self.fresh:  # the control: generate from the current weights
            self.lag.load_state_dict(trainer.accelerator.unwrap_model(trainer.model).state_dict())
        texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
        enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        gen = self.lag.generate(**enc, do_sample=True, temperature=trainer.temperature, top_k=0, top_p=1.0,
                                max_new_tokens=trainer.max_completion_length, output_scores=True,
                                return_dict_in_generate=True, pad_token_id=tok.pad_token_id)  # fmt: skip
        # the next batch samples from the weights this one is trained with
        self.lag.load_state_dict(trainer.accelerator.unwrap_model(trainer.model).state_dict())
        new = gen.sequences[:, enc["input_ids"].shape[1] :]
        logp = torch.log_softmax(torch.stack(gen.scores, 1).float(), -1)  # scores after the temperature warper
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "logprob_token_ids": [], "sampled": []}
        for i in range(len(prompts)):
            ids = new[i].tolist()
            if tok.eos_token_id in ids:
                ids = ids[: ids.index(tok.eos_token_id) + 1]
            top = logp[i, : len(ids)].topk(self.top_k)
            lps, tids = top.values.tolist(), top.indices.tolist()
            for t, token in enumerate(ids):
                if token not in tids[t]:
                    tids[t].append(token)
                    lps[t].append(float(logp[i, t, token]))
            out["prompt_ids"].append(enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist())
            out["completion_ids"].append(ids)
            out["logprobs"].append(lps)
            out["logprob_token_ids"].append(tids)
            out["sampled"].append([float(logp[i, t, token]) for t, token in enumerate(ids)])
        self.last = out
        sampled = out.pop("sampled")
        if not self.nested:  # TRL's own format: the sampled tokens' log-probs, for its importance sampling
            out = {**out, "logprobs": sampled}
            out.pop("logprob_token_ids")
        return out


def study_trainer_class():
    from troll.categorical.losses import sparse_kl_metrics
    from troll.categorical.policy import DenseLogits
    from troll.categorical.sparse import SparseLogProbs
    from troll.integrations.sampler import fit_length, sparse_from_topk
    from troll.integrations.trl import TrollGRPOTrainer
    from troll.integrations.trl.trainer import loss_mask

    class StudyTrainer(TrollGRPOTrainer):
        """Stores the stale sampler's policy in every batch and logs KL(pi_theta || pi_sampler) at each step."""

        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            last = self.rollout_func_study.last
            if self.model.training and last is not None:
                old = sparse_from_topk(last["logprobs"], last["logprob_token_ids"], last["completion_ids"],
                                       vocab_size=self._troll_vocab_size(), top_k=self.args.troll_top_k,
                                       delta=self.args.troll_delta)  # fmt: skip
                batch.update(fit_length(old, batch["completion_ids"].shape[1]).to_dict(prefix=PREFIX))
            return batch

        def _compute_loss(self, model, inputs):
            loss = super()._compute_loss(model, inputs)
            if f"{PREFIX}ids" in inputs and model.training:
                with torch.no_grad():
                    logits = self._troll_logits(model, inputs)
                    old = SparseLogProbs.from_dict(inputs, prefix=PREFIX)
                    rule = dict(kl_bound=0.05, top_k=self.args.troll_top_k, delta=self.args.troll_delta,
                                tail="bucket", fill=1e-12)  # fmt: skip
                    m = sparse_kl_metrics(DenseLogits(logits.reshape(-1, logits.shape[-1])), old,
                                          inputs["completion_ids"], loss_mask(inputs), **rule)  # fmt: skip
                keys = {"study/kl_to_sampler/mean": m["kl_before/mean"], "study/kl_to_sampler/max": m["kl_before/max"]}
                self._troll_log(keys, loss_mask(inputs))
            return loss

    return StudyTrainer


def run_one(method: str, seed: int, args, out: Path) -> dict:
    from troll.integrations.trl import TrollGRPOConfig
    from troll.lm import model as model_lib
    from troll.lm import run as run_lib
    from troll.lm import tasks
    from troll.lm.evaluate import heldout_accuracy
    from troll.lm.options import RunOptions

    torch.manual_seed(seed)
    loss = "troll" if method.startswith("troll") else "clip"
    opts = RunOptions(task=args.task, loss=loss, steps=args.steps, lr=args.lr, prompts_per_step=args.prompts,
                      generations=args.generations, max_completion_length=args.max_len,
                      steps_per_rollout=args.steps_per_rollout, heldout=args.heldout, seed=seed, measure_kl="off",
                      system=args.system, out=str(out / f"{method}-seed{seed}")).resolved()  # fmt: skip
    config = run_lib.build_config(opts, TrollGRPOConfig)
    config.save_strategy = "no"  # a finished run's json is the resume unit; checkpoints would cost ~1 GB each
    if method == "troll-sampler":
        config.troll_old_policy = "sampler"
    model, tok = model_lib.load_model(model_lib.resolve_model(opts.model))
    task = run_lib._build_task(opts)
    rollout = StaleRollout(model, top_k=args.top_k, nested=method == "troll-sampler", fresh=args.fresh)
    config.troll_top_k = args.top_k
    trainer = study_trainer_class()(model=model, reward_funcs=[tasks.TaskReward(task.train)], args=config,
                                     train_dataset=tasks.train_dataset(task, True), processing_class=tok,
                                     rollout_func=rollout)  # fmt: skip
    trainer.rollout_func_study = rollout
    if method == "clip-tis":  # TRL's correction, which it applies only with vLLM (module docstring)
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
        trainer.vllm_generation, trainer._last_loaded_step = SimpleNamespace(sync_weights=lambda: None), -1
    run_lib._quiet_trainer(trainer)
    t0 = time.time()
    trainer.train()
    after = heldout_accuracy(trainer.model, tok, task, max_new_tokens=args.max_len)
    logs = [e for e in trainer.state.log_history if "loss" in e]
    pick = ("study/kl_to_sampler/mean", "study/kl_to_sampler/max", "troll/kl_after/max", "troll/projected_frac")
    return {"method": method, "seed": seed, "accuracy": after.accuracy, "score": after.score,
            "train_s": round(time.time() - t0, 1), "steps": [{k: e.get(k) for k in pick} for e in logs]}  # fmt: skip


def before_accuracy(seed: int, args) -> float:
    from troll.lm import model as model_lib
    from troll.lm import run as run_lib
    from troll.lm.evaluate import heldout_accuracy
    from troll.lm.options import RunOptions

    opts = RunOptions(task=args.task, steps=args.steps, steps_per_rollout=args.steps_per_rollout,
                      prompts_per_step=args.prompts, generations=args.generations, heldout=args.heldout, seed=seed,
                      system=args.system)  # fmt: skip
    opts = opts.resolved()
    model, tok = model_lib.load_model(model_lib.resolve_model(opts.model))
    return heldout_accuracy(model, tok, run_lib._build_task(opts), max_new_tokens=args.max_len).accuracy


def report(out: Path, args) -> str:
    from troll.study.stats import paired, summarize

    runs = [r for r in (json.loads(p.read_text()) for p in sorted(out.glob("*-seed*.json"))) if "method" in r]
    before = {json.loads(p.read_text())["seed"]: json.loads(p.read_text())["accuracy"] for p in out.glob("before-*")}
    acc = {m: {r["seed"]: r["accuracy"] for r in runs if r["method"] == m} for m in METHODS}
    lines = [f"held-out accuracy before (per seed): {dict(sorted(before.items()))}", "",
             "| method | seeds | accuracy after (mean +- se) | KL to sampler, mean of step means | max over steps "
             "| troll kl_after max | wall s / run |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for m in METHODS:
        rs = [r for r in runs if r["method"] == m]
        if not rs:
            continue
        s = summarize(list(acc[m].values()))
        kl_mean = [
            st["study/kl_to_sampler/mean"]
            for r in rs
            for st in r["steps"]
            if st.get("study/kl_to_sampler/mean") is not None
        ]
        kl_max = [
            st["study/kl_to_sampler/max"]
            for r in rs
            for st in r["steps"]
            if st.get("study/kl_to_sampler/max") is not None
        ]
        after = [st["troll/kl_after/max"] for r in rs for st in r["steps"] if st.get("troll/kl_after/max") is not None]
        se = "" if s["se"] is None else f" +- {s['se']:.3f}"
        lines.append(f"| {m} | {s['n']} | {s['mean']:.3f}{se} | {sum(kl_mean) / max(len(kl_mean), 1):.4f} | "
                     f"{max(kl_max, default=float('nan')):.4f} | {f'{max(after):.4f}' if after else 'n/a'} | "
                     f"{sum(r['train_s'] for r in rs) / len(rs):.0f} |")  # fmt: skip
    lines.append("")
    for a, b in (("troll-sampler", "troll-recompute"), ("troll-sampler", "clip-tis"), ("troll-recompute", "clip-tis")):
        d = paired(acc[a], acc[b])
        ci = "n/a" if d["ci95"] is None else f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
        mean = "n/a" if d["mean"] is None else f"{d['mean']:+.3f}"
        lines.append(f"- accuracy {a} - {b}: {mean} over {d['n']} seeds, 95% t-interval {ci}")
    return "\n".join(lines)


def _values(runs: list[dict], key: str) -> list[float]:
    return [step[key] for r in runs for step in r["steps"] if step.get(key) is not None]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--task", default="chain_sum")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--steps-per-rollout", type=int, default=2)
    p.add_argument("--prompts", type=int, default=2, help="prompts per optimiser step")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-len", type=int, default=8, help="max completion tokens")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--top-k", type=int, default=20, help="top log-probs the rollout returns, and TROLL's top_k")
    p.add_argument("--heldout", type=int, default=64)
    p.add_argument("--system", default="You are a helpful AI assistant.")
    p.add_argument("--fresh", action="store_true", help="control: generate from the current weights (no staleness)")
    p.add_argument("--report", action="store_true", help="only print the table of the finished runs")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for seed in range(args.seeds):
            path = args.out / f"before-seed{seed}.json"
            if not path.exists():
                path.write_text(json.dumps({"seed": seed, "accuracy": before_accuracy(seed, args)}))
            for method in args.methods:
                path = args.out / f"{method}-seed{seed}.json"
                if path.exists():
                    continue
                result = run_one(method, seed, args, args.out)
                path.write_text(json.dumps(result))
                print(f"{method} seed {seed}: accuracy {result['accuracy']:.3f} ({result['train_s']} s)", flush=True)
    text = report(args.out, args)
    (args.out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
