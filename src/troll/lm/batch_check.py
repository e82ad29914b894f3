"""Check a finished run's TROLL loss on that run's own batch against the float64 reference.

``python -m troll.lm.batch_check RUN [--step N]`` answers "was the loss right in *this* run?" for a run (or a
study cell) of ``troll train`` with a TROLL loss. Runs do not store their batches, so it rebuilds the batch:

1. It reruns RUN from its config.json (same options, seed and thread count, hence the same prompts, samples and
   updates) in a temporary folder, up to optimiser step N (default: the run's last step, which is off-policy whenever
   a rollout batch feeds more than one step).
2. It checks that the rerun logged the same loss as RUN at every step before N (relative difference at most 1e-5).
3. At step N, on the first micro-batch, before the optimiser touches it, it computes the loss three ways:
   - ``trained``: the trainer's own loss, on the LM-head path the run used (float32);
   - ``dense``: the library's :func:`troll.categorical.losses.troll_loss` in float64, on the same weights' logits
   cast to it;
   - ``reference``: :mod:`troll.categorical.reference`'s dense float64 loss, written from the equations of
   docs/method.md,
     against the old policy completed over the whole vocabulary as "The sparse support and the rest bucket" says
     (stored log-probs on the old kept ids, the unkept mass spread uniformly on the rest of the support, and
     inside the rest the old mass in the current policy's shape; the support takes the current policy's kept ids
     as the library chose them, which matters where ids tie at the cut); with ``--tail renormalize``, the paper's
     representation position by position (:func:`troll.categorical.reference.troll_loss_renormalized`).
   It also compares the gradient: the directional derivative of ``dense`` along a random direction in logit space
   (autograd) against central finite differences of the reference, with the old policy and the projection inside
   the regression term held fixed, as the loss's gradient treats them.
4. The trainer's loss at step N, scaled as TRL scales it, must equal the loss RUN logged at step N: the batch checked
   is the one RUN trained on.

Prints a table and writes the numbers as JSON (``--json``); exit status 1 if a difference exceeds its tolerance
(float32 ``trained``: 2e-6 + 1e-3 x |reference|; float64 ``dense``: 1e-9 + 1e-6 x |reference|; the derivative: relative
1e-4), 2 on bad input. It warns when the projection was inactive on every token of the batch (then only the
policy-gradient term is checked). The rerun costs about as much as the run up to step N, with the run's own thread
count.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from troll.lm.metrics import off_policy_rows
from troll.lm.options import TROLL_LOSSES, bound_name, saved_options
from troll.runs.files import CONFIG_FILE, METRICS_FILE, UsageError, read_jsonl

TOLERANCES = {"trained_minus_reference": (2e-6, 1e-3), "dense_minus_reference": (1e-9, 1e-6)}  # (abs, rel)
DERIVATIVE_RTOL = 1e-4
RERUN_RTOL = 1e-5
FD_STEP = 1e-6
# The report's first rows, in this order; the rest follow as computed.
REPORT_HEAD = (
    "positions",
    "projected_positions",
    "sequences",
    "trained",
    "dense",
    "reference",
    "trained_minus_reference",
)


class _Stop(Exception):
    """Raised from inside the trainer once step N's batch has been checked."""


