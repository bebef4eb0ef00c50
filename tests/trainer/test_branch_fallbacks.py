"""Branching that cannot value a decision says so: failures inside env copies are counted by cause, warned once per
env, and raise under ``on_env_error="raise"``; continuations stop at ``branch_max_rounds``. Either way the decision
falls back to reward-to-go."""

import copy
import functools
import warnings

import numpy as np
import pytest
import torch

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.envs import AleaEnv
from alea_trl.questions import Decision, Question
from alea_trl.trainer.rollout import Rollout
from alea_trl.trainer.rollout.branching import FAILURE_CAUSES
from alea_trl.trainer.rollout.pool import EpisodePool


class FragileCopies(AleaEnv):
    """Outcome: three steps paying the action's index; the episode itself is sound, its deep copies misbehave as
    ``fault`` says: ``"step"`` (step raises), ``"nan"`` (step returns a NaN reward), and once a copy has taken its
    first step (the sampled action, whose checks observe the decision copied) ``"observe"`` (observe raises),
    ``"invalid"`` (the decision has two act questions), ``"long"`` (the state outgrows ``max_len``); ``"none"``: sound copies."""

    name, dense = "fragile", False

    def __init__(self, fault: str = "step"):
        super().__init__()
        self.fault, self.is_copy, self.copy_steps = fault, False, 0

    def _reset(self, rng):
        self.t = 0

    def _observe(self):
        broken = self.is_copy and self.copy_steps >= 1
        if broken and self.fault == "observe":
            raise KeyError("the copy lost its state")
        act = Question("act", "choice", "Which number?", options=["zero", "one", "two"], env=self.name)
        questions = [act, act] if broken and self.fault == "invalid" else [act]
        state = "word " * 3000 if broken and self.fault == "long" else f"Step {self.t + 1} of 3."
        return Decision(state, questions, env=self.name)

    def oracle_targets(self):
        return {}

    def oracle_action(self):
        return 2

    def _step(self, action):
        if self.is_copy and self.fault == "step":
            raise RuntimeError("the copy shares a closed handle")
        self.t += 1
        self.copy_steps += self.is_copy
        reward = float("nan") if self.is_copy and self.fault == "nan" else float(action)
        return reward, self.t == 3

    def __deepcopy__(self, memo):
        new = copy.copy(self)
        new.is_copy, new._decision = True, None
        return new


class Corridor(AleaEnv):
    """Outcome with no horizon: the episode ends (+1) only when "exit" is chosen."""

    name, dense = "corridor", False

    def _reset(self, rng):
        self.t = 0

    def _observe(self):
        return Decision("A corridor.", [Question("act", "choice", "Which way?", options=["exit", "wait"])])

    def oracle_targets(self):
        return {}

    def oracle_action(self):
        return 0

    def _step(self, action):
        self.t += 1
        return (1.0, True) if action == 0 else (0.0, False)


def _rollout(tokenizer, make_args, name, factory, **overrides):
    args = make_args(
        envs=[name], eps_per_env=1, num_generations=4, scale_rewards="none", outcome_advantage="branch",
        **({"beta": 0.0} | overrides),  # driven by hand: no reference policy, no KL
    )  # fmt: skip
    pool = EpisodePool({name: factory}, eps_per_env=1, rng=np.random.default_rng(0))
    return Rollout(pool, tokenizer, args, seed=0)


def _uniform(packed):
    return torch.zeros(len(packed), 3)


def _decide(rollout, n, logits=_uniform, continuation=None):
    """``n`` decisions, one at a time, branch continuations answered by ``continuation``; each one's row."""
    rows = []
    for _ in range(n):
        wave = rollout.observe_wave(1)
        rows.append(rollout.advance(wave, logits(wave.packed), continuation_logits=continuation)[0])
    return rows


# the fault of a copy -> the cause it is counted under
FAULT_CAUSES = {"step": "step", "nan": "step", "observe": "observe", "invalid": "observe", "long": "max_len"}
# decisions whose copies meet the fault in two three-step episodes: a fault after the copy's first step spares each
# episode's last decision (its copies end at that step)
FAULTY_DECISIONS = {"step": 6, "nan": 6, "observe": 4, "invalid": 4, "long": 4}


@pytest.mark.parametrize("fault", sorted(FAULT_CAUSES))
def test_a_failing_copy_is_counted_by_cause_warned_once_and_valued_by_reward_to_go(tokenizer, make_args, fault):
    rollout = _rollout(
        tokenizer, make_args, "fragile", functools.partial(FragileCopies, fault),
        on_env_error="skip",  # count the failures and keep training
        max_len=256,  # the "long" copy's state (3,000 words) does not fit; every sound decision does
    )  # fmt: skip
    continuation = _uniform
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = _decide(rollout, 6, continuation=continuation)
    n_failed = FAULTY_DECISIONS[fault]
    assert sum(not row.ready for row in rows) == n_failed  # not valued by branching: they wait for reward-to-go
    valued_at_the_end = rollout.take(10)  # the two episodes ended: their return-to-go valued the waiting rows
    assert len(valued_at_the_end) == n_failed and all(len(row.advantages) == 1 for row in valued_at_the_end)
    stats = rollout.pop_stats()
    cause = FAULT_CAUSES[fault]
    assert sum(stats[f"branch/failed/{cause}"]) == n_failed and sum(stats["branch/failed"]) == n_failed
    assert all(sum(stats[f"branch/failed/{c}"]) == 0 for c in FAILURE_CAUSES if c != cause)
    assert sum(stats["branch/decisions"]) == 6 - n_failed
    assert sum(stats.get("env_errors", [])) == 0  # the episodes themselves were sound
    ours = [w for w in caught if "branching failed" in str(w.message)]
    assert len(ours) == 1 and "'fragile'" in str(ours[0].message) and f"branch/failed/{cause}" in str(ours[0].message)


