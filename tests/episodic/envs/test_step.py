"""The step env of :mod:`troll.episodic.envs.step` (PPO's): Reacher episodes checked by hand against the episodic
env's reset of the same episode seed, and training episodes that follow the run's seed."""

from __future__ import annotations

import numpy as np
import pytest

from troll.episodic.envs.step import make_step_task


@pytest.fixture(scope="module")
def reacher():
    import gymnasium as gym

    sim = gym.make("Reacher-v5", disable_env_checker=True)
    yield sim.unwrapped
    sim.close()


def run_episode(task, episode_seed: int, action) -> tuple[np.ndarray, list, list]:
    obs, info = task.reset(options={"episode_seed": episode_seed})
    assert info == {}
    rewards, steps = [], []
    for _ in range(task.horizon):
        obs, reward, terminated, truncated, info = task.step(np.asarray(action, dtype=np.float32))
        rewards.append(reward)
        steps.append((terminated, truncated, info))
    return obs, rewards, steps


@pytest.mark.parametrize("sparse", [False, True])
def test_step_task_episode_by_hand(reacher, sparse):
    """Reacher as PPO's step env: 50 steps, truncated at the last only, its info there; with the constant action
    (0.5, -0.5) every step costs ||a||^2 = 0.5, so the sparse episode pays -25 - 50 x final distance at its end."""
    name = "gym/reacher-sparse" if sparse else "gym/reacher"
    task = make_step_task(name, seed=0)
    try:
        assert task.horizon == 50 and task.sparse is sparse
        first, _ = task.reset(options={"episode_seed": 1234})
        expected, _ = reacher.reset(seed=1234)  # the episodic env's reset of that episode seed
        np.testing.assert_array_equal(first, expected)
        _, rewards, steps = run_episode(task, 1234, [0.5, -0.5])
        assert [t for t, _, _ in steps] == [False] * 50
        assert [t for _, t, _ in steps] == [False] * 49 + [True]
        assert [info for _, _, info in steps[:-1]] == [{}] * 49
        last = steps[-1][2]
        assert set(last) == {"is_success", "distance", "episode_return"}
        fingertip = task.sim.get_body_com("fingertip") - task.sim.get_body_com("target")
        assert last["distance"] == pytest.approx(float(np.linalg.norm(fingertip)), abs=1e-12)
        assert last["is_success"] == (last["distance"] <= 0.02)
        assert last["episode_return"] == pytest.approx(sum(rewards), abs=1e-9)
        if sparse:
            assert rewards[:-1] == [0.0] * 49
            assert rewards[-1] == pytest.approx(-25.0 - 50 * last["distance"], abs=1e-9)
        else:
            assert all(r < -0.5 for r in rewards)  # minus the distance minus the control cost 0.5
        # the same episode seed gives the same episode
        _, again, _ = run_episode(task, 1234, [0.5, -0.5])
        assert again == rewards
    finally:
        task.close()


def test_step_task_training_episodes_follow_the_seed():
    a, b = make_step_task("gym/reacher", seed=0), make_step_task("gym/reacher", seed=0)
    other = make_step_task("gym/reacher", seed=1)
    try:
        starts = [a.reset()[0] for _ in range(3)]
        assert a.index == 3
        assert not np.array_equal(starts[0], starts[1])  # a new episode each reset
        for s in starts:
            np.testing.assert_array_equal(b.reset()[0], s)  # the same run seed: the same episodes
        assert not np.array_equal(other.reset()[0], starts[0])
    finally:
        for task in (a, b, other):
            task.close()


def test_an_env_without_a_step_interface_is_refused():
    with pytest.raises(ValueError, match="env 'toy/viapoint' has no step interface"):
        make_step_task("toy/viapoint", seed=0)


def test_box_pushing_ends_a_success_as_terminated_as_fancy_gym_does():
    """fancy_gym's box pushing returns terminated = (last step and success), truncated = (last step and not success),
    so that PPO bootstraps no value past a success; the task's success is forced at the last step here."""
    task = make_step_task("fancy/box-pushing-dense", seed=0)
    real, success = task.sim.step, [True]

    def step(action):
        obs, reward, info = real(action)
        return obs, reward, {**info, "is_success": success[0]} if info else info

    task.sim.step = step  # an instance attribute: the task's next steps call it
    try:
        _, _, steps = run_episode(task, 7, np.zeros(7))
        assert [(t, u) for t, u, _ in steps[:-1]] == [(False, False)] * 99
        assert steps[-1][:2] == (True, False) and steps[-1][2]["is_success"]
        success[0], task.t, task.sim.t = False, 99, 99  # the last step again, failed
        _, _, terminated, truncated, info = task.step(np.zeros(7))
        assert (terminated, truncated, info["is_success"]) == (False, True, False)
        assert not make_step_task.__globals__["_GymnasiumTask"].terminates_on_success  # Reacher: always truncated
    finally:
        task.close()