def completed_old_logp(logits, old, tokens, *, top_k: int, delta: float, new_kept=None):
    """(B, T, V) float64 log-probs of the old policy over the whole vocabulary, completed from the sparse ``old``
    as the rest bucket assumes (docs/method.md, "The sparse support and the rest bucket").

    The support U per position is the old kept ids, the new kept ids (the kept rule on ``logits``) and the sampled
    token. On U: the stored log-prob where the old policy kept the id, else R / (V - |kept|), R the old unkept mass.
    Outside U: the remaining old mass R (V - |U|) / (V - |kept|), spread in the current policy's shape.

    ``new_kept``: the new kept ids per position ((B, T) nested lists) as the library chose them, in place of
    :func:`troll.categorical.reference.kept_set`'s. Where tokens tie at the cut (SmolLM2 has ids with equal logits),
    both
    choices are kept sets, but the completion, and with it the loss's gradient, depends on which ids are in U. The
    given sets are checked to be kept sets: the same probabilities as the reference's, ties aside.
    """
    import torch

    from troll.categorical import reference

    new = torch.log_softmax(logits.double(), -1)
    bsz, seq, vocab = new.shape
    out = torch.empty_like(new)
    for i in range(bsz):
        for t in range(seq):
            ids, logp, rest = _old_row(old, i, t)
            ids = ids.tolist()
            if rest <= 0.0 and len(ids) < vocab:
                raise ValueError(f"position ({i}, {t}): the old policy's unkept mass is {rest}; no finite completion")
            kept = reference.kept_set(new[i, t], top_k, delta)
            if new_kept is not None:
                given = list(new_kept[i][t])
                if not torch.equal(new[i, t][given].sort().values, new[i, t][kept].sort().values):
                    raise RuntimeError(f"position ({i}, {t}): the library's kept ids are not a kept set of the rule")
                kept = given
            support = set(ids) | set(kept) | {int(tokens[i, t])}
            others = vocab - len(ids)
            row = torch.full((vocab,), math.log(rest / others) if others else -math.inf, dtype=torch.float64)
            row[ids] = logp
            outside = torch.ones(vocab, dtype=torch.bool)
            outside[sorted(support)] = False
            if bool(outside.any()):
                shape = torch.log_softmax(new[i, t][outside], -1)
                row[outside] = shape + math.log(rest * int(outside.sum()) / others)
            out[i, t] = row
    return out


def loss_settings(opts) -> dict:
    """The keywords of :func:`troll.categorical.losses.troll_loss` that ``opts`` (a run's saved options) asks for,
    read from the
    options themselves rather than from the trainer that ran them."""
    from troll.categorical.defaults import TAIL_FILL, troll_agg, troll_level

    opts = opts.resolved()
    level, agg = troll_level(opts.loss), troll_agg(opts.loss, opts.agg)
    return dict(kl_bound=opts.bound, alpha=opts.alpha, top_k=opts.top_k, delta=opts.delta, level=level, agg=agg,
                max_len=opts.max_completion_length, tail=opts.tail, fill=TAIL_FILL)  # fmt: skip


def check_batch(trainer, model, inputs: dict, kwargs: dict, *, seed: int = 0) -> dict:
    """The three losses and the two derivatives of one micro-batch (see the module docstring); ``kwargs`` are the
    run's loss settings (:func:`loss_settings`)."""
    import torch

    from troll.categorical.sparse import SparseLogProbs
    from troll.integrations.trl.trainer import loss_mask

    tokens, mask, adv = inputs["completion_ids"], loss_mask(inputs), inputs["advantages"]
    old = SparseLogProbs.from_dict(inputs)
    trained = float(trainer._troll_compute_loss(model, inputs).loss.detach())
    logged_as = trained * float(trainer._troll_loss_scale(inputs, mask))  # what TRL logs as the step's loss
    with torch.no_grad():
        logits = trainer._troll_logits(model, inputs).double()
    r = check_logits(logits, old, tokens, adv, mask, kwargs, seed=seed)
    r |= {"trained": trained, "trained_minus_reference": trained - r["reference"], "trained_logged_as": logged_as}
    return {k: r[k] for k in REPORT_HEAD} | r


