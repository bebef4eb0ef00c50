"""TextArena's two-player games against a uniformly random opponent, as outcome envs (needs ``pip install textarena``).

Design decisions:
1. TextArena runs the game (its rules, its texts, its win detection and rewards); the adapter plays the opponent with
   a uniformly random legal move drawn from the env's generator. The agent is player 0 or 1 with probability 1/2
   each, drawn at reset. TextArena's own opponents are LLMs behind web APIs, so none of them is used.
2. TextArena's actions are free text and only some games print their legal moves, so each game has a spec: the legal
   moves of a game state (the exact action strings the game parses), and its rules as a pure function (``play``) and
   an ``outcome`` for the exact oracle: the Bayes-optimal policy against the random opponent, by expectimax over the
   game tree (memoised on the position). The oracle is checked against TextArena's own play in the tests.
3. TextArena seeds Python's global ``random`` module. Every call into it runs inside this env's own saved ``random``
   state (swapped in and out), so envs in one pool do not share a stream, a seed replays an episode, and a deep copy
   continues identically.
4. State text: TextArena's prompt for the agent's player, the opponent's last move as TextArena described it, and
   the current board as TextArena prints it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from ..questions import ACT_QID, Decision, Question
from .base import AleaEnv


# ------------------------------------------------------------------------------------------------- game specs
def _ttt_moves(board: tuple) -> list[str]:
    return [f"[{i}]" for i, x in enumerate(board) if x == ""]


def _ttt_play(board: tuple, move: str, player: int) -> tuple:
    i = int(move.strip("[]"))
    return board[:i] + ("OX"[player],) + board[i + 1 :]


_LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def _ttt_outcome(board: tuple, mover: int) -> float | None:
    """Reward of player 0 once ``mover`` has moved: +-1 for three in a row, 0 for a full board, else ``None``."""
    if any(board[a] != "" and board[a] == board[b] == board[c] for a, b, c in _LINES):
        return 1.0 if mover == 0 else -1.0
    return 0.0 if all(board) else None


def _ttt_position(game_state: dict) -> tuple:
    return tuple(x for row in game_state["board"] for x in row)


def _nim_position(game_state: dict) -> tuple:
    return tuple(game_state["piles"])


def _nim_moves(piles: tuple) -> list[str]:
    return [f"[{i} {q}]" for i, n in enumerate(piles) for q in range(1, n + 1)]


def _nim_play(piles: tuple, move: str, player: int) -> tuple:
    i, q = (int(x) for x in move.strip("[]").split())
    return piles[:i] + (piles[i] - q,) + piles[i + 1 :]


def _nim_outcome(piles: tuple, mover: int) -> float | None:
    """Whoever takes the last object wins."""
    return (1.0 if mover == 0 else -1.0) if sum(piles) == 0 else None


@dataclass(frozen=True)
class GameSpec:
    """A TextArena game for the adapter: ``position(game_state)`` (hashable), ``moves(position)`` (the action strings
    the game parses), and the rules for the oracle: ``play(position, move, player)``, ``outcome(position, mover)``
    (player 0's reward, or ``None`` while the game goes on)."""

    position: Callable
    moves: Callable
    play: Callable
    outcome: Callable


GAMES = {
    "TicTacToe-v0": GameSpec(_ttt_position, _ttt_moves, _ttt_play, _ttt_outcome),
    "Nim-v0": GameSpec(_nim_position, _nim_moves, _nim_play, _nim_outcome),
}
"""TextArena game id -> its spec."""


@cache
def _value(game: str, position: tuple, player: int, agent: int) -> float:
    """The agent's expected reward (+1 win, -1 loss) with ``player`` to move: the agent maximises, the opponent
    moves uniformly at random."""
    spec = GAMES[game]
    values = [_move_value(game, position, move, player, agent) for move in spec.moves(position)]
    return max(values) if player == agent else float(np.mean(values))


def _move_value(game: str, position: tuple, move: str, player: int, agent: int) -> float:
    spec = GAMES[game]
    after = spec.play(position, move, player)
    result = spec.outcome(after, player)
    if result is not None:
        return result if agent == 0 else -result
    return _value(game, after, 1 - player, agent)


# ------------------------------------------------------------------------------------------------------- env
class TextArenaEnv(AleaEnv):
    """A TextArena two-player game against a uniformly random opponent.

    Description:
        TextArena plays the game; the opponent picks a uniformly random legal move; the agent is player 0 or 1
        with probability 1/2 each.

    Actions:
        The legal moves as the game parses them (TicTacToe: ``[4]``; Nim: ``[pile quantity]``).

    State text:
        TextArena's prompt for the agent's player, the opponent's last move, and the board.

    Questions:
        - ``act`` (choice): the legal moves.

    Rewards:
        TextArena's reward of the agent's player at the end (+1 win, -1 loss, 0 draw).

    Episode end:
        When TextArena ends the game.

    Oracle:
        Expectimax against the uniformly random opponent over the game's rules (``GAMES``): the agent's best move,
        lowest index on ties.

    Arguments:
        game (`str`, defaults to `"TicTacToe-v0"`): a TextArena game id in ``GAMES``.
    """

    dense = False

    def __init__(self, game: str = "TicTacToe-v0"):
        super().__init__()
        import textarena  # optional: pip install textarena

        if game not in GAMES:
            raise ValueError(f"env 'textarena': field 'game': {game!r} is not one of {sorted(GAMES)}")
        self.game, self.name = game, f"textarena-{game}"
        self.ta_env = textarena.make(game)
        while hasattr(self.ta_env, "env"):  # TextArena's wrappers do not deep-copy; the moves are exact strings
            self.ta_env = self.ta_env.env
        self._random_state = None

    @property
    def spec(self) -> GameSpec:
        """The game's spec (looked up, so a pickled env refers to it by name)."""
        return GAMES[self.game]

    def _call(self, method: str, *args, **kwargs):
        """Call TextArena inside this env's own state of Python's ``random``."""
        outside = random.getstate()
        random.setstate(self._random_state)
        try:
            return getattr(self.ta_env, method)(*args, **kwargs)
        finally:
            self._random_state = random.getstate()
            random.setstate(outside)

    # ------------------------------------------------------------------------------------------------------ episode
    def _reset(self, rng: np.random.Generator) -> None:
        self._random_state = random.Random(int(rng.integers(2**31 - 1))).getstate()
        self.agent = int(rng.integers(2))
        self._call("reset", num_players=2, seed=int(rng.integers(2**31 - 1)))
        self.prompt, self.board, self.last = "", "", ""
        if self.agent == 1:  # the opponent is player 0 and opens (two-player games here never end in one move)
            self._opponent_moves()
        self._read_messages()

    def _read_messages(self) -> None:
        """Keep the agent's prompt, the board and the opponent's last move from TextArena's new messages to the agent
        (the player to move)."""
        _, messages = self._call("get_observation")
        for sender, text, kind in messages:
            if kind.name == "PROMPT":
                self.prompt = text
            elif kind.name == "GAME_BOARD":
                self.board = text
            elif kind.name == "GAME_ACTION_DESCRIPTION" and sender == -1:
                self.last = text

    def _opponent_moves(self) -> bool:
        moves = self.legal_moves()
        done, _ = self._call("step", moves[int(self.rng.integers(len(moves)))])
        return done

    def _step(self, action: int) -> tuple[float, bool]:
        done, _ = self._call("step", self.legal_moves()[action])
        if not done:
            done = self._opponent_moves()
        if done:
            rewards, _ = self._call("close")
            return float(rewards[self.agent]), True
        self._read_messages()
        return 0.0, False

    def legal_moves(self) -> list[str]:
        """The legal moves of the player to move, as the game parses them."""
        return self.spec.moves(self.position())

    def position(self) -> tuple:
        """The game's position (hashable), from TextArena's game state."""
        return self.spec.position(self.ta_env.state.game_state)

    def n_legal(self) -> int:
        return len(self.legal_moves())

    # -------------------------------------------------------------------------------------------------- observation
    def _observe(self) -> Decision:
        last = f"\n{self.last}" if self.last else ""
        state = f"{self.prompt.strip()}\nYour opponent plays uniformly random legal moves.{last}\n{self.board.strip()}"
        act = Question(ACT_QID, "choice", "Which move do you make?", options=self.legal_moves(), env=self.name)
        return Decision(state, [act], env=self.name)

    # ------------------------------------------------------------------------------------------------------- oracle
    def oracle_targets(self) -> dict:
        return {}

    def oracle_action(self) -> int:
        self._check_live("oracle_action")
        position = self.position()
        values = [_move_value(self.game, position, m, self.agent, self.agent) for m in self.spec.moves(position)]
        return int(np.argmax(np.asarray(values) >= max(values) - 1e-12))

    def optimal_value(self) -> float:
        """The agent's expected reward under the oracle from the current position (the agent to move)."""
        return _value(self.game, self.position(), self.agent, self.agent)


__all__ = ["GAMES", "GameSpec", "TextArenaEnv"]
