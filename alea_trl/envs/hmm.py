"""``hmm``: name the hidden regime of a Markov chain from the symbols it emits (dense).

Design decisions:
1. The parameters (start, transition and emission probabilities) are drawn at reset and stored as integer hundredths
   whose rows sum to exactly 100, so the two-decimal numbers printed in the state are *exactly* the numbers the
   oracle uses (no hidden precision).
2. Every oracle is a forward recursion over the printed parameters and the printed symbols: the filtering posterior
   (the act's expected rewards), its one-step prediction (next regime, next symbol) and a (regime, count) recursion
   for the count of a symbol in the next ``n_ahead`` steps. No sampling, so targets are exact and cost nothing.
3. The chain runs on past the last decision: questions about later steps are about that continuation, which keeps
   every question well defined at every decision (the state says so).
4. The symbols named by the report questions are drawn from the env's generator when a step is observed, so a model
   cannot learn a fixed pattern of which symbol is asked about.
5. Regime and symbol names are neutral letters ("A", "B", ... and "x", "y", ...): the parameters are random, so
   suggestive names ("calm", "volatile") would mislead a pretrained model.
"""

from __future__ import annotations

import numpy as np

from ..questions import ACT_QID, Decision, Question
from .base import AleaEnv


REGIME_NAMES = ("A", "B", "C", "D", "E", "F")
SYMBOL_NAMES = ("x", "y", "z", "u", "v", "w")


def round_simplex(p, total: int = 100, min_count: int = 1) -> np.ndarray:
    """Round a probability vector to integer counts summing to ``total`` (largest-remainder rounding).

    Args:
        p (`array-like`): non-negative weights (normalised internally).
        total (`int`, defaults to 100): the sum of the counts (100 = two-decimal probabilities).
        min_count (`int`, defaults to 1): every count is at least this (so no printed probability is 0.00).

    Returns:
        `np.ndarray`: int64 counts, ``counts.sum() == total`` and ``counts >= min_count``.
    """
    p = np.asarray(p, dtype=np.float64)
    k = p.shape[0]
    free = total - k * min_count
    if free < 0:
        raise ValueError(f"round_simplex: field 'total': {total} is too small for {k} entries of at least {min_count}")
    scaled = p / p.sum() * free
    counts = np.floor(scaled).astype(np.int64)
    rest = free - int(counts.sum())
    order = np.argsort(-(scaled - counts), kind="stable")
    counts[order[:rest]] += 1
    return counts + min_count


def forward_filter(init, trans, emit, symbols) -> np.ndarray:
    """Filtering posterior of the current regime of a hidden Markov chain (the normalised forward algorithm).

    Args:
        init (`array-like`): ``(K,)`` distribution of the regime at step 1.
        trans (`array-like`): ``(K, K)`` transition matrix, ``trans[i, j] = P(next = j | now = i)``.
        emit (`array-like`): ``(K, S)`` emission matrix, ``emit[i, s] = P(symbol = s | regime = i)``.
        symbols (`Sequence[int]`): the observed symbols at steps 1..t (t >= 1).

    Returns:
        `np.ndarray`: ``(K,)`` vector ``P(regime_t = i | symbols_1..t)``.
    """
    init, trans, emit = (np.asarray(a, dtype=np.float64) for a in (init, trans, emit))
    if len(symbols) == 0:
        raise ValueError("forward_filter: field 'symbols': at least one symbol is needed")
    alpha = init * emit[:, symbols[0]]
    alpha = alpha / alpha.sum()
    for s in symbols[1:]:
        alpha = (alpha @ trans) * emit[:, s]
        alpha = alpha / alpha.sum()
    return alpha


def predict_regime(posterior, trans) -> np.ndarray:
    """Predictive distribution of the next regime: ``P(regime_{t+1} = j) = sum_i posterior_i trans[i, j]``.

    Args:
        posterior (`array-like`): ``(K,)`` distribution of the current regime.
        trans (`array-like`): ``(K, K)`` transition matrix.

    Returns:
        `np.ndarray`: ``(K,)`` distribution of the next regime.
    """
    return np.asarray(posterior, dtype=np.float64) @ np.asarray(trans, dtype=np.float64)


def next_symbol_probs(posterior, trans, emit) -> np.ndarray:
    """Predictive distribution of the next symbol: the next-regime prediction pushed through the emissions.

    Args:
        posterior (`array-like`): ``(K,)`` distribution of the current regime.
        trans (`array-like`): ``(K, K)`` transition matrix.
        emit (`array-like`): ``(K, S)`` emission matrix.

    Returns:
        `np.ndarray`: ``(S,)`` vector ``P(symbol_{t+1} = s)``.
    """
    return predict_regime(posterior, trans) @ np.asarray(emit, dtype=np.float64)


