"""troll.gaussian.trpl_loss scored by a log-probability function (what TCE calls): the same loss as the actions
path, the projected-surrogate-plus-regression written out by hand for (E, K) segment likelihoods, and its checks."""

from __future__ import annotations

import math

import pytest
import torch

import troll.gaussian as tg
from troll.episodic.config import DISTANCES
from troll.gaussian.projection import KINDS_FOR

F64 = torch.float64
KW = {"mean_bound": 0.01, "cov_bound": 0.002}


def policies(e: int = 5, p: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    chol_o = torch.eye(p, dtype=F64) + 0.1 * torch.randn(p, p, generator=g, dtype=F64).tril(-1)
    old = tg.Gaussian.from_chol(torch.randn(e, p, generator=g, dtype=F64), chol_o)
    mean = (old.mean + 0.3 * torch.randn(e, p, generator=g, dtype=F64)).requires_grad_()
    chol = (chol_o * 1.2).requires_grad_()
    return old, mean, chol, g


def test_log_prob_function_equals_the_actions_path_value_and_gradients():
    old, mean, chol, g = policies()
    actions = old.mean + torch.randn(old.mean.shape, generator=g, dtype=F64)
    adv = torch.randn(5, generator=g, dtype=F64)
    grads = []
    for kwargs in ({"actions": actions}, {"actions": None, "log_prob": lambda q: q.log_prob(actions)}):
        action = kwargs.pop("actions")
        out = tg.trpl_loss(tg.Gaussian.from_chol(mean, chol), old, action, adv, **KW, **kwargs, entropy_bound=2.0)
        grads.append((out.loss.detach(), *torch.autograd.grad(out.loss, (mean, chol))))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_segment_shaped_log_probs_give_the_hand_written_tce_loss():
    """(E, K) log-probs: -mean_{e,k} exp(lp^ - lp_old) A + alpha mean_e d(pi~, sg(pi^)), by hand."""
    old, mean, chol, g = policies()
    points = torch.randn(5, 3, 4, generator=g, dtype=F64)  # three "segments" per episode, each a point in theta

    def log_prob(q: tg.Gaussian) -> torch.Tensor:  # (E, K)
        return torch.stack([q.log_prob(points[:, k]) for k in range(3)], 1)

    adv = torch.randn(5, 3, generator=g, dtype=F64)
    new = tg.Gaussian.from_chol(mean, chol)
    out = tg.trpl_loss(new, old, None, adv, **KW, alpha=0.7, log_prob=log_prob)
    proj = tg.project(new, old, **KW).policy
    with torch.no_grad():
        old_lp = log_prob(old)
    want = -((log_prob(proj) - old_lp).exp() * adv).mean() + 0.7 * tg.regression(new, proj, distance="kl").mean()
    torch.testing.assert_close(out.loss, want, rtol=1e-14, atol=0)
    g1 = torch.autograd.grad(out.loss, (mean, chol))
    g2 = torch.autograd.grad(want, (mean, chol))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    assert out.metrics["ratio/min"] > 0 and out.metrics["projected_frac/mean"] > 0  # the bound acts here


def test_log_prob_path_refuses_bad_input():
    old, mean, chol, _ = policies()
    new = tg.Gaussian.from_chol(mean, chol)
    adv = torch.zeros(5, 3, dtype=F64)

    def lp(q):
        return q.mean[:, :3]

    with pytest.raises(ValueError, match="exactly one of actions"):
        tg.trpl_loss(new, old, None, adv, **KW)
    with pytest.raises(ValueError, match="exactly one of actions"):
        tg.trpl_loss(new, old, old.mean, adv[:, 0], **KW, log_prob=lp)
    with pytest.raises(ValueError, match="log_prob must be a function"):
        tg.trpl_loss(new, old, None, adv, **KW, log_prob=3)
    with pytest.raises(ValueError, match=r"advantages has shape \(4, 3\) but \(B, \.\.\.\) with B = 5"):
        tg.trpl_loss(new, old, None, adv[:4], **KW, log_prob=lp)
    with pytest.raises(ValueError, match=r"old_log_prob has shape \(5,\) but \(5, 3\) is expected"):
        tg.trpl_loss(new, old, None, adv, **KW, log_prob=lp, old_log_prob=torch.zeros(5, dtype=F64))
    with pytest.raises(ValueError, match=r"log_prob returned shape \(5, 3\) but advantages have \(5, 2\)"):
        tg.trpl_loss(new, old, None, adv[:, :2], **KW, log_prob=lp, old_log_prob=torch.zeros(5, 2, dtype=F64))
    with pytest.raises(ValueError, match="advantages contains NaN"):
        tg.trpl_loss(new, old, None, adv + math.nan, **KW, log_prob=lp)


def test_episodic_distances_are_the_gaussian_ones_that_project_a_cholesky_factor():
    assert set(DISTANCES) <= set(tg.DISTANCES) and DISTANCES == ("kl", "frobenius")
    assert all("chol" in KINDS_FOR[d] for d in DISTANCES)
