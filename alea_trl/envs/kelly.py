"""``kelly``: bet a fraction of a bankroll on a coin of unknown bias (dense).

Design decisions:
1. The coin's chance of heads ``p`` is drawn at reset from a Beta(a, b) prior that the state text states; every flip is
   Bernoulli(p) from the env's generator. The posterior after ``h`` heads and ``t`` tails is Beta(a + h, b + t), so
   every oracle is a closed form of ``(a + h, b + t, odds)`` and the state text states exactly those numbers.
2. The reward of staking fraction ``f`` at odds ``odds``-to-1 is the realised log growth of the bankroll:
   ``log(1 + f * odds)`` on heads, ``log(1 - f)`` on tails. The episode return is therefore ``log(final / initial)``
   and the exact expected reward is ``m * log(1 + f * odds) + (1 - m) * log(1 - f)`` with ``m`` the posterior mean.
3. Stakes come from a fixed grid (default 0%, 5%, ..., 50%), always including 0% and never reaching 100%, so every
   reward is finite and the expected reward of the best stake is never negative.
4. The score question asks about the next ``n_future`` flips of the coin, a hypothetical continuation that does not
   depend on how many rounds are left, so its bins are the same at every decision.
5. The flip history is shown as a sequence while it is short (<= 20 flips) and as counts afterwards, so the state stays
   short for any horizon while still stating everything the oracle uses.
6. The text states exactly the numbers the oracles use: the prior is two integers, the odds have at most 2 decimals
   ("1.25 to 1") and the stakes are percentages with at most 2 decimals ("12.5%"); the constructor refuses other
   values (odds 1/3, stake 0.123456) instead of rounding them in the text. The bankroll, which no oracle uses (the
   log growth does not depend on its level), starts at a value with at most 2 decimals and is shown to the cent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..questions import ACT_QID, Decision, Question
from .base import AleaEnv, decimal_text, exact_decimal


DEFAULT_STAKES = tuple(round(0.05 * i, 2) for i in range(11))
"""Default stake grid: 0%, 5%, ..., 50% of the bankroll."""

_MAX_SHOWN_FLIPS = 20


def posterior_mean(a: float, b: float, heads: int = 0, tails: int = 0) -> float:
    """Posterior mean of a coin's chance of heads under a Beta(a, b) prior after ``heads`` heads and ``tails`` tails.

    This is also the posterior predictive probability that the next flip is heads.

    Args:
        a (`float`): first Beta prior parameter (pseudo-count of heads), positive.
        b (`float`): second Beta prior parameter (pseudo-count of tails), positive.
        heads (`int`, defaults to 0): heads observed.
        tails (`int`, defaults to 0): tails observed.

    Returns:
        `float`: ``(a + heads) / (a + b + heads + tails)``.
    """
    return (a + heads) / (a + b + heads + tails)


def expected_log_growth(m: float, f, b: float):
    """Expected log growth of a bankroll staking fraction ``f`` on an event of probability ``m`` paying ``b`` to 1.

    Args:
        m (`float`): probability of winning (for an uncertain coin, the posterior mean).
        f (`float` or array-like): staked fraction(s) of the bankroll, in [0, 1).
        b (`float`): net odds: a win multiplies the stake by ``1 + b`` (pays ``b`` to 1), a loss forfeits the stake.

    Returns:
        `float` or `np.ndarray`: ``m * log(1 + f * b) + (1 - m) * log(1 - f)`` (same shape as ``f``).
    """
    f = np.asarray(f, dtype=np.float64)
    out = m * np.log1p(f * b) + (1.0 - m) * np.log1p(-f)
    return float(out) if out.ndim == 0 else out


def kelly_fraction(p: float, b: float) -> float:
    """Kelly stake: the fraction of the bankroll maximising expected log growth at win probability ``p``, odds ``b``:1.

    Args:
        p (`float`): probability of winning.
        b (`float`): net odds (a win pays ``b`` per unit staked).

    Returns:
        `float`: ``max(0, p - (1 - p) / b)``.
    """
    return max(0.0, p - (1.0 - p) / b)


def beta_binomial_pmf(n: int, a: float, b: float) -> np.ndarray:
    """Beta-binomial pmf: the number of heads in ``n`` flips of a coin whose chance of heads is Beta(a, b).

    Args:
        n (`int`): number of flips (>= 0).
        a (`float`): first Beta parameter, positive.
        b (`float`): second Beta parameter, positive.

    Returns:
        `np.ndarray`: shape ``(n + 1,)``, entry ``k`` is ``C(n, k) B(k + a, n - k + b) / B(a, b)``.
    """

    def log_beta(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)

    logs = [math.log(math.comb(n, k)) + log_beta(k + a, n - k + b) - log_beta(a, b) for k in range(n + 1)]
    pmf = np.exp(np.array(logs))
    return pmf / pmf.sum()


class KellyEnv(AleaEnv):
    """Bet a fraction of a bankroll on heads of a coin whose bias is learned from its flips.

    Description:
        A coin has an unknown chance of heads ``p`` drawn from a Beta(a, b) prior stated in the text. Each round the
        agent stakes a fraction of its bankroll on heads at odds ``odds``-to-1, then the coin is flipped. A good
        agent tracks the posterior Beta(a + heads, b + tails) and stakes near the Kelly fraction of its mean.

    Actions:
        The stake as a percentage of the bankroll, from the grid ``stakes`` (default "0%", "5%", ..., "50%").

    State text:
        The prior, the odds, the bankroll (2 decimals), the round ("Round 6 of 10") and the flips so far (the
        sequence, e.g. "H T H H T", with its counts; counts only beyond 20 flips). Example::

            You are betting on a coin whose chance of heads is unknown. Before any flips you believed it was
            Beta(2, 2). Each round you stake a fraction of your bankroll on heads; heads pays 2 to 1, tails loses
            the stake. Your reward is the log of your bankroll's growth. Bankroll: 118.40. Round 6 of 10. Flips so
            far: H T H H T (3 heads, 2 tails).

    Questions:
        - ``act`` (choice): how much of the bankroll to stake on heads.
        - ``p_heads`` (noul): the probability that the next flip is heads.
        - ``kelly`` (regress): the fraction the Kelly criterion would stake.
        - ``wins{n_future}`` (score, ``n_future + 1`` bins): how many of the next ``n_future`` flips are heads.

    Rewards:
        ``log(1 + f * odds)`` if the flip is heads, ``log(1 - f)`` if tails, for the staked fraction ``f``; the episode
        return is ``log(final bankroll / initial bankroll)``.

    Episode end:
        After ``n_rounds`` flips.

    Oracle:
        With posterior mean ``m = (a + h) / (a + b + h + t)``: ``p_heads = m``; ``kelly = max(0, m - (1 - m) / odds)``;
        ``wins`` is the beta-binomial pmf of ``n_future`` flips under Beta(a + h, b + t); the expected reward of
        stake ``f`` is ``m log(1 + f odds) + (1 - m) log(1 - f)`` and ``oracle_action`` is its argmax over the grid.

    Arguments:
        n_rounds (`int`, defaults to 10): flips (decisions) per episode.
        odds (`float` or `Sequence[float]`, defaults to `(1, 2, 3)`): net odds of heads, positive with at most 2
            decimals; a sequence means one is drawn uniformly at reset.
        prior (`tuple[int, int]`, *optional*): fixed Beta prior (a, b); by default a and b are drawn uniformly from
            1..``max_prior`` at reset.
        max_prior (`int`, defaults to 4): largest prior parameter drawn when ``prior`` is not given.
        n_future (`int`, defaults to 10): flips the score question asks about.
        stakes (`Sequence[float]`, defaults to 0.00, 0.05, ..., 0.50): the stake grid, increasing, in [0, 1), each a
            percentage with at most 2 decimals (0.125 is "12.5%"; 0.123456 is refused).
        bankroll (`float`, defaults to 100.0): initial bankroll, positive with at most 2 decimals.
    """

    name = "kelly"
    dense = True

    def __init__(
        self,
        n_rounds: int = 10,
        odds: float | Sequence[float] = (1, 2, 3),
        prior: tuple[int, int] | None = None,
        max_prior: int = 4,
        n_future: int = 10,
        stakes: Sequence[float] = DEFAULT_STAKES,
        bankroll: float = 100.0,
    ):
        super().__init__()
        if not isinstance(n_rounds, (int, np.integer)) or n_rounds < 1:
            raise ValueError(f"env 'kelly': field 'n_rounds': must be a positive integer, got {n_rounds!r}")
        odds_choices = tuple(
            exact_decimal("kelly", "odds", o, 2) for o in (odds if isinstance(odds, Sequence) else (odds,))
        )
        if not odds_choices or any(o <= 0 for o in odds_choices):
            raise ValueError(
                f"env 'kelly': field 'odds': must be positive (or a list of positive numbers), got {odds}"
            )
        if prior is not None:
            if len(prior) != 2 or any(not isinstance(x, (int, np.integer)) or x < 1 for x in prior):
                raise ValueError(f"env 'kelly': field 'prior': must be two positive integers (a, b), got {prior!r}")
            prior = (int(prior[0]), int(prior[1]))
        if not isinstance(max_prior, (int, np.integer)) or max_prior < 1:
            raise ValueError(f"env 'kelly': field 'max_prior': must be a positive integer, got {max_prior!r}")
        if not isinstance(n_future, (int, np.integer)) or n_future < 1:
            raise ValueError(f"env 'kelly': field 'n_future': must be a positive integer, got {n_future!r}")
        stakes = tuple(exact_decimal("kelly", "stakes", f, 2, percent=True) for f in stakes)
        if not stakes or any(not 0.0 <= f < 1.0 for f in stakes) or list(stakes) != sorted(set(stakes)):
            raise ValueError(
                f"env 'kelly': field 'stakes': must be increasing distinct fractions in [0, 1), got {stakes}"
            )
        initial_bankroll = exact_decimal("kelly", "bankroll", bankroll, 2)
        if initial_bankroll <= 0:
            raise ValueError(f"env 'kelly': field 'bankroll': must be positive, got {bankroll!r}")
        self.n_rounds = int(n_rounds)
        self.odds_choices = odds_choices
        self.prior = prior
        self.max_prior = int(max_prior)
        self.n_future = int(n_future)
        self.stakes = stakes
        self.stake_labels = tuple(decimal_text(f, 2, percent=True) for f in stakes)
        self.initial_bankroll = initial_bankroll

    # ------------------------------------------------------------------------------------------------------ episode
    def _reset(self, rng: np.random.Generator) -> None:
        if self.prior is None:
            self.a, self.b = (int(x) for x in rng.integers(1, self.max_prior + 1, size=2))
        else:
            self.a, self.b = self.prior
        self.odds = self.odds_choices[int(rng.integers(len(self.odds_choices)))]
        self._p = float(rng.beta(self.a, self.b))  # hidden truth
        self.flips: list[int] = []  # 1 = heads, 0 = tails
        self.bankroll = self.initial_bankroll

    @property
    def heads(self) -> int:
        """Heads observed so far."""
        return sum(self.flips)

    @property
    def tails(self) -> int:
        """Tails observed so far."""
        return len(self.flips) - self.heads

    def _history_text(self) -> str:
        h, t = self.heads, self.tails
        if not self.flips:
            return "none"
        counts = f"{h} head{'s' * (h != 1)}, {t} tail{'s' * (t != 1)}"
        if len(self.flips) > _MAX_SHOWN_FLIPS:
            return counts
        return " ".join("H" if x else "T" for x in self.flips) + f" ({counts})"

    def _observe(self) -> Decision:
        state = (
            "You are betting on a coin whose chance of heads is unknown. Before any flips you believed it was "
            f"Beta({self.a}, {self.b}). Each round you stake a fraction of your bankroll on heads; heads pays "
            f"{decimal_text(self.odds, 2)} to 1, tails loses the stake. "
            "Your reward is the log of your bankroll's growth. "
            f"Bankroll: {self.bankroll:.2f}. Round {len(self.flips) + 1} of {self.n_rounds}. "
            f"Flips so far: {self._history_text()}."
        )
        n = self.n_future
        questions = [
            Question(
                ACT_QID,
                "choice",
                "How much of your bankroll do you stake on heads?",
                options=self.stake_labels,
                env=self.name,
            ),
            Question("p_heads", "noul", "What is the probability that the next flip is heads?", env=self.name),
            Question(
                "kelly", "regress", "What fraction of the bankroll would the Kelly criterion stake?", env=self.name
            ),
            Question(
                f"wins{n}",
                "score",
                f"How many of the next {n} flips of this coin will be heads?",
                n_bins=n + 1,
                env=self.name,
            ),
        ]
        return Decision(state, questions, env=self.name)

    def _step(self, action: int) -> tuple[float, bool]:
        f = self.stakes[action]
        heads = bool(self.rng.random() < self._p)
        growth = 1.0 + f * self.odds if heads else 1.0 - f
        self.bankroll *= growth
        self.flips.append(int(heads))
        return math.log(growth), len(self.flips) >= self.n_rounds

    def n_legal(self) -> int:
        return len(self.stakes)

    # ------------------------------------------------------------------------------------------------------- oracle
    def _posterior_mean(self) -> float:
        return posterior_mean(self.a, self.b, self.heads, self.tails)

    def oracle_targets(self) -> dict:
        m = self._posterior_mean()
        return {
            "p_heads": m,
            "kelly": kelly_fraction(m, self.odds),
            f"wins{self.n_future}": beta_binomial_pmf(self.n_future, self.a + self.heads, self.b + self.tails),
        }

    def action_rewards(self) -> list[float]:
        return expected_log_growth(self._posterior_mean(), np.array(self.stakes), self.odds).tolist()


__all__ = [
    "DEFAULT_STAKES",
    "KellyEnv",
    "beta_binomial_pmf",
    "expected_log_growth",
    "kelly_fraction",
    "posterior_mean",
]