def check_logits(logits, old, tokens, adv, mask, kwargs: dict, *, seed: int = 0) -> dict:
    """The library's float64 loss at these (B, T, V) logits against the reference, in value and in a directional
    derivative (:func:`check_batch` without the trainer)."""
    import torch

    from troll.categorical.losses import troll_loss

    x = logits.clone().requires_grad_(True)
    dense = troll_loss(x, old, tokens, adv.double(), mask, **kwargs).loss
    value_dense = float(dense.detach())
    (grad,) = torch.autograd.grad(dense, x)
    direction = torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    direction = direction * mask.unsqueeze(-1)
    ref, ref_frozen, projected = _references(logits, old, tokens, adv, mask, kwargs)
    value = ref(logits)
    # The loss's gradient treats the projection in the regression term KL(pi~ || sg(pi)) as a constant
    # (docs/method.md, "The loss"), so the finite differences hold it fixed at the batch's logits.
    fd = (ref_frozen(logits + FD_STEP * direction) - ref_frozen(logits - FD_STEP * direction)) / (2 * FD_STEP)
    autograd = float((grad * direction).sum())
    return {
        "positions": int(mask.sum()),
        "projected_positions": projected,
        "sequences": int(tokens.shape[0]),
        "dense": value_dense,
        "reference": value,
        "dense_minus_reference": value_dense - value,
        "derivative_autograd": autograd,
        "derivative_reference_fd": fd,
        "derivative_rel_diff": abs(autograd - fd) / max(abs(fd), 1e-12),
    }


def _references(logits, old, tokens, adv, mask, kwargs: dict) -> tuple[Callable, Callable, int]:
    """(the float64 reference loss as a function of the (B, T, V) logits, the same with the projection of its
    regression term frozen at ``logits``, the number of projected positions), for the tail rule of ``kwargs``."""
    import torch

    from troll.categorical import reference

    level, agg, alpha, bound = kwargs["level"], kwargs["agg"], kwargs["alpha"], kwargs["kl_bound"]
    if kwargs["tail"] == "renormalize":
        rule = dict(top_k=kwargs["top_k"], delta=kwargs["delta"], fill=kwargs["fill"])
        old_logits = _old_logits_renormalize(old, logits.shape[-1])
        frozen = _renormalized_projection(logits, old_logits, tokens, mask, bound, rule)
        projected = sum(int(eta > 0) for _, _, eta in frozen.values())

        def ref(z):
            return float(reference.troll_loss_renormalized(z, old_logits, tokens, adv, mask, kl_bound=bound,
                                                           alpha=alpha, **rule))  # fmt: skip

        def ref_frozen(z):  # the regression term against the projection frozen at the batch's logits
            pg = reference.troll_loss_renormalized(z, old_logits, tokens, adv, mask, kl_bound=bound, alpha=0.0, **rule)
            reg = [_kl_on(z[i, t], old_logits[i, t], int(tokens[i, t]), rule, frozen[i, t]) for i, t in frozen]
            return float(pg + alpha * sum(reg) / max(len(reg), 1))
    else:
        new_kept = _library_kept(logits, kwargs["top_k"], kwargs["delta"])
        old_logits = completed_old_logp(logits, old, tokens, top_k=kwargs["top_k"], delta=kwargs["delta"],
                                        new_kept=new_kept)  # fmt: skip
        agg_kw = dict(level=level, agg=agg, max_len=kwargs["max_len"])
        frozen, eta, _, _ = reference.project(logits, old_logits, bound)
        projected = int(((eta > 0) & mask).sum())

        def ref(z):
            return float(reference.troll_loss(z, old_logits, tokens, adv, mask, kl_bound=bound, alpha=alpha, **agg_kw))

        def ref_frozen(z):
            pg = reference.troll_loss(z, old_logits, tokens, adv, mask, kl_bound=bound, alpha=0.0, **agg_kw)
            a = torch.log_softmax(z, -1)
            reg = (a.exp() * (a - frozen)).sum(-1)
            return float(pg + alpha * reference.aggregate(reg, mask, agg, kwargs["max_len"]))

    return ref, ref_frozen, projected


def _renormalized_projection(logits, old_logits, tokens, mask, bound: float, rule: dict) -> dict:
    """{(i, t): (support ids, projected log-probs, eta)} of the paper's representation at every loss position."""
    from troll.categorical import reference

    out = {}
    for i, t in mask.nonzero().tolist():
        ids, a, b = reference.renormalized_row(logits[i, t], old_logits[i, t], int(tokens[i, t]), **rule)
        logp, eta, _, _ = reference.project_row(a, b, bound)
        out[(i, t)] = (ids, logp, eta)
    return out


