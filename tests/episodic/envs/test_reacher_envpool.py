"""Reacher on EnvPool (envs/reacher.py's EnvPoolReacher) is gymnasium's Reacher-v5 task behind the same controller.

- The observation layout, checked on both backends against the arm's own kinematics: cos q, sin q, target xy, q'
  (the change of the unwrapped q), fingertip - target (forward kinematics of q minus the target).
- The joint angles recovered from cos / sin (JointAngles) equal gymnasium's qpos on runs at full torque, where
  joint 0 turns about five times (through +-pi each time); and a desired move through pi is tracked on EnvPool.
- The two backends are one task: 64 episodes each (different draws: each backend has its own generator) of a
  hand-made reaching solution give the same success rate (Fisher's exact test), return, final distance and
  control cost (Welch's t-test), and the same distribution of every reset-observation entry (two-sample
  Kolmogorov-Smirnov); Bonferroni over all of them at 0.05. The check can fail: the same comparison against the
  Python backend with kp 4 instead of 8 is flagged.
The rest (dims, rewards, seeding over threads, a second run of one reset) runs on both backends in
test_envs.py; bad options and a missing envpool in test_envpool_backend.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from troll.episodic.envs import make_env
from troll.episodic.envs.reacher import DT, HORIZON, JointAngles

from .test_envs import min_jerk

pytest.importorskip("envpool")
pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

BACKENDS = ("envpool", "python")
L1, L2 = 0.1, 0.11  # reacher.xml: link 1 from joint 0 to joint 1, link 2 from joint 1 to the fingertip
EPISODES = 64


def fingertip(q: torch.Tensor) -> torch.Tensor:
    """Planar forward kinematics (..., 2) of joint angles q (..., 2)."""
    q0, q01 = q[..., 0], q[..., 0] + q[..., 1]
    return torch.stack([L1 * q0.cos() + L2 * q01.cos(), L1 * q0.sin() + L2 * q01.sin()], -1)


def reaching(start, *, noise: float = 0.0, miss: float = 0.0):
    """Desired q, q' (E, T+1, 2): a minimum-jerk move in 40 steps from the start to the joint angles that put the
    fingertip on the target (context 4:6; the elbow solution nearer the start, joint 0 within pi of it), or
    ``miss`` metres beyond it, plus Gaussian noise of ``noise`` rad on the final angles (a fixed generator)."""
    target, q_start = start.context[:, 4:6].double(), start.pos.double()
    r = target.norm(dim=1)
    target, r = target * ((r + miss) / r)[:, None], (r + miss).clamp(L2 - L1, L1 + L2)
    elbow = torch.acos(((r**2 - L1**2 - L2**2) / (2 * L1 * L2)).clamp(-1, 1))
    best = None
    for q1 in (elbow, -elbow):
        q0 = torch.atan2(target[:, 1], target[:, 0]) - torch.atan2(L2 * q1.sin(), L1 + L2 * q1.cos())
        q0 = q_start[:, 0] + torch.remainder(q0 - q_start[:, 0] + torch.pi, 2 * torch.pi) - torch.pi
        q = torch.stack([q0, q1], 1)
        nearer = (q - q_start).abs().sum(1) < (best - q_start).abs().sum(1) if best is not None else True
        best = torch.where(torch.as_tensor(nearer)[..., None], q, best if best is not None else q)
    best = best + noise * torch.randn(best.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return min_jerk(start.pos, best.float(), HORIZON, DT, move=40)


def rollout(backend: str, seed: int = 0, *, noise: float = 0.0, miss: float = 0.0, **options):
    """(start, episodes) of EPISODES episodes of :func:`reaching` on ``backend``."""
    with make_env("gym/reacher", num_episodes=EPISODES, workers=0, backend=backend, **options) as env:
        start = env.reset(seed)
        return start, env.run(*reaching(start, noise=noise, miss=miss))


@pytest.mark.parametrize("backend", BACKENDS)
def test_observation_layout(backend):
    start, ep = rollout(backend, seed=1)
    assert start.context.shape == (EPISODES, 10) and ep.states.shape == (EPISODES, HORIZON + 1, 10)
    obs = ep.states.double()
    torch.testing.assert_close(obs[..., 0:2] ** 2 + obs[..., 2:4] ** 2, torch.ones_like(obs[..., :2]))
    q = torch.atan2(obs[..., 2:4], obs[..., 0:2])
    assert start.pos.abs().max() <= 0.1 and start.vel.abs().max() <= 0.005  # Reacher-v5's reset noise
    torch.testing.assert_close(start.pos, q[:, 0].float())
    target = obs[:, 0, 4:6]
    assert (target.norm(dim=-1) < 0.2).all() and torch.equal(obs[..., 4:6], target[:, None].expand_as(obs[..., 4:6]))
    # at reset within 1e-6 m (the fingertip body's frame); after a step within 0.5 mm, as MuJoCo's RK4 step leaves
    # the body positions of its last stage, a little behind the final qpos in fast moves (up to ~0.1 mm here)
    tip = fingertip(q) - target[:, None]
    torch.testing.assert_close(obs[:, 0, 8:10], tip[:, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(obs[..., 8:10], tip, atol=5e-4, rtol=0)
    # q' is the joint velocity: the trapezoid rule over it gives each step's change of q (wrapped)
    step = torch.remainder(q[:, 1:] - q[:, :-1] + torch.pi, 2 * torch.pi) - torch.pi
    assert (step - DT * (obs[:, 1:, 6:8] + obs[:, :-1, 6:8]) / 2).abs().max() < 0.01
    assert ep.success.float().mean() > 0.5  # the hand-made solution reaches most targets


def test_joint_angles_equal_qpos_through_pi():
    """JointAngles on gymnasium's observations equals its qpos (what the Python backend's controller reads) on
    two runs at full torque: joint 0 turns ~31 rad either way, joint 1 hits its limits."""
    import gymnasium as gym

    env = gym.make("Reacher-v5", disable_env_checker=True)
    sim = env.unwrapped
    try:
        for sign in (1.0, -1.0):
            obs, _ = sim.reset(seed=3)
            angles, seen = JointAngles(sim.dt), [sim.data.qpos[:2].copy()]
            q, qd = angles(obs[None])
            err = [np.abs(q[0] - seen[0]).max()]
            guess = []  # the trapezoid prediction's error (JointAngles' docstring)
            for t in range(HORIZON):
                before = angles.q + 0.5 * sim.dt * angles.qd
                obs, *_ = sim.step(np.array([sign, -sign]) * (1 if t < 25 else -1))
                q, qd = angles(obs[None])
                seen.append(sim.data.qpos[:2].copy())
                err.append(max(np.abs(q[0] - seen[-1]).max(), np.abs(qd[0] - sim.data.qvel[:2]).max()))
                guess.append(np.abs(before[0] + 0.5 * sim.dt * qd[0] - seen[-1]).max())
            turns = np.abs(np.array(seen)[:, 0]).max() / (2 * np.pi)
            assert turns > 4 and max(err) < 1e-12 and max(guess) < 0.15, (turns, max(err), max(guess))
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_move_through_pi_is_tracked(backend):
    """Joint 0 asked to turn 4 rad (through pi from near 0): tracked as on a move that does not wrap. Without the
    unwrapping, the PD error would jump by 2 pi where the arm passes pi and turn it back."""
    with make_env("gym/reacher", num_episodes=4, workers=0, backend=backend) as env:
        start = env.reset(0)
        pos, vel = min_jerk(start.pos, start.pos + torch.tensor([4.0, 0.0]), HORIZON, DT, move=40)
        ep = env.run(pos, vel)
    angles = JointAngles(DT)
    q = torch.from_numpy(np.stack([angles(s)[0] for s in ep.states.double().numpy().transpose(1, 0, 2)], 1))
    assert q[:, -1, 0].min() > np.pi and (q - pos).abs().max() < 0.1, (q - pos).abs().max()


def _compare(a, b) -> dict[str, float]:
    """p of "same distribution" per metric and reset entry, of two rollouts (start, episodes)."""
    from scipy import stats

    from troll.episodic.envs.equivalence import p_value

    (sa, ea), (sb, eb) = a, b
    out = {"success": p_value("success", ea.success.double().numpy(), eb.success.double().numpy())}
    for k in ("return", "distance", "ctrl_cost"):
        out[k] = p_value(k, ea.final[k].double().numpy(), eb.final[k].double().numpy())
    for i in range(10):
        out[f"reset obs {i}"] = float(stats.ks_2samp(sa.context[:, i].numpy(), sb.context[:, i].numpy()).pvalue)
    return out


@pytest.mark.parametrize(
    ("noise", "control", "flagged"),
    [(0.0, {"kp": 2.0}, ("distance",)), (0.1, {"miss": 0.02}, ("success", "distance"))],
    ids=["reaching", "noisy"],
)
def test_backends_are_one_task(noise, control, flagged):
    """The reaching solution (success 1.0 on both backends) and the same with 0.1 rad of noise on its final angles
    (success ~0.7): no metric and no reset entry differs beyond noise (Bonferroni over the 14 p-values of each of
    the two policies at 0.05). The negative controls, on the Python backend: kp 2 instead of 8 (the final
    distance grows from ~0.1 mm to ~0.8 mm), or aiming 2 cm beyond the target, are flagged."""
    envpool = rollout("envpool", noise=noise)
    p = _compare(envpool, rollout("python", noise=noise))
    alpha = 0.05 / (2 * len(p))
    assert min(p.values()) >= alpha, p
    changed = _compare(envpool, rollout("python", noise=noise, **control))
    assert all(changed[k] < alpha for k in flagged), changed
