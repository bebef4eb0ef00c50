"""Tests of the ``kelly`` env: its oracle maths against closed forms, exact rational arithmetic and Monte Carlo."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest

from alea_trl.envs.kelly import (
    KellyEnv,
    beta_binomial_pmf,
    expected_log_growth,
    kelly_fraction,
    posterior_mean,
)
from alea_trl.questions import validate_action_rewards, validate_targets

from .conftest import play_episode


SLACK = 1e-9  # absolute slack for zero-variance comparisons


def _within(est, target, se, k=4.0):
    est, target, se = np.asarray(est, float), np.asarray(target, float), np.asarray(se, float)
    return np.all(np.abs(est - target) <= k * se + SLACK)


def _play_to(seed, n_steps, **kwargs):
    """An env after ``n_steps`` random actions (drawn from a separate generator)."""
    env = KellyEnv(**kwargs).reset(np.random.default_rng(seed))
    act_rng = np.random.default_rng(seed + 10_000)
    for _ in range(n_steps):
        env.step(int(act_rng.integers(env.n_legal())))
    return env


# ------------------------------------------------------------------------------------------------- pure functions
def test_posterior_mean_closed_form():
    assert posterior_mean(2, 2, 3, 2) == pytest.approx(5 / 9)
    assert posterior_mean(1, 1) == pytest.approx(0.5)
    assert posterior_mean(3, 1, 0, 4) == pytest.approx(3 / 8)


def test_kelly_fraction_closed_form():
    assert kelly_fraction(0.6, 1) == pytest.approx(0.2)
    assert kelly_fraction(0.5, 2) == pytest.approx(0.25)
    assert kelly_fraction(0.3, 1) == 0.0  # unfavourable bet: stake nothing
    assert kelly_fraction(0.25, 3) == 0.0  # fair bet: stake nothing


@pytest.mark.parametrize(
    "m,b", [(0.6, 1.0), (0.5, 2.0), (5 / 9, 2.0), (0.35, 3.0), (0.8, 1.5), (0.3, 1.0), (0.2, 2.0)]
)
def test_expected_log_growth_maximiser_is_kelly(m, b):
    grid = np.linspace(0.0, 0.999, 99901)  # step 1e-5
    values = expected_log_growth(m, grid, b)
    f_best = grid[int(np.argmax(values))]
    assert abs(f_best - kelly_fraction(m, b)) <= 2e-5
    # and at the Kelly fraction no grid point does better (up to rounding)
    assert values.max() <= expected_log_growth(m, kelly_fraction(m, b), b) + 1e-12


@pytest.mark.parametrize("a,b,odds,f", [(3, 4, 2.0, 0.25), (1, 1, 1.0, 0.5), (6, 2, 3.0, 0.1), (2, 5, 2.0, 0.4)])
def test_expected_log_growth_vs_monte_carlo(a, b, odds, f):
    """Draw p from Beta(a, b), flip once, realise the log growth; its mean is the expected log growth at m."""
    rng = np.random.default_rng(0)
    n = 400_000
    p = rng.beta(a, b, size=n)
    heads = rng.random(n) < p
    growth = np.where(heads, math.log(1 + f * odds), math.log(1 - f))
    se = growth.std() / math.sqrt(n)
    assert _within(growth.mean(), expected_log_growth(a / (a + b), f, odds), se)


@pytest.mark.parametrize("n,a,b", [(10, 2, 2), (10, 1, 4), (5, 7, 3), (1, 2, 5), (12, 0.5, 1.5)])
def test_beta_binomial_pmf_vs_monte_carlo(n, a, b):
    pmf = beta_binomial_pmf(n, a, b)
    assert pmf.shape == (n + 1,)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(pmf >= 0)
    rng = np.random.default_rng(1)
    draws = 300_000
    k = rng.binomial(n, rng.beta(a, b, size=draws))
    freq = np.bincount(k, minlength=n + 1) / draws
    assert _within(freq, pmf, np.sqrt(pmf * (1 - pmf) / draws))


def test_beta_binomial_pmf_exact_rational():
    """Integer parameters: C(n, k) B(k + a, n - k + b) / B(a, b) with factorials, in exact arithmetic."""

    def beta_fn(x, y):
        return Fraction(math.factorial(x - 1) * math.factorial(y - 1), math.factorial(x + y - 1))

    for n, a, b in [(10, 2, 2), (10, 5, 9), (4, 1, 1), (1, 3, 2)]:
        exact = [math.comb(n, k) * beta_fn(k + a, n - k + b) / beta_fn(a, b) for k in range(n + 1)]
        assert sum(exact) == 1
        np.testing.assert_allclose(beta_binomial_pmf(n, a, b), [float(x) for x in exact], rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(beta_binomial_pmf(1, 3, 2), [2 / 5, 3 / 5])
    np.testing.assert_allclose(beta_binomial_pmf(10, 1, 1), np.full(11, 1 / 11))  # uniform prior: uniform count


# -------------------------------------------------------------------------------------------------- the env
def test_targets_valid_and_observe_stable():
    for seed in range(60):
        env = KellyEnv().reset(np.random.default_rng(seed))
        act_rng = np.random.default_rng(seed + 999)
        n_decisions = 0
        while not env.done:
            d1, d2 = env.observe(), env.observe()
            assert d1 == d2 and d1.state == d2.state
            assert len(d1.state) < 1000
            assert d1.env == "kelly" and all(q.env == "kelly" for q in d1.questions)
            targets = validate_targets(d1, env.oracle_targets())
            assert set(targets) == {q.qid for q in d1.reports}
            rewards = validate_action_rewards(d1, env.action_rewards())
            assert env.oracle_action() == int(np.argmax(rewards))
            assert env.observe() == d1  # oracles did not change the decision
            env.step(int(act_rng.integers(env.n_legal())))
            n_decisions += 1
        assert n_decisions == 10


def _parse_state(state):
    """Recover everything the oracle needs from the state text alone."""
    a, b = (int(x) for x in re.search(r"Beta\((\d+), (\d+)\)", state).groups())
    odds = Fraction(re.search(r"heads pays ([\d.]+) to 1", state).group(1))
    hist = re.search(r"Flips so far: (.*)\.$", state).group(1)
    if hist == "none":
        heads = tails = 0
    else:
        heads, tails = (int(x) for x in re.search(r"(\d+) heads?, (\d+) tails?", hist).groups())
        if "(" in hist:  # the sequence is shown too: it must agree with the counts
            seq = hist.split(" (")[0].split()
            assert (seq.count("H"), seq.count("T")) == (heads, tails)
    return a, b, odds, heads, tails


@pytest.mark.parametrize("kwargs", [{}, {"n_rounds": 30, "odds": 1.5}, {"prior": (3, 1), "n_future": 4}])
def test_state_text_states_everything_the_oracle_uses(kwargs):
    """Recompute every target from the parsed state text with exact rational arithmetic."""
    for seed in range(8):
        env = KellyEnv(**kwargs).reset(np.random.default_rng(seed))
        while not env.done:
            state = env.observe().state
            a, b, odds, heads, tails = _parse_state(state)
            m = Fraction(a + heads, a + b + heads + tails)
            targets = env.oracle_targets()
            assert targets["p_heads"] == pytest.approx(float(m), abs=1e-12)
            assert targets["kelly"] == pytest.approx(float(max(Fraction(0), m - (1 - m) / odds)), abs=1e-12)
            # beta-binomial by brute force over all 2^n sequences: P(seq) = B(a' + k, b' + n - k) / B(a', b')
            n = env.n_future
            a2, b2 = a + heads, b + tails
            seq_prob = [math.prod(range(a2, a2 + k)) * math.prod(range(b2, b2 + n - k)) for k in range(n + 1)]
            total = math.prod(range(a2 + b2, a2 + b2 + n))
            brute = np.zeros(n + 1)
            for mask in range(2**n):
                k = mask.bit_count()
                brute[k] += seq_prob[k] / total
            np.testing.assert_allclose(targets[f"wins{n}"], brute, atol=1e-12)
            for f, r in zip(env.stakes, env.action_rewards()):
                want = float(m) * math.log(1 + f * float(odds)) + float(1 - m) * math.log(1 - f)
                assert r == pytest.approx(want, abs=1e-12)
            env.step(int(env.oracle_action()))


@pytest.mark.parametrize("seed,n_steps", [(3, 0), (4, 2), (5, 4), (6, 6), (7, 5)])
def test_targets_vs_rejection_sampling_from_the_prior(seed, n_steps):
    """Simulate the generative process from the prior, keep runs whose first flips equal the env's history exactly,
    and compare the next flip, the next n_future flips and the next stake's log growth with the oracle."""
    env = _play_to(seed, n_steps)
    flips = np.array(env.flips, dtype=bool)
    k, n = len(flips), env.n_future
    rng = np.random.default_rng(seed)
    draws = 300_000
    p = rng.beta(env.a, env.b, size=draws)
    coin = rng.random((draws, k + n)) < p[:, None]
    keep = np.all(coin[:, :k] == flips, axis=1)
    future = coin[keep, k:]
    n_acc = future.shape[0]
    assert n_acc > 1000

    targets = env.oracle_targets()
    next_heads = future[:, 0].mean()
    q = targets["p_heads"]
    assert _within(next_heads, q, math.sqrt(q * (1 - q) / n_acc))
    # Kelly stake at the estimated mean: kelly_fraction is Lipschitz with constant 1 + 1/odds
    assert abs(kelly_fraction(next_heads, env.odds) - targets["kelly"]) <= 4 * math.sqrt(q * (1 - q) / n_acc) * (
        1 + 1 / env.odds
    )
    pmf = targets[f"wins{n}"]
    freq = np.bincount(future.sum(axis=1), minlength=n + 1) / n_acc
    assert _within(freq, pmf, np.sqrt(pmf * (1 - pmf) / n_acc))
    stakes = np.array(env.stakes)
    growth = np.where(future[:, :1], np.log1p(stakes * env.odds), np.log1p(-stakes))  # (n_acc, n_stakes)
    assert _within(growth.mean(0), env.action_rewards(), growth.std(0) / math.sqrt(n_acc))


