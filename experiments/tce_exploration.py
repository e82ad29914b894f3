"""How far a preset explores at the start, and what limits its pace in a run (docs/tce-exploration.md, "Exploration: why
TCE is slow at 2M steps").

Part 1, the initial policy (no learning). For each preset (``authors``: the metaworld/* preset; ``hand``: the same
with metaworld's own env options, as the runs of docs/archive/tce-hand-study.md had; ``earlier``: the same with
every field the authors' setup sets put back to its value before it (:data:`EARLIER`, the preset of 2026-11-23), build
the agent for ``--env``, reset E episodes and draw ``--samples`` parameter vectors theta per episode from the
initial policy. Reported, from the desired trajectories (E x samples):

- ``xyz spread at T (cm)``: the standard deviation over samples of the desired hand position at the last step,
  averaged over episodes and the three axes; ``max |move| (cm)``: the median over samples of the largest distance
  of the desired hand position from its start;
- ``gripper closed``: the share of (sample, step) whose desired gripper command is above 0 (Meta-World closes
  the fingers for a positive command);
- ``1 std of weight n (cm)``: the largest move of the desired x position over the episode caused by one initial
  standard deviation of basis weight n of x alone (the same for y and z); and of the goal parameter.

Part 2, a run's metrics (``--runs <run folder> ...``, each a ``troll tce train`` folder): per run, means over its
iterations of the share of policy epochs the projection was active, the mean and covariance distances before the
projection against their bounds, the entropy against the entropy schedule's bound (also at the last iteration, and
the number of iterations it was within 1 nat of it), the critic's explained variance, and the smallest diagonal
entry of the covariance's Cholesky factor at the last iteration.

    OMP_NUM_THREADS=1 python experiments/tce_exploration.py --env metaworld/reach-v3
    OMP_NUM_THREADS=1 python experiments/tce_exploration.py --runs studies/tce-authors/mt10-reach-v3/tce/seed*
    python -m troll.tce.archive restore docs/data/tce-ablation /tmp/tce-ablation   # runs kept without weights
    OMP_NUM_THREADS=1 python experiments/tce_exploration.py --runs /tmp/tce-ablation/reach-v3-init-std/*/*/seed0

Prints markdown tables; writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

from troll.episodic.agent import TCEAgent
from troll.episodic.config import TCEConfig
from troll.episodic.envs import make_env
from troll.episodic.envs.metaworld import MetaWorldConfig
from troll.episodic.presets import METAWORLD_ENV
from troll.runs import CONFIG_FILE, METRICS_FILE, read_jsonl

# the Meta-World preset of 2026-11-23, before the authors' setup: the fields that setup changed, as they were
EARLIER = dict(
    tau=None, basis_bandwidth=2.0, auto_scale_basis=False, weights_scale=10.0, goal_scale=0.2, relative_goal=True,
    activation="tanh", init_std=0.5, min_std=1e-4, lr_final=1.0, entropy_schedule="none", entropy_reference="initial",
    entropy_target=0.0, values_before_fit=False, offset_per_iteration=False,
)  # fmt: skip


# metaworld/*'s own values of the options the preset sets (envs/metaworld.py's defaults)
METAWORLD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(MetaWorldConfig) if f.name in METAWORLD_ENV}


def presets(env: str) -> dict[str, TCEConfig]:
    """The authors' preset of ``env``; ``hand``, the same with metaworld's own env options (the runs of
    docs/archive/tce-hand-study.md); and the earlier one (:data:`EARLIER`)."""
    return {
        "authors": TCEConfig.preset(env, workers=1),
        "hand": TCEConfig.preset(env, workers=1, env_options=METAWORLD_DEFAULTS),
        "earlier": TCEConfig.preset(env, workers=1, **EARLIER, env_options=METAWORLD_DEFAULTS),
    }


def initial_exploration(config: TCEConfig, samples: int, seed: int) -> dict[str, float]:
    """Part 1's numbers for one preset (module docstring)."""
    torch.manual_seed(seed)
    with make_env(config.env, num_episodes=config.episodes, workers=1, seed=seed, **config.env_options) as env:
        agent = TCEAgent.for_env(config, env)
        start = env.reset(seed)
    dmp, d, n = agent.dmp, env.dof, config.num_basis
    with torch.no_grad():
        policy = agent.policy(start.context)
        mean, factor = policy.mean.double(), policy.factor.double()
        e, p = mean.shape
        noise = torch.randn(samples, e, p, dtype=torch.float64)
        scaled = noise * factor if policy.kind == "diag" else noise @ factor.mT
        theta = (mean + scaled).reshape(samples * e, p)
        y0, v0 = start.pos.double().repeat(samples, 1), start.vel.double().repeat(samples, 1)
        pos, _ = dmp.trajectory(theta, y0, v0)  # (S E, T + 1, D)
        pos = pos.reshape(samples, e, -1, d)
        xyz = pos[..., :3] * 100.0
        out = {
            "xyz spread at T (cm)": xyz[:, :, -1].std(0).mean().item(),
            "max |move| (cm)": (xyz - xyz[:, :, :1]).norm(dim=-1).amax(-1).median().item(),
            "gripper closed": (pos[..., 3] > 0).double().mean().item() if d > 3 else float("nan"),
        }
        std = factor if policy.kind == "diag" else factor.diagonal(dim1=-2, dim2=-1)
        std = std.reshape(-1, p)[0]  # the covariance may be shared by all contexts
        base, _ = dmp.trajectory(mean[:1], start.pos[:1].double(), start.vel[:1].double())
        for j in range(n + 1):
            bumped = mean[:1].clone()
            bumped[0, j] += std[j]  # parameter j of DoF 0 (x): weights 0..n-1, then the goal
            moved, _ = dmp.trajectory(bumped, start.pos[:1].double(), start.vel[:1].double())
            label = f"1 std of weight {j} (cm)" if j < n else "1 std of the goal (cm)"
            out[label] = (moved - base)[0, :, 0].abs().max().item() * 100.0
    return out


