"""Tests of the ``hmm`` env: oracles against brute-force path enumeration and Monte Carlo of the chain."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from alea_trl.envs.hmm import (
    HMMEnv,
    forward_filter,
    next_symbol_probs,
    predict_regime,
    round_simplex,
    symbol_count_pmf,
)
from alea_trl.questions import validate_action_rewards, validate_targets

from .conftest import play_episode


def _random_params(rng, k, s):
    init = rng.dirichlet(np.ones(k))
    trans = rng.dirichlet(np.ones(k), size=k)
    emit = rng.dirichlet(np.ones(s), size=k)
    return init, trans, emit


def _path_weight(init, trans, emit, path, symbols):
    """P(hidden path, the first len(symbols) symbols) by the chain rule (the path may be longer than the symbols)."""
    w = init[path[0]]
    for a, b in itertools.pairwise(path):
        w *= trans[a, b]
    for z, x in zip(path, symbols):
        w *= emit[z, x]
    return w


def _simulate(init, trans, emit, n, length, rng):
    """Vectorised draws of ``n`` chains: regimes and symbols, each ``(n, length)``."""
    cum_t, cum_e = np.cumsum(trans, axis=1), np.cumsum(emit, axis=1)
    k = len(init)
    z = np.empty((n, length), dtype=np.int64)
    x = np.empty((n, length), dtype=np.int64)
    z[:, 0] = np.minimum((rng.random(n)[:, None] > np.cumsum(init)[None, :]).sum(1), k - 1)
    for i in range(length):
        if i > 0:
            z[:, i] = np.minimum((rng.random(n)[:, None] > cum_t[z[:, i - 1]]).sum(1), k - 1)
        x[:, i] = np.minimum((rng.random(n)[:, None] > cum_e[z[:, i]]).sum(1), emit.shape[1] - 1)
    return z, x


def _assert_freq(freq, prob, n, what):
    freq, prob = np.atleast_1d(freq), np.atleast_1d(prob)
    se = np.sqrt(prob * (1 - prob) / n)
    assert np.all(np.abs(freq - prob) <= 4 * se + 1e-6), f"{what}: freq {freq} vs prob {prob} (n={n})"


# ------------------------------------------------------------------------------------------------ pure functions
def test_round_simplex():
    rng = np.random.default_rng(0)
    assert round_simplex([0.5, 0.5]).tolist() == [50, 50]
    assert round_simplex([1.0, 0.0, 0.0]).tolist() == [98, 1, 1]
    for _ in range(500):
        k = int(rng.integers(2, 7))
        p = rng.dirichlet(np.full(k, 0.5))
        c = round_simplex(p)
        assert c.sum() == 100 and c.min() >= 1
        # largest remainder: each count is within one unit of its unrounded share
        exact = p * (100 - k) + 1
        assert np.all(np.abs(c - exact) < 1.0 + 1e-9)


@pytest.mark.parametrize("k,s,t", [(2, 2, 1), (2, 3, 4), (3, 3, 5), (3, 2, 3)])
def test_forward_filter_and_predictions_vs_enumeration(k, s, t):
    rng = np.random.default_rng(k * 100 + s * 10 + t)
    for _ in range(3):
        init, trans, emit = _random_params(rng, k, s)
        symbols = rng.integers(s, size=t).tolist()
        post_bf, next_reg_bf, next_sym_bf = np.zeros(k), np.zeros(k), np.zeros(s)
        for path in itertools.product(range(k), repeat=t + 1):
            w = _path_weight(init, trans, emit, path, symbols)
            post_bf[path[t - 1]] += w
            next_reg_bf[path[t]] += w
            next_sym_bf += w * emit[path[t]]
        total = post_bf.sum()
        post = forward_filter(init, trans, emit, symbols)
        np.testing.assert_allclose(post, post_bf / total, atol=1e-12)
        np.testing.assert_allclose(predict_regime(post, trans), next_reg_bf / total, atol=1e-12)
        np.testing.assert_allclose(next_symbol_probs(post, trans, emit), next_sym_bf / total, atol=1e-12)


@pytest.mark.parametrize("k,s,t,n", [(2, 2, 1, 4), (3, 3, 2, 3), (2, 3, 3, 2)])
def test_symbol_count_pmf_vs_enumeration(k, s, t, n):
    rng = np.random.default_rng(7 + k + s + t + n)
    init, trans, emit = _random_params(rng, k, s)
    symbols = rng.integers(s, size=t).tolist()
    target = int(rng.integers(s))
    pmf_bf = np.zeros(n + 1)
    for path in itertools.product(range(k), repeat=t + n):
        w = _path_weight(init, trans, emit, path, symbols)
        hit = [emit[z, target] for z in path[t:]]
        for outcome in itertools.product((0, 1), repeat=n):  # each future symbol: is it the target or not
            pmf_bf[sum(outcome)] += w * np.prod([h if o else 1 - h for h, o in zip(hit, outcome)])
    post = forward_filter(init, trans, emit, symbols)
    np.testing.assert_allclose(symbol_count_pmf(post, trans, emit, target, n), pmf_bf / pmf_bf.sum(), atol=1e-12)
    # n = 1 is a Bernoulli with the next-symbol probability
    p = next_symbol_probs(post, trans, emit)[target]
    np.testing.assert_allclose(symbol_count_pmf(post, trans, emit, target, 1), [1 - p, p], atol=1e-12)


# ------------------------------------------------------------------------------------------------ env contract
_CONFIGS = [{}, {"n_regimes": 2, "n_symbols": 2}, {"n_regimes": 4, "n_symbols": 3, "horizon": 6, "n_ahead": 2}]


@pytest.mark.parametrize("kwargs", _CONFIGS)
def test_targets_validate_and_observe_is_stable(kwargs):
    rng = np.random.default_rng(1)
    env = HMMEnv(**kwargs)
    for ep in range(60):
        env.reset(np.random.default_rng(ep))
        n_dec = 0
        while not env.done:
            d = env.observe()
            assert d == env.observe()
            assert len(d.state) < 1000
            validate_targets(d, env.oracle_targets())
            rewards = validate_action_rewards(d, env.action_rewards())
            assert abs(rewards.sum() - 1) < 1e-9
            assert d.act.options == env.regime_names
            env.step(int(rng.integers(env.n_legal())))
            n_dec += 1
        assert n_dec == env.horizon


def _parse_state(state, regimes, symbols):
    """Read the parameters and the observed symbols back from the state text alone."""

    def row(text, names):
        return [float(re.search(rf"\b{n} (\d\.\d\d)", text).group(1)) for n in names]

    start = re.search(r"Start: (.*?)\.\n", state).group(1)
    trans_txt = re.search(r"Transitions: (.*?)\.\n", state).group(1)
    emit_txt = re.search(r"Emissions: (.*?)\.\n", state).group(1)
    init = row(start, regimes)
    trans = [row(re.search(rf"from {r}: ([^;]*)", trans_txt).group(1), regimes) for r in regimes]
    emit = [row(re.search(rf"in {r}: ([^;]*)", emit_txt).group(1), symbols) for r in regimes]
    seen = re.search(r"Symbols so far: ([a-z ]+)\.", state).group(1).split()
    return np.array(init), np.array(trans), np.array(emit), [symbols.index(x) for x in seen]


def test_state_text_states_what_the_oracle_uses():
    rng = np.random.default_rng(2)
    env = HMMEnv()
    for ep in range(40):
        env.reset(np.random.default_rng(100 + ep))
        while not env.done:
            d = env.observe()
            init, trans, emit, seen = _parse_state(d.state, env.regime_names, env.symbol_names)
            for m in (init[None, :], trans, emit):
                np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-9)  # rows print as summing to 1.00
            assert env.symbols == tuple(seen)  # the public record of the symbols is what the text shows
            post = forward_filter(init, trans, emit, seen)
            np.testing.assert_allclose(env.action_rewards(), post, atol=1e-12)
            q_next = re.search(r"next symbol is (\w+)\?", d.question("next_sym").text).group(1)
            p_next = next_symbol_probs(post, trans, emit)[env.symbol_names.index(q_next)]
            assert abs(env.oracle_targets()["next_sym"] - p_next) < 1e-12
            env.step(int(rng.integers(env.n_legal())))


def test_symbols_is_a_read_only_copy():
    env = HMMEnv()
    assert env.symbols == ()  # before the first reset
    env.reset(np.random.default_rng(5))
    env.step(0)
    seen = env.symbols
    assert isinstance(seen, tuple) and len(seen) == 2
    state = env.observe().state
    with pytest.raises(AttributeError):
        env.symbols = ()
    assert env.symbols == seen and env.observe().state == state


# ------------------------------------------------------------------------------------------------ Monte Carlo
@pytest.mark.parametrize("seed,t", [(3, 1), (4, 2), (5, 3), (6, 3)])
def test_targets_vs_rejection_monte_carlo(seed, t):
    """Simulate the chain from scratch, keep runs whose first t symbols match the observed ones, compare frequencies."""
    env = HMMEnv().reset(np.random.default_rng(seed))
    for _ in range(t - 1):
        env.step(0)
    targets = validate_targets(env.observe(), env.oracle_targets())
    n_ahead, q_next, q_count = env.n_ahead, env._q_next, env._q_count
    z, x = _simulate(env.init, env.trans, env.emit, 400_000, t + n_ahead, np.random.default_rng(seed + 1000))
    keep = np.all(x[:, :t] == np.array(env.symbols)[None, :], axis=1)
    n = int(keep.sum())
    assert n > 2000
    z, x = z[keep], x[keep]
    k = env.n_regimes
    _assert_freq(np.bincount(z[:, t - 1], minlength=k) / n, np.array(env.action_rewards()), n, "act")
    _assert_freq(np.bincount(z[:, t], minlength=k) / n, targets["next_regime"], n, "next_regime")
    _assert_freq(np.mean(x[:, t] == q_next), targets["next_sym"], n, "next_sym")
    counts = (x[:, t:] == q_count).sum(axis=1)
    _assert_freq(np.bincount(counts, minlength=n_ahead + 1) / n, targets["count"], n, "count")


def test_targets_calibrated_against_the_env_itself():
    """Pooled over random states: realised next regime / next symbol / future count vs the predicted probabilities."""
    rng = np.random.default_rng(8)
    env = HMMEnv()
    res_reg, res_sym, res_cnt = [], [], []
    var_reg, var_sym, var_cnt = [], [], []
    for ep in range(600):
        env.reset(np.random.default_rng(10_000 + ep))
        pending = []  # (decision step, count symbol, count pmf)
        while not env.done:
            t = len(env.symbols)
            tg = env.oracle_targets()
            if t + env.n_ahead <= env.horizon:
                pending.append((t, env._q_count, tg["count"]))
            q_next = env._q_next
            _, done = env.step(int(rng.integers(env.n_legal())))
            if not done:
                onehot = np.eye(env.n_regimes)[env._regimes[-1]]
                res_reg.append(onehot - tg["next_regime"])
                var_reg.append(tg["next_regime"] * (1 - tg["next_regime"]))
                p = tg["next_sym"]
                res_sym.append(float(env.symbols[-1] == q_next) - p)
                var_sym.append(p * (1 - p))
        for t, q, pmf in pending:
            c = sum(1 for x in env.symbols[t : t + env.n_ahead] if x == q)
            res_cnt.append(np.eye(len(pmf))[c] - pmf)
            var_cnt.append(pmf * (1 - pmf))
    for res, var, what in (
        (res_reg, var_reg, "next_regime"),
        (res_sym, var_sym, "next_sym"),
        (res_cnt, var_cnt, "count"),
    ):
        res, var = np.array(res), np.array(var)
        se = np.sqrt(var.sum(axis=0)) / len(res)
        assert np.all(np.abs(res.mean(axis=0)) <= 4 * se + 1e-9), what


def test_env_samples_from_the_printed_parameters():
    """The hidden path and symbols the env draws follow the printed start / transition / emission rows.

    Pooled over episodes (each with its own parameters): the frequency with which a draw hits the most likely entry of
    its row matches that entry's probability; this catches e.g. emitting from the wrong regime or an off-by-one row.
    """
    rng = np.random.default_rng(12)
    env = HMMEnv()
    res, var = {"init": [], "trans": [], "emit": []}, {"init": [], "trans": [], "emit": []}

    def record(kind, row, drawn):
        res[kind].append(float(drawn == int(np.argmax(row))) - row.max())
        var[kind].append(row.max() * (1 - row.max()))

    for ep in range(800):
        env.reset(np.random.default_rng(40_000 + ep))
        play_episode(env, rng)
        z, x = env._regimes, env.symbols
        record("init", env.init, z[0])
        for i in range(len(z)):
            record("emit", env.emit[z[i]], x[i])
            if i > 0:
                record("trans", env.trans[z[i - 1]], z[i])
    for kind, r in res.items():
        se = np.sqrt(np.sum(var[kind])) / len(r)
        assert abs(np.mean(r)) <= 4 * se + 1e-9, kind


def test_dense_rewards_are_exact_expectations_and_oracle_is_argmax():
    rng = np.random.default_rng(9)
    env = HMMEnv()
    residuals, variances = [], []
    for ep in range(500):
        env.reset(np.random.default_rng(20_000 + ep))
        while not env.done:
            rewards = np.array(env.action_rewards())
            best = env.oracle_action()
            assert best == int(np.flatnonzero(rewards == rewards.max())[0])
            assert rewards[best] >= rewards.max() - 1e-15
            a = int(rng.integers(env.n_legal()))
            r, _ = env.step(a)
            residuals.append(r - rewards[a])
            variances.append(rewards[a] * (1 - rewards[a]))
    se = np.sqrt(np.sum(variances)) / len(residuals)
    assert len(residuals) == 5000
    assert abs(np.mean(residuals)) <= 4 * se + 1e-9


def test_oracle_beats_random():
    env = HMMEnv()
    rng = np.random.default_rng(11)
    oracle = [play_episode(env.reset(np.random.default_rng(30_000 + ep)), rng, "oracle") for ep in range(300)]
    random_ = [play_episode(env.reset(np.random.default_rng(30_000 + ep)), rng, "random") for ep in range(300)]
    diff = np.mean(oracle) - np.mean(random_)
    se = np.sqrt(np.var(oracle) / 300 + np.var(random_) / 300)
    assert diff > 4 * se and diff > 1.0, (np.mean(oracle), np.mean(random_))