@pytest.mark.parametrize("fault", ["step", "nan", "observe", "invalid"])
def test_on_env_error_raise_is_honoured_inside_copies(tokenizer, make_args, fault):
    rollout = _rollout(tokenizer, make_args, "fragile", functools.partial(FragileCopies, fault), on_env_error="raise")
    continuation = _uniform
    with pytest.raises(ValueError, match=rf"env 'fragile'.*during {FAULT_CAUSES[fault]}\(\) in a deep copy"):
        _decide(rollout, 1, continuation=continuation)


def test_a_copy_too_long_for_max_len_is_never_an_error(tokenizer, make_args):
    """As in the episode itself, a decision longer than ``max_len`` is counted, not raised, under the default
    ``on_env_error="raise"``."""
    rollout = _rollout(tokenizer, make_args, "fragile", functools.partial(FragileCopies, "long"), max_len=256)
    continuation = _uniform
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = _decide(rollout, 3, continuation=continuation)
    assert [row.ready for row in rows] == [False, False, True]  # the last decision's copies end at their first step
    assert sum(rollout.pop_stats()["branch/failed/max_len"]) == 2


def test_an_uncopyable_env_is_counted_at_each_decision_it_could_not_branch(tokenizer, make_args):
    class Uncopyable(FragileCopies):
        def __deepcopy__(self, memo):
            raise TypeError("holds a live connection")

    rollout = _rollout(tokenizer, make_args, "fragile", Uncopyable)  # the default on_env_error="raise"
    continuation = _uniform
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _decide(rollout, 6, continuation=continuation)
    assert sum(rollout.pop_stats()["branch/failed/copy"]) == 6  # a failed copy is not an env error: never raised
    assert len([w for w in caught if "cannot be deep-copied" in str(w.message)]) == 1


def test_continuations_stop_at_branch_max_rounds_and_the_decision_falls_back(tokenizer, make_args):
    """An env with no horizon under a policy that never ends it: branching stops after ``branch_max_rounds``
    continuation forwards, counts the decision in ``branch/capped``, and values it by reward-to-go."""
    rollout = _rollout(tokenizer, make_args, "corridor", Corridor, branch_max_rounds=20)
    forwards = []

    def never_exit(packed):  # "exit" has probability ~0
        forwards.append(len(packed))
        if len(forwards) > 200:
            raise RuntimeError("branch continuations ran past 200 rounds")
        return torch.tensor([[-50.0, 0.0]] * len(packed))

    continuation = never_exit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the sampled actions wait (their copies never end), so no branch of this decision ends
        rows = _decide(rollout, 2, lambda packed: torch.tensor([[-50.0, 0.0]] * len(packed)), continuation)
    assert len(forwards) == 2 * 20  # 20 rounds per decision
    assert not any(row.ready for row in rows)
    stats = rollout.pop_stats()
    assert sum(stats["branch/capped"]) == 2 and sum(stats["branch/decisions"]) == 0
    assert len([w for w in caught if "branch_max_rounds=20" in str(w.message)]) == 1


def test_branch_max_rounds_does_not_cut_branches_that_end_in_time(tokenizer, make_args):
    """The cap counts rounds, not decisions: three-step episodes need two continuation rounds, and a cap of 2 lets
    every branch finish."""
    sound = functools.partial(FragileCopies, "none")
    rollout = _rollout(tokenizer, make_args, "fragile", sound, branch_max_rounds=2)

    def continuation(packed):
        return torch.tensor([[0.0, -1e9, -1e9]] * len(packed))

    row = _decide(rollout, 1, continuation=continuation)[0]
    assert row.ready and row.values == [float(a) for a in row.actions]  # the copies are sound
    assert sum(rollout.pop_stats()["branch/capped"]) == 0


@pytest.mark.parametrize("value", [0, -1])
def test_branch_max_rounds_refuses_a_cap_below_one(make_args, value):
    with pytest.raises(ValueError, match="branch_max_rounds"):
        make_args(branch_max_rounds=value)


def test_the_trainer_logs_branch_failures(tokenizer, make_args, tiny_model):
    args = make_args(
        envs=["fragile"], eps_per_env=1, max_steps=1, outcome_advantage="branch",
        on_env_error="skip",  # the copies fail; training goes on
        per_device_train_batch_size=4, num_generations=2,
    )  # fmt: skip
    trainer = AleaEnvGRPOTrainer(
        tiny_model(), args=args, processing_class=tokenizer, env_factories={"fragile": FragileCopies}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    log = next(h for h in trainer.state.log_history if "branch/failed" in h)
    assert log["branch/failed"] > 0 and log["branch/failed/step"] == log["branch/failed"]
    assert log["branch/capped"] == 0