def _library_kept(logits, top_k: int, delta: float) -> list[list[list[int]]]:
    """The new kept ids per position, (B, T) nested lists, as :func:`troll.categorical.losses.troll_loss` picks them
    on these
    logits (the same rows in one call, hence the same ties broken the same way)."""
    from troll.categorical.policy import DenseLogits

    bsz, seq, vocab = logits.shape
    ids, mask = DenseLogits(logits.reshape(-1, vocab)).kept(top_k, delta)
    rows = [r[m].tolist() for r, m in zip(ids, mask)]
    return [rows[i * seq : (i + 1) * seq] for i in range(bsz)]


def _kl_on(new_row, old_row, token: int, rule: dict, frozen):
    """KL(pi~ || pi) on the support of the paper's representation, pi the frozen projection (same ids)."""
    from troll.categorical import reference

    ids, a, _ = reference.renormalized_row(new_row, old_row, token, **rule)
    if ids != frozen[0]:
        raise RuntimeError("the finite-difference step changed the support; rerun with another --seed")
    return (a.exp() * (a - frozen[1])).sum()


def _old_logits_renormalize(old, vocab: int):
    """Dense old log-probs whose kept set under the kept rule is the stored one: stored values on the kept ids, the
    unkept mass spread evenly elsewhere (the renormalised representation reads only the kept ids' values)."""
    import torch

    bsz, seq = old.ids.shape[:2]
    out = torch.empty(bsz, seq, vocab, dtype=torch.float64)
    for i in range(bsz):
        for t in range(seq):
            ids, logp, rest = _old_row(old, i, t, from_log_rest=False)
            out[i, t] = math.log(max(rest, 1e-300) / max(vocab - len(ids), 1))
            out[i, t, ids] = logp
    return out


def _old_row(old, i: int, t: int, *, from_log_rest: bool = True):
    """Position (i, t) of the sparse ``old``: its kept ids, their log-probs in float64 and its unkept mass R (the
    stored ``log_rest`` when there is one and ``from_log_rest``, else 1 - the kept mass)."""
    keep = old.mask[i, t]
    ids, logp = old.ids[i, t][keep], old.logp[i, t][keep].double()
    if from_log_rest and old.log_rest is not None:
        return ids, logp, math.exp(float(old.log_rest[i, t]))
    return ids, logp, 1.0 - float(logp.exp().sum())


def _checked_run(run: Path, step: int | None) -> tuple:
    """(options, loss settings, step, {step: logged loss}) of a run the check covers, at ``step`` (None: its last);
    UsageError naming what to pass instead otherwise, before anything is rerun."""
    if not (run / CONFIG_FILE).is_file():
        raise UsageError(f"{run} has no {CONFIG_FILE}: pass the folder of a troll train run or study cell")
    try:
        opts = saved_options(run)
    except UsageError as err:
        raise UsageError(
            f"RUN: {run / CONFIG_FILE} holds no valid run options; pass a run or study cell folder "
            "(for example <study>/lr=2e-05/troll/seed0), not a study folder"
        ) from err
    if opts.steps_per_rollout == 1:
        raise UsageError(f"{run} ran with --steps-per-rollout 1: every step is on-policy, no old policy is stored")
    settings = loss_settings(opts)
    if settings["tail"] == "renormalize" and (settings["level"], settings["agg"]) != ("token", "token-mean"):
        raise UsageError(
            f"{run}: the reference for --tail renormalize covers --loss troll with token-mean aggregation only"
        )
    if opts.loss not in TROLL_LOSSES:
        raise UsageError(f"{run} trained with --loss {opts.loss}; the check covers the TROLL losses ({TROLL_LOSSES})")
    step = opts.steps if step is None else step
    if not 1 <= step <= opts.steps:
        raise UsageError(f"--step must be between 1 and the run's {opts.steps} steps, got {step}; pass one in range")
    logged = {r["step"]: r["loss"] for r in read_jsonl(run / METRICS_FILE) if r.get("loss") is not None}
    if any(s not in logged for s in range(1, step + 1)):
        raise UsageError(
            f"{run / METRICS_FILE} lacks the loss of step {step} or an earlier one; pass a finished run, or a --step "
            "it has logged"
        )
    return opts, settings, step, logged


