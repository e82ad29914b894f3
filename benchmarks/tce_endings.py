"""Where a trained Meta-World policy's episodes end: does the object reach the goal and stay, or pass it?

docs/tce.md, "Why TCE falls short". A run's success after the last step (the authors' measure) can sit far below
its success at any step: the mean trajectory reaches the goal and then leaves it. For each run folder (a finished
or interrupted ``troll tce train`` folder of metaworld/push-v3 or pick-place-v3), this loads the newest checkpoint,
plays the mean trajectory (as the run's evaluations do) on the run's own evaluation episodes and on ``--batches`` - 1
further batches of fresh episodes, and reads the per-step distance of the object to the goal from the observations
(entries 4-6 and 36-38; this equals Meta-World's ``info["obj_to_target"]`` exactly on these two tasks, not on
reach-v3, where the observed hand and goal give a distance up to 3 cm off it). Reported per run, over all episodes
played:

- ``success after the last step`` and ``at any step``: the env's own flags (``info["success"]``);
- ``within the radius at some step`` and ``at the end``: from the distances and Meta-World's success radius (5 cm
  for push, 7 cm for pick-place), a check on the flags;
- ``passed``: the share of episodes within the radius at some step but not at the end, and for those the medians of the
  closest distance, the step it was reached at, the distance at the end, and how far the object moved after its
  closest approach (cm);
- ``hand to object at the end (cm)``, median over all episodes.

    OMP_NUM_THREADS=1 python benchmarks/tce_endings.py --batches 8 studies/tce-authors/push-v3-10m/tce/seed0 \\
        studies/tce-authors/push-v3-10m/bbrl/seed0

Prints a markdown table; writes nothing. Needs the run folders (weights are not archived in docs/data).
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch

from troll.episodic.agent import TCEAgent, reset_seed
from troll.episodic.envs import make_env
from troll.episodic.train import EVAL_STREAM, checkpoints, saved_config

HAND, OBJECT, GOAL = slice(0, 3), slice(4, 7), slice(36, 39)  # Meta-World v3's 39-entry observation
RADIUS = {"push-v3": 0.05, "pick-place-v3": 0.07}  # m: Meta-World's success threshold on obj_to_target


def play(folder: Path, batches: int) -> dict[str, float]:
    """The numbers of the module docstring for one run folder."""
    config = saved_config(folder)
    if config is None:
        raise SystemExit(f"{folder}: no config.json of a troll tce train run")
    task = config.env.removeprefix("metaworld/")
    if task not in RADIUS:
        raise SystemExit(f"{folder}: {config.env} is not one of {', '.join('metaworld/' + t for t in RADIUS)}")
    found = checkpoints(folder)
    if not found:
        raise SystemExit(f"{folder}: no checkpoint-*.pt (the run has not saved one yet)")
    iteration, path = found[-1]
    rows = []

    def env_of(episodes: int):
        return make_env(config.env, num_episodes=episodes, workers=1, seed=config.seed, **config.env_options)

    with contextlib.ExitStack() as stack:
        env = stack.enter_context(env_of(config.episodes))  # the agent is built for the training batch's size
        agent = TCEAgent.for_env(config, env)
        agent.load_state_dict(torch.load(path, weights_only=True)["agent"])
        if config.eval_episodes != config.episodes:
            env = stack.enter_context(env_of(config.eval_episodes))
        for b in range(batches):
            start = env.reset(reset_seed(config.seed, EVAL_STREAM + b))  # b = 0: the run's own evaluation episodes
            _, pos, vel = agent.trajectories(start, deterministic=True)
            ep = env.run(pos, vel)
            states = ep.states.double()
            dist = (states[:, :, OBJECT] - states[:, :, GOAL]).norm(dim=-1)[:, 1:]  # (E, T): after each step
            closest, at = dist.min(1)
            ends = states[:, -1]
            after = (states[:, -1, OBJECT] - states[torch.arange(len(at)), at + 1, OBJECT]).norm(dim=-1)
            for i in range(dist.shape[0]):
                rows.append(
                    {
                        "success": float(ep.success[i]),
                        "success_any": float(ep.final["success_any"][i]),
                        "near_any": float(closest[i] <= RADIUS[task]),
                        "near_end": float(dist[i, -1] <= RADIUS[task]),
                        "closest": closest[i].item(),
                        "at": at[i].item() + 1,
                        "end": dist[i, -1].item(),
                        "after": after[i].item(),
                        "hand_object": (ends[i, HAND] - ends[i, OBJECT]).norm().item(),
                    }
                )

    def mean(key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    def median(key: str, subset) -> float:
        values = torch.tensor([r[key] for r in subset], dtype=torch.float64)
        return values.quantile(0.5).item() if subset else float("nan")  # the midpoint of the middle two when even

    passed = [r for r in rows if r["near_any"] and not r["near_end"]]
    return {
        "checkpoint iteration": iteration,
        "episodes": len(rows),
        "success after the last step": mean("success"),
        "success at any step": mean("success_any"),
        "within the radius at some step": mean("near_any"),
        "within the radius at the end": mean("near_end"),
        "passed (near, then left)": len(passed) / len(rows),
        "passed: closest (cm)": 100 * median("closest", passed),
        "passed: closest at step": median("at", passed),
        "passed: end distance (cm)": 100 * median("end", passed),
        "passed: moved after closest (cm)": 100 * median("after", passed),
        "end distance, all (cm)": 100 * median("end", rows),
        "hand to object at the end (cm)": 100 * median("hand_object", rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="troll tce train run folders")
    parser.add_argument("--batches", type=int, default=4, help="batches of eval_episodes (the first: the run's own)")
    args = parser.parse_args()
    if args.batches < 1:
        parser.error(f"--batches must be at least 1, got {args.batches}")
    torch.set_num_threads(1)
    columns = {str(f): play(f, args.batches) for f in args.runs}
    keys = list(next(iter(columns.values())))
    print("| | " + " | ".join(columns) + " |\n" + "|---" * (len(columns) + 1) + "|")
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{c[key]:.3g}" for c in columns.values()) + " |")


if __name__ == "__main__":
    main()
