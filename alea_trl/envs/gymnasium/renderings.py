"""Built-in text renderings, action names, goals and models of Gymnasium's toy-text envs.

Design decisions:
1. A rendering is ``render(obs, env) -> str`` (``env`` the :class:`GymnasiumEnv` adapter, whose ``unwrapped`` is the
   Gymnasium env): the same signature as a user's own. The adapter adds the steps left and the discount, which every
   env's oracle uses, so a rendering only describes the env itself.
2. Every number an oracle uses is read from the env's own transition table (slip probabilities, rewards), not from
   constructor arguments, and stated exactly: ``1/3``, not ``0.333``. Grids are printed cell by cell, separated by
   spaces, with the agent's cell marked; the text ends with what changes from step to step (the agent's row and
   column in words, the taxi's passenger, the hand), next to the questions that follow it.
3. One :class:`ToyTextSpec` per Gymnasium class (keyed by class name, so a user's own instance of ``FrozenLakeEnv``
   with a custom map gets the same rendering): its rendering, action names, goal, goal question and model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from ..base import decimal_text
from .blackjack import blackjack_model, state_index
from .tabular import TabularModel


def exact_text(p: float, env: str, field: str) -> str:
    """``p`` in short exact form: a decimal with at most 4 places (``0.8``) or a fraction (``1/3``).

    Raises:
        ValueError: naming the env and the field, when neither form is exact (the text must state the oracle's number).
    """
    if abs(round(p, 4) - p) <= 1e-12:
        return decimal_text(round(p, 4), 4)
    frac = Fraction(p).limit_denominator(1000)
    if abs(float(frac) - p) <= 1e-12:
        return f"{frac.numerator}/{frac.denominator}"
    raise ValueError(f"env {env!r}: field {field!r}: {p!r} is neither a short decimal nor a simple fraction")


def _cell(row: int, col: int) -> str:
    return f"row {row + 1}, column {col + 1}"


def _grid(cells: list[list[str]], agent: tuple[int, int]) -> str:
    return "\n".join(
        " ".join("*" if (r, c) == agent else x for c, x in enumerate(line)) for r, line in enumerate(cells)
    )


def _slip_text(intended: float, env, field: str, verb: str) -> str:
    """Describe a move that goes as intended with probability ``intended``, else to either side equally."""
    if intended == 1.0:
        return f"{verb} in the direction you choose."
    side = exact_text((1.0 - intended) / 2, env.name, field)
    return (
        f"{verb} in the direction you choose with probability {exact_text(intended, env.name, field)} and in each of "
        f"the two perpendicular directions with probability {side}."
    )


def _intended(entries: list, position: int) -> float:
    """The probability of the intended move in a transition list: its only entry, or the one at ``position`` of
    Gymnasium's slippery lists (FrozenLake and CliffWalking: side, intended, side; Taxi in the rain: intended
    first)."""
    return float(entries[0][0]) if len(entries) == 1 else float(entries[position][0])


# ------------------------------------------------------------------------------------------------------- FrozenLake
def frozenlake_text(obs: int, env) -> str:
    """FrozenLake: the lake cell by cell, the position, the slip probabilities and the rewards."""
    lake = env.unwrapped
    letters = [[bytes(x).decode() for x in line] for line in lake.desc]
    row, col = divmod(int(obs), lake.ncol)
    start = next(s for s in range(lake.nrow * lake.ncol) if letters[s // lake.ncol][s % lake.ncol] not in "GH")
    rewards = {}  # the reward of entering each kind of cell, from the transition table
    for entries in lake.P.values():
        for _, s2, r, _ in (e for a in entries.values() for e in a):
            rewards.setdefault(letters[s2 // lake.ncol][s2 % lake.ncol], r)
    paid = ", ".join(f"{k} {decimal_text(float(rewards[k]), 4)}" for k in "GHF" if k in rewards and rewards[k] != 0)
    return (
        f"Frozen lake, {lake.nrow} rows by {lake.ncol} columns (S start, F frozen, H hole, G goal). "
        + _slip_text(_intended(lake.P[start][0], 1), env, "success_rate", "The ice moves you")
        + f" Entering G or H ends the episode. Rewards for entering a cell: {paid or 'none'}. Your cell is marked *:\n"
        f"{_grid(letters, (row, col))}\nYou are at {_cell(row, col)}."
    )


def frozenlake_goal(lake) -> Callable[[int, float, bool], bool]:
    """Entering a G cell."""
    return lambda s2, r, term: bytes(lake.desc.flat[s2]) == b"G"


# ------------------------------------------------------------------------------------------------------------- Taxi
_STANDS = "RGYB"


def taxi_text(obs: int, env) -> str:
    """Taxi: the map with its walls, the taxi's cell, where the passenger and the destination are."""
    taxi = env.unwrapped
    row, col, passenger, dest = taxi.decode(int(obs))
    rows = [bytes(line).decode() for line in taxi.desc]
    where = "is in the taxi" if passenger == 4 else f"waits at {_STANDS[passenger]} ({_cell(*taxi.locs[passenger])})"
    return (
        _slip_text(_intended(taxi.P[0][0], 0), env, "rainy_probability", "The taxi drives")
        + " Rewards: -1 a step, +20 for dropping the passenger at the destination (ends the episode), -10 for a "
        "pickup or drop-off where none is allowed. The 5 by 5 map; | is a wall, R, G, Y, B are the four stands:\n"
        + "\n".join(rows)
        + f"\nThe passenger {where}; the destination is {_STANDS[dest]} ({_cell(*taxi.locs[dest])}). The taxi is "
        f"at {_cell(row, col)}."
    )