def test_population_calibration_with_the_hidden_coin():
    """Across decisions of real episodes, forecasts match outcomes drawn with the env's hidden p."""
    out_rng = np.random.default_rng(123)
    p_heads, next_flip, wins_target, wins_outcome, hidden_p = [], [], [], [], []
    for seed in range(400):
        env = KellyEnv().reset(np.random.default_rng(seed))
        while not env.done:
            t = env.oracle_targets()
            p_heads.append(t["p_heads"])
            wins_target.append(t["wins10"])
            wins_outcome.append(int((out_rng.random(10) < env._p).sum()))
            hidden_p.append(env._p)
            n_before = len(env.flips)
            env.step(int(out_rng.integers(env.n_legal())))
            assert len(env.flips) == n_before + 1
            next_flip.append(env.flips[-1])
    diff = np.array(next_flip) - np.array(hidden_p)  # each flip is Bernoulli(hidden p)
    assert _within(diff.mean(), 0.0, diff.std() / math.sqrt(len(diff)))
    diff = np.array(next_flip) - np.array(p_heads)
    assert _within(diff.mean(), 0.0, diff.std() / math.sqrt(len(diff)))
    onehot = np.eye(11)[wins_outcome]
    diff = onehot - np.array(wins_target)  # (N, 11)
    assert _within(diff.mean(0), 0.0, diff.std(0) / math.sqrt(len(diff)))


