"""Decision datasets: env rollouts stored as a ``datasets.Dataset`` of decisions with oracle targets.

Design decisions:
1. One row is one decision: ``env``, ``state``, ``questions`` (qid, qtype, text, options, n_bins) and ``targets``,
   a list of float lists aligned with the questions, so every row has one schema whatever the env (choice / score:
   a distribution; noul: ``[p]``; regress: samples; a report without an oracle target: ``[]``).
2. The act target is what a warm start should imitate: a softmax of the exact expected rewards at
   ``act_temperature`` (relative to the reward spread of the decision) for dense envs, the oracle action for outcome
   envs.
3. Rollouts follow a behaviour policy mixing oracle and random actions (``oracle_mix``), so the data covers both
   good play and the states that bad play reaches.
4. Rows round-trip exactly: ``decision_from_row`` rebuilds the validated ``Decision`` and its targets.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from datasets import Dataset

from .questions import ACT_QID, Decision, Question, validate_targets


def act_target(env, temperature: float) -> list[float]:
    """The act question's target: softmax of expected rewards (dense) or the oracle action one-hot (outcome)."""
    n = env.observe().n_legal
    rewards = env.action_rewards() if env.dense else None
    if rewards is None:
        out = np.zeros(n)
        out[env.oracle_action()] = 1.0
        return out.tolist()
    r = np.asarray(rewards, dtype=np.float64)
    spread = r.max() - r.min()
    if spread <= 0:
        return np.full(n, 1.0 / n).tolist()
    z = (r - r.max()) / (temperature * spread)
    p = np.exp(z)
    return (p / p.sum()).tolist()


def decision_to_row(decision: Decision, targets: dict, act: list[float], env: str) -> dict:
    """One dataset row from a decision, its validated report targets and its act target."""
    questions, flat = [], []
    for q in decision.questions:
        questions.append(
            {"qid": q.qid, "qtype": q.qtype, "text": q.text, "options": list(q.options or []), "n_bins": q.n_bins or 0}
        )
        if q.qid == ACT_QID:
            flat.append([float(x) for x in act])
        elif q.qid in targets:
            flat.append([float(x) for x in np.atleast_1d(targets[q.qid])])
        else:
            flat.append([])
    return {"env": env, "state": decision.state, "questions": questions, "targets": flat}


def decision_from_row(row: dict) -> tuple[Decision, dict, np.ndarray]:
    """The ``Decision``, its validated report targets and the act target distribution of a dataset row."""
    env = row["env"]
    questions = [
        Question(q["qid"], q["qtype"], q["text"], options=q["options"] or None, n_bins=q["n_bins"] or None, env=env)
        for q in row["questions"]
    ]
    decision = Decision(row["state"], questions, env=env)
    raw, act = {}, None
    for q, t in zip(questions, row["targets"]):
        if q.qid == ACT_QID:
            act = np.asarray(t, dtype=np.float64)
        elif t:
            raw[q.qid] = t[0] if q.qtype == "noul" else t
    if act is None or act.shape != (decision.n_legal,) or abs(act.sum() - 1.0) > 1e-4:
        raise ValueError(
            f"env {env!r}: question 'act', field 'targets': needs a distribution over "
            f"{decision.n_legal} actions, got {act}"
        )
    return decision, validate_targets(decision, raw, env=env), act


def collect_decisions(
    envs: dict[str, Callable] | list[str],
    episodes_per_env: int,
    seed: int = 0,
    oracle_mix: float = 0.5,
    act_temperature: float = 0.1,
) -> Dataset:
    """Roll out envs under a behaviour policy and record every decision with its oracle targets.

    Args:
        envs (`list[str]` or `dict[str, Callable]`): registered env names, or name -> factory.
        episodes_per_env (`int`): episodes per env.
        seed (`int`, defaults to 0): seed of the episodes and of the behaviour policy.
        oracle_mix (`float`, defaults to 0.5): probability that the behaviour policy plays the oracle action
            (random otherwise).
        act_temperature (`float`, defaults to 0.1): temperature of the dense act target, relative to each
            decision's reward spread (small: close to the oracle action; large: close to uniform).

    Returns:
        `datasets.Dataset` with columns ``env``, ``state``, ``questions``, ``targets`` (see the module docstring).
    """
    from .envs import env_factories

    if not 0.0 <= oracle_mix <= 1.0:
        raise ValueError(f"collect_decisions: field 'oracle_mix': must be in [0, 1], got {oracle_mix}")
    factories = env_factories(envs)
    rows = []
    for e, (name, factory) in enumerate(factories.items()):
        env, pick = factory(), np.random.default_rng([seed, e, 1])
        for i in range(episodes_per_env):
            env.reset(np.random.default_rng([seed, e, i]))
            while not env.done:
                decision = env.observe()
                targets = validate_targets(decision, env.oracle_targets(), env=name)
                rows.append(decision_to_row(decision, targets, act_target(env, act_temperature), name))
                use_oracle = pick.random() < oracle_mix
                env.step(env.oracle_action() if use_oracle else int(pick.integers(decision.n_legal)))
    return Dataset.from_list(rows)


__all__ = ["act_target", "collect_decisions", "decision_from_row", "decision_to_row"]
