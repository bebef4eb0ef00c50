"""Outcome envs' credit assignment: reward-to-go against per-step baselines, Monte Carlo branching from env copies,
the fall-back for envs that cannot be copied, a sparse multi-step env learnt, and the logged return of the sampled
policy."""

import warnings

import numpy as np
import pytest
import torch

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.collate import collate_segments
from alea_trl.envs import AleaEnv
from alea_trl.envs.nim import NimEnv, legal_moves, opponent_move_probs
from alea_trl.questions import Decision, Question
from alea_trl.trainer.act import act_rows
from alea_trl.trainer.rollout import Rollout
from alea_trl.trainer.rollout.branching import BranchFallbacks, branch_values
from alea_trl.trainer.rollout.pool import Episode, EpisodePool

from .conftest import TOY_FACTORIES
from .toy_envs import ThreeInARowEnv


class CountingEnv(AleaEnv):
    """Outcome: three steps; each step pays the index of the action taken (0, 1 or 2). Deterministic."""

    name, dense = "counting", False

    def _reset(self, rng):
        self.t = 0

    def _observe(self):
        act = Question("act", "choice", "Which number?", options=["zero", "one", "two"], env=self.name)
        return Decision(f"Step {self.t + 1} of 3.", [act], env=self.name)

    def oracle_targets(self):
        return {}

    def oracle_action(self):
        return 2

    def _step(self, action):
        self.t += 1
        return float(action), self.t == 3


class Uncopyable(CountingEnv):
    name = "uncopyable"

    def __deepcopy__(self, memo):
        raise TypeError("holds a live connection")


def _rollout(tokenizer, make_args, factory, **overrides):
    args = make_args(
        envs=[factory.name], eps_per_env=1, num_generations=4, scale_rewards="none", **({"beta": 0.0} | overrides)
    )  # driven by hand: no reference policy, no KL
    pool = EpisodePool({factory.name: factory}, eps_per_env=1, rng=np.random.default_rng(0))
    return Rollout(pool, tokenizer, args, seed=0)


def _uniform(packed):
    return torch.zeros(len(packed), 3)


def test_reward_to_go_is_measured_against_the_returns_to_go_of_the_same_step(tokenizer, make_args):
    rollout = _rollout(tokenizer, make_args, CountingEnv, outcome_advantage="rtg")
    episodes = []
    for _ in range(2):  # two episodes of three decisions, actions drawn uniformly
        actions = []
        for _ in range(3):
            wave = rollout.observe_wave(1)
            row = rollout.advance(wave, _uniform(wave.packed))[0]
            actions.append(row.actions[0])
        episodes.append(actions)
    rows = rollout.take(10)
    assert len(rows) == 6
    to_go = [np.cumsum(a[::-1])[::-1] for a in episodes]  # the reward of a step is its action
    first, second = rows[:3], rows[3:]
    assert all(r.advantages == [0.0] for r in first)  # one return-to-go per step seen: no baseline yet
    for t, row in enumerate(second):  # scale_rewards="none": G_t minus the other episode's G_t (leave-one-out)
        assert row.advantages[0] == pytest.approx(to_go[1][t] - to_go[0][t])


def test_branching_values_each_sampled_action_by_its_return_in_an_env_copy(tokenizer, make_args):
    rollout = _rollout(tokenizer, make_args, CountingEnv, outcome_advantage="branch")

    def continuation(packed):
        return torch.tensor([[0.0, -1e9, -1e9]] * len(packed))  # always "zero"

    wave = rollout.observe_wave(1)
    before = wave.episodes[0].env.t
    row = rollout.advance(wave, _uniform(wave.packed), continuation_logits=continuation)[0]
    assert row.ready and len(row.actions) == 4  # a group, valued now
    values = torch.tensor(row.actions, dtype=torch.float32)  # the action's own reward; the copies then play "zero"
    expected = values - values.mean()
    if values.eq(values[0]).all():
        expected = torch.zeros(4)
    torch.testing.assert_close(torch.tensor(row.advantages), expected)
    assert wave.episodes[0].env.t == before + 1  # the episode itself took one step (the first sample)
    stats = rollout.pop_stats()
    assert stats["branch/continuation_decisions"] == [8.0]  # 4 copies x the 2 decisions left
    assert stats["branch/continuation_forwards"] == [2.0]  # the copies read "Step t of 3" alike: one row a round