def test_dense_rewards_are_calibrated():
    rng = np.random.default_rng(7)
    diffs = []
    for seed in range(600):
        env = KellyEnv().reset(np.random.default_rng(10_000 + seed))
        while not env.done:
            expected = env.action_rewards()
            a = int(rng.integers(env.n_legal()))
            reward, _ = env.step(a)
            diffs.append(reward - expected[a])
    diffs = np.array(diffs)
    assert len(diffs) == 6000
    assert _within(diffs.mean(), 0.0, diffs.std() / math.sqrt(len(diffs)))


def test_oracle_action_is_the_argmax():
    for seed in range(40):
        env = KellyEnv(odds=(1, 1.5, 2, 3)).reset(np.random.default_rng(seed))
        while not env.done:
            m = (env.a + env.heads) / (env.a + env.b + env.heads + env.tails)
            values = [m * math.log(1 + f * env.odds) + (1 - m) * math.log(1 - f) for f in env.stakes]
            best = max(range(len(values)), key=lambda i: (values[i], -i))
            assert env.oracle_action() == best
            # concavity: the best grid stake brackets the Kelly fraction (or is the largest stake)
            kf, f_best = kelly_fraction(m, env.odds), env.stakes[best]
            lower = max(f for f in env.stakes if f <= kf)
            upper = min((f for f in env.stakes if f >= kf), default=env.stakes[-1])
            assert f_best in (lower, upper)
            env.step(int(np.random.default_rng(seed).integers(env.n_legal())))