def taxi_short_text(obs: int, env) -> str:
    """Taxi without the map: where the passenger, the destination and the taxi are.

    About a third of :func:`taxi_text`'s tokens. The walls and the rewards are Gymnasium's Taxi's and are not restated:
    the model learns them from the rewards, as an agent that sees Gymnasium's integer observation does. Rain, when on,
    is stated (it changes where a move goes).
    """
    taxi = env.unwrapped
    row, col, passenger, dest = taxi.decode(int(obs))
    where = "is in the taxi" if passenger == 4 else f"waits at {_STANDS[passenger]} ({_cell(*taxi.locs[passenger])})"
    intended = _intended(taxi.P[0][0], 0)
    rain = "" if intended == 1.0 else " " + _slip_text(intended, env, "rainy_probability", "The taxi drives")
    return (
        f"Taxi on Gymnasium's 5 by 5 map.{rain} The passenger {where}; the destination is {_STANDS[dest]} "
        f"({_cell(*taxi.locs[dest])}). The taxi is at {_cell(row, col)}."
    )


def taxi_goal(taxi) -> Callable[[int, float, bool], bool]:
    """Delivering the passenger (the only ending)."""
    return lambda s2, r, term: term


# ----------------------------------------------------------------------------------------------------- CliffWalking
def cliffwalking_text(obs: int, env) -> str:
    """CliffWalking: the grid (S start, C cliff, G goal), the position, the slip probabilities, the rewards."""
    cliff = env.unwrapped
    n_rows, n_cols = cliff.shape
    row, col = divmod(int(obs), n_cols)
    cells = [["C" if cliff._cliff[r, c] else "." for c in range(n_cols)] for r in range(n_rows)]
    start = divmod(int(cliff.start_state_index), n_cols)
    cells[start[0]][start[1]], cells[-1][-1] = "S", "G"
    return (
        f"Cliff walk, {n_rows} rows by {n_cols} columns (S start, G goal, C cliff, . ground). "
        + _slip_text(_intended(cliff.P[0][0], 1), env, "is_slippery", "You move")
        + " Each move costs -1; stepping into the cliff costs -100 and sends you back to S. Reaching G ends the "
        f"episode. Your cell is marked *:\n{_grid(cells, (row, col))}\nYou are at {_cell(row, col)}."
    )


def cliffwalking_goal(cliff) -> Callable[[int, float, bool], bool]:
    """Reaching the goal (the only ending)."""
    return lambda s2, r, term: term


# -------------------------------------------------------------------------------------------------------- Blackjack
def _card(value: int) -> str:
    return "an ace" if value == 1 else "a ten-card" if value == 10 else f"a {value}"


