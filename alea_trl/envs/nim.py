"""Nim against an ε-optimal opponent: a perfect-information game whose exact oracle is the nim-sum.

Design decisions:
1. Normal play: the player who takes the last stone wins (+1 for the agent, -1 when the opponent does it). The
   reward comes only at the end, so this is an outcome env: ``action_rewards()`` is ``None``.
2. Piles are labelled A, B, C, ...; a move is "take k from pile X". Legal moves are listed pile by pile, k ascending,
   so the act options (and their order) follow from the piles alone.
3. The opponent moves inside ``step`` (and once inside ``reset`` when it moves first), drawing from ``self.rng``: with
   probability ε a uniformly random legal move, otherwise a uniformly random winning move (one leaving nim-sum 0) when
   one exists, else a uniformly random legal move. At least two non-empty piles are required at reset so an opening
   opponent move can never end the game before the agent's first decision.
4. The reports are exact functions of the piles (Bouton's theorem): "winning position?" (nim-sum != 0), the nim-sum
   itself (one-hot score) and the number of winning moves (a count, regressed as one exact value). The number of
   winning moves is used instead of "stones left after an optimal move" because several winning moves can leave
   different totals, whereas the count is unambiguous.
5. ``oracle_action`` plays the lowest-index winning move; in a losing position it falls back to taking one stone from
   the largest pile (the first such pile), which keeps the game as long as possible for the opponent to err.
6. The text states ε exactly, with 2 decimals ("0.30"): the constructor refuses an ε with more decimals (1/3) instead
   of rounding it in the text, so the opponent plays exactly the rule the agent reads.
"""

from __future__ import annotations

import string
from functools import reduce

import numpy as np

from ..questions import Decision, Question
from .base import AleaEnv, exact_decimal


def nim_sum(piles) -> int:
    """XOR of the pile sizes (the Sprague-Grundy value of a Nim position).

    Args:
        piles (`Sequence[int]`): the pile sizes.

    Returns:
        `int`: the nim-sum; the player to move wins under perfect play iff it is non-zero (Bouton's theorem).
    """
    return int(reduce(lambda a, b: a ^ int(b), piles, 0))


def legal_moves(piles) -> list[tuple[int, int]]:
    """Every legal move, pile by pile and then by the number of stones taken.

    Args:
        piles (`Sequence[int]`): the pile sizes.

    Returns:
        `list[tuple[int, int]]`: ``(pile index, stones taken)`` pairs; ``sum(piles)`` of them.
    """
    return [(i, k) for i, n in enumerate(piles) for k in range(1, int(n) + 1)]


def winning_moves(piles) -> list[tuple[int, int]]:
    """The moves that leave a nim-sum of 0 (a losing position for the player then to move).

    A pile ``n`` admits one such move exactly when ``n ^ s < n`` (``s`` the nim-sum): reduce it to ``n ^ s``.

    Args:
        piles (`Sequence[int]`): the pile sizes.

    Returns:
        `list[tuple[int, int]]`: ``(pile index, stones taken)`` pairs in the order of :func:`legal_moves`; empty iff
        the nim-sum is 0.
    """
    s = nim_sum(piles)
    if s == 0:
        return []
    return [(i, int(n) - (int(n) ^ s)) for i, n in enumerate(piles) if (int(n) ^ s) < int(n)]


def opponent_move_probs(piles, epsilon: float) -> np.ndarray:
    """Probability of each legal move (in :func:`legal_moves` order) under the ε-optimal opponent.

    Args:
        piles (`Sequence[int]`): the pile sizes (at least one stone).
        epsilon (`float`): probability of a uniformly random legal move instead of a winning one.

    Returns:
        `np.ndarray`: ``ε / n_legal + (1 - ε) / n_winning`` on winning moves and ``ε / n_legal`` elsewhere; uniform
        when there is no winning move.
    """
    moves = legal_moves(piles)
    wins = set(winning_moves(piles))
    probs = np.full(len(moves), 1.0 / len(moves))
    if wins:
        probs *= epsilon
        probs += np.array([(1.0 - epsilon) / len(wins) if m in wins else 0.0 for m in moves])
    return probs


def _move_text(move: tuple[int, int]) -> str:
    return f"take {move[1]} from pile {string.ascii_uppercase[move[0]]}"


