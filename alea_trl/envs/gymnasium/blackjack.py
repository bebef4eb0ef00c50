"""Gymnasium's Blackjack as an exact tabular model over the infinite deck it deals from.

Design decisions:
1. Gymnasium deals every card independently from ``[1, 2, ..., 10, 10, 10, 10]`` (ace = 1, three face cards count
   10): an infinite deck. The player's future then depends only on its total, whether an ace counts 11 (a usable ace)
   and, at the first decision, whether the two cards are a natural (ace and a ten-card); the dealer's hidden card is
   independent of everything the player sees. So the state is ``(total, usable ace, natural, dealer's card)``:
   29 player situations x 10 dealer cards, the observation plus the natural flag.
2. Sticking ends the hand: its outcomes are the dealer's final total (or bust) and whether the dealer holds a natural,
   computed exactly by recursion over the dealer's draws (it draws below 17 and stands on a soft 17, as Gymnasium's
   dealer does), scored with Gymnasium's rules: the higher total wins, and with ``sab`` a natural wins +1 unless the
   dealer has one too, or with ``natural`` a winning natural pays 1.5. Hitting draws one card: the new situation, or
   a bust (-1, end).
3. The model is acyclic (every hit raises the cards' face total), so value iteration is exact after a few sweeps:
   this is the exact dynamic programme over the infinite deck.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .tabular import TabularModel


CARD_PROBS = {c: (4 if c == 10 else 1) / 13 for c in range(1, 11)}
"""Probability of each card value from Gymnasium's infinite deck (ace = 1; ten, jack, queen, king = 10)."""

# player situations: hard totals 4..21, soft totals (a usable ace) 12..21, and a natural (soft 21 of two cards)
PLAYER_STATES = (
    [(t, False, False) for t in range(4, 22)] + [(t, True, False) for t in range(12, 22)] + [(21, True, True)]
)
_PLAYER_INDEX = {s: i for i, s in enumerate(PLAYER_STATES)}
N_STATES = len(PLAYER_STATES) * 10
STICK, HIT = 0, 1


def hand_state(face_total: int, has_ace: bool) -> tuple[int, bool]:
    """``(total, usable ace)`` of a hand whose cards add up to ``face_total`` with aces counted 1."""
    usable = has_ace and face_total + 10 <= 21
    return face_total + 10 * usable, usable


def state_index(total: int, usable: bool, natural: bool, dealer_card: int) -> int:
    """The model's state of a player situation facing the dealer's card ``dealer_card`` (1 = ace)."""
    return _PLAYER_INDEX[(int(total), bool(usable), bool(natural))] * 10 + int(dealer_card) - 1


@cache
def _dealer_draws(face_total: int, has_ace: bool) -> tuple[tuple[int, float], ...]:
    """Final score distribution (0 = bust) of a dealer who holds ``face_total`` and keeps drawing below 17."""
    total, _ = hand_state(face_total, has_ace)
    if face_total > 21:
        return ((0, 1.0),)
    if total >= 17:
        return ((total, 1.0),)
    out: dict[int, float] = {}
    for card, p in CARD_PROBS.items():
        for score, q in _dealer_draws(face_total + card, has_ace or card == 1):
            out[score] = out.get(score, 0.0) + p * q
    return tuple(sorted(out.items()))


def dealer_outcomes(card: int) -> dict[tuple[int, bool], float]:
    """``{(final score, natural): probability}`` of the dealer showing ``card``, over its hidden card and draws."""
    out: dict[tuple[int, bool], float] = {}
    for hidden, p in CARD_PROBS.items():
        if {card, hidden} == {1, 10}:
            out[(21, True)] = out.get((21, True), 0.0) + p
            continue
        for score, q in _dealer_draws(card + hidden, 1 in (card, hidden)):
            out[(score, False)] = out.get((score, False), 0.0) + p * q
    return out


def stick_reward(player: int, player_natural: bool, dealer: int, dealer_natural: bool, sab: bool, natural: bool):
    """Gymnasium's reward for sticking on ``player`` against a dealer's final ``dealer`` (0 = bust)."""
    reward = float(player > dealer) - float(player < dealer)
    if sab and player_natural and not dealer_natural:
        return 1.0
    if not sab and natural and player_natural and reward == 1.0:
        return 1.5
    return reward


def blackjack_model(sab: bool = False, natural: bool = False) -> TabularModel:
    """The exact model of Gymnasium's Blackjack with its ``sab`` and ``natural`` rules; a goal is a won hand."""
    width = len(CARD_PROBS)
    shape = (N_STATES, 2, width)
    prob, reward = np.zeros(shape), np.zeros(shape)
    nxt, terminal = np.zeros(shape, dtype=np.int64), np.ones(shape, dtype=bool)
    for (total, usable, is_natural), dealer in ((p, d) for p in PLAYER_STATES for d in range(1, 11)):
        s = state_index(total, usable, is_natural, dealer)
        rewards: dict[float, float] = {}
        for (score, dealer_natural), p in dealer_outcomes(dealer).items():
            r = stick_reward(total, is_natural, score, dealer_natural, sab, natural)
            rewards[r] = rewards.get(r, 0.0) + p
        for k, (r, p) in enumerate(sorted(rewards.items())):
            prob[s, STICK, k], reward[s, STICK, k] = p, r
        face = total - 10 * usable
        for k, (card, p) in enumerate(CARD_PROBS.items()):
            prob[s, HIT, k] = p
            if face + card > 21:
                reward[s, HIT, k] = -1.0
                continue
            new_total, new_usable = hand_state(face + card, usable or card == 1)
            nxt[s, HIT, k], terminal[s, HIT, k] = state_index(new_total, new_usable, False, dealer), False
    initial = np.zeros(N_STATES)
    for dealer, pd in CARD_PROBS.items():
        for c1, p1 in CARD_PROBS.items():
            for c2, p2 in CARD_PROBS.items():
                total, usable = hand_state(c1 + c2, 1 in (c1, c2))
                initial[state_index(total, usable, {c1, c2} == {1, 10}, dealer)] += pd * p1 * p2
    return TabularModel(prob, nxt, reward, terminal, reward > 0, initial)


__all__ = [
    "CARD_PROBS",
    "PLAYER_STATES",
    "blackjack_model",
    "dealer_outcomes",
    "hand_state",
    "state_index",
    "stick_reward",
]
