"""Tests of the nim env: oracles against an independent brute-force game search and Monte Carlo simulation."""

from __future__ import annotations

import copy
import itertools
import re
from fractions import Fraction
from functools import cache

import numpy as np
import pytest

from alea_trl.envs.nim import NimEnv, legal_moves, nim_sum, opponent_move_probs, winning_moves
from alea_trl.questions import validate_targets

from .conftest import play_episode


# ----------------------------------------------------------------------------------- independent reference code
@cache
def _bf_wins(position: tuple[int, ...]) -> bool:
    """Memoised minimax: the player to move wins iff some move leads to a position the other player loses."""
    if sum(position) == 0:
        return False  # the previous player took the last stone
    for i, n in enumerate(position):
        for k in range(1, n + 1):
            child = tuple(sorted(position[:i] + (n - k,) + position[i + 1 :]))
            if not _bf_wins(child):
                return True
    return False


def bf_wins(piles) -> bool:
    return _bf_wins(tuple(sorted(int(n) for n in piles)))


def bf_moves(piles):
    """All (pile, take) pairs, enumerated independently of the env's ordering function."""
    out = []
    for i in range(len(piles)):
        k = 1
        while k <= piles[i]:
            out.append((i, k))
            k += 1
    return out


def after(piles, move):
    p = list(piles)
    p[move[0]] -= move[1]
    return p


def bf_winning_moves(piles):
    return [m for m in bf_moves(piles) if not bf_wins(after(piles, m))]


def bitwise_parity_sum(piles) -> int:
    """Nim-sum computed bit by bit from the parity of each binary column (no XOR operator)."""
    total = 0
    for bit in range(16):
        if sum((int(n) >> bit) & 1 for n in piles) % 2:
            total += 1 << bit
    return total


def all_positions():
    yield from itertools.product(range(8), repeat=2)
    yield from itertools.product(range(8), repeat=3)
    yield from itertools.product(range(5), repeat=4)


def decisions_of_random_episodes(n_episodes, seed, **kwargs):
    """Yield (env, decision) for every decision of random-action episodes."""
    rng = np.random.default_rng(seed)
    act_rng = np.random.default_rng(seed + 1)
    for _ in range(n_episodes):
        env = NimEnv(**kwargs).reset(rng)
        while not env.done:
            yield env, env.observe()
            env.step(int(act_rng.integers(env.n_legal())))


# ------------------------------------------------------------------------------------------- pure oracle functions
def test_nim_sum_matches_bitwise_parity_and_brute_force_win_labels():
    for piles in all_positions():
        assert nim_sum(piles) == bitwise_parity_sum(piles)
        assert (nim_sum(piles) != 0) == bf_wins(piles), piles


def test_legal_moves_enumerate_every_move_once_pile_major():
    for piles in all_positions():
        moves = legal_moves(piles)
        assert moves == bf_moves(piles)
        assert len(moves) == sum(piles) == len(set(moves))


def test_winning_moves_are_exactly_the_moves_to_brute_force_losing_positions():
    for piles in all_positions():
        wins = winning_moves(piles)
        assert wins == bf_winning_moves(piles), piles
        for m in wins:
            assert m in bf_moves(piles)
            assert not bf_wins(after(piles, m))
        assert (len(wins) > 0) == bf_wins(piles)


def test_opponent_move_probs_closed_form():
    eps = 0.3
    p = opponent_move_probs([3, 5, 7], eps)  # nim-sum 1: the odd piles 3, 5, 7 each admit one winning move
    moves = bf_moves([3, 5, 7])
    wins = bf_winning_moves([3, 5, 7])
    assert len(wins) == 3
    for m, pm in zip(moves, p):
        expected = eps / 15 + ((1 - eps) / 3 if m in wins else 0.0)
        assert pm == pytest.approx(expected)
    assert opponent_move_probs([1, 2, 3], eps) == pytest.approx(np.full(6, 1 / 6))  # losing: uniform
    assert opponent_move_probs([4, 1], 0.0).sum() == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------- the env
