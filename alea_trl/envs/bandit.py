"""A Bernoulli multi-armed bandit with a finite horizon and a Bayes-optimal oracle.

Design decisions:
1. The hidden truth is one success rate per arm, drawn independently from a Beta(prior_a, prior_b) prior at reset.
   The prior parameters are positive integers, so every posterior is a Beta with integer parameters: its CDF is a
   binomial tail sum and every oracle is exact (no special functions, no scipy).
2. The state text gives the prior, the horizon, the pulls left and per arm the counts of wins and losses. By
   exchangeability these counts are a sufficient statistic, so the text states everything the oracles use.
3. ``P(arm i is best)`` is the integral of ``pdf_i * prod_{j != i} cdf_j`` over [0, 1]. With integer parameters the
   integrand is a polynomial, so Gauss-Legendre quadrature with enough nodes computes it exactly (to rounding).
4. The oracle action is the Bayes-optimal policy for the remaining horizon (maximal expected total remaining reward),
   found by dynamic programming over the posterior parameters. The arms are exchangeable, so the value function is
   memoised (``functools.lru_cache``) on the sorted tuple of per-arm parameters; the cache is shared by all episodes.
5. The "pays next pull" report names one arm, rotating with the number of pulls made, so every arm is asked about.
"""

from __future__ import annotations

import math
import string
from functools import lru_cache

import numpy as np

from ..questions import Decision, Question
from .base import AleaEnv


def beta_pdf(x, a: int, b: int) -> np.ndarray:
    """Density of Beta(a, b) for integer ``a, b >= 1``.

    Args:
        x (`array-like`): points in [0, 1].
        a (`int`), b (`int`): the Beta parameters.

    Returns:
        `np.ndarray`: the density at ``x``; ``1 / B(a, b) = (a + b - 1) * C(a + b - 2, a - 1)``.
    """
    x = np.asarray(x, dtype=np.float64)
    return (a + b - 1) * math.comb(a + b - 2, a - 1) * x ** (a - 1) * (1.0 - x) ** (b - 1)


def beta_cdf(x, a: int, b: int) -> np.ndarray:
    """CDF of Beta(a, b) for integer ``a, b >= 1``, as a binomial tail: ``I_x(a, b) = P(Binomial(a+b-1, x) >= a)``.

    Args:
        x (`array-like`): points in [0, 1].
        a (`int`), b (`int`): the Beta parameters.

    Returns:
        `np.ndarray`: the CDF at ``x`` (same shape as ``x``).
    """
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    n = a + b - 1
    k = np.arange(a, n + 1)
    log_comb = np.array([math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) for j in k])
    with np.errstate(divide="ignore", invalid="ignore"):
        lx, l1x = np.log(x)[..., None], np.log1p(-x)[..., None]
        terms = np.exp(log_comb + k * lx + (n - k) * l1x)
    terms = np.nan_to_num(terms, nan=0.0)
    out = terms.sum(axis=-1)
    return np.where(x >= 1.0, 1.0, np.where(x <= 0.0, 0.0, out))


def posterior_means(successes, failures, prior_a: int = 1, prior_b: int = 1) -> np.ndarray:
    """Posterior mean rate of each arm, i.e. the probability that its next pull pays.

    Args:
        successes (`Sequence[int]`), failures (`Sequence[int]`): per-arm counts.
        prior_a (`int`), prior_b (`int`): the Beta prior of every arm.

    Returns:
        `np.ndarray`: ``(prior_a + s_i) / (prior_a + prior_b + s_i + f_i)`` per arm.
    """
    s, f = np.asarray(successes, dtype=np.float64), np.asarray(failures, dtype=np.float64)
    return (prior_a + s) / (prior_a + prior_b + s + f)


def prob_best(successes, failures, prior_a: int = 1, prior_b: int = 1) -> np.ndarray:
    """Posterior probability that each arm has the highest rate (ties have probability zero).

    Args:
        successes (`Sequence[int]`), failures (`Sequence[int]`): per-arm counts.
        prior_a (`int`), prior_b (`int`): the (integer) Beta prior of every arm.

    Returns:
        `np.ndarray`: ``P_i = int_0^1 pdf_i(x) prod_{j != i} cdf_j(x) dx`` per arm, by Gauss-Legendre quadrature,
        exact because the integrand is a polynomial of degree below ``2 * n_nodes``.
    """
    a = tuple(prior_a + int(s) for s in successes)
    b = tuple(prior_b + int(f) for f in failures)
    return np.array(_prob_best(a, b))