def test_an_env_of_its_own_k_gets_groups_of_that_size(tokenizer, make_args):
    """``num_generations_per_env``: the named env's decisions sample and value their own k (here 6 against the
    others' 4: a dense and an outcome env), each group centred on its own mean, and branching pays for that env's k."""
    factories = {"counting": CountingEnv, **TOY_FACTORIES}
    args = make_args(
        envs=list(factories), eps_per_env=1, num_generations=4, scale_rewards="none",
        num_generations_per_env={"counting": 6}, outcome_advantage="branch", branch_limit=8,
        beta=0.0,  # driven by hand: no reference policy, no KL
    )  # fmt: skip
    pool = EpisodePool(factories, eps_per_env=1, rng=np.random.default_rng(0))
    rollout = Rollout(pool, tokenizer, args, seed=0)

    def continuation(packed):
        return torch.tensor([[0.0, -1e9, -1e9]] * len(packed))  # always "zero"

    assert rollout.widest == 6
    wave = rollout.observe_wave(3)
    rows = rollout.advance(
        wave, [torch.zeros(ep.env.observe().n_legal) for ep in wave.episodes], continuation_logits=continuation
    )  # uniform
    widths = {ep.env_name: len(row.actions) for ep, row in zip(wave.episodes, rows) if row.ready}
    assert widths["counting"] == 6 and widths["named_best"] == 4
    for row in rows:
        if row.ready:
            assert len(row.advantages) == len(row.values) == len(row.actions)
            assert sum(row.advantages) == pytest.approx(0.0, abs=1e-5)
    counting = next(row for ep, row in zip(wave.episodes, rows) if ep.env_name == "counting")
    assert counting.values == [float(a) for a in counting.actions]  # its reward, then "zero" twice
    # counting: 6 copies x its 2 decisions left; three_in_a_row (outcome, 3 decisions): 4 copies x 2
    assert rollout.pop_stats()["branch/continuation_decisions"] == [6 * 2 + 4 * 2]


def _nim_value_under_uniform_play(piles: tuple, action: int, epsilon: float) -> float:
    """The agent's expected return after ``action`` at ``piles`` when it plays uniformly at random afterwards, by
    brute-force recursion over the ε-optimal opponent's moves (+1 if the agent takes the last stone, -1 if the
    opponent does)."""
    pile, k = legal_moves(piles)[action]
    after = list(piles)
    after[pile] -= k
    if sum(after) == 0:
        return 1.0
    value = 0.0
    for (opp_pile, opp_k), p in zip(legal_moves(after), opponent_move_probs(after, epsilon)):
        mine = list(after)
        mine[opp_pile] -= opp_k
        if sum(mine) == 0:
            value -= p
        else:
            n = sum(mine)
            value += p * sum(_nim_value_under_uniform_play(tuple(mine), a, epsilon) for a in range(n)) / n
    return value


def _uniform_legal(packed):
    """Continuation act logits: uniform over each nim decision's legal moves (at most 3 x 3 = 9)."""
    return torch.stack([torch.where(torch.arange(9) < len(p.questions[0].options), 0.0, -torch.inf) for p in packed])


def _nim_branch_values(rollout, piles, n_decisions):
    """Branch values of every move at ``piles`` in ``n_decisions`` nim episodes (each with its own generator for the
    opponent's future moves), continued by uniform play."""
    episodes = []
    for i in range(n_decisions):
        env = NimEnv(n_piles=3, max_stones=3).reset(np.random.default_rng([7, i]))
        env.piles, env._decision = list(piles), None
        episodes.append(Episode("nim", env))
    n = sum(piles)
    values, answered, _ = branch_values(
        episodes, [list(range(n))] * n_decisions, rollout.observer, _uniform_legal, torch.Generator().manual_seed(0),
        temperature=1.0, limit=n_decisions, fallbacks=BranchFallbacks(),
    )  # fmt: skip
    assert all(v is not None for v in values)
    return np.array(values), answered