def test_targets_validate_and_observe_is_stable():
    n = 0
    for env, d in decisions_of_random_episodes(300, seed=0):
        assert env.observe() == d
        assert env.oracle_targets() == env.oracle_targets()
        validate_targets(d, env.oracle_targets())
        assert d.n_legal == env.n_legal() == sum(env.piles)
        assert len(d.state) < 1000
        assert {q.qid for q in d.questions} == {"act", "win", "nimsum", "n_win_moves"}
        n += 1
    assert n > 500


@pytest.mark.parametrize("kwargs", [{}, {"n_piles": 4, "max_stones": 4}, {"n_piles": 2, "min_stones": 3}])
def test_report_targets_match_brute_force(kwargs):
    for env, d in decisions_of_random_episodes(200, seed=1, **kwargs):
        t = validate_targets(d, env.oracle_targets())
        s = bitwise_parity_sum(env.piles)
        onehot = np.zeros(d.question("nimsum").n_bins)
        onehot[s] = 1.0
        np.testing.assert_array_equal(t["nimsum"], onehot)
        assert t["win"] == (1.0 if bf_wins(env.piles) else 0.0)
        np.testing.assert_array_equal(t["n_win_moves"], [float(len(bf_winning_moves(env.piles)))])
        # the state text states the piles the oracle uses
        letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        assert ", ".join(f"{letters[i]} {n}" for i, n in enumerate(env.piles)) in d.state


def test_oracle_action_is_a_winning_move_or_the_documented_fallback():
    for env, d in decisions_of_random_episodes(200, seed=2):
        a = env.oracle_action()
        move = bf_moves(env.piles)[a]
        wins = bf_winning_moves(env.piles)
        if wins:
            assert move == wins[0]  # lowest index winning move
            assert not bf_wins(after(env.piles, move))
        else:
            biggest = max(env.piles)
            assert move == (env.piles.index(biggest), 1)
        assert d.act.options[a] == f"take {move[1]} from pile {'ABCDEFGHIJKLMNOPQRSTUVWXYZ'[move[0]]}"


def test_win_label_is_the_real_outcome_of_perfect_play_from_the_state():
    """Play on from each observed state with a perfect (ε=0) opponent and the oracle agent: win iff target says so."""
    checked = 0
    rng = np.random.default_rng(3)
    for env, _ in decisions_of_random_episodes(60, seed=3):
        sim = copy.deepcopy(env)
        sim.epsilon = 0.0
        sim.rng = np.random.default_rng(int(rng.integers(2**31)))
        ret = play_episode(sim, None, "oracle")
        assert ret == (1.0 if env.oracle_targets()["win"] == 1.0 else -1.0)
        checked += 1
    assert checked > 100


def test_perfect_opponent_oracle_wins_every_winning_start_and_random_loses_every_losing_one():
    rng = np.random.default_rng(4)
    act_rng = np.random.default_rng(5)
    n_win = n_lose = 0
    for _ in range(400):
        env = NimEnv(epsilon=0.0).reset(rng)
        winning = nim_sum(env.piles) != 0
        if winning:
            assert play_episode(env, act_rng, "oracle") == 1.0
            n_win += 1
        else:
            assert play_episode(env, act_rng, "random") == -1.0
            n_lose += 1
    assert n_win > 50 and n_lose > 10


@pytest.mark.parametrize("piles, action", [([4, 5, 7], 0), ([3, 5, 6], 0), ([1, 2, 4], 3)])
def test_opponent_moves_follow_the_stated_rule_monte_carlo(piles, action):
    """Frequencies of the opponent's reply vs the rule stated in the text (ε random, else a random winning move)."""
    eps, n = 0.3, 12000
    rng = np.random.default_rng(6)
    env = NimEnv(epsilon=eps, p_agent_first=1.0)
    mid = after(piles, bf_moves(piles)[action])
    replies = bf_moves(mid)
    wins = bf_winning_moves(mid)
    expected = np.array(
        [
            eps / len(replies) + ((1 - eps) / len(wins) if m in wins else 0.0) if wins else 1 / len(replies)
            for m in replies
        ]
    )
    counts = np.zeros(len(replies))
    for _ in range(n):
        env.reset(rng)
        env.piles = list(piles)
        r, done = env.step(action)
        assert r == 0.0 and not done
        diff = [j for j in range(len(mid)) if env.piles[j] != mid[j]]
        assert len(diff) == 1
        counts[replies.index((diff[0], mid[diff[0]] - env.piles[diff[0]]))] += 1
        assert env.last_opponent_move == (diff[0], mid[diff[0]] - env.piles[diff[0]])
    freq = counts / n
    se = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(freq - expected) <= 4 * se + 1e-9), (freq, expected)