def rerun_and_check(run: Path, step: int | None = None, *, seed: int = 0) -> dict:
    """Rerun ``run`` to ``step``, check the rerun against its log, and check the loss there (module docstring)."""
    from troll.lm import run as run_lib

    opts, settings, step, logged = _checked_run(run, step)
    _, trainer_cls = run_lib.trainer_classes(opts.loss)
    original = trainer_cls._compute_loss
    result = {}

    def compute_loss(self, model, inputs):
        if self.model.training and self.state.global_step + 1 == step and not result:
            result.update(check_batch(self, model, inputs, settings, seed=seed))
            raise _Stop
        return original(self, model, inputs)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "rerun")
        trainer_cls._compute_loss = compute_loss
        try:
            run_lib.train(dataclasses.replace(opts, out=str(out)), save_model=False)
        except _Stop:
            pass
        finally:
            trainer_cls._compute_loss = original
        rerun = {r["step"]: r["loss"] for r in read_jsonl(out / METRICS_FILE) if "loss" in r}
    if not result:
        raise RuntimeError(f"the rerun finished without reaching step {step}")
    diffs = [_rel(rerun.get(s), logged[s]) for s in range(1, step)]
    diffs.append(_rel(result.pop("trained_logged_as"), logged[step]))
    return {
        "run": str(run),
        "step": step,
        "off_policy": bool(off_policy_rows([{"step": step}], opts.steps_per_rollout)),
        "loss": opts.loss,
        "tail": opts.tail,
        bound_name(opts.loss): opts.bound,
        "rerun_steps_compared": len(diffs),
        "rerun_max_rel_diff": math.inf if any(math.isnan(d) for d in diffs) else max(diffs),
        **result,
    }


def _rel(a, b) -> float:
    """|a - b| / max(|b|, 1e-8); NaN when either is missing or not finite (a check that cannot pass)."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return math.nan
    return abs(a - b) / max(abs(b), 1e-8)


def verdict(r: dict) -> list[str]:
    """What is out of tolerance in a :func:`rerun_and_check` result (empty: everything holds)."""
    bad = []
    if not r["rerun_max_rel_diff"] <= RERUN_RTOL:
        bad.append(f"the rerun's loss differs from the run's log by {r['rerun_max_rel_diff']:.2e} (relative)")
    for key, (atol, rtol) in TOLERANCES.items():
        if not abs(r[key]) <= atol + rtol * abs(r["reference"]):
            bad.append(f"{key} = {r[key]:.3e}")
    if not r["derivative_rel_diff"] <= DERIVATIVE_RTOL:
        bad.append(f"directional derivative: relative difference {r['derivative_rel_diff']:.3e}")
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m troll.lm.batch_check", description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a finished troll train folder (or study cell) with a TROLL loss")
    p.add_argument("--step", type=int, help="optimiser step whose batch is checked (default: the run's last)")
    p.add_argument("--json", type=Path, help="also write the numbers here (refuses an existing file)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random direction (default: 0)")
    args = p.parse_args(argv)
    try:
        if args.json is not None and args.json.exists():
            raise UsageError(f"--json: {args.json} exists; pass a new file name")
        if args.json is not None and not args.json.parent.is_dir():
            raise UsageError(f"--json: the folder {args.json.parent} does not exist; create it or pass another path")
        r = rerun_and_check(args.run, args.step, seed=args.seed)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for key, value in r.items():
        print(f"{key:>26}: {value:.6g}" if isinstance(value, float) else f"{key:>26}: {value}")
    bad = verdict(r)
    if r["projected_positions"] == 0:
        print("warning: the projection was inactive on every token of this batch; only the policy-gradient term "
              "was checked (pick an off-policy --step)")  # fmt: skip
    print("FAILED: " + "; ".join(bad) if bad else "ok: the loss of this batch matches the float64 reference")
    if args.json is not None:
        args.json.write_text(json.dumps(r | {"ok": not bad}, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
