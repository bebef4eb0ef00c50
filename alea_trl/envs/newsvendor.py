"""The newsvendor: order stock each day against Poisson demand whose rate is learned from a Gamma prior.

Design decisions:
1. The hidden truth is one Poisson demand rate, drawn from a Gamma prior stated in the text. Demand is observed in
   full every day (unmet demand is lost but seen), so the posterior is Gamma(shape + total demand, rate + days) and
   the next day's demand is negative binomial: the oracle is exact, with no censoring to integrate over.
2. Expected profit is an exact finite sum: ``E[min(D, q)] = sum_{d<q} d p(d) + q P(D >= q)``, so no tail of the
   demand distribution is ever truncated for the rewards. Quantiles and tail probabilities use the predictive pmf
   extended until the mass left out is below ``1e-12``.
3. The reward is the day's profit in money (price times units sold minus cost times units ordered), unscaled: with
   the defaults it mostly lies between -20 and 40, and the text states price and cost exactly.
4. Numbers are stated with 2 decimals; the constructor refuses prices, costs and prior parameters with more
   decimals, so the text always states exactly what the oracle uses. Past demands are listed (the last 12 days when
   the history is longer) together with their count and total, which are all the posterior needs.
5. The threshold ``x`` of the tail question is drawn from ``self.rng`` at reset and after each step (never in
   ``observe``), uniformly between half and one and a half times the predictive mean, so its target varies.
"""

from __future__ import annotations

import math

import numpy as np

from ..questions import ACT_QID, Decision, Question
from .base import AleaEnv


N_QUANTILES = 64
"""Number of mid-point quantile levels ``(i + 0.5) / 64`` used as the samples of the demand forecast."""

TAIL_TOL = 1e-12
"""The predictive pmf is extended until the probability mass it leaves out is below this."""

MAX_LISTED = 12
"""At most this many past demands are listed in the state text (always with their count and total)."""


def nb_posterior(k: float, r: float, demands) -> tuple[float, float]:
    """Gamma posterior of a Poisson rate after observing counts.

    Args:
        k (`float`): prior shape. r (`float`): prior rate. demands (`Sequence[int]`): observed counts.

    Returns:
        `tuple[float, float]`: the posterior ``(shape, rate) = (k + sum(demands), r + len(demands))``.
    """
    demands = [int(d) for d in demands]
    return float(k) + sum(demands), float(r) + len(demands)


def nb_predictive_pmf(k: float, r: float, demands, max_d: int = 0, tail: float = TAIL_TOL) -> np.ndarray:
    """Posterior predictive pmf of the next Poisson count under a Gamma(k, r) prior (a negative binomial).

    With posterior shape ``a`` and rate ``b``: ``p(d) = Gamma(a + d) / (Gamma(a) d!) (b / (b + 1))^a (1 / (b + 1))^d``,
    computed in log space.

    Args:
        k (`float`): prior shape. r (`float`): prior rate (the prior mean of the rate is ``k / r``).
        demands (`Sequence[int]`): past counts.
        max_d (`int`, defaults to 0): the pmf covers at least ``0..max_d``.
        tail (`float`, defaults to `1e-12`): the pmf is extended beyond ``max_d`` until the mass left out is below it.

    Returns:
        `np.ndarray`: ``pmf[d] = P(D = d)`` for ``d = 0..len(pmf) - 1``.
    """
    a, b = nb_posterior(k, r, demands)
    mean, sd = a / b, math.sqrt(a / b * (1.0 + 1.0 / b))
    n = max(int(max_d), int(mean + 12.0 * sd) + 16)
    while True:
        d = np.arange(n + 1, dtype=np.float64)
        log_ratio = np.log(a + d[:-1]) - np.log(d[1:])
        logp = a * math.log(b / (b + 1.0)) - d * math.log1p(b) + np.concatenate([[0.0], np.cumsum(log_ratio)])
        pmf = np.exp(logp)
        if 1.0 - pmf.sum() < tail or n > 10**7:
            return pmf
        n *= 2


def expected_profit(q: int, pmf, price: float, cost: float) -> float:
    """Exact expected profit ``E[price * min(D, q) - cost * q]`` of ordering ``q`` units.

    Uses ``E[min(D, q)] = sum_{d<q} d pmf[d] + q (1 - sum_{d<q} pmf[d])``: the tail ``D >= q`` is counted exactly.

    Args:
        q (`int`): units ordered. pmf (`array`): demand pmf covering at least ``0..q - 1``.
        price (`float`): sale price per unit. cost (`float`): purchase cost per unit.

    Returns:
        `float`: the expected profit.
    """
    q = int(q)
    pmf = np.asarray(pmf, dtype=np.float64)
    if q < 0 or len(pmf) < q:
        raise ValueError(f"expected_profit: field 'pmf': needs at least {q} entries for q={q}, got {len(pmf)}")
    head = pmf[:q]
    sold = float(np.dot(np.arange(q), head)) + q * (1.0 - float(head.sum()))
    return price * sold - cost * q


