"""Gymnasium adapter: exact oracles checked against Gymnasium's own step() and against brute force, the contract
(replay, copies), outcome mode, and errors that name the field."""

from __future__ import annotations

import copy
import pickle
import re
from functools import cache
from pathlib import Path

import gymnasium  # the optional extra `gym`, installed by `.[dev]`
import numpy as np
import pytest

from alea_trl.envs import make_env
from alea_trl.envs.gym_ids import GYM_ENVS
from alea_trl.envs.gymnasium import GymnasiumEnv, blackjack_model, solve
from alea_trl.envs.gymnasium.blackjack import CARD_PROBS, dealer_outcomes, state_index
from alea_trl.envs.gymnasium.renderings import taxi_short_text
from alea_trl.questions import validate_action_rewards, validate_targets

from .test_contract import _rollout


# episodes per env: a few thousand steps each keeps the whole Monte Carlo check to seconds
MC_EPISODES = {
    "gym-frozenlake-4x4": 2000,
    "gym-frozenlake-8x8": 400,
    "gym-taxi": 400,
    "gym-cliffwalking": 5,
    "gym-blackjack": 4000,
}


def _oracle_episodes(env, n: int, seed: int = 0):
    """Play ``n`` episodes with the oracle policy through Gymnasium's own step(): per episode the discounted
    return, whether a goal outcome happened (a positive reward in Blackjack, else the env's goal cell / ending),
    and its length."""
    returns, lengths = np.zeros(n), np.zeros(n)
    for i in range(n):
        env.reset(np.random.default_rng([seed, i]))
        weight = 1.0
        while not env.done:
            returns[i] += weight * env.step(env.oracle_action())[0]
            weight *= env.discount
            lengths[i] += 1
    return returns, lengths


def _within_3se(samples: np.ndarray, exact: float) -> bool:
    se = samples.std(ddof=1) / np.sqrt(len(samples)) if len(samples) > 1 else 0.0
    return abs(samples.mean() - exact) <= max(3 * se, 1e-9)


@pytest.mark.parametrize("name", list(GYM_ENVS))
def test_oracle_return_matches_optimal_value_by_monte_carlo(name):
    env = make_env(name)
    returns, lengths = _oracle_episodes(env, MC_EPISODES[name])
    assert _within_3se(returns, env.initial_value()), (returns.mean(), env.initial_value())
    expected_steps = float(env.model.initial @ env.solution.steps_left[0])
    assert _within_3se(lengths, expected_steps), (lengths.mean(), expected_steps)


def test_discounted_value_matches_monte_carlo_and_text_states_the_discount():
    env = make_env("gym-frozenlake-4x4", discount=0.95)
    returns, _ = _oracle_episodes(env, 2000, seed=1)
    assert _within_3se(returns, env.initial_value())
    assert env.initial_value() < make_env("gym-frozenlake-4x4").initial_value()
    assert "discounted by 0.95 a step" in env.reset(np.random.default_rng(0)).observe().state


def test_goal_probability_matches_monte_carlo_on_frozenlake():
    env = make_env("gym-frozenlake-4x4")
    reached = []
    for i in range(1500):
        env.reset(np.random.default_rng([2, i]))
        total = 0.0
        while not env.done:
            total += env.step(env.oracle_action())[0]
        reached.append(total > 0)  # reward 1 only for entering G
    assert _within_3se(np.array(reached, float), float(env.solution.goal_prob[0, 0]))


# ------------------------------------------------------------------------------------------- brute-force expectimax
def _expectimax(transitions, state: int, steps: int, discount: float) -> np.ndarray:
    """Q(state, .) with ``steps`` steps left, by plain recursion over Gymnasium's table (no value table)."""

    def value(s: int, k: int) -> float:
        return 0.0 if k == 0 else float(max(q(s, k)))

    def q(s: int, k: int) -> list[float]:
        return [
            sum(p * (r + (0.0 if term else discount * value(s2, k - 1))) for p, s2, r, term in transitions[s][a])
            for a in range(len(transitions[s]))
        ]

    return np.array(q(state, steps))