def symbol_count_pmf(posterior, trans, emit, symbol: int, n: int) -> np.ndarray:
    """Distribution of how many of the next ``n`` symbols equal ``symbol``, by a forward (regime, count) recursion.

    ``joint[i, c]`` is the probability that the regime is ``i`` and ``c`` matches were seen so far; each step moves the
    regime by ``trans`` and adds one to the count with probability ``emit[new regime, symbol]``.

    Args:
        posterior (`array-like`): ``(K,)`` distribution of the current regime.
        trans (`array-like`): ``(K, K)`` transition matrix.
        emit (`array-like`): ``(K, S)`` emission matrix.
        symbol (`int`): the symbol counted.
        n (`int`): the number of future steps.

    Returns:
        `np.ndarray`: ``(n + 1,)`` pmf of the count.
    """
    trans = np.asarray(trans, dtype=np.float64)
    hit = np.asarray(emit, dtype=np.float64)[:, symbol]
    joint = np.zeros((trans.shape[0], n + 1))
    joint[:, 0] = posterior
    for _ in range(n):
        moved = trans.T @ joint  # (K, n + 1): regime after the move, count so far
        joint = moved * (1.0 - hit)[:, None]
        joint[:, 1:] += moved[:, :-1] * hit[:, None]
    return joint.sum(axis=0)


def _sample_index(rng: np.random.Generator, counts: np.ndarray) -> int:
    """Draw an index with probability ``counts / counts.sum()`` from integer counts (exact, no float renormalising)."""
    cum = np.cumsum(counts)
    return int(min(np.searchsorted(cum, rng.random() * cum[-1], side="right"), len(counts) - 1))


def _fmt_row(names, counts) -> str:
    return ", ".join(f"{name} {c / 100:.2f}" for name, c in zip(names, counts))


