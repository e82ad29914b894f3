"""``troll study``: the language-model frontend of the study engine (:mod:`troll.study`).

The grid is losses x seeds, optionally swept over one ``troll train`` option; each cell is a ``troll train`` run,
started as ``python -m troll.cli train --options FILE``, its options as data (:mod:`troll.study.options`). What this
module adds to the engine: the grid's options (:class:`StudySpec`: the base RunOptions, with the TROLL losses'
``kl_bound`` and the clip losses' ``clip_eps``), a cell's command line and options, the numbers of a cell (held-out
accuracy before and after, reward of the last quarter, final entropy, and over the off-policy steps the largest KL
after projection or the clipped share), the pairs (each TROLL loss minus each baseline) and the curves against
optimiser steps. Cells drop their checkpoints and final model when they finish unless ``--keep-checkpoints`` /
``--keep-model``: a cell then holds config.json, metrics.jsonl, summary.json and plots.png (a few hundred kB).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path

from troll.categorical.defaults import TROLL_LOSSES
from troll.lm import checkpoints, options
from troll.lm.compare import parse_losses
from troll.lm.metrics import off_policy_rows
from troll.lm.options import LOSSES, RunOptions
from troll.study import Cell, Curve, Frontend, Grid, Number, Pairing, Study, UsageError, runner, stats
from troll.study import grid as grid_lib
from troll.study import options as cell_options_file

__all__ = [
    "StudySpec",
    "cell_argv",
    "cell_metrics",
    "frontend",
    "load_spec",
    "parse_arms",
    "parse_losses",
    "split_arm",
    "parse_sweep",
    "plan",
    "run",
]

COMMAND = "study"  # config.json's "command": a folder is resumed only by the command that wrote it
# Run options a sweep may not name: the grid already varies loss and seed, and out is the study's.
NOT_SWEPT = frozenset({"loss", "seed", "out"})
# The bounds a study sweeps (--sweep kl-bound=..., clip-eps=...): each reaches the losses of its family only.
SWEEP_BOUNDS = {"kl_bound": float, "clip_eps": float}
SWEEP_BOUND_HINT = " A loss's bound is swept as kl-bound=... (the TROLL losses') or clip-eps=... (the clip losses')."


@dataclass
class StudySpec:
    """The grid of a study: ``base`` options (shared, without a loss; ``kl_bound``: the TROLL losses' bound,
    ``clip_eps``: the clip losses'), losses, seeds, one optional swept option."""

    base: RunOptions
    losses: list[str]
    seeds: list[int]
    sweep_key: str | None = None  # a RunOptions field name
    sweep_values: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.base.loss is not None:  # the arms give the loss: the base is the options they share
            self.base = dataclasses.replace(self.base, loss=None)

    @property
    def grid(self) -> Grid:
        return Grid(self.losses, self.seeds, self.sweep_key, self.sweep_values)

    def to_json(self) -> dict:
        return {
            "base": self.base.to_json(),
            "losses": self.losses,
            "seeds": self.seeds,
            "sweep_key": self.sweep_key,
            "sweep_values": self.sweep_values,
        }

    @classmethod
    def from_json(cls, data: dict) -> StudySpec:
        """The grid :meth:`to_json` saved."""
        base = RunOptions.from_json(data["base"], shared=True)
        return cls(base, list(data["losses"]), [int(s) for s in data["seeds"]], data.get("sweep_key"),
                   list(data.get("sweep_values") or []))  # fmt: skip


def load_spec(out: Path) -> StudySpec:
    """The grid saved in a study folder's config.json (UsageError when it is missing or damaged)."""
    data = runner.load_spec(out)
    try:
        return StudySpec.from_json(data)
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"--resume: {out / options.CONFIG_FILE} holds a damaged study spec ({err}).") from err


def parse_sweep(text: str, types: dict[str, type]) -> tuple[str, list]:
    """``--sweep KEY=V1,V2``: one run option, never the loss, the seed or the folder."""
    return grid_lib.parse_sweep(text, types, NOT_SWEPT, hint=SWEEP_BOUND_HINT)


