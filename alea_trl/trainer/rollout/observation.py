"""Observation: turn scheduled episodes into packed, validated decisions, optionally ahead of time in a background
thread, and apply the env-error policy.

Design decisions:
1. A wave is the decisions of a list of episodes, observed together: each env's ``Decision`` is validated (targets,
   dense rewards, at least one legal action) and packed; a :class:`Wave` keeps them in the episodes' order.
2. Bad input never passes silently: a decision that does not fit ``max_len`` resets its episode and is counted in
   ``skipped_decisions`` (nothing is truncated); a malformed decision, target or reward, or an exception inside the
   env, raises a ``ValueError`` naming the env, the decision and what failed, or (``on_env_error="skip"``) resets the
   episode and is counted in ``skipped_decisions`` and ``env_errors``.
3. Observing is host work (env oracles, the tokenizer) that can overlap the backward pass: after a wave's envs are
   stepped, their next decisions are observed and packed in one background thread (``prefetch``). The thread has no
   side effects (it never resets an episode, records a statistic or raises); an entry is used only while its env
   still returns the very same ``Decision`` object (an ``AleaEnv`` caches it until ``step``), and the caller waits for
   the thread (``join_prefetch``) before it steps, resets or checkpoints any env.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ...envs.base import AleaEnv
from ...packing import PackedRequest, pack_request
from ...questions import validate_action_rewards, validate_targets
from .pool import Episode


@dataclass
class Wave:
    """Decisions observed together: their episodes, packings, validated targets and (dense) expected rewards."""

    episodes: list[Episode]
    packed: list[PackedRequest]
    targets: list[dict]
    rewards: list[list[float] | None]


class Observer:
    """Observes, validates and packs episodes' decisions.

    Args:
        tokenizer: the model's tokenizer.
        args: an ``AleaEnvGRPOConfig`` (``max_len``, ``on_env_error``, ``prefetch_observations``).
        stats (`dict[str, list[float]]`): where ``skipped_decisions`` and ``env_errors`` are counted (shared with
            the caller, mutated in place).
        reset_episode (`Callable[[Episode], None]`): starts a fresh episode in a slot (the pool's).
    """

    def __init__(self, tokenizer, args, stats: dict[str, list[float]], reset_episode: Callable[[Episode], None]):
        self.tokenizer = tokenizer
        self.args = args
        self.stats = stats
        self.reset_episode = reset_episode
        self._prefetched: dict[int, tuple] = {}  # id(episode) -> (decision, (packed, targets, rewards))
        self._prefetch: Future | None = None
        self._executor: ThreadPoolExecutor | None = None

    def observe(self, episodes: list[Episode]) -> Wave:
        """The decisions of ``episodes``, observed, validated and packed (skipped ones left out)."""
        self.join_prefetch()
        wave = Wave([], [], [], [])
        for ep in episodes:
            got = self._observe(ep)
            if got is None:
                continue
            wave.episodes.append(ep)
            wave.packed.append(got[0])
            wave.targets.append(got[1])
            wave.rewards.append(got[2])
        if wave.episodes:
            self.stats["skipped_decisions"].append(0.0)
        return wave

    def prepare(self, env, name: str, act_only: bool = False):
        """Observe, validate and pack ``env``'s decision without side effects: ``(None, (packed, targets, rewards),
        decision)``, or ``(where, error, decision)`` with ``where`` "observe" (a malformed decision, target or
        reward, or an error inside the env) or "pack" (the decision does not fit ``max_len``).

        With ``act_only`` (branch continuations, which use only the act) the report questions are neither packed nor
        their targets computed: the act's logits are the same (a question attends only to the state and itself) for
        fewer tokens; ``targets`` and ``rewards`` are then ``None``."""
        decision = None
        try:
            decision = env.observe()
            if act_only:
                targets = rewards = None
            else:
                targets = validate_targets(decision, env.oracle_targets(), env=name)
                rewards = validate_action_rewards(decision, env.action_rewards(), env=name) if env.dense else None
            if decision.n_legal < 1:
                raise ValueError(f"env {name!r}: question 'act', field 'options': no legal action")
        except Exception as err:
            return "observe", err, decision
        questions = [decision.act] if act_only else decision.questions
        try:
            packed = pack_request(self.tokenizer, decision.state, questions, max_len=self.args.max_len, env=name)
        except ValueError as err:
            return "pack", err, decision
        _ = packed.arrays  # the arrays collation reads, made here (in the background thread when prefetching)
        return None, (packed, targets, rewards), decision

    def _observe(self, episode: Episode):
        """Observe, validate and pack one episode's decision; ``None`` when it was skipped (episode reset)."""
        cached = self._prefetched.pop(id(episode), None)
        if cached is not None and cached[0] is episode.env.observe():  # the env has not moved since
            return cached[1]
        where, value, _ = self.prepare(episode.env, episode.env_name)
        if where == "observe":
            self.env_failed(episode, "observe", value)
            return None
        if where == "pack":  # oversize: reset the episode and count it, never truncate
            self.stats["skipped_decisions"].append(1.0)
            self.reset_episode(episode)
            return None
        return value

    def env_failed(self, episode: Episode, where: str, err: Exception) -> None:
        """A malformed decision, target or reward, or an exception inside the env during ``where`` ("observe" or
        "step"): raise a ``ValueError`` naming the env, the decision and what failed, or (``on_env_error="skip"``)
        reset the episode and count it."""
        name = episode.env_name
        if self.args.on_env_error == "skip":
            self.stats["skipped_decisions"].append(1.0)
            self.stats["env_errors"].append(1.0)
            self.reset_episode(episode)
            return
        detail = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        raise ValueError(
            f"env {name!r}, decision {episode.n_decisions} of its episode, during {where}(): {detail} "
            f"(set on_env_error='skip' to reset such episodes and keep training)"
        ) from err

    # ------------------------------------------------------------------------------------------------- prefetch
    def prefetch(self, episodes: list[Episode]) -> None:
        """Start observing the next decisions of ``episodes`` (just stepped) in the background thread."""
        self.join_prefetch()
        if not self.args.prefetch_observations:
            return
        todo = [ep for ep in episodes if isinstance(ep.env, AleaEnv) and not ep.env.done]
        if todo:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="alea-observe")
            self._prefetch = self._executor.submit(self._prefetch_run, todo)

    def _prefetch_run(self, episodes: list[Episode]) -> None:
        for ep in episodes:
            try:
                where, value, decision = self.prepare(ep.env, ep.env_name)
            except Exception:  # left for the main thread, which raises it where it belongs
                continue
            if where is None:
                self._prefetched[id(ep)] = (decision, value)

    def join_prefetch(self) -> None:
        """Wait for the background observations (before any env is stepped, reset or saved)."""
        if self._prefetch is not None:
            self._prefetch.result()
            self._prefetch = None

    def forget_prefetched(self) -> None:
        """Drop every observation made ahead (the episodes were replaced, e.g. by a checkpoint's)."""
        self.join_prefetch()
        self._prefetched = {}


__all__ = ["Observer", "Wave"]