def critical_fractile(price: float, cost: float) -> float:
    """The newsvendor critical fractile ``(price - cost) / price`` (no salvage value, no shortage penalty).

    Args:
        price (`float`): sale price per unit. cost (`float`): purchase cost per unit.

    Returns:
        `float`: the optimal order is the smallest ``q`` with ``P(D <= q)`` at least this.
    """
    return (price - cost) / price


def optimal_order(pmf, price: float, cost: float) -> int:
    """The smallest integer order ``q`` with predictive CDF ``P(D <= q) >= critical_fractile(price, cost)``.

    Args:
        pmf (`array`): demand pmf (its tail mass must be negligible). price, cost (`float`): as above.

    Returns:
        `int`: the profit-maximising order over all non-negative integers.
    """
    cdf = np.cumsum(np.asarray(pmf, dtype=np.float64))
    return int(min(np.searchsorted(cdf, critical_fractile(price, cost), side="left"), len(cdf) - 1))


def predictive_quantiles(pmf, n: int = N_QUANTILES) -> np.ndarray:
    """Exact quantiles of a discrete pmf at the mid-point levels ``(i + 0.5) / n``.

    Args:
        pmf (`array`): the pmf on ``0..len(pmf) - 1``. n (`int`, defaults to 64): number of levels.

    Returns:
        `np.ndarray`: ``n`` floats, the smallest ``d`` with ``P(D <= d) >= (i + 0.5) / n`` for each ``i``.
    """
    cdf = np.cumsum(np.asarray(pmf, dtype=np.float64))
    levels = (np.arange(n) + 0.5) / n
    return np.minimum(np.searchsorted(cdf, levels, side="left"), len(cdf) - 1).astype(np.float64)


def _money(x: float) -> str:
    return f"{x:.2f}"


def _two_decimals(name: str, value: float, positive: bool = True) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"env 'newsvendor': field {name!r}: must be {'> 0' if positive else '>= 0'}, got {value!r}")
    if abs(round(value, 2) - value) > 1e-9:
        raise ValueError(f"env 'newsvendor': field {name!r}: at most 2 decimals (the text states it), got {value!r}")
    return round(value, 2)


