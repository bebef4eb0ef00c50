"""Tests of the bandit env: oracles against closed forms, brute force and Monte Carlo of the generative model."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from alea_trl.envs.bandit import (
    BanditEnv,
    bayes_optimal_action,
    bayes_optimal_value,
    bayes_q_values,
    beta_cdf,
    beta_pdf,
    posterior_means,
    prob_best,
)
from alea_trl.questions import validate_targets


CONFIGS = [{}, {"n_arms": 2, "horizon": 4}, {"n_arms": 4, "horizon": 12, "prior_a": 2, "prior_b": 3}]


def _within(mean, se, target, slack=1e-9):
    return abs(mean - target) <= 4 * se + slack


# ------------------------------------------------------------------------------------------------ independent helpers
def _log_beta(x, y):
    return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)


def _marginal(a, b, s, f):
    """Exact marginal likelihood of one particular sequence with s wins and f losses: B(a+s, b+f) / B(a, b)."""

    def beta_fn(x, y):
        return Fraction(math.factorial(x - 1) * math.factorial(y - 1), math.factorial(x + y - 1))

    return beta_fn(a + s, b + f) / beta_fn(a, b)


def _brute_q(succ, fail, pulls_left, a0, b0):
    """Expectimax over full histories (no memo, no symmetry), predictive probabilities from marginal likelihoods."""

    def value(s, f, left):
        if left == 0:
            return Fraction(0)
        return max(q(s, f, left))

    def q(s, f, left):
        out = []
        for i in range(len(s)):
            p = _marginal(a0, b0, s[i] + 1, f[i]) / _marginal(a0, b0, s[i], f[i])
            s_win = s[:i] + (s[i] + 1,) + s[i + 1 :]
            f_loss = f[:i] + (f[i] + 1,) + f[i + 1 :]
            out.append(p * (1 + value(s_win, f, left - 1)) + (1 - p) * value(s, f_loss, left - 1))
        return out

    return q(tuple(succ), tuple(fail), pulls_left)


def _greedy_value(n_arms, horizon, a0=1, b0=1):
    """Exact expected return of the greedy posterior-mean policy (lowest index on ties), by policy evaluation."""
    memo = {}

    def value(s, f, left):
        if left == 0:
            return Fraction(0)
        key = (s, f, left)
        if key not in memo:
            means = [Fraction(a0 + si, a0 + b0 + si + fi) for si, fi in zip(s, f)]
            i = means.index(max(means))
            p = means[i]
            s_win = s[:i] + (s[i] + 1,) + s[i + 1 :]
            f_loss = f[:i] + (f[i] + 1,) + f[i + 1 :]
            memo[key] = p * (1 + value(s_win, f, left - 1)) + (1 - p) * value(s, f_loss, left - 1)
        return memo[key]

    return value((0,) * n_arms, (0,) * n_arms, horizon)


def _random_states(n_states, seed, min_steps=0, **kwargs):
    """Mid-episode envs reached by random actions (at a random step >= min_steps each)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_states):
        env = BanditEnv(**kwargs).reset(np.random.default_rng(rng.integers(2**32)))
        for _ in range(rng.integers(min_steps, env.horizon)):
            env.step(int(rng.integers(env.n_arms)))
        out.append(env)
    return out


# ------------------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize("kwargs", CONFIGS)
def test_targets_valid_and_observe_stable(kwargs):
    rng = np.random.default_rng(0)
    for episode in range(40):
        env = BanditEnv(**kwargs).reset(np.random.default_rng(episode))
        n_steps = 0
        while not env.done:
            d = env.observe()
            assert d == env.observe()
            assert d.act.options == env.arm_names and d.n_legal == env.n_legal() == env.n_arms
            targets = validate_targets(d, env.oracle_targets())
            assert set(targets) == {"pays", "best"}
            if not kwargs:
                assert len(d.state) < 1000
            assert 0 <= env.oracle_action() < env.n_arms
            reward, _ = env.step(int(rng.integers(env.n_arms)))
            assert reward in (0.0, 1.0)
            n_steps += 1
        assert n_steps == env.horizon