def test_a_round_answers_each_distinct_decision_once_and_the_branch_values_are_unchanged(
    tokenizer, make_args, monkeypatch
):
    """Nim at piles (2, 3, 3), every move branched in 40 episodes whose opponents share their randomness: a round's
    copies often stand in the same position. The policy here is a fixed function of the packed tokens, so answering
    the distinct decisions once and repeating their rows must give the very draws, returns and counts that answering
    every decision gives, with fewer rows answered."""
    from alea_trl.trainer.rollout import branching

    rollout = _rollout(tokenizer, make_args, NimEnv, outcome_advantage="branch")
    seen = []

    def token_policy(packed):  # logits that depend on the tokens only, -inf beyond the legal moves
        seen.append(len(packed))
        rows = []
        for p in packed:
            z = torch.tensor([((sum(p.input_ids) * (a + 3)) % 17) / 4.0 for a in range(9)])
            rows.append(torch.where(torch.arange(9) < len(p.questions[0].options), z, -torch.inf))
        return torch.stack(rows)

    def run():
        episodes = []
        for _ in range(40):
            env = NimEnv(n_piles=3, max_stones=3).reset(np.random.default_rng(3))
            env.piles, env._decision = [2, 3, 3], None
            episodes.append(Episode("nim", env))
        return branch_values(
            episodes, [list(range(8))] * 40, rollout.observer, token_policy,
            torch.Generator().manual_seed(0), temperature=1.0, limit=40, fallbacks=BranchFallbacks(),
        )  # fmt: skip

    values, answered, forwarded = run()
    assert sum(seen) == forwarded and forwarded < answered / 4  # 40 identical starts: most rows repeat
    seen.clear()
    monkeypatch.setattr(branching, "distinct_logits", lambda fn, packed: (fn(packed), len(packed)))
    every_values, every_answered, every_forwarded = run()
    assert sum(seen) == every_forwarded == every_answered == answered
    assert values == every_values


@pytest.mark.parametrize("explore", [0.0, 0.5, 1.0])
def test_branch_explore_values_branches_under_the_mixed_continuation_policy(tokenizer, make_args, explore):
    """CountingEnv pays each action's index for three steps. The continuation policy plays "zero" (logits 0, -30, -30):
    without exploration every branch is worth its own action only; with a share ``explore`` of uniform play each of the
    two later steps pays 1 (the uniform mean) that often, so an action's branch value is ``a + 2 x explore``."""
    rollout = _rollout(tokenizer, make_args, CountingEnv, outcome_advantage="branch", branch_explore=explore)
    episodes = [Episode("counting", CountingEnv().reset(np.random.default_rng(i))) for i in range(200)]

    def sure_of_zero(packed):
        return torch.tensor([[0.0, -30.0, -30.0]] * len(packed))

    values, answered, _ = branch_values(
        episodes, [[0, 1, 2]] * len(episodes), rollout.observer, sure_of_zero, torch.Generator().manual_seed(0),
        temperature=1.0, limit=len(episodes), fallbacks=BranchFallbacks(), explore=explore,
    )  # fmt: skip
    assert answered == 200 * 3 * 2
    later = np.array(values) - np.arange(3)  # what the two continuation steps paid, per branch
    if explore == 0.0:
        assert (later == 0).all()
    else:  # 600 branches of two steps: the standard error of the mean is below 0.04
        np.testing.assert_allclose(later.mean(), 2 * explore, atol=0.12)


def test_branch_explore_refuses_values_outside_0_1_and_a_run_that_does_not_branch(make_args):
    for value in (-0.1, 1.5):
        with pytest.raises(ValueError, match="branch_explore"):
            make_args(outcome_advantage="branch", branch_explore=value)
    with pytest.raises(ValueError, match="branch_explore.*does not branch"):
        make_args(outcome_advantage="rtg", branch_explore=0.2)


