"""Exact oracles of a tabular model: optimal action values, and the goal probability and expected episode length of
the optimal policy, by backward induction over a finite horizon or value iteration to a fixed point.

Design decisions:
1. A model is Gymnasium's own transition table (``env.unwrapped.P[s][a] = [(p, s', r, terminated), ...]``, as in
   FrozenLake, Taxi and CliffWalking) turned into padded arrays ``(S, A, K)``, so a backup is a few array operations
   and Taxi's 200-step horizon solves in milliseconds. Padding entries have probability 0.
2. With a horizon ``H`` (the env's time limit) the values depend on the steps taken: ``Q[t, s, a]`` for
   ``t = 0..H-1``, ``V[H] = 0`` (the episode is cut there), solved by backward induction; exact for any discount.
   Without one the model must end every episode by itself or discount: value iteration runs to a fixed point (exact
   after as many sweeps as the longest episode when the model is acyclic, as Blackjack's is) and refuses a model whose
   values do not converge.
3. The optimal policy breaks ties to the lowest action index, with a relative tolerance of ``1e-9`` so that two
   actions whose values differ by rounding only count as tied: ``greedy(q)``.
4. The report targets follow the same policy: the probability of a goal transition before the episode ends, and the
   expected number of steps left counting the current one (cut at the horizon).
5. A solved model is immutable and shared: deep copies of an env (branching) share it instead of copying the arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


TIE_RTOL = 1e-9
"""Relative tolerance under which two action values count as tied (the lowest index wins)."""

_MAX_SWEEPS = 10_000


def greedy(q: np.ndarray) -> np.ndarray:
    """The lowest-index action whose value is within ``TIE_RTOL`` of the best, along the last axis.

    Args:
        q (`np.ndarray`): action values, shape ``(..., A)``.

    Returns:
        `np.ndarray`: integer actions, shape ``(...)``.
    """
    best = q.max(axis=-1, keepdims=True)
    return np.argmax(q >= best - TIE_RTOL * np.maximum(1.0, np.abs(best)), axis=-1)


@dataclass(frozen=True)
class TabularModel:
    """A finite MDP as padded arrays: ``K`` outcomes per state and action.

    Args:
        prob (`np.ndarray`): ``(S, A, K)`` outcome probabilities (each ``(s, a)`` sums to 1).
        next_state (`np.ndarray`): ``(S, A, K)`` next states.
        reward (`np.ndarray`): ``(S, A, K)`` rewards.
        terminal (`np.ndarray`): ``(S, A, K)`` whether the outcome ends the episode.
        goal (`np.ndarray`): ``(S, A, K)`` whether the outcome counts as reaching the goal (all ``False``: no goal).
        initial (`np.ndarray`): ``(S,)`` distribution of the first state.
    """

    prob: np.ndarray
    next_state: np.ndarray
    reward: np.ndarray
    terminal: np.ndarray
    goal: np.ndarray
    initial: np.ndarray

    @property
    def n_states(self) -> int:
        return self.prob.shape[0]

    @property
    def n_actions(self) -> int:
        return self.prob.shape[1]

    @classmethod
    def from_transitions(
        cls,
        transitions: Mapping | Sequence,
        initial: Sequence[float],
        goal: Callable[[int, float, bool], bool] | None = None,
        env: str = "gym",
    ) -> TabularModel:
        """Build a model from Gymnasium's table ``P[s][a] = [(p, s', r, terminated), ...]``.

        Args:
            transitions (`Mapping` or `Sequence`): ``P``, indexed by state then action.
            initial (`Sequence[float]`): distribution of the first state (Gymnasium's ``initial_state_distrib``).
            goal (`Callable`, *optional*): ``goal(next_state, reward, terminated) -> bool`` marks the outcomes that
                reach the goal; without it no outcome does.
            env (`str`, defaults to `"gym"`): env name for error messages.

        Raises:
            ValueError: a state without actions, probabilities that do not sum to 1, a next state out of range.
        """
        n_states = len(transitions)
        n_actions = len(transitions[0]) if n_states else 0
        if n_states == 0 or n_actions == 0:
            raise ValueError(f"env {env!r}: field 'P': the transition table is empty")
        width = max(len(transitions[s][a]) for s in range(n_states) for a in range(n_actions))
        shape = (n_states, n_actions, width)
        prob, reward = np.zeros(shape), np.zeros(shape)
        nxt, terminal, is_goal = np.zeros(shape, dtype=np.int64), np.ones(shape, dtype=bool), np.zeros(shape, bool)
        for s in range(n_states):
            if len(transitions[s]) != n_actions:
                raise ValueError(
                    f"env {env!r}: field 'P': state {s} has {len(transitions[s])} actions, not {n_actions}"
                )
            for a in range(n_actions):
                for k, (p, s2, r, term) in enumerate(transitions[s][a]):
                    if not 0 <= int(s2) < n_states:
                        raise ValueError(f"env {env!r}: field 'P': P[{s}][{a}] leads to state {s2}, out of range")
                    prob[s, a, k], nxt[s, a, k], reward[s, a, k], terminal[s, a, k] = p, s2, r, bool(term)
                    is_goal[s, a, k] = bool(goal(int(s2), float(r), bool(term))) if goal is not None else False
        sums = prob.sum(-1)
        if not np.allclose(sums, 1.0, atol=1e-9):
            s, a = np.argwhere(~np.isclose(sums, 1.0, atol=1e-9))[0]
            raise ValueError(f"env {env!r}: field 'P': the probabilities of P[{s}][{a}] sum to {sums[s, a]:.6g}")
        initial = np.asarray(initial, dtype=np.float64)
        if initial.shape != (n_states,) or abs(initial.sum() - 1.0) > 1e-9 or (initial < 0).any():
            raise ValueError(f"env {env!r}: field 'initial_state_distrib': not a distribution over {n_states} states")
        return cls(prob, nxt, reward, terminal, is_goal, initial)


@dataclass(frozen=True)
class Solution:
    """The exact oracles of a model under a discount and an optional horizon.

    Arrays have a leading time axis: ``H`` entries with a horizon (index = steps taken), one without (stationary).

    Args:
        q (`np.ndarray`): ``(T, S, A)`` optimal action values.
        goal_prob (`np.ndarray`): ``(T, S)`` probability that the optimal policy reaches the goal before the end.
        steps_left (`np.ndarray`): ``(T, S)`` expected steps left under the optimal policy, the current one included.
        horizon (`int` or `None`): the horizon, or ``None`` for a stationary solution.
        discount (`float`): the discount.
    """

    q: np.ndarray
    goal_prob: np.ndarray
    steps_left: np.ndarray
    horizon: int | None
    discount: float

    def __deepcopy__(self, memo):  # immutable and possibly large: copies of an env share it
        return self

    def at(self, t: int) -> int:
        """The time index of the arrays after ``t`` steps."""
        return 0 if self.horizon is None else t

    def values(self, t: int, state: int) -> np.ndarray:
        """``Q*(s, .)`` after ``t`` steps."""
        return self.q[self.at(t), state]

    def action(self, t: int, state: int) -> int:
        """The optimal action (lowest index on ties) after ``t`` steps."""
        return int(greedy(self.values(t, state)))

    def initial_value(self, model: TabularModel) -> float:
        """``E[V*(s0)]`` over the model's initial distribution."""
        return float(model.initial @ self.q[0].max(-1))


def _policy_backup(model: TabularModel, q: np.ndarray, goal_next: np.ndarray, steps_next: np.ndarray):
    """One backup of the goal probability and steps left under the greedy policy of ``q``."""
    pi = greedy(q)  # (S,)
    rows = np.arange(model.n_states)
    p, nxt = model.prob[rows, pi], model.next_state[rows, pi]  # (S, K)
    go_on = p * ~model.terminal[rows, pi]
    goal = (p * model.goal[rows, pi]).sum(-1) + (go_on * goal_next[nxt]).sum(-1)
    steps = 1.0 + (go_on * steps_next[nxt]).sum(-1)
    return goal, steps


def _q_backup(model: TabularModel, v_next: np.ndarray, discount: float) -> np.ndarray:
    return (model.prob * (model.reward + discount * ~model.terminal * v_next[model.next_state])).sum(-1)


def solve(model: TabularModel, discount: float = 1.0, horizon: int | None = None, env: str = "gym") -> Solution:
    """Optimal action values of ``model`` and the report targets of its optimal policy.

    Args:
        model (`TabularModel`): the MDP.
        discount (`float`, defaults to 1.0): discount factor in (0, 1].
        horizon (`int`, *optional*): steps after which the episode is cut; ``None``: the episode ends only by a
            terminal outcome (value iteration to a fixed point).
        env (`str`, defaults to `"gym"`): env name for error messages.

    Raises:
        ValueError: without a horizon, when the values, goal probabilities or episode lengths do not converge (an
            optimal policy that may never end the episode): pass a horizon.
    """
    n = model.n_states
    if horizon is not None:
        q = np.zeros((horizon, n, model.n_actions))
        goal, steps = np.zeros((horizon + 1, n)), np.zeros((horizon + 1, n))
        v = np.zeros(n)
        for t in reversed(range(horizon)):
            q[t] = _q_backup(model, v, discount)
            v = q[t].max(-1)
            goal[t], steps[t] = _policy_backup(model, q[t], goal[t + 1], steps[t + 1])
        return Solution(q, goal[:-1], steps[:-1], horizon, discount)
    v, goal, steps = np.zeros(n), np.zeros(n), np.zeros(n)
    for _ in range(_MAX_SWEEPS):
        q = _q_backup(model, v, discount)
        new_goal, new_steps = _policy_backup(model, q, goal, steps)
        new_v = q.max(-1)
        done = all(
            np.allclose(a, b, rtol=1e-13, atol=1e-13) for a, b in ((new_v, v), (new_goal, goal), (new_steps, steps))
        )
        v, goal, steps = new_v, new_goal, new_steps
        if done:
            return Solution(q[None], goal[None], steps[None], None, discount)
    raise ValueError(
        f"env {env!r}: field 'horizon': without a horizon the optimal values of this model do not converge in "
        f"{_MAX_SWEEPS} sweeps (an optimal policy may never end the episode); pass a horizon"
    )


__all__ = ["TIE_RTOL", "Solution", "TabularModel", "greedy", "solve"]