class HMMEnv(AleaEnv):
    """Name the current regime of a hidden Markov chain whose parameters are stated, from the symbols it emitted.

    Description:
        A Markov chain over ``n_regimes`` hidden regimes emits one of ``n_symbols`` symbols per step. At reset the start
        distribution, the transition matrix (sticky: extra Dirichlet mass on the diagonal) and the emission matrix are
        drawn and rounded to two decimals; the chain then runs and the agent sees its symbols one at a time.

    Actions:
        The regime names (``"A"``, ``"B"``, ...): the agent's guess of the regime at the current step.

    State text:
        The regime and symbol names, the start, transition and emission probabilities (two decimals, rows summing
        to 1.00), the symbols observed so far in order, the step number and the horizon.

    Questions:
        - ``act`` (choice): which regime is the chain in now?
        - ``next_sym`` (noul): probability that the next symbol is a named symbol.
        - ``next_regime`` (choice): which regime will the chain be in at the next step?
        - ``count`` (score, ``n_ahead + 1`` bins): how many of the next ``n_ahead`` symbols equal a named symbol?

    Rewards:
        1 if the named regime is the true current regime, else 0.

    Episode end:
        After the decision at step ``horizon`` (so ``horizon`` decisions). The chain itself runs on: the report
        questions about later steps are about that continuation.

    Oracle:
        The expected reward of naming regime ``r`` is the filtering posterior ``P(regime_t = r | symbols_1..t)``
        (:func:`forward_filter`); ``next_regime`` is :func:`predict_regime`, ``next_sym`` is :func:`next_symbol_probs`
        and ``count`` is :func:`symbol_count_pmf`. The oracle action is the posterior mode.

    Arguments:
        n_regimes (`int`, defaults to 3): number of hidden regimes (2..6).
        n_symbols (`int`, defaults to 3): number of symbols (2..6).
        horizon (`int`, defaults to 10): number of observed symbols, and of decisions, per episode.
        n_ahead (`int`, defaults to 4): the window of the ``count`` question.
        stickiness (`float`, defaults to 3.0): extra Dirichlet mass on the diagonal of the transition rows (higher:
            regimes last longer, so history is more informative).
        emit_alpha (`float`, defaults to 0.7): Dirichlet concentration of the emission rows (lower: symbols reveal
            the regime more sharply).
    """

    name = "hmm"
    dense = True

    def __init__(self, n_regimes=3, n_symbols=3, horizon=10, n_ahead=4, stickiness=3.0, emit_alpha=0.7):
        super().__init__()
        for field_name, value, lo, hi in (
            ("n_regimes", n_regimes, 2, len(REGIME_NAMES)),
            ("n_symbols", n_symbols, 2, len(SYMBOL_NAMES)),
            ("horizon", horizon, 1, 200),
            ("n_ahead", n_ahead, 1, 50),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
                raise ValueError(f"env 'hmm': field {field_name!r}: must be an integer in [{lo}, {hi}], got {value!r}")
        if not stickiness >= 0:
            raise ValueError(f"env 'hmm': field 'stickiness': must be >= 0, got {stickiness!r}")
        if not emit_alpha > 0:
            raise ValueError(f"env 'hmm': field 'emit_alpha': must be > 0, got {emit_alpha!r}")
        self.n_regimes, self.n_symbols = int(n_regimes), int(n_symbols)
        self.horizon, self.n_ahead = int(horizon), int(n_ahead)
        self.stickiness, self.emit_alpha = float(stickiness), float(emit_alpha)
        self.regime_names = REGIME_NAMES[: self.n_regimes]
        self.symbol_names = SYMBOL_NAMES[: self.n_symbols]
        self._regimes: list[int] = []  # the hidden regime of every step so far (the truth)
        self._symbols: list[int] = []  # the symbol of every step so far (what the state text shows)

    # ------------------------------------------------------------------------------------------------ parameters
    @property
    def init(self) -> np.ndarray:
        """Start distribution, exactly as printed."""
        return self._init_c / 100.0

    @property
    def trans(self) -> np.ndarray:
        """Transition matrix, exactly as printed."""
        return self._trans_c / 100.0

    @property
    def emit(self) -> np.ndarray:
        """Emission matrix, exactly as printed."""
        return self._emit_c / 100.0

    @property
    def symbols(self) -> tuple[int, ...]:
        """The symbols observed so far in this episode, oldest first, as indices into ``symbol_names``
        (``symbols[-1]`` is the current step's); empty before the first ``reset``. A copy: reading it changes
        nothing."""
        return tuple(self._symbols)

    def _posterior(self) -> np.ndarray:
        return forward_filter(self.init, self.trans, self.emit, self._symbols)

    # ------------------------------------------------------------------------------------------------ hooks
    def _reset(self, rng: np.random.Generator) -> None:
        k, s = self.n_regimes, self.n_symbols
        self._init_c = round_simplex(rng.dirichlet(np.full(k, 2.0)))
        self._trans_c = np.stack(
            [round_simplex(rng.dirichlet(1.0 + self.stickiness * np.eye(k)[i])) for i in range(k)]
        )
        self._emit_c = np.stack([round_simplex(rng.dirichlet(np.full(s, self.emit_alpha))) for _ in range(k)])
        self._regimes = [_sample_index(rng, self._init_c)]
        self._symbols = [_sample_index(rng, self._emit_c[self._regimes[0]])]
        self._draw_queries(rng)

    def _draw_queries(self, rng: np.random.Generator) -> None:
        self._q_next = int(rng.integers(self.n_symbols))
        self._q_count = int(rng.integers(self.n_symbols))

    def _observe(self) -> Decision:
        rn, sn = self.regime_names, self.symbol_names
        t = len(self._symbols)
        lines = [
            (
                f"A hidden Markov chain moves between regimes {', '.join(rn)} and emits one symbol ({', '.join(sn)}) "
                "per step: the step-1 regime follows the start probabilities, each later regime follows the "
                "transition row of the previous one, and each symbol follows the emission row of the current regime."
            ),
            f"Start: {_fmt_row(rn, self._init_c)}.",
            "Transitions: " + "; ".join(f"from {r}: {_fmt_row(rn, row)}" for r, row in zip(rn, self._trans_c)) + ".",
            "Emissions: " + "; ".join(f"in {r}: {_fmt_row(sn, row)}" for r, row in zip(rn, self._emit_c)) + ".",
            f"Step {t} of {self.horizon}. Symbols so far: {' '.join(sn[x] for x in self._symbols)}.",
            "The chain keeps running after the last step.",
        ]
        questions = [
            Question(ACT_QID, "choice", "Which regime is the chain in now?", options=rn, env=self.name),
            Question(
                "next_sym",
                "noul",
                f"What is the probability that the next symbol is {sn[self._q_next]}?",
                env=self.name,
            ),
            Question(
                "next_regime",
                "choice",
                "Which regime will the chain be in at the next step?",
                options=rn,
                env=self.name,
            ),
            Question(
                "count",
                "score",
                f"How many of the next {self.n_ahead} symbols will be {sn[self._q_count]}?",
                n_bins=self.n_ahead + 1,
                env=self.name,
            ),
        ]
        return Decision("\n".join(lines), questions, env=self.name)

    def _step(self, action: int) -> tuple[float, bool]:
        reward = 1.0 if action == self._regimes[-1] else 0.0
        if len(self._symbols) >= self.horizon:
            return reward, True
        rng = self.rng
        self._regimes.append(_sample_index(rng, self._trans_c[self._regimes[-1]]))
        self._symbols.append(_sample_index(rng, self._emit_c[self._regimes[-1]]))
        self._draw_queries(rng)
        return reward, False

    # ------------------------------------------------------------------------------------------------ oracle
    def n_legal(self) -> int:
        """Number of legal actions: the number of regimes."""
        return self.n_regimes

    def action_rewards(self) -> list[float]:
        """Expected reward of naming each regime: its filtering posterior probability (the oracle action, their argmax,
        is the posterior mode)."""
        return self._posterior().tolist()

    def oracle_targets(self) -> dict:
        """Exact targets of ``next_sym``, ``next_regime`` and ``count``."""
        post = self._posterior()
        trans, emit = self.trans, self.emit
        return {
            "next_sym": float(next_symbol_probs(post, trans, emit)[self._q_next]),
            "next_regime": predict_regime(post, trans),
            "count": symbol_count_pmf(post, trans, emit, self._q_count, self.n_ahead),
        }


__all__ = [
    "HMMEnv",
    "forward_filter",
    "next_symbol_probs",
    "predict_regime",
    "round_simplex",
    "symbol_count_pmf",
]
