"""The episode pool: live episodes per env on one process, fair scheduling, recycling, and recent returns.

Design decisions:
1. Each process owns a pool seeded from ``(seed, rank)``: ``eps_per_env`` live episodes per env, every one drawing
   its randomness from the pool's generator, so a seed replays the whole stream of episodes.
2. Scheduling is fair across envs: decisions are taken round-robin over envs (one live episode of each env in turn,
   starting from a rotating env), so an env with long states or long episodes cannot crowd the others out.
3. A finished episode is recycled at once (reset with the pool's generator) and its return recorded.
4. Each env keeps a window of its recent returns, and one of its recent returns-to-go per step index: outcome
   advantages are normalised per env (and per step) against them, since envs' returns live on different scales.
5. The whole pool (envs, generator, open outcome decisions, return windows) pickles, so a checkpoint carries it and
   training resumes where it stopped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Episode:
    """One live episode: its env, the return so far (realised, and for dense envs the policy's expected return at the
    states met), the reward of each step, and (outcome envs) the decisions awaiting the return."""

    env_name: str
    env: Any
    ret: float = 0.0
    n_decisions: int = 0
    pending: list = field(default_factory=list)
    policy_ret: float = 0.0
    rewards: list = field(default_factory=list)


class EpisodePool:
    """Live episodes of several envs on one process.

    Args:
        factories (`dict[str, Callable]`): env name -> zero-argument factory.
        eps_per_env (`int`): live episodes per env.
        rng (`np.random.Generator`): the pool's generator; every episode reset draws from it.
        baseline_window (`int`): recent returns per env used to normalise outcome returns.
    """

    def __init__(
        self, factories: dict[str, Callable], eps_per_env: int, rng: np.random.Generator, baseline_window: int = 64
    ):
        self.env_names = list(factories)
        self.rng = rng
        self.episodes: dict[str, list[Episode]] = {
            name: [Episode(name, factory().reset(rng)) for _ in range(eps_per_env)]
            for name, factory in factories.items()
        }
        self.returns: dict[str, deque] = {name: deque(maxlen=baseline_window) for name in self.env_names}
        self.step_returns: dict[str, list[deque]] = {name: [] for name in self.env_names}  # [step] -> window
        self._turn = 0
        self._cursor: dict[str, int] = {}

    def schedule(self, limit: int) -> list[Episode]:
        """Up to ``limit`` live episodes: envs in turn (rotating the starting env), and within an env the episodes in
        turn (rotating from where the last call stopped), so every live episode advances, not only the first few."""
        n_envs = len(self.env_names)
        order = [self.env_names[(self._turn + i) % n_envs] for i in range(n_envs)]
        self._turn = (self._turn + 1) % n_envs
        per_env = {}
        for name in order:
            eps, start = self.episodes[name], self._cursor.get(name, 0)
            rotated = eps[start:] + eps[:start]
            per_env[name] = [ep for ep in rotated if not ep.env.done]
        picked, taken = [], dict.fromkeys(order, 0)
        for depth in range(max((len(eps) for eps in per_env.values()), default=0)):
            for name in order:
                if depth < len(per_env[name]) and len(picked) < limit:
                    picked.append(per_env[name][depth])
                    taken[name] += 1
        for name in order:
            if taken[name]:
                last = per_env[name][taken[name] - 1]
                self._cursor[name] = (self.episodes[name].index(last) + 1) % len(self.episodes[name])
        return picked

    def reset_episode(self, episode: Episode) -> None:
        """Start a fresh episode in this slot (dropping anything the old one had pending)."""
        episode.env.reset(self.rng)
        episode.ret, episode.n_decisions, episode.pending = 0.0, 0, []
        episode.policy_ret, episode.rewards = 0.0, []

    def finish(self, episode: Episode) -> float:
        """Record a finished episode's return and recycle its slot; returns the return."""
        ret = episode.ret
        self.returns[episode.env_name].append(ret)
        self.reset_episode(episode)
        return ret

    def record_returns_to_go(self, env_name: str, returns_to_go: list[float]) -> list[deque]:
        """Record the returns-to-go of a finished episode's decisions, one per step index, in that env's per-step
        windows; returns the windows of those steps (each holding its new return)."""
        if not hasattr(self, "step_returns"):  # a pool pickled before per-step windows existed
            self.step_returns = {name: [] for name in self.env_names}
        windows = self.step_returns[env_name]
        while len(windows) < len(returns_to_go):
            windows.append(deque(maxlen=self.returns[env_name].maxlen))
        for window, g in zip(windows, returns_to_go):
            window.append(g)
        return windows[: len(returns_to_go)]


def np_rng_for_rank(seed: int, rank: int) -> np.random.Generator:
    """The pool generator of one process."""
    return np.random.default_rng([seed, rank])


__all__ = ["Episode", "EpisodePool", "np_rng_for_rank"]
