"""Are EnvPool's Meta-World tasks the Python package's? Meta-World's own scripted policies on both backends.

For each task, ``metaworld.policies.ENV_POLICY_MAP[task]`` acts on N episodes in each backend (the episodes' task
variations drawn as the backends draw them: envpool_backend.py's docstring), giving per episode the success after
the last step, the success at any step and the return. Differences beyond noise, per task and metric:

- success (last step, any step): Fisher's exact test of the two proportions (two-sided);
- return: Welch's t-test (two-sided); two constant samples that agree count as p = 1;
- a difference is flagged when p < alpha / m, Bonferroni over the m = 3 x tasks tests of the run (alpha 0.05):
  the chance of flagging any task when none differs is at most alpha.

The observation layout is compared too: the same varying context entries, and the same constant entries of the
reset observation (hand start, quaternions, padding) within 1e-3 (the objects settle at reset with
quaternion entries that vary by ~5e-4 between variations, in both backends).

    python -m troll.episodic.envs.equivalence --episodes 32 --jobs 2 --csv docs/img/envpool-equivalence.csv
(``make envpool-equivalence``; docs/tce.md, "Backends", shows its output.)
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing as mp
import time

import numpy as np

from troll.episodic.envs.base import episode_seeds
from troll.episodic.envs.workers import one_thread_children

METRICS = ("success_last", "success_any", "return")
ALPHA = 0.05


def scripted(task: str, backend: str, episodes: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Per-episode success_last, success_any, return (episodes,) and the reset observations (episodes, 39) of
    Meta-World's scripted policy for ``task`` on ``backend`` ("envpool" or "python")."""
    from metaworld.policies import ENV_POLICY_MAP

    policy = ENV_POLICY_MAP[task]()
    if backend == "envpool":
        steps = _envpool_steps(task, seed, episodes, policy)
    else:
        steps = _python_steps(task, episode_seeds(seed, episodes), policy)
    first, rewards, success = steps
    return {"success_last": success[:, -1].astype(float), "success_any": success.any(1).astype(float),
            "return": rewards.sum(1), "first": first}  # fmt: skip


def _envpool_steps(task, seed, episodes, policy):
    import envpool

    from troll.episodic.envs.envpool_backend import HORIZON, pool_seeds, task_id

    env = envpool.make_gymnasium(task_id(task), num_envs=episodes, env_seed=pool_seeds(seed, episodes),
                                 num_threads=1, partially_observable=False, max_episode_steps=HORIZON)  # fmt: skip
    obs, _ = env.reset()
    first = np.asarray(obs, dtype=np.float64).copy()
    rewards, success = np.empty((episodes, HORIZON)), np.empty((episodes, HORIZON), bool)
    for t in range(HORIZON):
        action = np.stack([policy.get_action(o) for o in obs]).astype(np.float32)
        obs, reward, _, _, info = env.step(action)
        rewards[:, t], success[:, t] = reward, info["success"] > 0
    env.close()
    return first, rewards, success


def _python_steps(task, seeds, policy):
    import gymnasium as gym
    import metaworld  # noqa: F401 -- registers Meta-World/*

    env = gym.make("Meta-World/MT1", env_name=task, seed=0, disable_env_checker=True)
    tasks, sim = list(env.get_wrapper_attr("tasks")), env.unwrapped
    horizon = int(sim.max_path_length)
    first = np.empty((len(seeds), 39))
    rewards, success = np.empty((len(seeds), horizon)), np.empty((len(seeds), horizon), bool)
    for i, s in enumerate(seeds):  # as metaworld.py's runner picks an episode's variation
        sim.set_task(tasks[int(np.random.default_rng(s).integers(len(tasks)))])
        sim.seed(s)
        obs, _ = sim.reset()
        first[i] = obs
        for t in range(horizon):
            obs, reward, _, _, info = sim.step(policy.get_action(obs))
            rewards[i, t], success[i, t] = reward, info["success"] > 0
    env.close()
    return first, rewards, success