def test_oracle_beats_random():
    """Paired episodes (same seed: same prior, coin and flips): the oracle's log growth beats uniform random stakes."""
    returns = {"oracle": [], "random": []}
    for policy, totals in returns.items():
        act_rng = np.random.default_rng(0)
        for seed in range(300):
            env = KellyEnv().reset(np.random.default_rng(seed))
            total = play_episode(env, act_rng, policy)
            assert total == pytest.approx(math.log(env.bankroll / env.initial_bankroll), abs=1e-9)
            totals.append(total)
    diff = np.array(returns["oracle"]) - np.array(returns["random"])
    assert diff.mean() > 4 * diff.std() / math.sqrt(len(diff))
    assert np.mean(returns["oracle"]) > 0


def test_long_history_is_shown_as_counts():
    env = _play_to(0, 25, n_rounds=40)
    state = env.observe().state
    assert f"Flips so far: {env.heads} head" in state and " H " not in state
    assert "Round 26 of 40" in state and len(state) < 1000
    env = _play_to(0, 3)
    assert " ".join("H" if x else "T" for x in env.flips) in env.observe().state


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_rounds": 0},
        {"odds": 0},
        {"odds": (1, -2)},
        {"prior": (0, 2)},
        {"prior": (1, 2, 3)},
        {"max_prior": 0},
        {"n_future": 0},
        {"stakes": (0.0, 1.0)},
        {"stakes": (0.2, 0.1)},
        {"bankroll": -1.0},
    ],
)
def test_bad_arguments_raise(kwargs):
    with pytest.raises(ValueError, match="kelly"):
        KellyEnv(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"odds": (0.5, 1.25, 2.75, 10), "stakes": (0.0, 0.0125, 0.125, 0.3333, 0.9999), "bankroll": 123.45},
        {"odds": 0.1 + 0.2, "stakes": [0.05 * i for i in range(11)], "prior": (3, 7), "bankroll": 0.01},
    ],
)
def test_text_numbers_parse_back_to_the_floats_the_oracles_use(kwargs):
    """Odds, stakes, prior and starting bankroll read from the text are the very floats the oracles compute with, in
    short form ("2.75", "12.5%"): recomputing every oracle from the parsed numbers gives bit-identical results."""
    for seed in range(40):
        env = KellyEnv(**kwargs).reset(np.random.default_rng(seed))
        bankroll = re.search(r"Bankroll: ([\d.]+)\.", env.observe().state).group(1)
        assert float(Fraction(bankroll)) == env.initial_bankroll
        while not env.done:
            d = env.observe()
            a, b, odds, heads, tails = _parse_state(d.state)
            assert re.search(r"heads pays \d+(\.\d\d?)? to 1", d.state) and float(odds) == env.odds
            assert (a, b) == (env.a, env.b)
            assert all(re.fullmatch(r"\d+(\.\d\d?)?%", label) for label in d.act.options)
            stakes = [float(Fraction(label[:-1]) / 100) for label in d.act.options]
            assert stakes == list(env.stakes)
            m = posterior_mean(a, b, heads, tails)
            assert env.action_rewards() == expected_log_growth(m, np.array(stakes), float(odds)).tolist()
            targets = env.oracle_targets()
            assert (targets["p_heads"], targets["kelly"]) == (m, kelly_fraction(m, float(odds)))
            np.testing.assert_array_equal(
                targets[f"wins{env.n_future}"], beta_binomial_pmf(env.n_future, a + heads, b + tails)
            )
            env.step(int(np.random.default_rng(seed + len(env.flips)).integers(env.n_legal())))


@pytest.mark.parametrize(
    "field,value",
    [("odds", 1 / 3), ("odds", (1, 2.005)), ("odds", float("inf")), ("stakes", (0.0, 0.123456))]
    + [("stakes", (0.0, 0.00001, 0.5)), ("bankroll", 100.001), ("bankroll", "lots")],
)
def test_values_the_text_cannot_state_exactly_are_refused(field, value):
    rule = "at most 2 decimals" + (" as a percentage (0.125 is 12.5%)" if field == "stakes" else "")
    with pytest.raises(ValueError, match=rf"env 'kelly': field '{field}': must be a number with {re.escape(rule)}"):
        KellyEnv(**{field: value})
