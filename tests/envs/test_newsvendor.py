"""Tests of the newsvendor env: its oracle maths against quadrature, closed forms, brute force and Monte Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest

from alea_trl.envs.newsvendor import (
    NewsvendorEnv,
    critical_fractile,
    expected_profit,
    nb_posterior,
    nb_predictive_pmf,
    optimal_order,
    predictive_quantiles,
)
from alea_trl.questions import validate_action_rewards, validate_targets

from .conftest import play_episode


def _nb_pmf_closed(a: float, b: float, n: int) -> np.ndarray:
    """Negative-binomial pmf written directly with lgamma (independent of the env's log-space recursion)."""
    p = b / (b + 1.0)
    return np.array(
        [
            math.exp(math.lgamma(a + d) - math.lgamma(a) - math.lgamma(d + 1) + a * math.log(p) + d * math.log(1 - p))
            for d in range(n)
        ]
    )


def _pois_logpmf(d: int, lam: np.ndarray) -> np.ndarray:
    return d * np.log(lam) - lam - math.lgamma(d + 1)


def _quadrature_predictive(k: float, r: float, demands, n: int) -> np.ndarray:
    """Predictive pmf by numerical integration of Poisson(d | lam) against prior x likelihood on a grid of lam."""
    lam = np.linspace(1e-6, 80.0, 200_001)
    logpost = (k - 1) * np.log(lam) - r * lam + sum(_pois_logpmf(d, lam) for d in demands)
    w = np.exp(logpost - logpost.max())
    w /= np.trapezoid(w, lam)
    return np.array([np.trapezoid(w * np.exp(_pois_logpmf(d, lam)), lam) for d in range(n)])


def _random_states(n_states: int, seed: int, **kw):
    """Envs at random decision points (random actions from reset)."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n_states:
        env = NewsvendorEnv(**kw).reset(np.random.default_rng(rng.integers(2**32)))
        for _ in range(rng.integers(0, env.n_periods)):
            env.step(int(rng.integers(env.n_legal())))
        out.append(env)
    return out


# ------------------------------------------------------------------------------------------------- pure functions
@pytest.mark.parametrize(
    "k,r,demands", [(4.0, 0.5, []), (4.0, 0.5, [7, 10]), (2.5, 1.25, [3, 0, 6, 2]), (1.5, 0.1, [20])]
)
def test_predictive_pmf_vs_quadrature_and_closed_form(k, r, demands):
    pmf = nb_predictive_pmf(k, r, demands, max_d=30)
    assert len(pmf) >= 31 and 1.0 - pmf.sum() < 1e-12
    quad = _quadrature_predictive(k, r, demands, 31)
    np.testing.assert_allclose(pmf[:31], quad, atol=1e-7)
    a, b = k + sum(demands), r + len(demands)
    assert nb_posterior(k, r, demands) == (a, b)
    np.testing.assert_allclose(pmf, _nb_pmf_closed(a, b, len(pmf)), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("observed", [[8], [3, 5]])
def test_predictive_pmf_vs_generative_monte_carlo(observed):
    """Simulate the generative model (rate from the prior, then demands) and condition on the observed demands."""
    rng = np.random.default_rng(1)
    n = 2_000_000
    lam = rng.gamma(4.0, 1.0 / 0.5, size=n)
    keep = np.ones(n, dtype=bool)
    for d in observed:
        keep &= rng.poisson(lam) == d
    nxt = rng.poisson(lam[keep])
    m = len(nxt)
    assert m > 5_000
    pmf = nb_predictive_pmf(4.0, 0.5, observed, max_d=30)
    freq = np.bincount(nxt, minlength=31)[:31] / m
    se = np.sqrt(pmf[:31] * (1 - pmf[:31]) / m)
    assert np.all(np.abs(freq - pmf[:31]) <= 4 * se + 1e-9)


def test_pmf_tail_extension():
    pmf = nb_predictive_pmf(0.5, 0.02, [], max_d=5)  # heavy tail: mean 25, sd about 36
    assert 1.0 - pmf.sum() < 1e-12 and len(pmf) > 200
    assert len(nb_predictive_pmf(4.0, 0.5, [], max_d=500)) >= 501


@pytest.mark.parametrize("q", [0, 1, 5, 8, 13, 24])
def test_expected_profit_vs_brute_force_and_monte_carlo(q):
    k, r, demands, price, cost = 4.0, 0.5, [7, 10, 4], 5.0, 2.0
    a, b = k + sum(demands), r + len(demands)
    long_pmf = _nb_pmf_closed(a, b, 400)
    d = np.arange(400)
    brute = float(np.sum(long_pmf * (price * np.minimum(d, q) - cost * q)))
    pmf = nb_predictive_pmf(k, r, demands, max_d=30)
    assert expected_profit(q, pmf, price, cost) == pytest.approx(brute, abs=1e-9)
    # the tail D >= q is accounted exactly: a pmf cut right at q - 1 gives the same answer
    assert expected_profit(q, pmf[:q], price, cost) == pytest.approx(brute, abs=1e-9)
    rng = np.random.default_rng(2)
    dem = rng.poisson(rng.gamma(a, 1.0 / b, size=400_000))
    profit = price * np.minimum(dem, q) - cost * q
    se = profit.std() / math.sqrt(len(profit))
    assert abs(profit.mean() - expected_profit(q, pmf, price, cost)) <= 4 * se + 1e-9
    with pytest.raises(ValueError):
        expected_profit(q + 1, pmf[:q], price, cost)


def test_optimal_order_over_all_integers_is_the_critical_fractile_quantity():
    rng = np.random.default_rng(3)
    for _ in range(40):
        k, r = float(rng.uniform(1, 10)), float(rng.uniform(0.1, 2))
        demands = rng.poisson(rng.uniform(1, 30), size=rng.integers(0, 10)).tolist()
        cost = float(rng.uniform(0.1, 5))
        price = cost + float(rng.uniform(0.1, 10))
        a, b = k + sum(demands), r + len(demands)
        closed = _nb_pmf_closed(a, b, 600)
        profits = [float(np.sum(closed * (price * np.minimum(np.arange(600), q) - cost * q))) for q in range(300)]
        best = int(np.argmax(profits))
        fractile = (price - cost) / price
        assert critical_fractile(price, cost) == pytest.approx(fractile)
        cdf = np.cumsum(closed)
        assert best == int(np.argmax(cdf >= fractile))
        assert optimal_order(nb_predictive_pmf(k, r, demands), price, cost) == best


def test_predictive_quantiles_vs_pmf():
    for env in _random_states(30, seed=4):
        a, b = nb_posterior(env.prior_shape, env.prior_rate, env.demands)
        cdf = np.cumsum(_nb_pmf_closed(a, b, 200))
        samples = np.asarray(env.oracle_targets()["demand"])
        levels = (np.arange(64) + 0.5) / 64
        assert len(samples) == 64 and np.all(np.diff(samples) >= 0) and np.all(samples == np.round(samples))
        s = samples.astype(int)
        assert np.all(cdf[s] >= levels - 1e-12)
        assert np.all((s == 0) | (cdf[np.maximum(s - 1, 0)] < levels + 1e-12))
    np.testing.assert_array_equal(predictive_quantiles([0.25, 0.5, 0.25], n=4), [0, 1, 1, 2])


# ------------------------------------------------------------------------------------------------------- env oracle
def test_targets_valid_and_observe_stable():
    for env in _random_states(150, seed=5) + _random_states(10, seed=6, n_periods=30):
        d1, d2 = env.observe(), env.observe()
        assert d1 == d2 and env.n_legal() == d1.n_legal == 13
        targets = validate_targets(d1, env.oracle_targets())
        assert set(targets) == {"demand", "over"}
        validate_action_rewards(d1, env.action_rewards())
        n = len(env.demands)
        assert f"Day {n + 1} of {env.n_periods}" in d1.state
        if n:
            assert f"total {sum(env.demands)})" in d1.state
        if env.n_periods == 8:
            assert len(d1.state) < 1000


def test_over_probability_vs_monte_carlo():
    rng = np.random.default_rng(7)
    for env in _random_states(12, seed=8):
        a, b = nb_posterior(env.prior_shape, env.prior_rate, env.demands)
        dem = rng.poisson(rng.gamma(a, 1.0 / b, size=200_000))
        p = env.oracle_targets()["over"]
        freq = np.mean(dem > env.threshold)
        assert str(env.threshold) in env.observe().question("over").text
        assert abs(freq - p) <= 4 * math.sqrt(p * (1 - p) / len(dem)) + 1e-9


def test_targets_calibrated_against_the_true_hidden_rate():
    """Forecasts made from the text vs demands drawn from the env's own hidden rate (drawn from the prior)."""
    rng = np.random.default_rng(9)
    over_err, cdf_err = [], []
    for _ in range(800):
        env = NewsvendorEnv().reset(np.random.default_rng(rng.integers(2**32)))
        while not env.done:
            p = env.oracle_targets()["over"]
            pmf = env.predictive_pmf()
            median = int(env.oracle_targets()["demand"][32])
            x = env.threshold
            env.step(int(rng.integers(env.n_legal())))
            demand = env.demands[-1]
            over_err.append(float(demand > x) - p)
            cdf_err.append(float(demand <= median) - pmf[: median + 1].sum())
    for err in (np.asarray(over_err), np.asarray(cdf_err)):
        assert abs(err.mean()) <= 4 * err.std() / math.sqrt(len(err)) + 1e-9


def test_dense_rewards_calibrated():
    rng = np.random.default_rng(10)
    errs = []
    for _ in range(600):
        env = NewsvendorEnv().reset(np.random.default_rng(rng.integers(2**32)))
        while not env.done:
            action = int(rng.integers(env.n_legal()))
            expected = env.action_rewards()[action]
            reward, _ = env.step(action)
            errs.append(reward - expected)
    errs = np.asarray(errs)
    assert len(errs) == 600 * 8
    assert abs(errs.mean()) <= 4 * errs.std() / math.sqrt(len(errs)) + 1e-9


def test_oracle_action_is_argmax_next_to_the_critical_fractile_quantity():
    for env in _random_states(100, seed=11):
        rewards = np.asarray(env.action_rewards())
        best = env.oracle_action()
        assert best == int(np.argmax(rewards))
        assert np.all(rewards[:best] < rewards[best]) and np.all(rewards <= rewards[best])
        q_star = optimal_order(env.predictive_pmf(), env.price, env.cost)
        grid = np.asarray(env.orders)
        neighbours = {int(np.searchsorted(grid, q_star, side="right")) - 1, int(np.searchsorted(grid, q_star))}
        assert best in {min(i, len(grid) - 1) for i in neighbours}


def test_oracle_beats_random():
    rng = np.random.default_rng(12)
    diffs = []
    for _ in range(300):
        seed = int(rng.integers(2**32))
        totals = []
        for policy in ("oracle", "random"):
            env = NewsvendorEnv().reset(np.random.default_rng(seed))
            totals.append(play_episode(env, np.random.default_rng(seed + 1), policy))
        diffs.append(totals[0] - totals[1])
    diffs = np.asarray(diffs)
    assert diffs.mean() > 4 * diffs.std() / math.sqrt(len(diffs)) and diffs.mean() > 20.0


@pytest.mark.parametrize(
    "kw",
    [
        {"prior_shape": 0},
        {"prior_rate": -1.0},
        {"price": 2.0, "cost": 2.0},
        {"cost": 2.345},
        {"n_periods": 0},
        {"max_order": 25, "order_step": 2},
        {"order_step": 1.5},
    ],
)
def test_bad_arguments_raise(kw):
    with pytest.raises(ValueError):
        NewsvendorEnv(**kw)
