"""evaluate_policy: the normalised and expected scores agree with a brute-force replay of the same episodes; per-env
episode counts play exactly the episodes of one call per env."""

import numpy as np
import pytest
import torch

from alea_trl.envs import make_env
from alea_trl.evaluation import evaluate_policy, evaluation_sums, format_table, table_from_means
from alea_trl.questions import ACT_QID


class ConstantPolicy(torch.nn.Module):
    """Wraps a tiny AleaModel: its forecasts, but the act head always puts all mass on option ``action`` (clipped to
    the legal options)."""

    def __init__(self, model, action: int):
        super().__init__()
        self.model, self.action = model, action
        self.config = model.config

    def predict(self, decisions, tokenizer, **kwargs):
        answers = self.model.predict(decisions, tokenizer, **kwargs)
        for d, ans in zip(decisions, answers):
            probs = torch.zeros(d.n_legal)
            probs[min(self.action, d.n_legal - 1)] = 1.0
            ans[ACT_QID] = probs
        return answers


def replay(name: str, action: int, episodes: int, seed: int = 0, env_idx: int = 0) -> dict[str, float]:
    """The figures of the constant policy by stepping the env directly, with evaluate_policy's episode seeds (episode
    ``i`` of the ``env_idx``-th env: ``[seed, env_idx, i]``)."""
    returns, expected = [], np.zeros(3)
    for i in range(episodes):
        env, total = make_env(name).reset(np.random.default_rng([seed, env_idx, i])), 0.0
        while not env.done:
            a = min(action, env.observe().n_legal - 1)
            if env.dense:
                r = np.asarray(env.action_rewards(), dtype=float)
                expected += (r[a], r.mean(), r.max())
            total += env.step(a)[0]
        returns.append(total)
    return {"return": float(np.mean(returns)), "expected": expected}


@pytest.mark.parametrize("name,action", [("kelly", 0), ("kelly", 6), ("newsvendor", 3), ("hmm", 1), ("nim", 0)])
def test_scores_match_brute_force_replay(make_model, tokenizer, name, action):
    episodes = 12
    policy = ConstantPolicy(make_model(), action)
    row = evaluate_policy(policy, tokenizer, [name], episodes=episodes, seed=0)[name]
    truth = replay(name, action, episodes)
    assert row["return"] == pytest.approx(truth["return"], abs=1e-9)
    want = (truth["return"] - row["random"]) / (row["oracle"] - row["random"])
    assert row["normalized_score"] == pytest.approx(want, abs=1e-9)
    if make_env(name).dense:
        chosen, mean, best = truth["expected"]
        assert row["expected_score"] == pytest.approx((chosen - mean) / (best - mean), rel=1e-9)
        assert row["regret"] >= 0.0
        assert row["expected_score"] <= 1.0 + 1e-12  # no action beats the best expected reward
    else:
        assert "expected_score" not in row  # outcome envs have no expected reward per action


def test_an_int_count_seeds_each_env_by_its_position(make_model, tokenizer):
    """With one count for all envs, episode i of the k-th env is seeded [seed, k, i] (as it always was)."""
    table = evaluate_policy(ConstantPolicy(make_model(), 2), tokenizer, ["hmm", "kelly"], episodes=4, seed=3)
    for k, name in enumerate(("hmm", "kelly")):
        assert table[name]["return"] == pytest.approx(replay(name, 2, 4, seed=3, env_idx=k)["return"], abs=1e-9)


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("shard", [(0, 1), (1, 2)])
def test_per_env_counts_equal_one_call_per_env(make_model, tokenizer, greedy, shard):
    """A mapping of counts plays every env exactly as a call on that env alone: the same sums, forecasts and table."""
    model, counts = make_model(), {"kelly": 3, "nim": 2, "hmm": 4}
    options = dict(seed=5, greedy=greedy, shard=shard)
    forecasts, alone_forecasts, alone = [], [], {}
    together = evaluation_sums(model, tokenizer, list(counts), episodes=counts, forecasts=forecasts, **options)
    for name, n in counts.items():
        alone |= evaluation_sums(model, tokenizer, [name], episodes=n, forecasts=alone_forecasts, **options)
    assert together == alone and forecasts == alone_forecasts
    assert {k.split("/")[0] for k in together} == set(counts)
    table = evaluate_policy(model, tokenizer, list(counts), counts | {"bandit": 9}, **options)  # extra names: ignored
    for name, n in counts.items():
        alone_table = evaluate_policy(model, tokenizer, [name], n, **options)
        np.testing.assert_equal(table[name], alone_table[name])  # NaN figures (nim's may tie) count as equal