class NimEnv(AleaEnv):
    """Nim, normal play, against an ε-optimal opponent.

    Description:
        ``n_piles`` piles of ``min_stones``..``max_stones`` stones are drawn uniformly at reset. Players alternate; a
        move takes one or more stones from a single pile; whoever takes the last stone wins. The agent moves first
        with probability ``p_agent_first``; otherwise the opponent makes its first move during ``reset``.

    Actions:
        Every legal move, as "take k from pile X", listed pile by pile (A, B, ...) with k ascending; there are
        ``sum(piles)`` of them.

    State text:
        The rules, the opponent's behaviour (with ε), who moved first, the opponent's last move, the current piles
        with the total, and that it is the agent's move. Example::

            Nim: players alternate; a move takes 1 or more stones from one pile; whoever takes the last stone wins.
            With probability 0.30 your opponent plays a uniformly random legal move; otherwise a random move leaving
            nim-sum 0 if there is one, else a random legal move. Your opponent moved first. Its last move: take 2
            from pile B. Piles: A 3, B 1, C 6 (10 stones in all). Your move.

    Questions:
        - ``act`` (choice): the legal moves.
        - ``win`` (noul): "Is this a winning position for you under perfect play?"
        - ``nimsum`` (score, ``2 ** max_stones.bit_length()`` bins): the XOR of the pile sizes.
        - ``n_win_moves`` (regress): how many legal moves leave a nim-sum of 0.

    Rewards:
        +1 when the agent takes the last stone, -1 when the opponent does, 0 otherwise.

    Episode end:
        When all piles are empty.

    Oracle:
        Bouton's theorem: ``win`` is 1.0 iff the nim-sum is non-zero; ``nimsum`` is one-hot at the nim-sum;
        ``n_win_moves`` is ``len(winning_moves(piles))`` (piles ``n`` with ``n ^ s < n``). ``oracle_action`` plays the
        lowest-index winning move, else takes 1 from the first largest pile.

    Arguments:
        n_piles (`int`, defaults to 4): number of piles (2 to 26).
        min_stones (`int`, defaults to 1): fewest stones per pile at reset (at least 1).
        max_stones (`int`, defaults to 7): most stones per pile at reset.
        epsilon (`float`, defaults to 0.3): the opponent's probability of a uniformly random move (at most 2
            decimals: the text states it).
        p_agent_first (`float`, defaults to 0.5): probability that the agent moves first.
    """

    name = "nim"
    dense = False

    def __init__(self, n_piles=4, min_stones=1, max_stones=7, epsilon=0.3, p_agent_first=0.5):
        super().__init__()
        if not 2 <= int(n_piles) <= 26:
            raise ValueError(f"env {self.name!r}: field 'n_piles': must be in 2..26, got {n_piles!r}")
        if not 1 <= int(min_stones) <= int(max_stones):
            raise ValueError(
                f"env {self.name!r}: field 'min_stones': need 1 <= min_stones <= max_stones, got {min_stones!r}, "
                f"{max_stones!r}"
            )
        epsilon = exact_decimal(self.name, "epsilon", epsilon, 2)
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"env {self.name!r}: field 'epsilon': must be in [0, 1], got {epsilon!r}")
        if not 0.0 <= float(p_agent_first) <= 1.0:
            raise ValueError(f"env {self.name!r}: field 'p_agent_first': must be in [0, 1], got {p_agent_first!r}")
        self.n_piles = int(n_piles)
        self.min_stones = int(min_stones)
        self.max_stones = int(max_stones)
        self.epsilon = epsilon
        self.p_agent_first = float(p_agent_first)
        self.n_bins = 1 << self.max_stones.bit_length()
        self.piles: list[int] = []
        self.agent_first = True
        self.last_opponent_move: tuple[int, int] | None = None

    # ------------------------------------------------------------------------------------------------------ episode
    def _reset(self, rng: np.random.Generator) -> None:
        self.piles = [int(n) for n in rng.integers(self.min_stones, self.max_stones + 1, size=self.n_piles)]
        self.agent_first = bool(rng.random() < self.p_agent_first)
        self.last_opponent_move = None
        if not self.agent_first:
            self._opponent_move()  # two or more non-empty piles: the game cannot end here

    def _opponent_move(self) -> None:
        moves = legal_moves(self.piles)
        probs = opponent_move_probs(self.piles, self.epsilon)
        i = int(self.rng.choice(len(moves), p=probs))
        pile, k = moves[i]
        self.piles[pile] -= k
        self.last_opponent_move = (pile, k)

    def _step(self, action: int) -> tuple[float, bool]:
        pile, k = legal_moves(self.piles)[action]
        self.piles[pile] -= k
        if sum(self.piles) == 0:
            return 1.0, True
        self._opponent_move()
        if sum(self.piles) == 0:
            return -1.0, True
        return 0.0, False

    def n_legal(self) -> int:
        return sum(self.piles)

    # -------------------------------------------------------------------------------------------------- observation
    def _observe(self) -> Decision:
        letters = string.ascii_uppercase
        piles = ", ".join(f"{letters[i]} {n}" for i, n in enumerate(self.piles))
        first = "You moved first." if self.agent_first else "Your opponent moved first."
        last = f" Its last move: {_move_text(self.last_opponent_move)}." if self.last_opponent_move else ""
        state = (
            "Nim: players alternate; a move takes 1 or more stones from one pile; whoever takes the last stone wins. "
            f"With probability {self.epsilon:.2f} your opponent plays a uniformly random legal move; otherwise a "
            "random move leaving nim-sum 0 if there is one, else a random legal move. "
            f"{first}{last} Piles: {piles} ({sum(self.piles)} stones in all). Your move."
        )
        questions = [
            Question(
                "act",
                "choice",
                "Which move do you make?",
                options=[_move_text(m) for m in legal_moves(self.piles)],
                env=self.name,
            ),
            Question("win", "noul", "Is this a winning position for you under perfect play?", env=self.name),
            Question(
                "nimsum", "score", "What is the nim-sum (XOR of the pile sizes)?", n_bins=self.n_bins, env=self.name
            ),
            Question("n_win_moves", "regress", "How many of your legal moves leave a nim-sum of 0?", env=self.name),
        ]
        return Decision(state, questions, env=self.name)

    # ------------------------------------------------------------------------------------------------------- oracle
    def oracle_targets(self) -> dict:
        s = nim_sum(self.piles)
        return {
            "win": 1.0 if s != 0 else 0.0,
            "nimsum": [1.0 if b == s else 0.0 for b in range(self.n_bins)],
            "n_win_moves": float(len(winning_moves(self.piles))),
        }

    def oracle_action(self) -> int:
        moves = legal_moves(self.piles)
        wins = winning_moves(self.piles)
        if wins:
            return moves.index(wins[0])
        return moves.index((int(np.argmax(self.piles)), 1))


__all__ = ["NimEnv", "legal_moves", "nim_sum", "opponent_move_probs", "winning_moves"]
