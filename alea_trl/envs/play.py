"""Whole episodes under a fixed policy: the random and oracle baselines of the evaluation and of
``python -m alea_trl.envs``, or any ``choose(env) -> action``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def play_episode(env, rng: np.random.Generator, choose: Callable) -> float:
    """Reset ``env`` with ``rng`` and play it to the end with ``choose(env) -> action``; return the sum of rewards."""
    env.reset(rng)
    total = 0.0
    while not env.done:
        total += env.step(choose(env))[0]
    return total


def baseline_return(env, rng: np.random.Generator, policy: str, pick: np.random.Generator) -> float:
    """One episode of the ``"oracle"`` policy (``env.oracle_action()``) or the ``"random"`` one (a uniform legal action
    drawn from ``pick``); the sum of rewards."""
    if policy not in ("oracle", "random"):
        raise ValueError(f"baseline_return: field 'policy': must be 'oracle' or 'random', got {policy!r}")
    if policy == "oracle":
        return play_episode(env, rng, lambda e: e.oracle_action())
    return play_episode(env, rng, lambda e: int(pick.integers(e.observe().n_legal)))


__all__ = ["baseline_return", "play_episode"]
