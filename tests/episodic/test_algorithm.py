"""TCE and BBRL as objects: learn gives the rows a ``troll tce train`` folder logs, save / load (from the file or
from a run folder) gives back the same numbers, predict is the policy's mean trajectory, the env may be an object."""

from __future__ import annotations

import pytest
import torch

from troll.episodic import BBRL, TCE, TCEConfig, make_env
from troll.runs.files import read_jsonl
from troll.tce.run import train

# 2 iterations of 8 toy episodes (100 steps each), small networks: about a second
TINY = dict(episodes=8, eval_episodes=8, total_env_steps=1600, eval_every=1, checkpoint_every=1, policy_hidden=(16,),
            critic_hidden=(16,), policy_epochs=3, critic_epochs=3, workers=0)  # fmt: skip


def _numbers(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


@pytest.mark.parametrize("cls", [TCE, BBRL])
def test_learn_logs_the_rows_of_a_run_folder_and_a_loaded_run_evaluates_alike(cls, tmp_path):
    rows = []
    model = cls("toy/viapoint", seed=3, **TINY).learn(callback=rows.append, progress_bar=False)
    assert model.iteration == 2 and model.config.algo == cls.algo
    out = tmp_path / "run"
    train(TCEConfig.preset("toy/viapoint", algo=cls.algo, seed=3, **TINY), out, progress=False, plot=False)
    logged = read_jsonl(out / "metrics.jsonl")
    assert [_numbers(r) for r in rows] == [_numbers(r) for r in logged]  # the command line runs this object
    final = {k.removeprefix("eval/"): v for k, v in logged[-1].items() if k.startswith("eval/")}
    assert TCE.load(out).evaluate() == final == model.evaluate()  # the run's last checkpoint, its last evaluation
    assert type(TCE.load(out)) is cls


def test_save_and_load_give_the_same_policy_and_continue_alike(tmp_path):
    model = TCE("toy/viapoint", seed=1, **TINY)
    model.learn(800, progress_bar=False)  # before any iteration: the budget (and the schedules) become 800 steps
    assert model.iteration == 1 and model.config.total_env_steps == 800
    path = model.save(tmp_path / "tce.pt")
    loaded = TCE.load(path)
    assert loaded.config == model.config and loaded.iteration == 1
    context, pos, vel = torch.tensor([0.1, -0.2, 0.3, 0.4]), torch.zeros(2), torch.zeros(2)
    for a, b in zip(model.predict(context, pos, vel), loaded.predict(context, pos, vel), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    rows_a, rows_b = [], []
    model.learn(1600, callback=rows_a.append, progress_bar=False)
    loaded.learn(1600, callback=rows_b.append, progress_bar=False)
    assert [_numbers(r) for r in rows_a] == [_numbers(r) for r in rows_b] and len(rows_a) == 1


def test_predict_is_the_mean_trajectory_and_a_sample_leaves_learning_alone():
    model = TCE("toy/viapoint", seed=0, **TINY)
    context = torch.tensor([[0.1, -0.2, 0.3, 0.4], [0.0, 0.5, -0.5, 0.2]])
    pos, vel = torch.tensor([[0.1, 0.2], [0.0, 0.0]]), torch.zeros(2, 2)
    theta, traj, traj_vel = model.predict(context, pos, vel)
    agent = model.agent
    with torch.no_grad():
        mean = agent.policy(context).mean
        want, want_vel = agent.dmp.trajectory(mean, pos.double(), vel.double())
    torch.testing.assert_close(theta, mean, rtol=0, atol=0)
    torch.testing.assert_close(traj, want, rtol=0, atol=0)
    torch.testing.assert_close(traj_vel, want_vel, rtol=0, atol=0)
    assert traj.shape == (2, 101, 2) and torch.allclose(traj[:, 0], pos.double())  # it starts where the arm is
    single = model.predict(context[0], pos[0], vel[0])
    torch.testing.assert_close(single.pos, traj[0], rtol=1e-12, atol=1e-15)  # one row: another matmul order
    assert model.predict(context[0]).pos is None  # no start: the parameters alone
    drawn = model.predict(context, pos, vel, deterministic=False)
    assert not torch.equal(drawn.theta, theta)
    other = TCE("toy/viapoint", seed=0, **TINY)
    rows_a, rows_b = [], []
    model.learn(progress_bar=False, callback=rows_a.append)
    other.learn(progress_bar=False, callback=rows_b.append)
    assert [_numbers(r) for r in rows_a] == [_numbers(r) for r in rows_b]


def test_an_env_object_sets_the_batch_and_the_classes_keep_their_algorithms(tmp_path):
    with make_env("toy/viapoint", num_episodes=4) as env:
        model = TCE(env, seed=0, policy_hidden=(8,), critic_hidden=(8,), total_env_steps=400)
        assert (model.config.episodes, model.config.eval_episodes) == (4, 4)
        assert set(model.evaluate()) == {"return", "success_rate", "distance"}
        with pytest.raises(ValueError, match="evaluate with episodes=4, or pass an env name"):
            model.evaluate(8)
        with pytest.raises(ValueError, match="the env runs 4 episodes at a time but episodes=8"):
            TCE(env, episodes=8)
    assert BBRL("toy/viapoint", algo="bbrl-cov", **TINY).config.covariance == "full"
    with pytest.raises(ValueError, match="use BBRL for that"):
        TCE("toy/viapoint", algo="bbrl")
    with pytest.raises(ValueError, match="unknown preset 'mw'"):
        TCE("toy/viapoint", preset="mw")
    assert TCE("toy/viapoint", preset="default", **TINY).config.num_basis == TCEConfig().num_basis
    torch.save({"agent": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a TCE or BBRL file"):
        TCE.load(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError, match="holds no checkpoint-<n>.pt"):
        TCE.load(tmp_path)
