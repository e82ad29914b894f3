"""Where a trained policy's episodes end: on Meta-World, does the object reach the goal and stay, or pass it; on box
pushing, which clause of the success rule do they miss?

docs/tce.md, "Endings". A run's success after the last step (the authors' measure) can sit far below
its success at any step: the mean trajectory reaches the goal and then leaves it. For each run folder (a finished
or interrupted ``troll tce train`` folder of metaworld/push-v3, pick-place-v3 or peg-insert-side-v3), this loads the
newest checkpoint, plays the mean trajectory (as the run's evaluations do) on the run's own evaluation episodes and
on ``--batches`` - 1 further batches of fresh episodes, and reads from the observations the per-step positions of
the hand (entries 0-2, the end effector), the gripper's opening (3), the object (4-6) and the goal (36-38). On push
and pick-place the object's distance to the goal equals Meta-World's ``info["obj_to_target"]`` exactly; on
peg-insert-side it does not (Meta-World measures the peg's head, scaled, and observes its grasp point), so the
distance rows are left out there. Reported per run, over all episodes played:

- ``success after the last step`` and ``at any step``: the env's own flags (``info["success"]``);
- ``within the radius at some step`` and ``at the end``: from the distances and Meta-World's success radius (5 cm
  for push, 7 cm for pick-place), a check on the flags;
- ``passed``: the share of episodes within the radius at some step but not at the end, and for those the medians of the
  closest distance, the step it was reached at, the distance at the end, and how far the object moved after its
  closest approach (cm);
- ``hand to object at the end (cm)``, median over all episodes;
- the grasp: the share of episodes whose fingers' centre comes within 3 cm of the object (Meta-World's
  ``near_object``; the centre is taken 4.5 cm below the observed hand, the offset at reset, which the fixed grip
  keeps to 0.6 cm under random actions), the gripper's opening when they are closest to it and its smallest
  opening in the episode (medians; 1 open, 0 closed), the share that lift the object 2 cm above its start
  (Meta-World's height rule for a grasp on pick-place; it takes 1 cm on peg-insert-side) with the median highest
  lift (cm), and the share of steps whose desired gripper command is above 0 (closing), in the mean trajectory and
  in one trajectory drawn from the policy per episode (what it still explores).

    OMP_NUM_THREADS=1 python experiments/tce_endings.py --batches 8 studies/tce-authors-hand/push-v3-10m/tce/seed0 \\
        studies/tce-authors-hand/push-v3-10m/bbrl/seed0

On fancy/box-pushing-dense and -sparse (docs/tce-tasks.md, "Box pushing"), per run: the success flags, the shares
of episodes whose box ends within 5 cm of the goal, within 0.5 rad of its orientation, one without the other, and
within 5 cm at some step (from the box and goal positions of the observations, entries 14-16 and 21-23), and the
medians of the final distance and rotation (the env's own final metrics; the script stops if its success flags do
not follow the rule from them).

    OMP_NUM_THREADS=1 python experiments/tce_endings.py --batches 2 studies/tce-box/box-pushing-dense/tce/seed0

Prints a markdown table; writes nothing. Needs the run folders (weights are not archived in docs/data).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from troll.episodic import TCE
from troll.episodic.agent import EVAL_STREAM, reset_seed
from troll.episodic.envs import make_env
from troll.episodic.envs.box_pushing_sim import SUCCESS_POS, SUCCESS_ROT
from troll.tce.run import checkpoints, saved_config

HAND, OPENING, OBJECT, GOAL = slice(0, 3), 3, slice(4, 7), slice(36, 39)  # Meta-World v3's 39-entry observation
GRIPPER = 3  # the gripper's DoF in the desired trajectory: Meta-World closes the fingers for a command above 0
# m: Meta-World's success threshold on obj_to_target, where the observations give it (None: they do not)
RADIUS = {"push-v3": 0.05, "pick-place-v3": 0.07, "peg-insert-side-v3": None}
FINGERS = torch.tensor([0.0, 0.0, -0.045], dtype=torch.float64)  # m: fingers' centre from the hand (fixed grip)
NEAR, LIFT = 0.03, 0.02  # m: Meta-World's near_object radius; the object "lifted"
BOX, BOX_GOAL = slice(14, 17), slice(21, 24)  # box pushing's 28-entry observation: the box's and the goal's position


def median(key: str, subset: list[dict]) -> float:
    values = torch.tensor([r[key] for r in subset], dtype=torch.float64)
    return values.quantile(0.5).item() if subset else float("nan")  # the midpoint of the middle two when even


def episodes(folder: Path, batches: int):
    """The run's config, the newest checkpoint's iteration, and per batch (the run's own evaluation episodes first,
    then fresh ones) the episode of its mean trajectory, that trajectory and one drawn from the policy."""
    config = saved_config(folder)
    if config is None:
        raise SystemExit(f"{folder}: no config.json of a troll tce train run")
    found = checkpoints(folder)
    if not found:
        raise SystemExit(f"{folder}: no checkpoint-*.pt (the run has not saved one yet)")
    iteration, path = found[-1]

    def env_of(count: int):
        return make_env(config.env, num_episodes=count, workers=1, seed=config.seed, **config.env_options)

    def batch_episodes():
        agent = TCE.load(path).agent  # its sampling generator as the checkpoint left it
        with env_of(config.eval_episodes) as env:
            for b in range(batches):
                start = env.reset(reset_seed(config.seed, EVAL_STREAM + b))  # b = 0: the run's own evaluation set
                _, pos, vel = agent.trajectories(start, deterministic=True)
                _, drawn, _ = agent.trajectories(start)  # one draw of theta per episode: what the policy explores
                yield env.run(pos, vel), pos, drawn

    return config, iteration, batch_episodes()


def play(folder: Path, batches: int) -> dict[str, float]:
    """The numbers of the module docstring for one run folder."""
    config, iteration, played = episodes(folder, batches)
    if config.env.startswith("fancy/box-pushing"):
        return play_box(iteration, played)
    task = config.env.removeprefix("metaworld/")
    if task not in RADIUS:
        raise SystemExit(f"{folder}: {config.env} is not fancy/box-pushing-* or one of "
                         f"{', '.join('metaworld/' + t for t in RADIUS)}")  # fmt: skip
    radius = RADIUS[task] or float("nan")  # nan: every comparison false; the rows built on it are left out below
    rows = []
    for ep, pos, drawn in played:
        states = ep.states.double()
        dist = (states[:, :, OBJECT] - states[:, :, GOAL]).norm(dim=-1)[:, 1:]  # (E, T): after each step
        closest, at = dist.min(1)
        ends = states[:, -1]
        after = (states[:, -1, OBJECT] - states[torch.arange(len(at)), at + 1, OBJECT]).norm(dim=-1)
        reach, nearest = (states[:, :, HAND] + FINGERS - states[:, :, OBJECT]).norm(dim=-1).min(1)
        opening = states[torch.arange(len(nearest)), nearest, OPENING]
        narrowest = states[:, :, OPENING].amin(1)
        if pos.shape[-1] > GRIPPER:
            closing = (pos[:, 1:, GRIPPER] > 0).double().mean(1), (drawn[:, 1:, GRIPPER] > 0).double().mean(1)
        else:  # the env option "gripper" holds the command: no gripper DoF (nan, printed "-")
            closing = (torch.full((len(pos),), float("nan")),) * 2
        lift = (states[:, :, OBJECT.stop - 1] - states[:, :1, OBJECT.stop - 1]).amax(1)
        for i in range(dist.shape[0]):
            rows.append(
                {
                    "success": float(ep.success[i]),
                    "success_any": float(ep.final["success_any"][i]),
                    "near_any": float(closest[i] <= radius),
                    "near_end": float(dist[i, -1] <= radius),
                    "closest": closest[i].item(),
                    "at": at[i].item() + 1,
                    "end": dist[i, -1].item(),
                    "after": after[i].item(),
                    "hand_object": (ends[i, HAND] - ends[i, OBJECT]).norm().item(),
                    "reached": float(reach[i] <= NEAR),
                    "opening": opening[i].item(),
                    "narrowest": narrowest[i].item(),
                    "closing_mean": closing[0][i].item(),
                    "closing_drawn": closing[1][i].item(),
                    "lifted": float(lift[i] >= LIFT),
                    "lift": lift[i].item(),
                }
            )

    def mean(key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    passed = [r for r in rows if r["near_any"] and not r["near_end"]]
    nan = float("nan")
    distances = {  # nan (printed "-") where the observations do not give Meta-World's distance
        "within the radius at some step": mean("near_any"),
        "within the radius at the end": mean("near_end"),
        "passed (near, then left)": len(passed) / len(rows),
        "passed: closest (cm)": 100 * median("closest", passed),
        "passed: closest at step": median("at", passed),
        "passed: end distance (cm)": 100 * median("end", passed),
        "passed: moved after closest (cm)": 100 * median("after", passed),
        "end distance, all (cm)": 100 * median("end", rows),
    }
    return {
        "checkpoint iteration": iteration,
        "episodes": len(rows),
        "success after the last step": mean("success"),
        "success at any step": mean("success_any"),
        **{key: value if RADIUS[task] else nan for key, value in distances.items()},
        "hand to object at the end (cm)": 100 * median("hand_object", rows),
        "fingers within 3 cm of the object at some step": mean("reached"),
        "gripper opening at the fingers' closest (median)": median("opening", rows),
        "gripper's smallest opening in the episode (median)": median("narrowest", rows),
        "steps commanding the gripper closed: mean trajectory": mean("closing_mean"),
        "steps commanding the gripper closed: drawn trajectories": mean("closing_drawn"),
        "lifted the object 2 cm at some step": mean("lifted"),
        "highest lift (median, cm)": 100 * median("lift", rows),
    }


def play_box(iteration: int, played) -> dict[str, float]:
    """Box pushing: which clause of the success rule (the box within 5 cm and 0.5 rad of the goal after the last
    step) the episodes miss, and how close the box came to the goal's position at any step."""
    rows = []
    for ep, _, _ in played:
        states = ep.states.double()
        dist = (states[:, 1:, BOX] - states[:, 1:, BOX_GOAL]).norm(dim=-1)  # (E, T): after each step
        for i in range(dist.shape[0]):
            rows.append({"success": float(ep.success[i]), "distance": float(ep.final["distance"][i]),
                         "rotation": float(ep.final["rotation"][i]), "closest": dist[i].min().item()})  # fmt: skip
    if any(r["success"] != (r["distance"] < SUCCESS_POS and r["rotation"] < SUCCESS_ROT) for r in rows):
        raise SystemExit("the env's success flags do not follow its rule on these episodes: a bug to report")
    near = [r for r in rows if r["distance"] < SUCCESS_POS]
    turned = [r for r in rows if r["rotation"] < SUCCESS_ROT]
    return {
        "checkpoint iteration": iteration,
        "episodes": len(rows),
        "success after the last step": sum(r["success"] for r in rows) / len(rows),
        "within 5 cm at the end": len(near) / len(rows),
        "within 0.5 rad at the end": len(turned) / len(rows),
        "within 5 cm, not within 0.5 rad": sum(r["rotation"] >= SUCCESS_ROT for r in near) / len(rows),
        "within 0.5 rad, not within 5 cm": sum(r["distance"] >= SUCCESS_POS for r in turned) / len(rows),
        "within 5 cm at some step": sum(r["closest"] < SUCCESS_POS for r in rows) / len(rows),
        "end distance, all (median, cm)": 100 * median("distance", rows),
        "end rotation, all (median, rad)": median("rotation", rows),
        "end rotation, within 5 cm (median, rad)": median("rotation", near),
    }


def cell(value) -> str:
    """A table entry: counts as integers, other numbers to 3 significant digits, NaN as '-'."""
    if value != value:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="troll tce train run folders")
    parser.add_argument("--batches", type=int, default=4, help="batches of eval_episodes (the first: the run's own)")
    args = parser.parse_args()
    if args.batches < 1:
        parser.error(f"--batches must be at least 1, got {args.batches}")
    torch.set_num_threads(1)
    boxes = {str(f): (saved_config(f) is not None and saved_config(f).env.startswith("fancy/box-pushing"))
             for f in args.runs}  # fmt: skip
    if len(set(boxes.values())) > 1:
        parser.error("give runs of box pushing or of Meta-World, not both: their tables have different rows")
    columns = {str(f): play(f, args.batches) for f in args.runs}
    keys = list(next(iter(columns.values())))
    print("| | " + " | ".join(columns) + " |\n" + "|---" * (len(columns) + 1) + "|")
    for key in keys:
        print(f"| {key} | " + " | ".join(cell(c[key]) for c in columns.values()) + " |")


if __name__ == "__main__":
    main()