def test_branch_values_are_unbiased_in_a_two_player_game(tokenizer, make_args):
    """Nim against its ε-optimal opponent (the opponent moves inside the env): the mean branch return of each action
    under a uniform continuation policy matches its exact value from the agent's side, by brute force."""
    piles = (1, 2, 2)
    rollout = _rollout(tokenizer, make_args, NimEnv, outcome_advantage="branch")
    values, answered = _nim_branch_values(rollout, piles, 300)
    assert answered > 0
    exact = [_nim_value_under_uniform_play(piles, a, 0.3) for a in range(sum(piles))]
    assert max(exact) - min(exact) > 0.5  # the moves differ: a wrong sign or perspective would show
    np.testing.assert_allclose(values.mean(0), exact, atol=0.16)  # +-1 returns: 300 give a standard error <= 0.058


def test_continuations_pack_only_the_act_and_answer_it_as_the_full_decision_does(tokenizer, make_args, tiny_model):
    """Branch continuations use only the act: they are packed without the report questions, and the act's logits of
    a real model on that packing equal those on the full decision (a question attends only to the state and itself)."""
    model = tiny_model().eval()
    rollout = _rollout(tokenizer, make_args, NimEnv, outcome_advantage="branch")
    seen = []

    def act_logits(packed):
        batch = collate_segments(packed, tokenizer.pad_token_id).to("cpu")
        with torch.no_grad():
            return act_rows(model(**batch.model_inputs()).choice_logits, batch)

    def continuation(packed):
        seen.extend(packed)
        return act_logits(packed)

    continuation = continuation
    wave = rollout.observe_wave(1)
    rollout.advance(wave, act_logits(wave.packed), continuation_logits=continuation)
    assert seen and all([q.qid for q in p.questions] == ["act"] for p in seen)
    assert len(wave.packed[0].questions) == 4  # the trained decision keeps its reports
    env = NimEnv(n_piles=3, max_stones=3).reset(np.random.default_rng(3))
    _, (full, targets, _), _ = rollout.observer.prepare(env, "nim")
    _, (act_only, no_targets, _), _ = rollout.observer.prepare(env, "nim", act_only=True)
    assert len(act_only.input_ids) < len(full.input_ids) and targets and no_targets is None
    torch.testing.assert_close(act_logits([act_only]), act_logits([full]), rtol=1e-5, atol=1e-5)


def test_shared_continuation_rows_equal_the_real_models_rows_for_every_copy(tokenizer, make_args, tiny_model):
    """A real model answers a round of nim continuations with repeats (three positions, each several times, in mixed
    order) once per distinct decision: every row equals the row the model gives that decision in a forward of all of
    them, to float tolerance (the batch shapes differ)."""
    from alea_trl.trainer.rollout.branching import distinct_logits

    model = tiny_model().eval()
    rollout = _rollout(tokenizer, make_args, NimEnv, outcome_advantage="branch")

    def act_logits(packed):
        batch = collate_segments(packed, tokenizer.pad_token_id).to("cpu")
        with torch.no_grad():
            return act_rows(model(**batch.model_inputs()).choice_logits, batch)

    positions = []
    for piles in ([1, 2, 3], [3, 3, 1], [2, 0, 1]):
        env = NimEnv(n_piles=3, max_stones=3).reset(np.random.default_rng(0))
        env.piles, env._decision = piles, None
        positions.append(rollout.observer.prepare(env, "nim", act_only=True)[1][0])
    packed = [positions[i] for i in (0, 1, 0, 2, 1, 0, 2, 2, 1, 0)]
    shared, n_answered = distinct_logits(act_logits, packed)
    assert n_answered == 3 and shared.shape[0] == len(packed)
    torch.testing.assert_close(shared, act_logits(packed), rtol=1e-5, atol=1e-5)