def test_rewards_and_episode_end():
    rng = np.random.default_rng(7)
    act_rng = np.random.default_rng(8)
    for _ in range(300):
        env = NimEnv().reset(rng)
        assert sum(env.piles) > 0
        while True:
            before = sum(env.piles)
            a = int(act_rng.integers(env.n_legal()))
            taken = bf_moves(env.piles)[a][1]
            r, done = env.step(a)
            if r == 1.0:
                assert done and before == taken and sum(env.piles) == 0
            elif r == -1.0:
                assert done and before > taken and sum(env.piles) == 0
            else:
                assert r == 0.0 and not done and 0 < sum(env.piles) < before - taken
            if done:
                with pytest.raises(RuntimeError):
                    env.observe()
                break


def test_oracle_beats_random():
    def mean_return(policy, seed):
        rng, act_rng = np.random.default_rng(seed), np.random.default_rng(seed + 100)
        return np.array([play_episode(NimEnv().reset(rng), act_rng, policy) for _ in range(400)])

    oracle, rand = mean_return("oracle", 9), mean_return("random", 9)
    se = np.sqrt(oracle.var() / len(oracle) + rand.var() / len(rand))
    assert oracle.mean() - rand.mean() > 4 * se
    assert oracle.mean() > 0.3


def test_score_bins_cover_every_nim_sum_and_bad_arguments_raise():
    assert NimEnv().n_bins == 8 and NimEnv(max_stones=8).n_bins == 16
    for piles in itertools.product(range(9), repeat=3):
        assert nim_sum(piles) < 16
    for bad in [
        {"n_piles": 1},
        {"min_stones": 0},
        {"min_stones": 5, "max_stones": 4},
        {"epsilon": 1.5},
        {"p_agent_first": -0.1},
    ]:
        with pytest.raises(ValueError):
            NimEnv(**bad)


@pytest.mark.parametrize("epsilon", [0.0, 0.05, 0.3, 0.1 + 0.2, 0.99, 1.0])
def test_text_states_the_exact_epsilon_piles_and_moves(epsilon):
    """ε, the piles and the moves read from the text are exactly what the opponent and the oracles use."""
    n = 0
    for env, d in decisions_of_random_episodes(40, seed=11, epsilon=epsilon):
        text = re.search(r"With probability (\S+) your opponent", d.state).group(1)
        assert re.fullmatch(r"[01]\.\d\d", text) and float(Fraction(text)) == env.epsilon
        piles = [int(k) for k in re.findall(r"[A-Z] (\d+)", d.state.split("Piles: ")[1])]
        assert piles == env.piles
        options = [re.fullmatch(r"take (\d+) from pile ([A-Z])", o).groups() for o in d.act.options]
        assert [(ord(x) - ord("A"), int(k)) for k, x in options] == legal_moves(env.piles)
        np.testing.assert_array_equal(
            opponent_move_probs(piles, float(Fraction(text))), opponent_move_probs(env.piles, env.epsilon)
        )
        n += 1
    assert n > 100


@pytest.mark.parametrize(
    "epsilon,message",
    [
        (1 / 3, "must be a number with at most 2 decimals, got 0.333"),
        (0.305, "must be a number with at most 2 decimals"),
        (0.001, "must be a number with at most 2 decimals"),
        (float("nan"), "must be a number with at most 2 decimals"),
        (1.5, r"must be in \[0, 1\]"),
        (-0.25, r"must be in \[0, 1\]"),
    ],
)
def test_epsilon_the_text_cannot_state_is_refused(epsilon, message):
    with pytest.raises(ValueError, match=rf"env 'nim': field 'epsilon': {message}"):
        NimEnv(epsilon=epsilon)


__all__ = []