@pytest.mark.parametrize("discount", [1.0, 0.9])
def test_q_equals_brute_force_expectimax_on_frozenlake_4x4(discount):
    horizon = 4
    env = make_env("gym-frozenlake-4x4", horizon=horizon, discount=discount)
    table = env.unwrapped.P
    for t in range(horizon):
        for s in range(16):
            expected = _expectimax(table, s, horizon - t, discount)
            np.testing.assert_allclose(env.solution.q[t, s], expected, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------------- Blackjack
def test_blackjack_policy_is_sutton_and_barto_figure_5_2():
    """The optimal policy of Sutton & Barto's blackjack (their Figure 5.2, the rules of ``sab=True``)."""
    solution = solve(blackjack_model(sab=True))
    for dealer in range(1, 11):
        for total in range(12, 22):
            hard_stick = total >= 17 or (total >= 13 and 2 <= dealer <= 6) or (total == 12 and 4 <= dealer <= 6)
            soft_stick = total >= 19 or (total == 18 and 2 <= dealer <= 8)
            assert solution.action(0, state_index(total, False, False, dealer)) == (0 if hard_stick else 1)
            assert solution.action(0, state_index(total, True, False, dealer)) == (0 if soft_stick else 1)


def test_blackjack_dealer_outcomes_by_exhaustive_deal():
    """The dealer's final-score distribution against an independent enumeration of every card sequence."""

    @cache
    def finals(cards: tuple[int, ...]) -> dict:
        total = sum(cards) + (10 if 1 in cards and sum(cards) + 10 <= 21 else 0)
        if total >= 17:
            return {(0 if total > 21 else total, len(cards) == 2 and total == 21): 1.0}
        out: dict = {}
        for c, p in CARD_PROBS.items():
            for k, q in finals(cards + (c,)).items():
                out[k] = out.get(k, 0.0) + p * q
        return out

    for shown in range(1, 11):
        expected: dict = {}
        for hidden, p in CARD_PROBS.items():
            for k, q in finals((shown, hidden)).items():
                expected[k] = expected.get(k, 0.0) + p * q
        got = dealer_outcomes(shown)
        assert got.keys() == expected.keys()
        for k in got:
            assert got[k] == pytest.approx(expected[k], abs=1e-12)


@pytest.mark.parametrize("rules", [{"sab": False, "natural": True}, {"sab": False, "natural": False}])
def test_blackjack_rule_variants_match_monte_carlo(rules):
    env = make_env("gym-blackjack", **rules)
    returns, _ = _oracle_episodes(env, 4000, seed=3)
    assert _within_3se(returns, env.initial_value())
    assert ("pays 1.5" in env.reset(np.random.default_rng(0)).observe().state) == rules["natural"]


# -------------------------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize("name", list(GYM_ENVS))
def test_registered_envs_obey_the_contract(name):
    first, again = _rollout(make_env(name), 7, 8, n_steps=60), _rollout(make_env(name), 7, 8, n_steps=60)
    assert first == again and first
    env = make_env(name).reset(np.random.default_rng(1))
    d = env.observe()
    assert [q.qid for q in d.questions] == ["act", "goal", "steps_left"]
    validate_targets(d, env.oracle_targets())
    rewards = validate_action_rewards(d, env.action_rewards())
    assert env.oracle_action() == int(np.argmax(rewards >= rewards.max() - 1e-9))


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda e: pickle.loads(pickle.dumps(e))])
def test_copy_mid_episode_continues_identically(clone):
    for name in ("gym-frozenlake-4x4", "gym-blackjack"):
        env = make_env(name).reset(np.random.default_rng(5))
        env.step(1)
        if env.done:
            continue
        twin = clone(env)
        while not env.done:
            assert env.observe() == twin.observe() and env.action_rewards() == twin.action_rewards()
            assert env.step(env.oracle_action()) == twin.step(twin.oracle_action())
        assert twin.done


def test_texts_state_the_oracles_numbers():
    lake = make_env("gym-frozenlake-4x4", success_rate=0.5).reset(np.random.default_rng(0))
    assert (
        "probability 0.5 and in each of the two perpendicular directions with probability 0.25" in lake.observe().state
    )
    assert "100 steps left" in lake.observe().state and "row 1, column 1" in lake.observe().state
    still = make_env("gym-frozenlake-4x4", is_slippery=False, horizon=10).reset(np.random.default_rng(0))
    assert "moves you in the direction you choose." in still.observe().state
    assert still.initial_value() == 1.0 and "10 steps left" in still.observe().state
    rainy = make_env("gym-taxi", is_rainy=True).reset(np.random.default_rng(0))
    assert (
        "probability 0.8 and in each of the two perpendicular directions with probability 0.1" in rainy.observe().state
    )
    with pytest.raises(ValueError, match=r"gym-frozenlake-4x4.*'success_rate'"):
        make_env("gym-frozenlake-4x4", success_rate=0.123456789).reset(np.random.default_rng(0)).observe()