def test_an_env_that_cannot_be_copied_falls_back_to_reward_to_go_with_one_warning(tokenizer, make_args):
    rollout = _rollout(tokenizer, make_args, Uncopyable, outcome_advantage="branch")
    continuation = _uniform
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):
            wave = rollout.observe_wave(1)
            rows = rollout.advance(wave, _uniform(wave.packed), continuation_logits=continuation)
            assert not rows[0].ready  # valued when the episode ends
    assert len([w for w in caught if "cannot be deep-copied" in str(w.message)]) == 1
    assert len(rollout.take(10)) == 6


def _p_right(model, tokenizer, n=200, seed=123, n_options=3, n_rounds=3):
    """Mean probability of the named colour over fresh decisions at every round of three_in_a_row."""
    envs = []
    for i in range(n):
        env = ThreeInARowEnv(n_options, n_rounds).reset(np.random.default_rng([seed, i]))
        for _ in range(i % n_rounds):  # every round, on the right path
            env.step(env.best)
        envs.append(env)
    answers = model.predict([e.observe() for e in envs], tokenizer, batch_size=100)
    return float(np.mean([a["act"][e.best] for a, e in zip(answers, envs)]))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_sparse_three_decision_env_is_learnt(tiny_model, tokenizer, make_args, seed):
    """Three decisions, return 1 only if all three pick the colour the state names (chance 1/27): the default credit
    assignment (branching) takes the policy to the right answer, on two model seeds. The learning rate is the one
    whose margin over 0.8 `benchmarks/sparse_credit.py` measured on one thread (figures in benchmarks/RESULTS.md)."""
    model = tiny_model(seed)
    assert _p_right(model, tokenizer) < 0.45
    batches = {"eps_per_env": 16, "max_batch": 16, "per_device_train_batch_size": 16}  # 16 decisions a step
    rates = {"learning_rate": 5e-4, "lr_head": 5e-4, "lr_aux": 5e-4}
    args = make_args(envs=["three_in_a_row"], max_steps=1200, beta=0.0, logging_steps=100, **batches, **rates)
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    trainer.train()
    p_right = _p_right(model, tokenizer)
    assert p_right >= 0.8, p_right


def test_logged_return_is_the_sampled_policys_not_the_best_of_k(tiny_model, tokenizer, make_args):
    """With dense_advance="best_of_k" the episode follows the best of k samples; ``return`` is the policy's expected
    return at the states met (near random play for an untrained policy), ``return_best_of_k`` the realised one."""
    args = make_args(
        envs=["newsvendor"],
        max_steps=20,
        eps_per_env=2,
        per_device_train_batch_size=8,
        learning_rate=0.0,  # the untrained policy throughout
        lr_head=0.0,
        lr_aux=0.0,
        logging_steps=20,
    )
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
    trainer.train()
    log = next(h for h in trainer.state.log_history if "env/newsvendor/return" in h)
    random_play, oracle = 47.8, 138.4  # `python -m alea_trl.envs`, 1,000 episodes each
    assert abs(log["env/newsvendor/return"] - random_play) < 0.25 * (oracle - random_play)
    assert log["env/newsvendor/return_best_of_k"] > log["env/newsvendor/return"] + 0.3 * (oracle - random_play)


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_continuations_run_in_the_mode_of_the_forward_that_sampled_the_actions(
    tiny_model, tokenizer, make_args, num_iterations
):
    """With dropout, train and eval mode are two policies: branches are played by the one whose actions they value
    (the loss forward's train mode when actions are sampled from it; a rollout wave's eval mode otherwise)."""
    args = make_args(envs=["three_in_a_row"], max_steps=2, num_iterations=num_iterations, outcome_advantage="branch")
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    modes = []
    trainer.policy_forward.add_collate_hook(
        lambda packed, batch: modes.append((torch.is_grad_enabled(), policy.training))
    )
    trainer.train()
    no_grad = [training for grad, training in modes if not grad]  # continuations (and, separately, rollout waves)
    logged = trainer.state.log_history[0]
    assert no_grad and logged["branch/continuation_decisions"] > 0
    assert 0 < logged["branch/continuation_forwards"] <= logged["branch/continuation_decisions"]
    assert set(no_grad) == {num_iterations == 1}
