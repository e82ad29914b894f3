"""Golden numbers of one TCE and one BBRL update on fixed batches (recorded before the loss and speed refactors).

History: recorded at 483233f (before any change); held through the move to trpl_loss (b21e11b); re-recorded once
when ProDMP's trapezoid became Gauss-Legendre (its columns moved by ~1e-7 relative, the updated parameters by up to
1e-5), with cases for the faithful Meta-World setup added.

Each case builds an agent from a fully spelled-out config (no preset: presets may change, these numbers may not),
makes one batch (the toy env, or the synthetic Meta-World-sized batch of ``tests/support/_tce_batch.py``: E
episodes of 500 steps, 39-entry states, 4 DoF, with no simulator) and runs one ``update``. The metrics (timings
aside) and every tensor of the agent's state afterwards (policy, critic, both Adam states, the RNG) must equal the
recorded ones. A refactor of the loss or of the update's speed must keep them.

Tolerances: on the machine that recorded them (an AMD EPYC) the numbers came back to 1e-12 (float64) and 1e-6 (the
float32 critic). Another CPU sums the float32 critic's products in another order (an Intel Xeon with AVX-512,
measured): the critic's state then moves by up to 8.9e-5, and through the advantages it feeds the float64 policy by
up to 1.5e-6 beyond 1e-6 relative, the metrics by up to 1e-6. The tolerances are about 10x those (float32: 1e-3
relative and absolute; float64 and the metrics: 1e-5), far below what a changed formula moves (a sign, a factor or a
term changes these numbers in their first digits).

Re-record (only for an intended change of the numbers, said so in the commit):
    PYTHONPATH=src:tests/support python tests/episodic/test_agent_golden.py --record
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from _tce_batch import synthetic_batch

from troll.episodic.agent import TCEAgent, reset_seed
from troll.episodic.config import TCEConfig
from troll.episodic.envs import make_env

GOLDEN = Path(__file__).with_name("data") / "tce_golden.pt"
FLOAT32_TOL, FLOAT64_TOL, METRIC_TOL = 1e-3, 1e-5, 1e-5  # relative and absolute (the module docstring says why)

# Every field that sets a number, as they were when the golden file was recorded (the old Meta-World defaults).
BASE = dict(
    episodes=4, total_env_steps=10_000, eval_every=10, eval_episodes=4, num_basis=8, dmp_alpha=10.0,
    dmp_alpha_x=3.0, weights_scale=10.0, goal_scale=0.2, relative_goal=True, num_segments=24, random_offset=True,
    policy_hidden=(32, 32), activation="tanh", init_std=0.5, min_std=1e-4, normalize_context=True, policy_lr=3e-4,
    policy_epochs=10, critic_hidden=(32, 32), critic_activation="relu", critic_lr=3e-4, critic_epochs=50,
    critic_minibatches=1, normalize_observations=True, normalize_values=True, critic_context=True,
    gae_lambda=0.95, gamma=1.0, normalize_advantages=True, distance="kl", mean_bound=0.005, cov_bound=0.0005,
    trust_region_coeff=1.0, entropy_schedule="none", entropy_target=0.0, entropy_rate=0.01, seed=3,
    tau=None, basis_bandwidth=2.0, auto_scale_basis=False, offset_per_iteration=False, lr_final=1.0,
    values_before_fit=False, entropy_reference="initial", covariance="full", env_options={},
)  # fmt: skip
TOY = dict(
    env="toy/viapoint", episodes=8, num_basis=5, dmp_alpha=25.0, weights_scale=500.0, goal_scale=1.0,
    relative_goal=False, init_std=0.3, num_segments=10, policy_lr=1e-3, critic_lr=1e-3, critic_epochs=5,
    critic_minibatches=4, mean_bound=0.1, cov_bound=0.02,
)  # fmt: skip
# The authors' Meta-World setup (the preset's numbers, without its env options: the batch is synthetic)
FAITHFUL = dict(
    env="metaworld/reach-v3", tau=5.0, basis_bandwidth=5.0, auto_scale_basis=True, weights_scale=0.1, goal_scale=0.1,
    activation="relu", init_std=1.0, min_std=1e-5, lr_final=0.01, entropy_schedule="linear",
    entropy_reference="zero", entropy_target=0.0, values_before_fit=True, offset_per_iteration=True,
)  # fmt: skip
CASES = {
    "toy-tce": dict(TOY, algo="tce"),
    "toy-tce-entropy": dict(TOY, algo="tce", entropy_schedule="linear", entropy_target=-0.5, mean_bound=0.002),
    "toy-bbrl-cov": dict(TOY, algo="bbrl-cov"),
    "mw-tce": dict(env="metaworld/reach-v3", algo="tce"),
    "mw-bbrl-cov": dict(env="metaworld/reach-v3", algo="bbrl-cov", critic_epochs=20),
    "mw-tce-faithful": dict(FAITHFUL, algo="tce"),
    "mw-bbrl-faithful": dict(FAITHFUL, algo="bbrl", covariance="diag", num_basis=4, trust_region_coeff=10.0),
}


def run_case(name: str) -> dict:
    """One update of case ``name``: {"metrics": {key: float}, "state": the agent's state_dict afterwards}."""
    torch.set_num_threads(1)
    cfg = TCEConfig(**{**BASE, **CASES[name]})
    if cfg.env.startswith("toy/"):
        env = make_env(cfg.env, num_episodes=cfg.episodes)
        agent = TCEAgent.for_env(cfg, env, total_iterations=4)
        agent.iteration = 1  # an entropy bound between the first and the last
        batch = agent.rollout(env, reset_seed(cfg.seed, 0))
        env.close()
    else:
        agent = TCEAgent(cfg, context_dim=39, state_dim=39, dof=4, horizon=500, dt=0.0125, total_iterations=4)
        batch = synthetic_batch(agent, cfg.seed)
    metrics = agent.update(batch)
    metrics = {k: float(v) for k, v in metrics.items() if not k.startswith("time/")}
    return {"metrics": metrics, "state": agent.state_dict()}


def flatten(tree, prefix: str = "") -> dict:
    """Nested dicts / lists of tensors and numbers -> {path: tensor or number}."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flatten(sub, f"{prefix}{key}/").items()}
    if isinstance(tree, list | tuple):
        return {k: v for i, sub in enumerate(tree) for k, v in flatten(sub, f"{prefix}{i}/").items()}
    return {prefix.rstrip("/"): tree}


def assert_same(got, want, where: str) -> None:
    if torch.is_tensor(want):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        if not want.is_floating_point():
            assert torch.equal(got, want), where
            return
        tol = FLOAT64_TOL if want.dtype == torch.float64 else FLOAT32_TOL
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{where}: {m}")
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=METRIC_TOL, abs_tol=METRIC_TOL), f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, where


@pytest.fixture(scope="module")
def golden() -> dict:
    return torch.load(GOLDEN, weights_only=False)


@pytest.mark.parametrize("name", list(CASES))
def test_one_update_computes_the_recorded_numbers(golden, name):
    got, want = run_case(name), golden[name]
    assert set(got["metrics"]) >= set(want["metrics"]), "a metric of the golden record is gone"
    for key, value in want["metrics"].items():
        assert_same(got["metrics"][key], value, f"{name} metric {key}")
    flat_got, flat_want = flatten(got["state"]), flatten(want["state"])
    assert set(flat_got) == set(flat_want), f"{name}: state keys differ"
    for key, value in flat_want.items():
        assert_same(flat_got[key], value, f"{name} state {key}")


if __name__ == "__main__" and "--record" in sys.argv:
    GOLDEN.parent.mkdir(exist_ok=True)
    torch.save({name: run_case(name) for name in CASES}, GOLDEN)
    print(f"wrote {GOLDEN}")