def p_value(metric: str, a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p of "a and b come from one distribution": Fisher's exact test for success, Welch's t-test for
    the return."""
    from scipy import stats

    if metric.startswith("success"):
        table = [[int(a.sum()), len(a) - int(a.sum())], [int(b.sum()), len(b) - int(b.sum())]]
        return float(stats.fisher_exact(table).pvalue)
    if a.std() == 0 and b.std() == 0:
        return 1.0 if a[0] == b[0] else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def compare(task: str, envpool_out: dict, python_out: dict, tests: int) -> dict:
    """One table row: both backends' means, the p of each metric, whether any is flagged at ALPHA / tests, and
    whether the observation layouts agree."""
    from troll.episodic.envs.metaworld import CONTEXT_CANDIDATES, varying_entries

    row = {"task": task, "episodes": len(envpool_out["return"])}
    flagged = []
    for m in METRICS:
        a, b = envpool_out[m], python_out[m]
        p = p_value(m, a, b)
        row |= {f"{m}_envpool": a.mean(), f"{m}_python": b.mean(), f"{m}_p": p}
        if p < ALPHA / tests:
            flagged.append(m)
    row["differs"] = ",".join(flagged)
    fa, fb = envpool_out["first"], python_out["first"]
    va, vb = varying_entries(fa), varying_entries(fb)
    constant = np.setdiff1d(CONTEXT_CANDIDATES, va)
    row["layout_ok"] = bool(np.array_equal(va, vb) and np.abs(fa[:, constant] - fb[:, constant]).max() < 1e-3)
    return row


def _job(args):
    task, backend, episodes, seed = args
    start = time.perf_counter()
    out = scripted(task, backend, episodes, seed)
    return task, backend, out, time.perf_counter() - start


def run(tasks: list[str], episodes: int, *, jobs: int = 1, seed: int = 0, family: int = 50, on_row=None):
    """The rows of ``tasks`` (and the seconds each backend took in total); the Bonferroni threshold counts 3 tests
    for each of ``family`` tasks (50: a subset is judged as in the full check). ``on_row(row)`` sees each row as
    soon as both backends of its task are done (tasks in order)."""
    work = [(t, b, episodes, seed) for t in tasks for b in ("envpool", "python")]
    tests = len(METRICS) * max(family, len(tasks))
    outs, seconds, rows = {}, {"envpool": 0.0, "python": 0.0}, []

    def collect(done):
        for task, backend, out, took in done:
            outs[(task, backend)] = out
            seconds[backend] += took
            if (task, "envpool") in outs and (task, "python") in outs:
                rows.append(compare(task, outs.pop((task, "envpool")), outs.pop((task, "python")), tests))
                if on_row is not None:
                    on_row(rows[-1])

    if jobs > 1:
        # one thread a process; and a forkserver started here passes the 1-thread settings on to the env workers
        # that later fork from it (envs/workers.py), as one started by a worker pool would
        with one_thread_children(), mp.get_context("forkserver").Pool(jobs) as pool:
            collect(pool.imap(_job, work, chunksize=1))
    else:
        collect(_job(w) for w in work)
    return rows, seconds


def table(rows: list[dict]) -> str:
    """The markdown table of the rows."""
    lines = ["| task | success last (envpool / python, p) | success any | return | differs | layout |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        cells = [f"{r[f'{m}_envpool']:.2f} / {r[f'{m}_python']:.2f} ({r[f'{m}_p']:.2g})" for m in METRICS[:2]]
        cells.append(f"{r['return_envpool']:.0f} / {r['return_python']:.0f} ({r['return_p']:.2g})")
        cells += [r["differs"] or "-", "same" if r["layout_ok"] else "DIFFERS"]
        lines.append(f"| {r['task']} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from troll.episodic.envs.registry import METAWORLD_TASKS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--tasks", default="all", help="comma-separated Meta-World tasks, or all (default)")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per task and backend (default 32)")
    parser.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    tasks = list(METAWORLD_TASKS) if args.tasks == "all" else args.tasks.split(",")
    unknown = sorted(set(tasks) - set(METAWORLD_TASKS))
    if unknown or args.episodes < 2 or args.jobs < 1:
        parser.error(f"--tasks: unknown {unknown}" if unknown else "--episodes must be >= 2 and --jobs >= 1")
    rows, seconds = run(tasks, args.episodes, jobs=args.jobs, seed=args.seed,
                        on_row=lambda r: print(table([r]).splitlines()[-1], flush=True))  # fmt: skip
    print("\n" + table(rows))
    flagged = [r["task"] for r in rows if r["differs"]]
    print(f"\n{len(tasks)} tasks x {args.episodes} episodes per backend; flagged at p < {ALPHA}/{3 * 50} "
          f"(Bonferroni): {', '.join(flagged) or 'none'}; layout differs: "
          f"{', '.join(r['task'] for r in rows if not r['layout_ok']) or 'none'}; seconds (summed over jobs): "
          f"envpool {seconds['envpool']:.0f}, python {seconds['python']:.0f}")  # fmt: skip
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows({k: (f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else v)
                              for k, v in r.items()} for r in rows)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
