"""Bad input to troll.gaussian: each case raises a ValueError or TypeError that names the argument and the fix."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from _gaussian_cases import F64, policy_pair
from conftest import gen

import troll.gaussian as tg


def pair(kind="chol", **kw):
    return policy_pair(kind, states=3, dim=2, g=gen(40), **kw)


def project(new, old, **kw):
    return tg.project(new, old, **({"mean_bound": 0.05, "cov_bound": 0.01} | kw))


@pytest.mark.parametrize("name", ["mean_bound", "cov_bound"])
@pytest.mark.parametrize("value", [0.0, -0.1, math.inf, math.nan, True, None, "0.1"])
def test_bounds_must_be_positive_finite_numbers(name, value):
    new, old = pair()
    with pytest.raises(ValueError, match=f"{name} must be > 0 and a finite number"):
        project(new, old, **{name: value})


def test_unknown_distance():
    new, old = pair()
    with pytest.raises(ValueError, match="distance='kl2' is not supported; choose one of 'kl', 'w2', 'frobenius'"):
        project(new, old, distance="kl2")


@pytest.mark.parametrize(("distance", "kind", "fix"), [("w2", "chol", "from_sqrt"), ("kl", "sqrt", "from_chol")])
def test_distance_needs_its_parameterisation(distance, kind, fix):
    new, old = pair(kind)
    with pytest.raises(ValueError, match=f"distance='{distance}' projects policies of kind .*{fix}"):
        project(new, old, distance=distance)


@pytest.mark.parametrize("part", ["mean", "factor"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("who", ["new", "old"])
def test_non_finite_values(part, bad, who):
    new, old = pair()
    policies = {"new": new, "old": old}
    t = getattr(policies[who], part).clone()
    t[0, 0] = bad
    policies[who] = tg.Gaussian(**{**vars(policies[who]), part: t})
    with pytest.raises(ValueError, match=rf"{who}\.{part} contains NaN or inf"):
        project(policies["new"], policies["old"])


def test_cholesky_factor_needs_positive_diagonal():
    new, old = pair()
    factor = new.factor.clone()
    factor[1, 1, 1] = -factor[1, 1, 1]
    with pytest.raises(ValueError, match=r"new\.factor \(kind 'chol'\) needs a positive diagonal.*softplus"):
        project(tg.Gaussian.from_chol(new.mean, factor), old)


def test_cholesky_factor_must_be_lower_triangular():
    new, old = pair()
    factor = new.factor.clone()
    factor[0, 0, 1] = 0.3
    with pytest.raises(ValueError, match=r"old\.factor \(kind 'chol'\) must be lower triangular; pass torch\.tril"):
        project(old, tg.Gaussian.from_chol(new.mean, factor))


def test_std_must_be_positive():
    new, old = pair("diag")
    std = new.factor.clone()
    std[2, 0] = 0.0
    with pytest.raises(ValueError, match=r"new\.factor \(std\) must be > 0 everywhere"):
        project(tg.Gaussian.from_std(new.mean, std), old, distance="kl")


def test_sqrt_factor_must_be_symmetric_positive_definite():
    new, old = pair("sqrt")
    asym = new.factor.clone()
    asym[0, 0, 1] += 0.5
    with pytest.raises(ValueError, match=r"new\.factor \(kind 'sqrt'\) must be symmetric; pass \(S \+ S\.mT\) / 2"):
        project(tg.Gaussian.from_sqrt(new.mean, asym), old, distance="w2")
    indefinite = torch.diag_embed(torch.tensor([[1.0, -1.0]] * 3, dtype=F64))
    with pytest.raises(ValueError, match=r"new\.factor \(kind 'sqrt'\) is not positive definite"):
        project(tg.Gaussian.from_sqrt(new.mean, indefinite), old, distance="w2")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda o: tg.Gaussian(o.mean[:2], o.factor[:2], o.kind), r"old\.mean has shape \(2, 2\) but new\.mean has"),
        (lambda o: tg.Gaussian(o.mean, o.factor[0], o.kind), r"old\.factor has shape \(2, 2\) .*global covariance"),
        (lambda o: tg.Gaussian.from_std(o.mean, o.factor.diagonal(dim1=-2, dim2=-1)), "new has kind 'chol' but old"),
    ],
)
def test_new_and_old_must_match(change, match):
    new, old = pair()
    with pytest.raises(ValueError, match=match):
        project(new, change(old))


def test_dtype_mix_is_a_type_error_with_the_fix():
    new, old = pair()
    with pytest.raises(TypeError, match=r"old\.mean is torch\.float32 but new\.mean is torch\.float64; cast old with"):
        project(new, old.to(torch.float32))
    with pytest.raises(TypeError, match=r"policy\.mean is torch\.float64 but policy\.factor is torch\.float32"):
        tg.Gaussian(new.mean, new.factor.float(), "chol")
    with pytest.raises(TypeError, match=r"float32 or float64: cast with \.float\(\)"):
        tg.Gaussian(new.mean.half(), new.factor.half(), "chol")


@pytest.mark.parametrize(
    ("mean", "factor", "kind", "match"),
    [
        (torch.zeros(3), torch.ones(3), "diag", r"mean must have shape \(B, D\)"),
        (torch.zeros(0, 3), torch.ones(3), "diag", r"mean must have shape \(B, D\) with B >= 1"),
        (torch.zeros(2, 3), torch.ones(2, 2), "diag", r"needs std \(B, D\) or \(D,\)"),
        (torch.zeros(2, 3), torch.eye(2), "chol", r"needs L \(B, D, D\) or \(D, D\)"),
        (torch.zeros(2, 3), torch.eye(3), "cholesky", "policy.kind='cholesky' is not supported"),
        ([[0.0, 0.0]], torch.eye(2), "chol", r"policy\.mean must be a torch\.Tensor, got list; wrap it"),
    ],
)
def test_policy_structure(mean, factor, kind, match):
    with pytest.raises((ValueError, TypeError), match=match):
        tg.Gaussian(mean, factor, kind)


def test_project_needs_gaussians():
    new, old = pair()
    with pytest.raises(TypeError, match="old must be a troll.gaussian.Gaussian, got tuple; build it with"):
        project(new, (old.mean, old.factor))


def test_loss_arguments():
    new, old = pair()
    actions, adv = old.mean.clone(), torch.zeros(3, dtype=F64)
    kw = {"mean_bound": 0.05, "cov_bound": 0.01}
    with pytest.raises(ValueError, match=r"actions has shape \(3, 3\) but \(3, 2\) is expected"):
        tg.trpl_loss(new, old, torch.zeros(3, 3, dtype=F64), adv, **kw)
    with pytest.raises(ValueError, match=r"advantages has shape \(3, 1\) but \(3,\) is expected"):
        tg.trpl_loss(new, old, actions, adv.unsqueeze(-1), **kw)
    with pytest.raises(ValueError, match=r"advantages contains NaN or inf"):
        tg.trpl_loss(new, old, actions, adv + math.nan, **kw)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        tg.trpl_loss(new, old, actions, adv, alpha=-1.0, **kw)
    with pytest.raises(ValueError, match="entropy_bound must be a number or None"):
        tg.trpl_loss(new, old, actions, adv, entropy_bound=math.nan, **kw)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64])
def test_loss_refuses_actions_that_are_no_samples(dtype):
    """A bool (a mask) or integer (indices) tensor of the right shape is refused by name, never cast and scored."""
    new, old = pair()
    actions = torch.ones(3, 2, dtype=dtype)
    with pytest.raises(ValueError, match=rf"actions must be a floating-point tensor .* got dtype {dtype}"):
        tg.trpl_loss(new, old, actions, torch.zeros(3, dtype=F64), mean_bound=0.05, cov_bound=0.01)


SUBNORMAL = 4.9e-324  # the smallest positive float64, a subnormal number (0 in float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["mean_bound", "cov_bound"])
@pytest.mark.parametrize("value", [SUBNORMAL, 1e-310])
def test_subnormal_bounds_are_refused_by_name(dtype, name, value):
    new, old = pair(dtype=dtype)
    bounds = {"mean_bound": 0.05, "cov_bound": 0.01, name: value}
    with pytest.raises(ValueError, match=rf"{name}=.* is a subnormal number.* pass {name} >= 2.225e-308"):
        tg.project(new, old, **bounds)
    with pytest.raises(ValueError, match=rf"{name}=.* is a subnormal number"):
        tg.trpl_loss(new, old, old.mean.clone(), torch.zeros(3, dtype=dtype), **bounds)


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize(("kind", "distance"), [("diag", "kl"), ("chol", "kl"), ("chol", "frobenius"), ("sqrt", "w2")])
def test_the_smallest_normal_bound_projects_onto_the_old_policy(kind, distance, single):
    """float32 at bound = 2.2e-308 (both parts) gives the old policy up to float32 rounding, with finite gradients.
    The steps omega and eta overflow float32 to inf there (1/r - 1 with r ~ sqrt(bound)), which is their value."""
    new, old = pair(kind, single=single, dtype=torch.float32)
    new = tg.Gaussian(new.mean.clone().requires_grad_(), new.factor.clone().requires_grad_(), kind)
    tiny = sys.float_info.min
    proj = tg.project(new, old, mean_bound=tiny, cov_bound=tiny, distance=distance)
    torch.testing.assert_close(proj.policy.mean, old.mean)
    torch.testing.assert_close(proj.policy.factor, old.factor)
    assert (proj.mean_after <= tiny).all() and (proj.cov_after <= 1e-6).all()  # float32 rounding, not a step
    (proj.policy.mean.sum() + proj.policy.factor.sum()).backward()
    assert torch.isfinite(new.mean.grad).all() and torch.isfinite(new.factor.grad).all()


def test_entropy_schedule_arguments():
    with pytest.raises(ValueError, match="kind='cosine' is not supported"):
        tg.EntropySchedule("cosine")
    with pytest.raises(ValueError, match="total_steps must be an integer >= 1"):
        tg.EntropySchedule("linear", initial=1.0, target=0.0, total_steps=0)
    with pytest.raises(ValueError, match=r"rate must lie in \(0, 1\)"):
        tg.EntropySchedule("exponential", rate=1.5)
    with pytest.raises(ValueError, match="initial must be > -inf and a finite number"):
        tg.EntropySchedule("linear", initial=math.nan)


# ------------------------------------------------------------------- every public function checks its input
# (each once raised a raw RuntimeError or AttributeError, or returned NaN)


def bad_calls():
    """(name, call, exception, message) for each public function of troll.gaussian beyond project."""
    new, old = pair()
    diag_new, diag_old = pair("diag")
    glob_new, _ = pair(single=True)
    proj = project(new, old)
    singular = old.factor.clone()
    singular[0, 1, 1] = 0.0
    tiny = old.factor.clone()
    tiny[0, 1, 1] = 1e-200  # positive, but numerically singular: the distance does not fit float64
    kl = {"distance": "kl"}
    return [
        ("mean_distance: list", lambda: tg.mean_distance([[0.0, 0.0]], old, **kl), ValueError, "mean must be a torch"),
        (
            "mean_distance: shape",
            lambda: tg.mean_distance(new.mean[:, :1], old, **kl),
            ValueError,
            r"mean has shape \(3, 1\) but q\.mean has \(3, 2\)",
        ),
        (
            "mean_distance: dtype",
            lambda: tg.mean_distance(new.mean.float(), old, **kl),
            TypeError,
            r"mean is torch\.float32 but q\.mean is torch\.float64; cast it with mean\.to",
        ),
        ("mean_distance: q", lambda: tg.mean_distance(new.mean, old.mean, **kl), TypeError, "q must be a troll"),
        ("mean_distance: NaN", lambda: tg.mean_distance(new.mean * math.nan, old, **kl), ValueError, "mean contains"),
        ("mean_distance: distance", lambda: tg.mean_distance(new.mean, old, distance="l2"), ValueError, "'l2' is not"),
        (
            "cov_distance: singular old factor",
            lambda: tg.cov_distance(new, tg.Gaussian.from_chol(old.mean, singular), **kl),
            ValueError,
            r"q\.factor \(kind 'chol'\) needs a positive diagonal",
        ),
        (
            "cov_distance: numerically singular old factor",
            lambda: tg.cov_distance(new, tg.Gaussian.from_chol(old.mean, tiny), **kl),
            ValueError,
            r"p is outside the supported range: its kl distance to q .* is inf",
        ),
        (
            "cov_distance: states",
            lambda: tg.cov_distance(new, tg.Gaussian(old.mean[:2], old.factor[:2], "chol"), **kl),
            ValueError,
            r"q\.mean has shape \(2, 2\) but p\.mean has \(3, 2\)",
        ),
        (
            "cov_distance: global on one side",
            lambda: tg.cov_distance(glob_new, old, **kl),
            ValueError,
            "p has one global covariance but the other policy one per state",
        ),
        ("cov_distance: dtype", lambda: tg.cov_distance(new, old.to(torch.float32), **kl), TypeError, "cast it"),
        ("cov_distance: q", lambda: tg.cov_distance(new, None, **kl), TypeError, "q must be a troll.gaussian"),
        (
            "total_distance: shape",
            lambda: tg.total_distance(new, tg.Gaussian(old.mean[:1], old.factor[:1], "chol"), **kl),
            ValueError,
            r"q\.mean has shape \(1, 2\)",
        ),
        (
            "regression: projected",
            lambda: tg.regression(new, proj, **kl),
            TypeError,
            "projected must be a troll.gaussian.Gaussian",
        ),
        (
            "regression: kinds and shapes",
            lambda: tg.regression(new, tg.Gaussian(diag_old.mean[:2], diag_old.factor[:2], "diag"), **kl),
            ValueError,
            r"projected\.mean has shape \(2, 2\) but new\.mean has \(3, 2\)",
        ),
        ("log_prob: shape", lambda: old.log_prob(new.mean[0]), ValueError, r"x has shape \(2,\) but policy\.mean"),
        ("log_prob: dtype", lambda: old.log_prob(new.mean.float()), TypeError, r"x is torch\.float32 but policy"),
        ("log_prob: list", lambda: old.log_prob([[0.0, 0.0]] * 3), ValueError, "x must be a torch.Tensor"),
        ("log_prob: NaN", lambda: old.log_prob(new.mean + math.nan), ValueError, "x contains NaN or inf"),
        (
            "log_prob: negative std",
            lambda: tg.Gaussian.from_std(diag_new.mean, -diag_new.factor).log_prob(diag_new.mean),
            ValueError,
            r"policy\.factor \(std\) must be > 0",
        ),
        ("control_entropy: policy", lambda: tg.control_entropy(proj, 0.0), TypeError, "policy must be a troll"),
        (
            "projection_metrics: mean_bound=-1",
            lambda: tg.projection_metrics(proj, mean_bound=-1, cov_bound=0.01),
            ValueError,
            "mean_bound must be > 0",
        ),
        (
            "projection_metrics: cov_bound",
            lambda: tg.projection_metrics(proj, mean_bound=0.05, cov_bound=math.nan),
            ValueError,
            "cov_bound must be > 0",
        ),
        (
            "projection_metrics: proj",
            lambda: tg.projection_metrics(proj.policy, mean_bound=0.05, cov_bound=0.01),
            TypeError,
            "proj must be the GaussianProjection",
        ),
        (
            "trpl_loss: entropy_bound=inf",
            lambda: tg.trpl_loss(
                new, old, old.mean, torch.zeros(3, dtype=F64), mean_bound=0.05, cov_bound=0.01, entropy_bound=math.inf
            ),
            ValueError,
            r"entropy_bound must be a number or None, got inf",
        ),
    ]


BAD_CALLS = bad_calls()


@pytest.mark.parametrize("index", range(len(BAD_CALLS)), ids=[c[0] for c in BAD_CALLS])
def test_public_functions_check_their_input(index):
    _, call, error, match = BAD_CALLS[index]
    with pytest.raises(error, match=match):
        call()


def test_every_public_function_is_covered():
    """Each callable of troll.gaussian.__all__ (and Gaussian.log_prob) has a bad-input case here or above."""
    covered = {name.split(":")[0] for name, *_ in BAD_CALLS} | {"project", "Gaussian", "EntropySchedule"}
    callables = {n for n in tg.__all__ if callable(getattr(tg, n)) and n != "GaussianProjection"} | {"log_prob"}
    assert callables <= covered, callables - covered
