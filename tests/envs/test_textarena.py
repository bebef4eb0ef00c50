"""TextArena adapter: its rules model agrees with TextArena's own play, the expectimax oracle's value matches its Monte
Carlo return, and the contract (replay, copies) holds despite TextArena's global random module."""

from __future__ import annotations

import copy
import pickle
import random

import numpy as np
import pytest

from alea_trl.envs.textarena import GAMES, TextArenaEnv


@pytest.mark.parametrize("game", sorted(GAMES))
def test_rules_model_agrees_with_textarena_play(game):
    env, spec = TextArenaEnv(game), GAMES[game]
    pick = np.random.default_rng(0)
    for seed in range(30):
        env.reset(np.random.default_rng(seed))
        while not env.done:
            position, mover = env.position(), env.ta_env.state.current_player_id
            move = int(pick.integers(env.n_legal()))
            predicted = spec.play(position, env.legal_moves()[move], mover)
            outcome = spec.outcome(predicted, mover)
            reward, done = env.step(move)
            if outcome is not None:  # the agent's move ended the game: TextArena's reward is the model's
                assert done and reward == (outcome if env.agent == 0 else -outcome)
            elif not done:
                assert env.position() != predicted  # the opponent moved too
            assert done or env.ta_env.state.current_player_id == env.agent


@pytest.mark.parametrize("game, episodes", [("TicTacToe-v0", 600), ("Nim-v0", 600)])
def test_oracle_return_matches_expectimax_value_by_monte_carlo(game, episodes):
    env = TextArenaEnv(game)
    returns, values = np.zeros(episodes), np.zeros(episodes)
    for i in range(episodes):
        env.reset(np.random.default_rng([4, i]))
        values[i] = env.optimal_value()
        while not env.done:
            returns[i] += env.step(env.oracle_action())[0]
    # each episode's exact value at its start; a return of +-1 or 0 with mean v has variance at most 1 - v^2
    se = np.sqrt(np.sum(1 - values**2)) / episodes
    assert abs(returns.mean() - values.mean()) <= 3 * se, (returns.mean(), values.mean(), se)
    random_play = []
    pick = np.random.default_rng(1)
    for i in range(episodes):
        env.reset(np.random.default_rng([4, i]))
        total = 0.0
        while not env.done:
            total += env.step(int(pick.integers(env.n_legal())))[0]
        random_play.append(total)
    assert returns.mean() > np.mean(random_play) + 0.3  # the oracle beats random play by a wide margin


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda e: pickle.loads(pickle.dumps(e))])
def test_replay_and_copies_are_independent_of_the_global_random_module(clone):
    def trace(env, seed):
        env.reset(np.random.default_rng(seed))
        out = []
        while not env.done:
            out.append(env.observe().state)
            out.append(env.step(env.oracle_action()))
        return out

    a, b = TextArenaEnv("TicTacToe-v0"), TextArenaEnv("TicTacToe-v0")
    first = trace(a, 3)
    random.seed(12345)  # other code touching the global stream does not change the episode
    assert trace(b, 3) == first
    env = TextArenaEnv("Nim-v0").reset(np.random.default_rng(2))
    twin = clone(env)
    while not env.done:
        assert env.observe() == twin.observe()
        assert env.step(env.oracle_action()) == twin.step(twin.oracle_action())
    assert twin.done


def test_unknown_game_names_the_field():
    with pytest.raises(ValueError, match="'game'"):
        TextArenaEnv("Chess-v0")