ARM_SEP = ":"  # an arm with options: LOSS:KEY=VALUE[:KEY=VALUE...], e.g. troll:tail=renormalize


def split_arm(arm: str) -> tuple[str, dict]:
    """``"troll:kl-bound=0.2:tail=renormalize"`` -> ("troll", {"kl_bound": 0.2, "tail": "renormalize"}): the loss and
    the run options this arm sets on top of the study's (KEY in flag form, any option --sweep takes; the loss's bound
    under the name ``troll train`` gives it, kl-bound, clip-eps or cispo-cap; UsageError otherwise)."""
    loss, *parts = [part.strip() for part in arm.split(ARM_SEP)]
    if loss not in LOSSES:
        raise UsageError(f"unknown loss {loss!r} in --losses; choose from: {', '.join(LOSSES)}.")
    own = options.bound_name(loss)
    types = {k: v for k, v in options.field_types().items() if k not in NOT_SWEPT}
    overrides = {}
    for part in parts:
        key, sep, raw = part.partition("=")
        name = key.strip().replace("-", "_")
        if sep and name in options.BOUNDS:
            try:
                options.check_bound_name(loss, name, form="{}=", subject="the loss")
            except UsageError as err:
                raise UsageError(f"--losses {arm}: {err}") from None
        if not sep or name not in types or name in overrides:
            allowed = ", ".join(sorted(k.replace("_", "-") for k in types if k == own or k not in options.BOUNDS))
            raise UsageError(
                f"--losses {arm}: {part!r} is not KEY=VALUE with KEY one of {allowed}, each once (e.g. "
                f"{loss}:{own.replace('_', '-')}=0.2)."
            )
        try:
            overrides[name] = types[name](raw.strip())
        except ValueError:
            raise UsageError(f"--losses {arm}: {key.strip()} must be a {types[name].__name__}, got {raw!r}.") from None
    return loss, overrides


def parse_arms(text: str) -> list[str]:
    """``--losses`` of a study: losses, each optionally with its own options (``troll:tail=renormalize``), each once."""
    arms = [s.strip() for s in text.split(",")]
    if not text.strip() or not all(arms):
        raise UsageError(f"--losses {text!r} is empty or has an empty entry; give e.g. --losses troll,clip.")
    if len(set(arms)) != len(arms):
        raise UsageError(f"--losses names a loss twice: {text}; list each once.")
    for arm in arms:
        split_arm(arm)
    return arms


def arm_loss(arm: str) -> str:
    return arm.split(ARM_SEP)[0].strip()


def cell_options(spec: StudySpec, value, arm: str, seed: int, folder: Path) -> RunOptions:
    """The resolved, value-checked options of one cell (UsageError naming the flag otherwise): the study's options,
    the swept value, then what the arm itself sets (``troll:kl-bound=0.2``). A bound (given or swept) reaches the
    losses of its family only (:func:`~troll.lm.options.for_loss`)."""
    loss, overrides = split_arm(arm)
    if spec.sweep_key in overrides:
        swept = spec.sweep_key.replace("_", "-")
        raise UsageError(f"--losses {arm} sets the swept option {swept}; sweep it or set it, not both.")
    swept = {spec.sweep_key: value} if spec.sweep_key else {}
    try:
        # the shared options this loss does not use (other bounds, --agg, ...) dropped, then the arm's own: checked
        # together (an arm's clip-eps= may be what makes the shared --dual-clip fit)
        opts = options.for_loss(spec.base, loss, own=overrides, seed=seed, out=str(folder), **swept)
    except UsageError as err:
        raise UsageError(f"--losses {arm}: {err}" if overrides else str(err)) from None
    return opts.resolved()


def plan(spec: StudySpec, out: Path) -> list[Cell]:
    """Every cell of the grid (:func:`troll.study.plan`), its options resolved and checked."""
    options.check_used(spec.base, [arm_loss(arm) for arm in spec.losses], spec.sweep_key)
    return grid_lib.plan(spec.grid, out, functools.partial(cell_options, spec))