def test_bad_arguments():
    for kwargs in ({"n_arms": 1}, {"n_arms": 27}, {"horizon": 0}, {"prior_a": 0}, {"prior_b": 1.5}):
        with pytest.raises(ValueError):
            BanditEnv(**kwargs)


# ------------------------------------------------------------------------------------------------ beta helpers
def test_beta_cdf_closed_forms_and_integral():
    x = np.linspace(0.0, 1.0, 201)
    np.testing.assert_allclose(beta_cdf(x, 1, 1), x, atol=1e-12)
    np.testing.assert_allclose(beta_cdf(x, 4, 1), x**4, atol=1e-12)
    np.testing.assert_allclose(beta_cdf(x, 1, 5), 1 - (1 - x) ** 5, atol=1e-12)
    fine = np.linspace(0.0, 1.0, 200_001)
    for a, b in [(5, 7), (12, 3), (2, 30)]:
        pdf = beta_pdf(fine, a, b)
        cum = np.concatenate([[0.0], np.cumsum(0.5 * (pdf[1:] + pdf[:-1]) * np.diff(fine))])
        assert abs(cum[-1] - 1.0) < 1e-6
        np.testing.assert_allclose(beta_cdf(fine[::1000], a, b), cum[::1000], atol=1e-6)


# ------------------------------------------------------------------------------------------------ reports
def test_prob_best_two_arm_closed_form():
    """Closed form for P(p_B > p_A) with integer Beta parameters (sum over i < a_B)."""
    for (sa, fa), (sb, fb) in [((0, 0), (2, 0)), ((3, 4), (5, 2)), ((10, 1), (7, 7)), ((0, 6), (1, 9))]:
        a_a, b_a, a_b, b_b = 1 + sa, 1 + fa, 1 + sb, 1 + fb
        total = sum(
            math.exp(_log_beta(a_a + i, b_a + b_b) - math.log(b_b + i) - _log_beta(1 + i, b_b) - _log_beta(a_a, b_a))
            for i in range(a_b)
        )
        np.testing.assert_allclose(prob_best([sa, sb], [fa, fb]), [1 - total, total], atol=1e-10)