def test_taxis_short_rendering_tells_every_state_apart_without_the_map():
    """render="short" (by name, as a YAML config passes it): each of Taxi's 500 states gets its own text, which names
    the taxi's cell, the passenger and the destination that Gymnasium's decode gives, and leaves the map out; the
    decision's state is that text after the steps left, and a pickled copy keeps it."""
    short, full = make_env("gym-taxi", render="short"), make_env("gym-taxi")
    taxi, stands = short.unwrapped, "RGYB"
    texts = set()
    for obs in range(taxi.observation_space.n):
        text = short.render(obs, short)
        row, col, passenger, dest = taxi.decode(obs)
        assert text.endswith(f"The taxi is at row {row + 1}, column {col + 1}.")
        where = "is in the taxi" if passenger == 4 else f"waits at {stands[passenger]}"
        assert f"The passenger {where}" in text and f"the destination is {stands[dest]}" in text
        assert "|" not in text and len(text) < len(full.render(obs, full)) / 2
        texts.add(text)
    assert len(texts) == taxi.observation_space.n
    short.reset(np.random.default_rng(3))
    state = short.observe().state
    assert state == "200 steps left in the episode, this one included. " + taxi_short_text(short.obs, short)
    assert pickle.loads(pickle.dumps(short)).observe().state == state  # checkpoints pickle envs
    rainy = make_env("gym-taxi", render="short", is_rainy=True).reset(np.random.default_rng(0))
    assert "with probability 0.8 and in each of the two perpendicular directions" in rainy.observe().state
    with pytest.raises(ValueError, match=r"'gym-taxi': field 'render': 'mapless'.*'default', 'short'"):
        make_env("gym-taxi", render="mapless")
    with pytest.raises(ValueError, match=r"'gym-blackjack': field 'render': 'short'.*built in: 'default'"):
        make_env("gym-blackjack", render="short")
    cartpole = GymnasiumEnv("CartPole-v1", render="default").reset(np.random.default_rng(0))  # no built-in spec
    assert "this one included. Observation: [" in cartpole.observe().state


# ----------------------------------------------------------------------------------------- user envs, outcome mode
def test_env_without_a_model_runs_in_outcome_mode():
    env = GymnasiumEnv("CartPole-v1", render=lambda obs, env: f"Pole angle {obs[2]:+.3f} rad.")
    assert env.name == "gym-CartPole-v1" and not env.dense and env.horizon == 500
    env.reset(np.random.default_rng(0))
    d = env.observe()
    assert d.act.options == ("action 0", "action 1") and [q.qid for q in d.questions] == ["act"]
    assert env.oracle_targets() == {} and env.action_rewards() is None
    with pytest.raises(NotImplementedError, match="oracle_policy"):
        env.oracle_action()
    lean = GymnasiumEnv(
        "CartPole-v1", oracle_policy=lambda e: int(e.obs[2] > 0), action_names=["push left", "push right"]
    )
    lean.reset(np.random.default_rng(0))
    assert lean.oracle_action() in (0, 1) and lean.observe().act.options == ("push left", "push right")
    assert not GymnasiumEnv("FrozenLake-v1", model=False).dense  # a model can be switched off


def test_user_instance_with_its_own_map_gets_the_builtin_rendering_and_oracle():
    lake = gymnasium.make("FrozenLake-v1", desc=["SF", "HG"], is_slippery=False, max_episode_steps=5)
    env = GymnasiumEnv(lake, discount=0.9).reset(np.random.default_rng(0))
    assert env.name == "gym-FrozenLakeEnv" and "* F\nH G" in env.observe().state  # the agent's cell is marked *
    # left / up stay at S (then right, down: 0.9^2), down falls in H, right then down reaches G (0.9)
    assert env.action_rewards() == pytest.approx([0.81, 0.0, 0.9, 0.81], abs=1e-12)
    assert env.oracle_targets() == pytest.approx({"goal": 1.0, "steps_left": 2.0})
    assert env.oracle_action() == 2 and env.step(2) == (0.0, False) and env.step(env.oracle_action()) == (1.0, True)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"action_names": ["a", "b"]}, "action_names"),
        ({"horizon": 2.5}, "horizon"),
        ({"horizon": 0}, "horizon"),
        ({"discount": 0.0}, "discount"),
        ({"discount": 1 / 3}, "discount"),
        ({"no_such_kwarg": 1}, "gym_kwargs"),
    ],
)
def test_bad_arguments_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"gym-frozenlake-4x4.*'{field}'"):
        make_env("gym-frozenlake-4x4", **kwargs)


@pytest.mark.parametrize("env", ["CartPole-v1", "FrozenLake-v1"])
def test_a_discount_is_refused_in_outcome_mode_where_no_return_would_apply_it(env):
    """Outcome mode has no oracle to discount, and its returns are summed undiscounted by training and evaluation: a
    discount below 1 would only change the state text ("Rewards are discounted by 0.5 a step"), so it is refused."""
    with pytest.raises(ValueError, match=rf"env 'gym-{env}': field 'discount': 0\.5 .* outcome mode"):
        GymnasiumEnv(env, action_names=["l", "r", "d", "u"][: 2 if env.startswith("Cart") else 4], model=False,
                     discount=0.5)  # fmt: skip
    with pytest.raises(ValueError, match="field 'discount'"):
        GymnasiumEnv("CartPole-v1", discount=0.5)  # no model at all: outcome mode
    undiscounted = GymnasiumEnv(env, model=False, discount=1.0).reset(np.random.default_rng(0))
    assert not undiscounted.dense and "discounted" not in undiscounted.observe().state
    assert GymnasiumEnv("FrozenLake-v1", discount=0.5).dense  # with a model the discount is the oracle's