def cell_argv(cell: Cell, *, resume: bool, keep_checkpoints: bool, keep_model: bool) -> list[str]:
    """The ``troll train`` command line of a cell: its options from its options file (:func:`cell_data`), or
    --resume from its folder."""
    argv = [sys.executable, "-m", "troll.cli", "train", "--out", str(cell.folder)]
    argv += ["--resume"] if resume else [cell_options_file.FLAG, str(cell.options_file)]
    if keep_checkpoints:
        argv.append("--keep-checkpoints")
    if not keep_model:
        argv.append("--no-model")
    return argv


def cell_data(cell: Cell) -> dict:
    """A cell's options as data (:mod:`troll.study.options`): every RunOptions field but the folder (``--out``);
    None where the option does not concern the cell's loss."""
    return {k: v for k, v in cell.options.to_json().items() if k != "out"}


# ---------------------------------------------------------------- what a cell gives


CELL_METRICS = (
    Number("acc_before", "held-out acc. before"),
    Number("acc_after", "held-out acc. after"),
    Number("acc_peak", "held-out acc. peak"),
    Number("reward_last_quarter", "reward, last quarter"),
    Number("entropy_final", "entropy, final"),
    Number("kl_mean", "KL reached, mean"),
    Number("kl_after_max", "max KL after projection"),
    Number("clipped_share", "clipped share"),
)
PAIRED_METRICS = (
    Number("acc_after", "held-out acc. after"),
    Number("acc_peak", "held-out acc. peak"),
    Number("reward_last_quarter", "reward, last quarter"),
)


def cell_metrics(summary: dict, rows: list[dict], steps_per_rollout: int) -> dict:
    """A cell's numbers: held-out accuracy before, after and at its peak (the best evaluation after step 0), mean
    reward of the last quarter of the logged rollouts, the last logged entropy, and over the off-policy steps the KL
    reached (the mean over steps of the token-mean KL(pi || pi_old) before projection, logged by TROLL and by a
    clip loss that measures it), the largest per-token KL (kl_max), the largest KL after projection (TROLL) and the
    mean clipped share (clip losses); None where not logged."""
    off = off_policy_rows(rows, steps_per_rollout)

    def values(key, picked=off):
        return [r[key] for r in picked if r.get(key) is not None]

    entropy = values("entropy", rows)
    accs = [r["heldout/accuracy"] for r in rows if r.get("heldout/accuracy") is not None and r.get("step", 0) > 0]
    after = summary.get("heldout_accuracy_after")
    kl_max, kl_after = values("troll/kl_before/max"), values("troll/kl_after/max")
    return {
        "acc_before": summary.get("heldout_accuracy_before"),
        "acc_after": after,
        "acc_peak": max(accs + ([after] if after is not None else []), default=None),
        "reward_last_quarter": summary.get("reward_last_quarter_mean"),
        "entropy_final": entropy[-1] if entropy else None,
        "kl_mean": stats.mean(values("troll/kl_before/mean")),
        "kl_max": max(kl_max) if kl_max else None,
        "kl_after_max": max(kl_after) if kl_after else None,
        "clipped_share": stats.mean(values("clip_ratio/region_mean")),
    }


def _off_policy(cell: Cell, rows: list[dict]) -> list[dict]:
    return off_policy_rows(rows, cell.options.steps_per_rollout)


CURVES = (
    Curve("heldout/accuracy", "held-out greedy accuracy", ylim=(-0.02, 1.02)),
    Curve("reward", "rollout reward"),
    Curve("entropy", "entropy (nats / token)"),
    Curve("troll/kl_before/mean", "KL(pi || pi_old) reached, token mean (off-policy steps)", rows=_off_policy),
    Curve("troll/kl_after/max", "max KL after projection (TROLL) (off-policy steps)", rows=_off_policy),
    Curve("clip_ratio/region_mean", "clipped share (clip losses) (off-policy steps)", rows=_off_policy),
)


def troll_minus_baselines(losses: list[str]) -> list[tuple[str, str]]:
    """Each TROLL arm of the study against each baseline arm run at the same setting, TROLL first: arms with their
    own options (``troll:steps-per-rollout=16``) pair when those agree, leaving aside the options whose meaning
    depends on the loss (the bounds, --agg and the clip's)."""
    trolls = [arm for arm in losses if arm_loss(arm) in TROLL_LOSSES]
    return [(t, b) for t in trolls for b in losses if arm_loss(b) not in TROLL_LOSSES and _same_setting(t, b)]