@pytest.mark.parametrize(
    "succ,fail,a0,b0",
    [([0, 2, 1], [0, 1, 3], 1, 1), ([20, 30, 5, 0], [15, 22, 3, 0], 1, 1), ([1, 1, 0, 4], [2, 0, 1, 4], 2, 3)],
)
def test_prob_best_vs_posterior_monte_carlo(succ, fail, a0, b0):
    rng = np.random.default_rng(1)
    n = 400_000
    draws = rng.beta(a0 + np.array(succ), b0 + np.array(fail), size=(n, len(succ)))
    freq = np.bincount(draws.argmax(axis=1), minlength=len(succ)) / n
    target = prob_best(succ, fail, a0, b0)
    assert abs(target.sum() - 1) < 1e-9
    for p, q in zip(freq, target):
        assert _within(p, math.sqrt(q * (1 - q) / n), q)


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_reports_vs_rejection_sampling_of_generative_model(kwargs):
    """Draw rates from the prior, simulate the pulls each arm has had, keep the runs matching the observed counts:
    the kept runs are draws from the true posterior; compare best-arm frequencies and next-pull pay frequency."""
    rng = np.random.default_rng(2)
    n = 500_000
    for env in _random_states(3, seed=3, min_steps=kwargs.get("horizon", 9) // 2, **kwargs):
        s, f = np.array(env.successes), np.array(env.failures)
        rates = rng.beta(env.prior_a, env.prior_b, size=(n, env.n_arms))
        keep = np.all(rng.binomial(s + f, rates) == s, axis=1)
        kept = rates[keep]
        m = len(kept)
        assert m > 1000
        targets = env.oracle_targets()
        freq = np.bincount(kept.argmax(axis=1), minlength=env.n_arms) / m
        for p, q in zip(freq, targets["best"]):
            assert _within(p, math.sqrt(q * (1 - q) / m), q)
        asked = env.pulls % env.n_arms
        assert env.observe().question("pays").text == f"Does {env.arm_names[asked]} pay on its next pull?"
        pays = rng.random(m) < kept[:, asked]
        q = targets["pays"]
        assert _within(pays.mean(), math.sqrt(q * (1 - q) / m), q)


def test_reports_calibrated_against_hidden_rates():
    """Across episodes, the env's own hidden rates agree with its targets on average (one decision per episode)."""
    rng = np.random.default_rng(4)
    best_err, pay_err = [], []
    for env in _random_states(2000, seed=5):
        t = env.oracle_targets()
        best_err.append((env.rates.argmax() == np.arange(env.n_arms)) - t["best"])
        pay_err.append(float(rng.random() < env.rates[env.pulls % env.n_arms]) - t["pays"])
    for err in [np.array(pay_err)] + list(np.array(best_err).T):
        assert _within(err.mean(), err.std(ddof=1) / math.sqrt(len(err)), 0.0)


def test_posterior_means_closed_form():
    np.testing.assert_allclose(posterior_means([0, 3], [0, 1]), [0.5, 4 / 6])
    np.testing.assert_allclose(posterior_means([2], [5], 2, 3), [4 / 12])


# ------------------------------------------------------------------------------------------------ Bayes-optimal policy
@pytest.mark.parametrize(
    "succ,fail,left,a0,b0",
    [
        ([0, 0], [0, 0], 4, 1, 1),
        ([1, 0], [0, 2], 4, 1, 1),
        ([0, 0, 0], [0, 0, 0], 3, 1, 1),
        ([2, 0, 1], [1, 0, 3], 3, 2, 3),
        ([0, 0], [0, 0], 5, 1, 1),
    ],
)
def test_bayes_value_vs_brute_force_expectimax(succ, fail, left, a0, b0):
    brute = [float(v) for v in _brute_q(succ, fail, left, a0, b0)]
    np.testing.assert_allclose(bayes_q_values(succ, fail, left, a0, b0), brute, atol=1e-12)
    assert abs(bayes_optimal_value(succ, fail, left, a0, b0) - max(brute)) < 1e-12
    assert brute[bayes_optimal_action(succ, fail, left, a0, b0)] >= max(brute) - 1e-12


def test_env_oracle_action_is_brute_force_argmax():
    for env in _random_states(60, seed=6, n_arms=2, horizon=4) + _random_states(30, seed=7, n_arms=3, horizon=3):
        brute = _brute_q(env.successes, env.failures, env.horizon - env.pulls, 1, 1)
        ties = [i for i, v in enumerate(brute) if v == max(brute)]  # exact (Fraction) ties
        assert env.oracle_action() == ties[0]


def _run(policy, n_episodes, seed, **kwargs):
    returns = np.empty(n_episodes)
    for e in range(n_episodes):
        env = BanditEnv(**kwargs).reset(np.random.default_rng([seed, e]))
        act_rng = np.random.default_rng([seed, e, 1])
        total = 0.0
        while not env.done:
            if policy == "oracle":
                a = env.oracle_action()
            elif policy == "greedy":
                means = [(1 + s) / (2 + s + f) for s, f in zip(env.successes, env.failures)]
                a = means.index(max(means))
            else:
                a = int(act_rng.integers(env.n_arms))
            total += env.step(a)[0]
        returns[e] = total
    return returns


def test_oracle_return_matches_value_and_beats_greedy_and_random():
    n = 2000
    oracle, greedy, rand = _run("oracle", n, 8), _run("greedy", n, 8), _run("random", n, 8)
    value = bayes_optimal_value([0, 0, 0], [0, 0, 0], 9)
    assert _within(oracle.mean(), oracle.std(ddof=1) / math.sqrt(n), value)
    assert _within(rand.mean(), rand.std(ddof=1) / math.sqrt(n), 4.5)
    greedy_exact = float(_greedy_value(3, 9))
    assert value >= greedy_exact - 1e-12
    assert _within(greedy.mean(), greedy.std(ddof=1) / math.sqrt(n), greedy_exact)
    diff_g, diff_r = oracle - greedy, oracle - rand
    assert diff_g.mean() > -4 * diff_g.std(ddof=1) / math.sqrt(n)
    assert diff_r.mean() > 4 * diff_r.std(ddof=1) / math.sqrt(n) and diff_r.mean() > 0.5