@lru_cache(maxsize=2**16)
def _prob_best(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[float, ...]:
    """:func:`prob_best` of the posterior parameters, memoised (episodes revisit the same few count vectors)."""
    degree = sum(ai + bi - 1 for ai, bi in zip(a, b)) - 1
    nodes, weights = np.polynomial.legendre.leggauss(degree // 2 + 2)
    x, w = 0.5 * (nodes + 1.0), 0.5 * weights
    cdfs = np.stack([beta_cdf(x, ai, bi) for ai, bi in zip(a, b)])
    out = np.empty(len(a))
    for i in range(len(a)):
        others = np.prod(np.delete(cdfs, i, axis=0), axis=0)
        out[i] = float(np.sum(w * beta_pdf(x, a[i], b[i]) * others))
    out = np.clip(out, 0.0, None)
    return tuple(float(v) for v in out / out.sum())


@lru_cache(maxsize=2**20)
def _value(params: tuple[tuple[int, int], ...], pulls_left: int) -> float:
    """Bayes-optimal expected remaining reward; ``params`` is the SORTED tuple of per-arm posterior (a, b)."""
    if pulls_left == 0:
        return 0.0
    return max(_q_values(params, pulls_left))


def _q_values(params: tuple[tuple[int, int], ...], pulls_left: int) -> list[float]:
    """Expected remaining reward of pulling each arm now and playing Bayes-optimally afterwards."""
    out = []
    for i, (a, b) in enumerate(params):
        p = a / (a + b)
        win = tuple(sorted(params[:i] + ((a + 1, b),) + params[i + 1 :]))
        lose = tuple(sorted(params[:i] + ((a, b + 1),) + params[i + 1 :]))
        out.append(p * (1.0 + _value(win, pulls_left - 1)) + (1.0 - p) * _value(lose, pulls_left - 1))
    return out


def bayes_q_values(successes, failures, pulls_left: int, prior_a: int = 1, prior_b: int = 1) -> np.ndarray:
    """Expected total remaining reward of pulling each arm now, then following the Bayes-optimal policy.

    Args:
        successes (`Sequence[int]`), failures (`Sequence[int]`): per-arm counts.
        pulls_left (`int`): pulls remaining, including this one (>= 1).
        prior_a (`int`), prior_b (`int`): the Beta prior of every arm.

    Returns:
        `np.ndarray`: one value per arm, by memoised dynamic programming over the posterior parameters.
    """
    if pulls_left < 1:
        raise ValueError(f"bayes_q_values: field 'pulls_left': must be >= 1, got {pulls_left}")
    params = tuple((prior_a + int(s), prior_b + int(f)) for s, f in zip(successes, failures))
    return np.array(_q_values(params, pulls_left))


def bayes_optimal_value(successes, failures, pulls_left: int, prior_a: int = 1, prior_b: int = 1) -> float:
    """Expected total remaining reward of the Bayes-optimal policy (0 when no pulls are left).

    Args:
        successes (`Sequence[int]`), failures (`Sequence[int]`): per-arm counts.
        pulls_left (`int`): pulls remaining.
        prior_a (`int`), prior_b (`int`): the Beta prior of every arm.

    Returns:
        `float`: ``V = max_i [p_i (1 + V(win_i)) + (1 - p_i) V(loss_i)]`` with ``p_i`` the posterior mean.
    """
    params = tuple(sorted((prior_a + int(s), prior_b + int(f)) for s, f in zip(successes, failures)))
    return _value(params, int(pulls_left))


def bayes_optimal_action(successes, failures, pulls_left: int, prior_a: int = 1, prior_b: int = 1) -> int:
    """The Bayes-optimal arm to pull now (lowest index among arms within 1e-12 of the best value).

    Args:
        successes (`Sequence[int]`), failures (`Sequence[int]`): per-arm counts.
        pulls_left (`int`): pulls remaining, including this one (>= 1).
        prior_a (`int`), prior_b (`int`): the Beta prior of every arm.

    Returns:
        `int`: the index of the arm.
    """
    q = bayes_q_values(successes, failures, pulls_left, prior_a, prior_b)
    return int(np.flatnonzero(q >= q.max() - 1e-12)[0])


class BanditEnv(AleaEnv):
    """Bernoulli bandit: pull arms with unknown payout rates for a fixed number of pulls.

    Description:
        ``n_arms`` arms each pay 1 with an unknown rate, drawn independently from Beta(prior_a, prior_b) at reset.
        The agent has ``horizon`` pulls and wants to maximise the total payout (explore vs exploit).

    Actions:
        ``act`` (choice): which arm to pull, options ``"arm A"``, ``"arm B"``, ...

    State text:
        The prior, the number of pulls made and left, and per arm the number of wins and losses so far.

    Questions:
        ``pays`` (noul): does the named arm (rotating with the pull count) pay on its next pull?
        ``best`` (choice over the arm names): which arm has the highest true rate?

    Rewards:
        1 when the pulled arm pays (drawn from ``self.rng`` with the arm's true rate), 0 otherwise. Outcome env:
        ``action_rewards()`` is ``None``; the return is the total payout.

    Episode end:
        After ``horizon`` pulls.

    Oracle:
        ``pays``: the posterior mean of the named arm. ``best``: :func:`prob_best` (exact quadrature over the Beta
        posteriors). ``oracle_action``: :func:`bayes_optimal_action`, the Bayes-optimal policy by dynamic programming.

    Arguments:
        n_arms (`int`, defaults to 3): number of arms (2 to 26).
        horizon (`int`, defaults to 9): number of pulls per episode.
        prior_a (`int`, defaults to 1), prior_b (`int`, defaults to 1): the integer Beta prior of every rate.
    """

    name = "bandit"
    dense = False

    def __init__(self, n_arms: int = 3, horizon: int = 9, prior_a: int = 1, prior_b: int = 1):
        super().__init__()
        for field_name, value, low in (
            ("n_arms", n_arms, 2),
            ("horizon", horizon, 1),
            ("prior_a", prior_a, 1),
            ("prior_b", prior_b, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"env 'bandit': field {field_name!r}: must be an integer >= {low}, got {value!r}")
        if n_arms > 26:
            raise ValueError(f"env 'bandit': field 'n_arms': at most 26 arms are supported, got {n_arms}")
        self.n_arms, self.horizon = int(n_arms), int(horizon)
        self.prior_a, self.prior_b = int(prior_a), int(prior_b)
        self.arm_names = tuple(f"arm {string.ascii_uppercase[i]}" for i in range(self.n_arms))
        self.rates = np.zeros(self.n_arms)
        self.successes = [0] * self.n_arms
        self.failures = [0] * self.n_arms
        self.pulls = 0

    # ----------------------------------------------------------------------------------------------------- hooks
    def _reset(self, rng: np.random.Generator) -> None:
        self.rates = rng.beta(self.prior_a, self.prior_b, size=self.n_arms)
        self.successes = [0] * self.n_arms
        self.failures = [0] * self.n_arms
        self.pulls = 0

    def _prior_text(self) -> str:
        if self.prior_a == 1 and self.prior_b == 1:
            return "uniform on [0, 1], i.e. Beta(1, 1)"
        return f"Beta({self.prior_a}, {self.prior_b}), with mean {self.prior_a / (self.prior_a + self.prior_b):.2f}"

    def _asked_arm(self) -> int:
        return self.pulls % self.n_arms

    def _observe(self) -> Decision:
        left = self.horizon - self.pulls
        counts = "; ".join(
            f"{name}: {s} win{'s' * (s != 1)}, {f} loss{'es' * (f != 1)}"
            for name, s, f in zip(self.arm_names, self.successes, self.failures)
        )
        state = (
            f"A slot machine has {self.n_arms} arms ({', '.join(self.arm_names)}). Each pull of an arm pays 1 with "
            f"that arm's own unknown chance, else 0. Before any pull, each arm's chance was believed "
            f"{self._prior_text()}, independently of the other arms. You have {self.horizon} pulls in all: "
            f"{self.pulls} made, {left} left. Results so far: {counts}. Total payout so far: {sum(self.successes)}."
        )
        asked = self.arm_names[self._asked_arm()]
        questions = [
            Question("act", "choice", "Which arm do you pull next?", options=self.arm_names, env=self.name),
            Question("pays", "noul", f"Does {asked} pay on its next pull?", env=self.name),
            Question(
                "best",
                "choice",
                "Which arm has the highest true chance of paying?",
                options=self.arm_names,
                env=self.name,
            ),
        ]
        return Decision(state, questions, env=self.name)

    def _step(self, action: int) -> tuple[float, bool]:
        win = bool(self.rng.random() < self.rates[action])
        if win:
            self.successes[action] += 1
        else:
            self.failures[action] += 1
        self.pulls += 1
        return float(win), self.pulls >= self.horizon

    # ----------------------------------------------------------------------------------------------------- oracle
    def n_legal(self) -> int:
        """Number of legal actions: one per arm."""
        return self.n_arms

    def oracle_targets(self) -> dict:
        """Exact targets: ``pays`` is the named arm's posterior mean, ``best`` is :func:`prob_best`."""
        means = posterior_means(self.successes, self.failures, self.prior_a, self.prior_b)
        return {
            "pays": float(means[self._asked_arm()]),
            "best": prob_best(self.successes, self.failures, self.prior_a, self.prior_b),
        }

    def oracle_action(self) -> int:
        """The Bayes-optimal arm for the remaining pulls (see :func:`bayes_optimal_action`)."""
        left = self.horizon - self.pulls
        return bayes_optimal_action(self.successes, self.failures, left, self.prior_a, self.prior_b)


__all__ = [
    "BanditEnv",
    "bayes_optimal_action",
    "bayes_optimal_value",
    "bayes_q_values",
    "beta_cdf",
    "beta_pdf",
    "posterior_means",
    "prob_best",
]