class NewsvendorEnv(AleaEnv):
    """Order newspapers each day against Poisson demand with an unknown, Gamma-distributed rate.

    Description:
        A stand sells newspapers for ``n_periods`` days. Daily demand is Poisson with a rate drawn once, at reset, from
        a Gamma(``prior_shape``, ``prior_rate``) prior. Each morning the agent orders papers; unsold papers are lost and
        unmet demand is lost too, but the full demand is observed every evening.

    Actions:
        The order quantity, one of ``0, order_step, 2 * order_step, ..., max_order`` (options ``"0"``, ``"2"``, ...).

    State text:
        The story, the prior (shape, rate, mean), price and cost, the day number, the past demands (the last 12 when
        there are more) with their count and total, and the profit so far. Example (defaults, day 3)::

            You run a newspaper stand. Each day the number of customers who want a paper is Poisson with an unknown
            daily rate that stays the same every day. Before day 1 your belief about that rate was a Gamma
            distribution with shape 4.00 and rate 0.50 (mean 8.00). Each morning you order papers at 2.00 each and
            sell them at 5.00 each; unsold papers are thrown away, and customers you cannot serve are lost, but you
            always learn the full demand. Day 3 of 8. Demand on past days: 7, 10 (2 days, total 17). Profit so far:
            31.00.

    Questions:
        - ``act`` (choice): how many papers to order today.
        - ``demand`` (regress): today's demand; target: the 64 mid-point quantiles of the predictive distribution.
        - ``over`` (noul): will today's demand exceed ``x`` papers; target: ``P(D > x)``.

    Rewards:
        Dense: the day's profit ``price * min(D, q) - cost * q``. ``action_rewards()`` is its exact expectation
        under the negative-binomial predictive of ``D``.

    Episode end:
        After ``n_periods`` orders.

    Oracle:
        Posterior Gamma(``prior_shape + total``, ``prior_rate + days``); predictive negative binomial
        (:func:`nb_predictive_pmf`); expected profit by exact summation (:func:`expected_profit`); the best grid order
        is the argmax of the expected profits (the unconstrained optimum is the critical-fractile quantity
        :func:`optimal_order`).

    Arguments:
        prior_shape (`float`, defaults to 4.0): shape of the Gamma prior on the demand rate (2 decimals at most).
        prior_rate (`float`, defaults to 0.5): rate of the Gamma prior (prior mean ``prior_shape / prior_rate``).
        price (`float`, defaults to 5.0): sale price per paper. cost (`float`, defaults to 2.0): cost per paper
        ordered; ``0 <= cost < price``.
        n_periods (`int`, defaults to 8): number of days (decisions).
        max_order (`int`, defaults to 24): largest order on the grid. order_step (`int`, defaults to 2): grid step.
    """

    name = "newsvendor"
    dense = True

    def __init__(
        self,
        prior_shape: float = 4.0,
        prior_rate: float = 0.5,
        price: float = 5.0,
        cost: float = 2.0,
        n_periods: int = 8,
        max_order: int = 24,
        order_step: int = 2,
    ):
        super().__init__()
        self.prior_shape = _two_decimals("prior_shape", prior_shape)
        self.prior_rate = _two_decimals("prior_rate", prior_rate)
        self.price = _two_decimals("price", price)
        self.cost = _two_decimals("cost", cost, positive=False)
        if self.cost >= self.price:
            raise ValueError(f"env 'newsvendor': field 'cost': must be below price {price}, got {cost}")
        for field_name, value in (("n_periods", n_periods), ("max_order", max_order), ("order_step", order_step)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"env 'newsvendor': field {field_name!r}: must be an integer >= 1, got {value!r}")
        if max_order % order_step:
            raise ValueError(f"env 'newsvendor': field 'max_order': must be a multiple of order_step, got {max_order}")
        self.n_periods = int(n_periods)
        self.orders = tuple(range(0, int(max_order) + 1, int(order_step)))
        self.rate = 0.0
        self.demands: list[int] = []
        self.profit = 0.0
        self.threshold = 0

    # ------------------------------------------------------------------------------------------------------- episode
    def _reset(self, rng: np.random.Generator) -> None:
        self.rate = float(rng.gamma(self.prior_shape, 1.0 / self.prior_rate))
        self.demands = []
        self.profit = 0.0
        self._draw_threshold()

    def _draw_threshold(self) -> None:
        a, b = nb_posterior(self.prior_shape, self.prior_rate, self.demands)
        mean = a / b
        self.threshold = int(self.rng.integers(math.floor(0.5 * mean), math.ceil(1.5 * mean) + 1))

    def _step(self, action: int) -> tuple[float, bool]:
        q = self.orders[action]
        demand = int(self.rng.poisson(self.rate))
        reward = self.price * min(demand, q) - self.cost * q
        self.demands.append(demand)
        self.profit += reward
        done = len(self.demands) >= self.n_periods
        if not done:
            self._draw_threshold()
        return reward, done

    def n_legal(self) -> int:
        return len(self.orders)

    # -------------------------------------------------------------------------------------------------- observation
    def _state_text(self) -> str:
        k, r, n = self.prior_shape, self.prior_rate, len(self.demands)
        text = (
            "You run a newspaper stand. Each day the number of customers who want a paper is Poisson with an unknown "
            "daily rate that stays the same every day. Before day 1 your belief about that rate was a Gamma "
            f"distribution with shape {k:.2f} and rate {r:.2f} (mean {k / r:.2f}). Each morning you order papers at "
            f"{_money(self.cost)} each and sell them at {_money(self.price)} each; unsold papers are thrown away, and "
            "customers you cannot serve are lost, but you always learn the full demand. "
            f"Day {n + 1} of {self.n_periods}. "
        )
        if n == 0:
            text += "No demand observed yet."
        else:
            shown = ", ".join(str(d) for d in self.demands[-MAX_LISTED:])
            prefix = "Demand on past days" if n <= MAX_LISTED else f"Demand on the last {MAX_LISTED} days"
            days = "1 day" if n == 1 else f"{n} days"
            text += f"{prefix}: {shown} ({days}, total {sum(self.demands)}). Profit so far: {_money(self.profit)}."
        return text

    def _observe(self) -> Decision:
        env = self.name
        questions = (
            Question(
                ACT_QID, "choice", "How many papers do you order today?", options=tuple(map(str, self.orders)), env=env
            ),
            Question("demand", "regress", "How many customers will want a paper today?", env=env),
            Question("over", "noul", f"Will more than {self.threshold} customers want a paper today?", env=env),
        )
        return Decision(self._state_text(), questions, env=env)

    # ------------------------------------------------------------------------------------------------------- oracle
    def predictive_pmf(self) -> np.ndarray:
        """The predictive pmf of today's demand given the state text, covering at least ``0..max_order``."""
        return nb_predictive_pmf(self.prior_shape, self.prior_rate, self.demands, max_d=self.orders[-1])

    def oracle_targets(self) -> dict:
        pmf = self.predictive_pmf()
        over = float(np.clip(1.0 - pmf[: self.threshold + 1].sum(), 0.0, 1.0))
        return {"demand": predictive_quantiles(pmf).tolist(), "over": over}

    def action_rewards(self) -> list[float]:
        pmf = self.predictive_pmf()
        return [expected_profit(q, pmf, self.price, self.cost) for q in self.orders]


__all__ = [
    "NewsvendorEnv",
    "critical_fractile",
    "expected_profit",
    "nb_posterior",
    "nb_predictive_pmf",
    "optimal_order",
    "predictive_quantiles",
]