def _same_setting(a: str, b: str) -> bool:
    own = (*options.BOUNDS, "agg", "clip_eps_high", "dual_clip", "beta")
    return {k: v for k, v in split_arm(a)[1].items() if k not in own} == {
        k: v for k, v in split_arm(b)[1].items() if k not in own
    }


PAIRING = Pairing(
    troll_minus_baselines,
    keys=("troll", "baseline"),
    heading="TROLL minus baseline",
    column="TROLL - baseline",
    none=f"No paired comparison: the study needs a TROLL loss ({', '.join(TROLL_LOSSES)}) and a baseline.\n",
)


def _title(grid: Grid, cells: list[Cell]) -> str:
    b = cells[0].options
    seeds = f"{len(grid.seeds)} seed{'s' if len(grid.seeds) > 1 else ''}"
    return f"{b.task}, {b.model}, {seeds}, {b.steps} steps"


def _note(grid: Grid, cells: list[Cell]) -> str:
    r = cells[0].options
    bounds = ", ".join(sorted({f"{c.arm} {options.bound_name(c.options.loss)} {c.options.bound:g}" for c in cells}))
    return (
        f"\nTask {r.task}, model {r.model}, seeds {', '.join(map(str, grid.seeds))}; {r.steps} optimiser steps, "
        f"rollouts of {r.prompts_per_step} prompts x {r.generations} samples in {r.steps_per_rollout} steps "
        f"(unless swept), {r.heldout} held-out items scored greedily; bounds: {bounds}. Standard errors use n - 1; the "
        "95% interval is mean ± t(0.975, n - 1) x standard error of the per-seed differences (seeds pair the "
        "data, the initial model and the held-out items). The peak is the best held-out evaluation after step 0. "
        "The KL reached (the mean over steps of the token-mean KL(pi || pi_old) over TROLL's sparse support, before "
        "any projection), the max KL after projection (TROLL) and the clipped share (clip losses) are over the "
        "off-policy steps (the 2nd to last of each rollout). The reward of the last quarter is the mean over the last "
        "quarter of the logged rollout rewards; entropy is at the last logged step.\n"
    )


def frontend(*, keep_checkpoints: bool = False, keep_model: bool = False, threads: int = 1) -> Frontend:
    """The engine's view of ``troll study``; ``threads``: torch (and OpenMP) threads of each cell."""

    def tidy(cell: Cell) -> None:
        if not keep_checkpoints:
            checkpoints.remove_all(cell.folder)

    return Frontend(
        command=COMMAND,
        run_command="train",
        arm="loss",
        cell_argv=lambda cell, resume: cell_argv(
            cell, resume=resume, keep_checkpoints=keep_checkpoints, keep_model=keep_model
        ),
        cell_options=cell_data,
        numbers=lambda cell, summary, rows: cell_metrics(summary, rows, cell.options.steps_per_rollout),
        table=CELL_METRICS,
        paired=PAIRED_METRICS,
        pairing=PAIRING,
        curves=CURVES,
        x_key="step",
        x_label="optimiser step",
        can_resume=lambda cell: checkpoints.last_checkpoint(cell.folder) is not None,
        tidy=tidy,
        title=_title,
        note=_note,
        env={"OMP_NUM_THREADS": str(threads)},
        cores=lambda cell: threads,
    )


def run(out: Path, spec: StudySpec, cells: list[Cell], *, clear: bool, jobs: int, keep_checkpoints: bool,
        keep_model: bool, report, executor=None) -> dict[str, str]:  # fmt: skip
    """Write config.json, run the cells (``executor``: where, :mod:`troll.study.executors`), then study.json /
    study.md / study.png; returns each cell's status."""
    engine = frontend(keep_checkpoints=keep_checkpoints, keep_model=keep_model, threads=spec.base.threads)
    study = Study(out, engine, spec.grid, spec.to_json(), cells)
    return runner.run_study(study, clear=clear, jobs=jobs, report=report, executor=executor)