def blackjack_natural(env) -> bool:
    """Whether the player's hand is a natural (an ace and a ten-card, two cards)."""
    return sorted(env.unwrapped.player) == [1, 10]


def blackjack_text(obs, env) -> str:
    """Blackjack: the rules that score the hand, the player's total and usable ace, the dealer's card."""
    game = env.unwrapped
    total, dealer, usable = (int(x) for x in obs)
    bonus = ""
    if game.sab:
        bonus = " A natural (an ace and a ten-card as your first two cards) wins +1 unless the dealer has one too."
    elif game.natural:
        bonus = " A natural (an ace and a ten-card as your first two cards) that wins pays 1.5."
    ace = "a usable ace (an ace counted as 11)" if usable else "no usable ace"
    natural = " Your hand is a natural." if blackjack_natural(env) else ""
    return (
        "Blackjack from an infinite deck: each card is an ace (1 or 11) or 2 to 9 with probability 1/13 each, or a "
        "ten-card (10, jack, queen, king) with probability 4/13. The dealer draws until reaching 17 or more (it "
        "stands on a soft 17). Hit: draw a card; going over 21 loses -1. Stick: the dealer plays, the higher total "
        f"wins +1, a tie is 0, a loss -1.{bonus} Your total is {total} with {ace}.{natural} The dealer shows "
        f"{_card(dealer)}."
    )


def blackjack_state(obs, env) -> int:
    """The Blackjack model's state of an observation (the natural flag read from the hand)."""
    total, dealer, usable = (int(x) for x in obs)
    return state_index(total, bool(usable), blackjack_natural(env), dealer)


def _blackjack_model(game, goal) -> TabularModel:
    return blackjack_model(sab=bool(game.sab), natural=bool(game.natural))


# ----------------------------------------------------------------------------------------------------------- specs
def table_model(unwrapped, goal) -> TabularModel:
    """The model of an env with Gymnasium's transition table (``P``) and first-state distribution."""
    return TabularModel.from_transitions(
        unwrapped.P, unwrapped.initial_state_distrib, goal, env=type(unwrapped).__name__
    )


@dataclass(frozen=True)
class ToyTextSpec:
    """How the adapter presents one Gymnasium class: ``render(obs, env)``, the action names, ``goal(unwrapped)`` (a
    predicate on model outcomes), the goal question, ``model(unwrapped, goal)`` (default: the env's transition table),
    ``state(obs, env)`` and ``renderings``, other built-in renderings by name (the adapter's ``render="short"``)."""

    render: Callable
    actions: tuple[str, ...]
    goal: Callable
    goal_question: str
    model: Callable | None = None
    state: Callable | None = None
    renderings: tuple[tuple[str, Callable], ...] = ()

    def named_renderings(self) -> dict[str, Callable]:
        """Every built-in rendering by name: ``"default"`` (:attr:`render`), then :attr:`renderings`."""
        return {"default": self.render, **dict(self.renderings)}


_REACH = "What is the probability that you {} before the episode ends, if you play optimally from here?"

TOY_TEXT = {
    "FrozenLakeEnv": ToyTextSpec(
        frozenlake_text, ("left", "down", "right", "up"), frozenlake_goal, _REACH.format("reach G")
    ),
    "TaxiEnv": ToyTextSpec(
        taxi_text,
        ("south", "north", "east", "west", "pickup", "dropoff"),
        taxi_goal,
        _REACH.format("deliver the passenger"),
        renderings=(("short", taxi_short_text),),
    ),
    "CliffWalkingEnv": ToyTextSpec(
        cliffwalking_text, ("up", "right", "down", "left"), cliffwalking_goal, _REACH.format("reach G")
    ),
    "BlackjackEnv": ToyTextSpec(
        blackjack_text,
        ("stick", "hit"),
        lambda game: None,
        "What is the probability that you win this hand, if you play optimally from here?",
        model=_blackjack_model,
        state=blackjack_state,
    ),
}
"""Gymnasium class name -> its built-in presentation."""


__all__ = ["TOY_TEXT", "ToyTextSpec", "exact_text", "table_model"]