@pytest.mark.parametrize(
    "episodes, needle",
    [
        ({"kelly": 2}, "env 'nim': field 'episodes': the mapping has no count"),
        ({"kelly": 2, "nim": 0}, "env 'nim': field 'episodes': must be an integer >= 1, got 0"),
        ({"kelly": 1.5, "nim": 2}, "env 'kelly': field 'episodes': must be an integer >= 1, got 1.5"),
        (0, "env 'kelly': field 'episodes': must be an integer >= 1, got 0"),
        (True, "env 'kelly': field 'episodes'"),
    ],
)
def test_bad_episode_counts_name_the_env_and_field(make_model, tokenizer, episodes, needle):
    with pytest.raises(ValueError, match=needle):
        evaluation_sums(make_model(), tokenizer, ["kelly", "nim"], episodes=episodes)


def test_expected_score_is_one_for_the_oracle_and_zero_on_average_for_random_play(make_model, tokenizer):
    """The best-expected-reward action scores exactly 1; the mean over all constant policies scores exactly 0 on
    hmm, whose states do not depend on the actions (the random baseline is the mean action)."""
    model = make_model()

    class Oracle(ConstantPolicy):
        def predict(self, decisions, tokenizer, **kwargs):
            answers = self.model.predict(decisions, tokenizer, **kwargs)
            for d, ans in zip(decisions, answers):
                ans[ACT_QID] = torch.nn.functional.one_hot(torch.tensor(self.env_lookup[d.state]), d.n_legal).float()
            return answers

    oracle = Oracle(model, 0)
    oracle.env_lookup = {}
    for i in range(10):  # the best expected action of every state the episodes meet (hmm's states are unique)
        env = make_env("hmm").reset(np.random.default_rng([0, 0, i]))
        while not env.done:
            oracle.env_lookup[env.observe().state] = int(np.argmax(env.action_rewards()))
            env.step(env.oracle_action())
    assert evaluate_policy(oracle, tokenizer, ["hmm"], episodes=10)["hmm"]["expected_score"] == pytest.approx(1.0)
    n_actions = make_env("hmm").reset(np.random.default_rng(0)).observe().n_legal
    scores = [
        evaluate_policy(ConstantPolicy(model, a), tokenizer, ["hmm"], episodes=10)["hmm"]["expected_score"]
        for a in range(n_actions)
    ]
    assert np.mean(scores) == pytest.approx(0.0, abs=1e-9)


def test_expected_score_is_less_noisy_than_realised_returns_on_kelly(make_model, tokenizer):
    """Across disjoint sets of episodes, the same policy's expected score moves less than its realised score."""
    policy = ConstantPolicy(make_model(), 4)
    rows = [evaluate_policy(policy, tokenizer, ["kelly"], episodes=15, seed=s)["kelly"] for s in range(5)]
    realised = np.std([r["normalized_score"] for r in rows])
    expected = np.std([r["expected_score"] for r in rows])
    assert expected < realised / 2


def test_table_from_means_and_format():
    means = {"e/return": 2.0, "e/random": 1.0, "e/oracle": 3.0, "e/report/noul": 0.1, "e/baseline/noul": 0.25}
    means |= {"e/expected/policy": 0.5, "e/expected/random": 0.25, "e/expected/oracle": 1.25}
    row = table_from_means(means)["e"]
    assert row["normalized_score"] == pytest.approx(0.5)
    assert row["expected_score"] == pytest.approx(0.25)
    assert row["skill/noul"] == pytest.approx(0.6)
    tied = table_from_means({"t/return": 1.0, "t/random": 1.0, "t/oracle": 1.0})["t"]
    assert tied["normalized_score"] != tied["normalized_score"]  # undefined when the oracle ties random: NaN
    text = format_table({"e": row, "t": tied})
    assert "exp.score" in text.splitlines()[0] and "0.250" in text.splitlines()[2]
