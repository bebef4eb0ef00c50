"""The environment contract shared by every Alea environment.

Design decisions:
1. An environment is a plain Python object (no gym dependency): ``reset(rng)``, ``observe()``, ``step(action)``,
   ``oracle_targets()``, ``action_rewards()``, ``oracle_action()``, ``done`` and ``dense``. A user's own env is any
   object with this shape; subclassing :class:`AleaEnv` only buys the argument checks below.
2. All randomness flows from the ``numpy.random.Generator`` given to ``reset``; the env keeps it, so the same seed and
   the same actions replay an episode exactly, and a pickled or deep-copied env continues identically.
3. ``observe()`` builds its decision once per decision point (cached until ``step`` or ``reset``), so the checks in
   ``step`` and a trainer's own ``observe`` do not build the state text twice.
4. Misuse fails loudly: an action out of range raises ``ValueError``; ``step`` or ``observe`` before ``reset`` or
   after the episode ended raises ``RuntimeError``. Both messages name the env.
5. A state text states exactly the numbers the oracles use: :func:`exact_decimal` refuses constructor values with more
   decimals than the text prints, and :func:`decimal_text` prints an accepted value in short exact form.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..questions import Decision


class AleaEnv:
    """Base class of Alea environments.

    Subclasses set ``name`` and ``dense`` and implement ``_reset``, ``_observe``, ``_step``, ``oracle_targets`` and
    ``oracle_action`` (dense envs implement ``action_rewards`` instead: the default ``oracle_action`` is its argmax).
    The public methods wrap them with the checks every env needs.

    Contract:
        - ``reset(rng) -> self``: start a new episode; all randomness of the episode comes from ``rng``.
        - ``observe() -> Decision``: the current decision point; the same until ``step`` is called.
        - ``oracle_targets() -> dict[qid, target]``: exact answers to the report questions of ``observe()``.
        - ``action_rewards() -> list[float] | None``: dense envs: the exact expected reward of every legal action,
          given everything the state text says; outcome envs: ``None``. By default the reward of this step alone;
          an env whose values are returns-to-go (this step's reward and every later one's, e.g. ``Q*(s, a)``) sets
          ``action_rewards_to_go = True``, so that a trainer does not add them up along an episode as if each were
          one step's (a user env without the attribute is taken as ``False``).
        - ``step(action) -> (reward, done)``: apply the action (an index into the act options).
        - ``oracle_action() -> int``: the best known action (exact for dense envs, Bayes-optimal or game-theoretic
          for outcome envs).
    """

    name: str = "env"
    dense: bool = False
    action_rewards_to_go: bool = False  # action_rewards() are returns-to-go (True) or this step's rewards (False)
    # goal-reaching envs: whether the episode reached its goal (terminated there, not cut off by a time limit or
    # ended another way); None for envs without a goal. Evaluation and training logs report the share of episodes.
    reached_goal: bool | None = None

    def __init__(self):
        self.rng: np.random.Generator | None = None
        self._done = True
        self._started = False
        self._decision = None

    # ----------------------------------------------------------------------------------------------------- contract
    def reset(self, rng: np.random.Generator) -> AleaEnv:
        """Start a new episode drawing all randomness from ``rng``; returns the env itself."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"env {self.name!r}: reset(rng) needs a numpy.random.Generator, got {type(rng).__name__}")
        self.rng = rng
        self._done = False
        self._started = True
        self._decision = None
        self._reset(rng)
        return self

    @property
    def done(self) -> bool:
        """Whether the episode has ended (``True`` before the first ``reset``)."""
        return self._done

    def observe(self) -> Decision:
        """The current decision point."""
        self._check_live("observe")
        if getattr(self, "_decision", None) is None:  # observe() is the same until step(): build it once
            self._decision = self._observe()
        return self._decision

    def step(self, action: int) -> tuple[float, bool]:
        """Apply ``action`` (an index into the act options); returns ``(reward, done)``."""
        self._check_live("step")
        n_legal = self.n_legal()
        if isinstance(action, bool) or not isinstance(action, (int, np.integer)):
            raise ValueError(f"env {self.name!r}: field 'action': must be an integer index, got {action!r}")
        if not 0 <= int(action) < n_legal:
            raise ValueError(
                f"env {self.name!r}: field 'action': {int(action)} is out of range, this decision has {n_legal} "
                f"legal actions (0..{n_legal - 1})"
            )
        self._decision = None
        reward, done = self._step(int(action))
        self._done = bool(done)
        return float(reward), self._done

    def action_rewards(self) -> list[float] | None:
        """Exact expected reward of every legal action (dense envs), ``None`` for outcome envs."""
        return None

    def oracle_targets(self) -> dict:
        """Exact targets of the report questions of the current decision."""
        raise NotImplementedError

    def oracle_action(self) -> int:
        """The best known action at the current decision; dense envs: the argmax of ``action_rewards()`` (lowest index
        on ties)."""
        if not self.dense:
            raise NotImplementedError(f"env {self.name!r}: an outcome env must implement oracle_action()")
        return int(np.argmax(self.action_rewards()))

    def n_legal(self) -> int:
        """Number of legal actions at the current decision."""
        return self.observe().n_legal

    # ------------------------------------------------------------------------------------------------ subclass hooks
    def _reset(self, rng: np.random.Generator) -> None:
        raise NotImplementedError

    def _observe(self) -> Decision:
        raise NotImplementedError

    def _step(self, action: int) -> tuple[float, bool]:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------------------- helpers
    def _check_live(self, what: str) -> None:
        if not self._started:
            raise RuntimeError(f"env {self.name!r}: {what}() called before reset(rng)")
        if self._done:
            raise RuntimeError(f"env {self.name!r}: {what}() called after the episode ended; call reset(rng) first")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, dense={self.dense}, done={self._done})"


def decimal_text(x: float, places: int, percent: bool = False) -> str:
    """A value :func:`exact_decimal` accepted, in short exact form: ``2.0 -> "2"``, ``1.25 -> "1.25"``, and with
    ``percent`` the fraction ``0.125 -> "12.5%"``."""
    text = f"{100 * x if percent else x:.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text + "%" if percent else text


def exact_decimal(env: str, field: str, value, places: int, percent: bool = False) -> float:
    """``value`` as a float with at most ``places`` decimals (as a percentage when ``percent``: 4 decimals of the
    fraction for ``places=2``), so :func:`decimal_text` states exactly the number the oracle computes with.

    A value within ``1e-9`` of such a number (``0.1 + 0.2``) is snapped to it; any other (``1 / 3``), and a
    non-finite or non-numeric one, raises ``ValueError`` naming the env and the field. The caller checks the range.
    """
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    digits = places + 2 if percent else places
    ok = math.isfinite(x) and abs(round(x, digits) - x) <= 1e-9
    snapped = round(x, digits) + 0.0 if ok else x  # + 0.0: never "-0"
    if ok:  # the printed text, parsed back, must be the very float the oracle computes with
        ok = float(Fraction(decimal_text(snapped, places, percent).rstrip("%")) / (100 if percent else 1)) == snapped
    if not ok:
        what = f"at most {places} decimals" + (" as a percentage (0.125 is 12.5%)" if percent else "")
        raise ValueError(f"env {env!r}: field {field!r}: must be a number with {what}, got {value!r}")
    return snapped


__all__ = ["AleaEnv", "decimal_text", "exact_decimal"]