def run_pace(folder: Path) -> dict[str, float | None]:
    """Part 2's numbers for one run folder (module docstring)."""
    rows = read_jsonl(folder / METRICS_FILE)  # a running study's torn last line is left out
    config = json.loads((folder / CONFIG_FILE).read_text())["config"]
    rows = [r for r in rows if "proj/active_epochs" in r]

    def avg(key: str) -> float:
        return statistics.fmean(r[key] for r in rows if r.get(key) is not None)

    # the entropy schedule's gap per iteration; a run without a schedule (BBRL) has none: printed as "-"
    bounded = rows[0].get("policy/entropy_bound") is not None
    gaps = [r["policy/entropy"] - r["policy/entropy_bound"] for r in rows] if bounded else []

    return {
        "iterations": len(rows),
        "projection active": avg("proj/active_epochs"),
        "mean dist before / bound": avg("proj/mean_dist_before/mean") / config["mean_bound"],
        "cov dist before / bound": avg("proj/cov_dist_before/mean") / config["cov_bound"],
        "entropy - its bound (nats)": avg("policy/entropy") - avg("policy/entropy_bound") if bounded else None,
        "entropy - its bound, last (nats)": gaps[-1] if bounded else None,
        "iterations within 1 nat of the bound": sum(g < 1.0 for g in gaps) if bounded else None,
        "critic explained var": avg("critic/explained_var_before"),
        "min chol diag, last": rows[-1]["policy/chol_diag_min"],
    }


def cell(value: float | None) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.3g}"


def markdown(columns: dict[str, dict[str, float | None]]) -> str:
    names = list(columns)
    keys = list(next(iter(columns.values())))
    text = "| | " + " | ".join(names) + " |\n|---" * 1 + "|---" * len(names) + "|\n"
    for key in keys:
        text += f"| {key} | " + " | ".join(cell(columns[n][key]) for n in names) + " |\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="metaworld/reach-v3")
    parser.add_argument("--samples", type=int, default=64, help="theta draws per episode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="run folders for part 2")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.runs:
        print(markdown({str(f): run_pace(f) for f in args.runs}))
        return
    columns = {name: initial_exploration(c, args.samples, args.seed) for name, c in presets(args.env).items()}
    print(f"{args.env}: the initial policy, {args.samples} draws per episode\n")
    print(markdown(columns))


if __name__ == "__main__":
    main()
