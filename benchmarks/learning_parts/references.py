"""What ``benchmarks/learning.py`` measures its figures on, and the policies they are read against.

The env set and instances (``ENVS``, ``SMALL``), the figure per env (``SCORE_KEY``), the evaluation episodes
(``EVAL_SEED``), and reference scores on those same episodes: the best state-blind policy per env (``best_constant``)
and, for hmm, hand-written policies and the ``next_regime`` skill of the prior and oracle forecasts.
"""

from __future__ import annotations

import numpy as np
import torch


ENVS = ["hmm", "kelly", "newsvendor", "bandit", "nim"]
DENSE = ["hmm", "kelly", "newsvendor"]
# Env instances sized for a tiny from-scratch model (``--env_kwargs small``, the default). hmm: 2 regimes, 2 symbols,
# sharper emissions, 3 decisions per episode (in the library default, 3 x 3 over 10 steps, the answer is a lookup in
# the printed emission table at a position that moves as the symbol list grows: too hard for a tiny model in a run of
# this length, see benchmarks/RESULTS.md); nim: 3 piles of 1..3 stones (the default 4 piles of 1..7 needs the nim-sum
# of 3-bit numbers). ``--env_kwargs default`` runs the library defaults of every env.
SMALL = {
    "hmm": {"n_regimes": 2, "n_symbols": 2, "emit_alpha": 0.3, "horizon": 3},
    "nim": {"n_piles": 3, "max_stones": 3},
}
# The curve's figure: dense envs are scored by exact expected rewards (``expected_score``: the outcome noise of kelly's
# log growth and newsvendor's demand is larger than the gap between two policies over a few hundred decisions);
# outcome envs by their realised returns (``normalized_score``: no expected reward per action exists).
SCORE_KEY = {"hmm": "expected_score", "kelly": "expected_score", "newsvendor": "expected_score"}
SCORE_KEY |= {"bandit": "normalized_score", "nim": "normalized_score"}
EVAL_SEED = 12345  # the evaluation episodes: distinct from the training pool's seed, the same at every evaluation


def play_eval_episodes(env, n: int, choose) -> tuple[float, np.ndarray]:
    """Play the ``n`` evaluation episodes of ``env`` (seeded as ``evaluate_policy`` seeds episode i of an env
    evaluated on its own, see ``CurveCallback.evaluate``) with ``choose(env) -> action``; return the summed realised
    return and, for a dense env, the summed expected rewards ``(chosen, mean, best)`` over its decisions."""
    total, expected = 0.0, np.zeros(3)
    for i in range(n):
        env.reset(np.random.default_rng([EVAL_SEED, 0, i]))
        while not env.done:
            choice = choose(env)
            if env.dense:
                r = np.asarray(env.action_rewards(), dtype=float)
                expected += (r[choice], r.mean(), r.max())
            total += env.step(choice)[0]
    return total, expected


def _expected_score(expected: np.ndarray) -> float:
    return float((expected[0] - expected[1]) / (expected[2] - expected[1]))


def best_constant(
    episodes: dict[str, int], baselines: dict[str, tuple[float, float]], env_kwargs: dict
) -> dict[str, float]:
    """Per env, the score of the best state-blind policy "always play option i" (clipped to the legal options) on
    the evaluation episodes, by the curve's figure (``SCORE_KEY``): what a policy that ignores the state text can
    reach."""
    from alea_trl.envs import make_env

    out = {}
    for name in ENVS:
        env, (rand, orac), n = make_env(name, **env_kwargs.get(name, {})), baselines[name], episodes[name]
        scores = []
        for a in range(env.reset(np.random.default_rng([EVAL_SEED, 0, 0])).observe().n_legal):
            total, expected = play_eval_episodes(env, n, lambda e, a=a: min(a, e.observe().n_legal - 1))
            dense = SCORE_KEY[name] == "expected_score"
            scores.append(_expected_score(expected) if dense else (total / n - rand) / (orac - rand))
        out[name] = float(max(scores))
    return out


def hmm_prior(env) -> np.ndarray:
    """hmm's regime distribution at the current step before any symbol is read: the start row pushed through the
    transition matrix once per step."""
    return env.init @ np.linalg.matrix_power(env.trans, len(env.symbols) - 1)


def hmm_reference_policies(episodes: int, env_kwargs: dict) -> dict[str, float]:
    """hmm's expected score (the curve's figure) of four hand-written policies on the evaluation episodes: the regime
    with the highest start probability; the highest *prior* probability (the start row pushed through the transition
    matrix once per step: reads the start and transition tables, never a symbol); the regime whose emission row gives
    the last symbol the highest probability; and start times last emission. They show which part of the state a
    learnt policy uses: one at or below "prior" has not learnt to look the symbols up in the emission table."""
    from alea_trl.envs import make_env

    env = make_env("hmm", **env_kwargs.get("hmm", {}))
    policies = {  # weights over the regimes; the policy plays their argmax
        "start": lambda e: e.init,
        "prior": hmm_prior,
        "last_emission": lambda e: e.emit[:, e.symbols[-1]],
        "start_x_last_emission": lambda e: e.init * e.emit[:, e.symbols[-1]],
    }
    return {
        name: _expected_score(play_eval_episodes(env, episodes, lambda e, w=w: int(np.argmax(w(e))))[1])
        for name, w in policies.items()
    }


def hmm_next_regime_skill(episodes: int, env_kwargs: dict) -> dict[str, float]:
    """Skill (``1 - log score / log score of uniform``, the report skill of ``evaluate_policy``) of two forecasts of
    hmm's ``next_regime`` question on the evaluation episodes: the prior (:func:`hmm_prior` one step on, no symbol
    read) and the oracle. A trained model whose ``choice`` skill on hmm sits at the prior's reads no symbol through its
    option read-out."""
    from alea_trl.envs import make_env
    from alea_trl.envs.hmm import predict_regime
    from alea_trl.losses import choice_loss

    env = make_env("hmm", **env_kwargs.get("hmm", {}))
    targets, priors = [], []

    def record(e) -> int:  # called at every decision; the action does not change hmm's chain
        targets.append(e.oracle_targets()["next_regime"])
        priors.append(predict_regime(hmm_prior(e), e.trans))
        return 0

    play_eval_episodes(env, episodes, record)
    target = torch.tensor(np.array(targets))  # (D, K)
    uniform = np.log(env.n_regimes)
    return {
        name: float(1 - choice_loss(torch.tensor(np.array(forecast)).log(), target) / uniform)
        for name, forecast in (("prior", priors), ("oracle", targets))
    }