def test_refusals():
    with pytest.raises(ValueError, match="'fickle_passenger'"):
        make_env("gym-taxi", fickle_passenger=True)
    assert not make_env("gym-taxi", fickle_passenger=True, model=False).dense
    with pytest.raises(ValueError, match="'horizon': 101 exceeds the env's time limit 100"):
        GymnasiumEnv(gymnasium.make("FrozenLake-v1"), horizon=101)
    with pytest.raises(ValueError, match="Discrete"):
        GymnasiumEnv("Pendulum-v1")
    # no time limit and no discount: staying put ties with moving on, the lowest-index action stays forever
    with pytest.raises(ValueError, match="'horizon'"):
        GymnasiumEnv(gymnasium.make("FrozenLake-v1", is_slippery=False).unwrapped)


# ------------------------------------------------------------------------------------------------------- docs
def test_readme_gymnasium_example_runs(tiny_model_factory, tokenizer, tmp_path):
    """The example of docs/environments.md, "Your Gymnasium environment", runs as written and trains."""
    from alea_trl import AleaEnvGRPOTrainer

    text = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    section = text[text.index("## Your Gymnasium environment") :]
    namespace: dict = {}
    exec(compile(re.search(r"```python\n(.*?)```", section, re.S).group(1), "docs/environments.md", "exec"), namespace)
    args = namespace["args"]
    test_sized = {"output_dir": str(tmp_path), "max_steps": 2, "use_cpu": True, "bf16": False, "report_to": []}
    test_sized |= {"save_strategy": "no", "eps_per_env": 2, "per_device_train_batch_size": 4, "max_batch": 8}
    for field, value in (test_sized | {"train_mode": "full", "gradient_checkpointing": False}).items():
        setattr(args, field, value)
    trainer = AleaEnvGRPOTrainer(tiny_model_factory(), args=args, processing_class=tokenizer)
    trainer.train()
    logged = {k for h in trainer.state.log_history for k in h}
    assert {f"env/{e}/regret" for e in args.envs} <= logged, logged


# ---------------------------------------------------------------------------------------------------- goal share
@pytest.mark.parametrize("name", ["gym-frozenlake-4x4", "gym-taxi", "gym-cliffwalking"])
def test_reached_goal_is_the_terminal_goal_not_a_time_limit(name):
    """An episode reached its goal exactly when it ended on it: FrozenLake's G (its only reward, 1), Taxi's delivery
    (the +20), CliffWalking's G (bottom right); random play cut off by the time limit did not. Blackjack reports none
    (its return already says how often a hand is won)."""
    goal_seen = 0
    for policy in ("oracle", "random"):
        env = make_env(name)
        for i in range(40):
            env.reset(np.random.default_rng([i, policy == "oracle"]))
            assert env.reached_goal is False
            last = 0.0
            while not env.done:
                a = env.oracle_action() if policy == "oracle" else int(env.rng.integers(env.observe().n_legal))
                last, _ = env.step(a)
            on_goal = {
                "gym-frozenlake-4x4": last == 1.0,
                "gym-taxi": last == 20.0,
                "gym-cliffwalking": int(env.unwrapped.s) == 47,
            }[name]
            assert env.reached_goal == on_goal
            goal_seen += on_goal
    assert goal_seen > 0  # the oracle reaches it
    assert make_env("gym-blackjack").reset(np.random.default_rng(0)).reached_goal is None


def test_evaluation_reports_the_goal_share_of_goal_reaching_envs_only(tiny_model_factory, tokenizer):
    from alea_trl.evaluation import evaluate_policy, format_table
    from alea_trl.trainer.outputs.model_card import evaluation_table

    table = evaluate_policy(tiny_model_factory(), tokenizer, ["gym-frozenlake-4x4", "kelly"], episodes=6)
    assert 0.0 <= table["gym-frozenlake-4x4"]["goal_share"] <= 1.0 and "goal_share" not in table["kelly"]
    assert "goal" in format_table(table).splitlines()[0] and "goal" in evaluation_table(table).splitlines()[0]
    plain = {"kelly": table["kelly"]}
    assert "goal" not in format_table(plain).splitlines()[0] and "goal" not in evaluation_table(plain)
