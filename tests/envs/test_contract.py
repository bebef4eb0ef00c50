"""The env contract, for every registered env: determinism, copying, misuse errors, valid targets."""

import copy
import math
import pickle
import re
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from alea_trl.envs import BUILTIN_ENVS, AleaEnv, make_env
from alea_trl.envs.base import decimal_text, exact_decimal
from alea_trl.questions import QTYPES, validate_action_rewards, validate_targets


def _rollout(env, rng_seed, action_seed, n_steps=200):
    """Play random actions; return everything observable (states, questions, targets, rewards)."""
    env.reset(np.random.default_rng(rng_seed))
    pick = np.random.default_rng(action_seed)
    trace = []
    for _ in range(n_steps):
        if env.done:
            break
        d = env.observe()
        targets = validate_targets(d, env.oracle_targets())
        rewards = env.action_rewards()
        a = int(pick.integers(d.n_legal))
        r, done = env.step(a)
        trace.append((d, {k: np.asarray(v).tolist() for k, v in targets.items()}, rewards, a, r, done))
    return trace


@pytest.mark.parametrize("name", BUILTIN_ENVS)
def test_same_seed_replays_exactly(name):
    a = _rollout(make_env(name), 7, 8)
    b = _rollout(make_env(name), 7, 8)
    assert a == b and len(a) > 0
    c = _rollout(make_env(name), 9, 8)
    assert [t[0].state for t in c] != [t[0].state for t in a]  # another seed gives another episode


@pytest.mark.parametrize("name", BUILTIN_ENVS)
@pytest.mark.parametrize("clone", [copy.deepcopy, lambda e: pickle.loads(pickle.dumps(e))])
def test_copy_mid_episode_continues_identically(name, clone):
    for seed in range(5):
        env = make_env(name).reset(np.random.default_rng(seed))
        env.step(0)
        if env.done:
            continue
        twin = clone(env)
        pick_a, pick_b = np.random.default_rng(seed), np.random.default_rng(seed)
        while not env.done:
            d, d2 = env.observe(), twin.observe()
            assert d == d2 and env.oracle_targets().keys() == twin.oracle_targets().keys()
            assert env.step(int(pick_a.integers(d.n_legal))) == twin.step(int(pick_b.integers(d2.n_legal)))
        assert twin.done


@pytest.mark.parametrize("name", BUILTIN_ENVS)
def test_misuse_errors_say_what_was_wrong(name):
    env = make_env(name)
    with pytest.raises(RuntimeError, match="before reset"):
        env.observe()
    env.reset(np.random.default_rng(0))
    n = env.observe().n_legal
    for bad in (n, -1):
        with pytest.raises(ValueError, match=rf"env '{name}'.*out of range"):
            env.step(bad)
    with pytest.raises(ValueError, match="integer index"):
        env.step(0.5)
    while not env.done:
        env.step(0)
    for call in (env.observe, lambda: env.step(0)):
        with pytest.raises(RuntimeError, match="after the episode ended"):
            call()


@pytest.mark.parametrize("name", BUILTIN_ENVS)
def test_every_decision_is_valid(name):
    env = make_env(name)
    for seed in range(30):
        for d, _, rewards, *_ in _rollout(env, seed, seed + 100):
            assert d.env == name
            if env.dense:
                validate_action_rewards(d, rewards)
            else:
                assert rewards is None


def test_each_qtype_appears_in_at_least_two_envs():
    seen = Counter()
    for name in BUILTIN_ENVS:
        d = make_env(name).reset(np.random.default_rng(0)).observe()
        for qtype in {q.qtype for q in d.reports}:
            seen[qtype] += 1
    assert all(seen[q] >= 2 for q in QTYPES), seen


@pytest.mark.parametrize("name", [n for n in BUILTIN_ENVS if make_env(n).dense])
def test_dense_oracle_action_is_the_best_expected_reward(name):
    env = make_env(name)
    for seed in range(10):
        env.reset(np.random.default_rng(seed))
        pick = np.random.default_rng(seed)
        while not env.done:
            assert env.oracle_action() == int(np.argmax(env.action_rewards()))  # the lowest index among the best
            env.step(int(pick.integers(env.n_legal())))


def test_outcome_env_without_oracle_action_says_so():
    class NoOracle(AleaEnv):
        name = "no_oracle"

    with pytest.raises(NotImplementedError, match="env 'no_oracle'.*oracle_action"):
        NoOracle().oracle_action()


def _short(n: int, places: int) -> str:
    """``n / 10**places`` written with integer arithmetic, trailing zeros dropped (an independent formatter)."""
    whole, frac = divmod(n, 10**places)
    frac_text = str(frac).rjust(places, "0").rstrip("0")
    return f"{whole}.{frac_text}" if frac_text else str(whole)


def test_accepted_decimals_are_printed_short_and_parse_back_to_the_same_float():
    for n in range(0, 200_001, 7):  # 0 to 2000 in steps of 0.07, and fractions 0 to 20 as percentages
        x = n / 100
        assert exact_decimal("e", "f", x, 2) == x and exact_decimal("e", "f", x + 3e-10, 2) == x  # snapped
        assert decimal_text(x, 2) == _short(n, 2) and float(Fraction(decimal_text(x, 2))) == x
        f = n / 10_000
        assert exact_decimal("e", "f", f, 2, percent=True) == f
        assert decimal_text(f, 2, percent=True) == _short(n, 2) + "%"
        assert float(Fraction(_short(n, 2)) / 100) == f
    assert exact_decimal("e", "f", 0.1 + 0.2, 2) == 0.3 and decimal_text(exact_decimal("e", "f", -0.0, 2), 2) == "0"


@pytest.mark.parametrize("value", [1 / 3, 0.125, 2.005, 1e-3, math.inf, math.nan, "x", None])
def test_values_with_more_decimals_are_refused_naming_env_and_field(value):
    with pytest.raises(ValueError, match=re.escape("env 'e': field 'f': must be a number with at most 2 decimals")):
        exact_decimal("e", "f", value, 2)
    if value not in (0.125, 2.005, 1e-3):  # 12.5%, 200.5% and 0.1% have at most 2 decimals as percentages
        with pytest.raises(ValueError, match=re.escape("field 'f': must be a number with at most 2 decimals as a")):
            exact_decimal("e", "f", value, 2, percent=True)
