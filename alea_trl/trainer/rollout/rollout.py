"""Rollouts: sample actions for waves of decisions, step the envs, and queue the rows that are ready for the loss.

Design decisions:
1. A wave takes decisions from the pool (fair across envs; observed by an :class:`Observer`); ``advance`` samples
   their actions from the act head's logits at ``temperature`` (restricted by ``top_k`` / ``top_p`` / ``min_p``, see
   :mod:`~alea_trl.trainer.act`; the stored log-probs are the unfiltered policy's, as TRL's) with the rollout's
   own ``torch.Generator`` (checkpointed with the pool) and steps the envs. Every reward an env reports (dense
   expected rewards, step rewards) is multiplied by ``reward_weights[0]`` when set, so advantages, returns and
   regrets of the rollout are in weighted units. The logits come either from the loss forward itself (the
   trainer's ``sample_in_loss_forward``) or from a separate no-grad forward (``run_wave``: up to ``max_batch``
   decisions).
2. Dense decisions: k actions from one set of act logits; their exact expected rewards give the group advantages
   (:func:`~alea_trl.trainer.rollout.advantages.group_advantages`); with a ``dense_update`` other than ``"sampled"``
   the row also carries every legal action's log-prob step (the default ``"all_actions_ascent"``, and ``"mirror"``)
   or advantage (``"all_actions"``), see :mod:`~alea_trl.trainer.loss.dense`. The episode advances by the best of
   the k (``dense_advance="best_of_k"``: the episode visits the states a better policy would) or by the first sample
   (``"sample"``, on-policy).
3. Outcome decisions (``outcome_advantage``): with ``"branch"`` each of the k sampled actions is valued in a deep copy
   of the env played to the end by the current policy (:mod:`~alea_trl.trainer.rollout.branching`), and the decision
   is a group like a dense one; otherwise one action is stored with its behaviour log-prob, and when the episode ends
   the row's advantage is its return-to-go (``"rtg"``) or the episode's return (``"episode"``) against that env's
   recent ones (:func:`~alea_trl.trainer.rollout.advantages.outcome_advantage`). The behaviour log-prob lets the loss
   importance-correct a replay that happens after the policy moved.
4. Every row carries the reference policy's log-probs over its legal actions (the reference is frozen, so computing
   them at decision time is exact) and the decision's validated report targets.
5. Rows wait in one FIFO queue owned here (``queue``, ``take``): outcome decisions when their episode ends, and,
   when actions come from a separate rollout forward, dense decisions as soon as their k actions are sampled. A batch
   takes the oldest rows; the rest wait for the next.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..act import host_log_probs, no_logits, sampling_probs
from ..loss.dense import STEP_TARGET_UPDATES
from ..loss.policy import act_entropy
from .advantages import (
    all_action_advantages,
    env_batch_std,
    group_advantages,
    outcome_advantage,
    regularised_advantages,
    reward_scale,
    step_targets,
)
from .branching import BranchFallbacks, branch_values
from .observation import Observer, Wave
from .pool import Episode, EpisodePool
from .rows import DecisionRow


@dataclass
class _Draw:
    """What :meth:`Rollout.advance` computes for a whole wave at once, before any env is stepped: host log-probs
    `(N, A)` of the policy and the reference, exact expected rewards `(N, A)` and the sampled actions' `(N, widest)`,
    and per decision its k, whether it is dense, its legal actions, entropy, regret, the dense action it advances
    by, its sampled actions and their log-probs, and (``dense_update`` other than ``"sampled"``) every legal action's
    advantage or step."""

    logp_all: torch.Tensor
    ref_all: torch.Tensor | None
    rewards: torch.Tensor
    sampled: torch.Tensor
    expected: torch.Tensor
    width: list[int]
    dense: list[bool]
    n_legal: list[int]
    entropy: list[float]
    regret: list[float]
    dense_step: list[int]
    actions: list[list[int]]
    logp_act: list[list[float]]
    every: list[list[float]] | None


class Rollout:
    """Collects rows from an :class:`EpisodePool`.

    Args:
        pool (`EpisodePool`): the live episodes.
        tokenizer: the model's tokenizer.
        args: an ``AleaEnvGRPOConfig`` (``num_generations``, ``temperature``, ``top_k`` / ``top_p`` / ``min_p``,
            ``reward_weights``, ``max_batch``, ``max_len``, ``dense_advance``, ``scale_rewards``, ``on_env_error``,
            ``prefetch_observations``).
        seed (`int`): seed of the action-sampling generator.
    """

    def __init__(self, pool: EpisodePool, tokenizer, args, seed: int):
        self.pool = pool
        self.args = args
        self.env_index = {name: i for i, name in enumerate(pool.env_names)}
        self.generator = torch.Generator().manual_seed(seed)
        self.filters = (args.top_k, args.top_p, args.min_p)  # of the distribution actions are drawn from
        # GRPOConfig's reward_weights: one reward source (the env), so one weight on every reward it reports
        self.reward_weight = float(args.reward_weights[0]) if args.reward_weights else 1.0
        # k per env (num_generations_per_env's, else num_generations); a wave draws the widest, a row keeps its k
        self.group_size = {n: args.num_generations_per_env.get(n, args.num_generations) for n in pool.env_names}
        self.widest = max(self.group_size.values())
        self.stats: dict[str, list[float]] = defaultdict(list)
        self.queue: deque[DecisionRow] = deque()
        self.observer = Observer(tokenizer, args, self.stats, lambda ep: self.pool.reset_episode(ep))
        # the decisions whose branching failed or was capped, counted by cause (and envs that cannot be copied)
        self.branch_fallbacks = BranchFallbacks(args.on_env_error)
        self.hooks: dict[str, list[Callable]] = {"forward": [], "advanced": []}

    def add_hook(self, event: str, hook: Callable) -> None:
        """Call ``hook`` at ``event``: ``"forward"`` with ``(replay, wave)``, the decisions one loss forward answers
        when actions are sampled from it (:meth:`replays_and_wave`); ``"advanced"`` with the rows :meth:`advance`
        made (e.g. to count what a step does; a hook must not change them)."""
        if event not in self.hooks:
            raise ValueError(f"Rollout.add_hook: field 'event': one of {sorted(self.hooks)}, got {event!r}")
        self.hooks[event].append(hook)

    # ------------------------------------------------------------------------------------------------- collection
    def collect(
        self, n_rows: int, logits_fn: Callable, *, step: int = 0, continuation_logits: Callable | None = None
    ) -> list[DecisionRow]:
        """Run waves until ``n_rows`` rows are ready; return the oldest ``n_rows``.

        Args:
            n_rows (`int`): rows wanted.
            logits_fn (`Callable`): ``list[PackedRequest] -> (act, ref)``: the policy's act logits (`(N, A)` with
                ``-inf`` beyond the legal options, or one `(n_legal,)` tensor per decision) and the reference
                policy's (``None`` when ``beta == 0``); see :meth:`advance`.
            step, continuation_logits: see :meth:`advance`.
        """
        stalled = 0
        while len(self.queue) < n_rows:
            produced = self.run_wave(logits_fn, step=step, continuation_logits=continuation_logits)
            stalled = 0 if produced else stalled + 1
            if stalled > 1000:
                raise RuntimeError(
                    "rollout: 1000 waves produced no row; every decision is being skipped (see skipped_decisions)"
                )
        return self.take(n_rows)

    def take(self, n: int) -> list[DecisionRow]:
        """The ``n`` oldest ready rows (fewer when fewer are ready)."""
        return [self.queue.popleft() for _ in range(min(n, len(self.queue)))]

    def replays_and_wave(self, n: int) -> tuple[list[DecisionRow], Wave]:
        """Up to ``n`` decisions for one forward: the oldest ready rows (replayed outcome decisions), then fresh
        decisions from the pool to fill it; raises when 1000 tries yield nothing (every decision is being skipped)."""
        for _ in range(1000):
            replay = self.take(n)
            wave = self.observe_wave(n - len(replay))
            if replay or wave.episodes:
                for hook in self.hooks["forward"]:
                    hook(replay, wave)
                return replay, wave
        raise RuntimeError(
            "rollout: 1000 waves produced no decision; every decision is being skipped (see skipped_decisions)"
        )

    def observe_wave(self, limit: int) -> Wave:
        """Up to ``limit`` decisions from the pool (fair across envs), observed, validated and packed."""
        self.observer.join_prefetch()
        return self.observer.observe(self.pool.schedule(limit))

    def prefetch(self, episodes: list[Episode]) -> None:
        """Observe the next decisions of ``episodes`` (just stepped) in the background (see :class:`Observer`)."""
        self.observer.prefetch(episodes)

    def join_prefetch(self) -> None:
        """Wait for the background observations (before any env is stepped, reset or saved)."""
        self.observer.join_prefetch()

    def run_wave(self, logits_fn: Callable, *, step: int = 0, continuation_logits: Callable | None = None) -> int:
        """One wave of ``max_batch`` decisions answered by ``logits_fn``; returns how many rows it added to the
        queue."""
        wave = self.observe_wave(self.args.max_batch)
        if not wave.episodes:
            return 0
        logits, ref_logits = logits_fn(wave.packed)
        before = len(self.queue)
        rows = self.advance(wave, logits, ref_logits, step=step, continuation_logits=continuation_logits)
        self.prefetch(wave.episodes)
        self.queue.extend(row for row in rows if row is not None and row.ready)
        return len(self.queue) - before

    # --------------------------------------------------------------------------------------- sampling and stepping
    def advance(
        self,
        wave: Wave,
        logits,
        ref_logits=None,
        *,
        step: int = 0,
        continuation_logits: Callable | None = None,
    ) -> list[DecisionRow | None]:
        """Sample actions for a wave from the policy's act logits, step the envs, and return one row per decision
        (``None`` where the env failed and ``on_env_error="skip"`` reset it).

        Dense rows come back with their k actions and group advantages; so do outcome rows valued by branching
        (``outcome_advantage="branch"``). Another outcome row holds its one action and waits with its episode: when
        the episode ends, it goes to the queue with its advantage (``"rtg"``: its return-to-go against that env's
        recent returns-to-go at the same step; ``"episode"``: the episode's return against the env's recent returns).
        The sampling and the advantages are computed for the whole wave at once (one ``(N, k)`` draw from the
        generator); only the env steps run per decision.

        Args:
            wave (`Wave`): the decisions.
            logits (`torch.Tensor` or `list[torch.Tensor]`): the policy's act logits (no gradient needed), either
                `(N, A)` with ``-inf`` beyond each decision's legal options, or one `(n_legal,)` tensor per decision.
            ref_logits (`torch.Tensor`, `list`, *optional*): the reference policy's, in the same form; ``None`` (or a
                list of ``None``) when ``beta == 0``.
            step (`int`, defaults to `0`): the optimizer step; rows record when their actions were sampled.
            continuation_logits (`Callable`, *optional*): ``list[PackedRequest] -> (M, A)`` act logits of the current
                policy (no gradient), for branch continuations; ``None``: outcome decisions are not branched.
        """
        self.join_prefetch()
        draw = self._draw(wave, logits, ref_logits)
        branched = self._branch(wave, draw.dense, draw.actions, continuation_logits)
        rows = [self._made_row(wave, i, draw, branched[i], step) for i in range(len(wave.episodes))]
        values = draw.sampled.clone()
        for i, v in enumerate(branched):
            if v is not None:
                values[i, : len(v)] = torch.tensor(v, dtype=values.dtype)
        self._set_group_advantages(wave, rows, values, draw.width)
        for hook in self.hooks["advanced"]:
            hook(rows)
        return rows

    def _draw(self, wave: Wave, logits, ref_logits) -> _Draw:
        """The wave's log-probs, sampled actions and exact expected rewards, and the dense decisions' targets."""
        args = self.args
        logp_all, legal = host_log_probs(logits, args.temperature)  # (N, A) on the host
        ref_all = None if no_logits(ref_logits) else host_log_probs(ref_logits, args.temperature)[0]
        probs = logp_all.exp()
        # drawn from the top-k / top-p / min-p filtered distribution; log-probs, entropy and regret are the policy's
        draws = sampling_probs(logp_all, *self.filters)
        actions = torch.multinomial(draws, self.widest, replacement=True, generator=self.generator)  # (N, widest)
        width = [self.group_size[ep.env_name] for ep in wave.episodes]  # each row's k: its first k draws
        dense = [ep.env.dense for ep in wave.episodes]
        rewards = self._expected_rewards(wave, dense, logp_all.shape) * self.reward_weight  # (N, A)
        sampled = rewards.gather(1, actions)  # (N, widest)
        expected = (probs * rewards).sum(-1)  # (N,) the policy's expected reward (dense)
        regret = rewards.masked_fill(~legal, float("-inf")).amax(-1) - expected  # (N,)
        if args.dense_advance == "best_of_k":
            beyond = torch.arange(self.widest) >= torch.tensor(width)[:, None]
            dense_step = actions.gather(1, sampled.masked_fill(beyond, float("-inf")).argmax(-1, keepdim=True))[:, 0]
        else:
            dense_step = actions[:, 0]
        every = None  # all_actions: each dense decision's legal actions' advantages; the step targets: log-prob steps
        if args.dense_update != "sampled":
            env_ids = torch.tensor([self.env_index[ep.env_name] for ep in wave.episodes])
        if args.dense_update == "all_actions":
            every = all_action_advantages(rewards, legal, logp_all, args.scale_rewards, env_ids).tolist()
        elif args.dense_update in STEP_TARGET_UPDATES:
            scale = reward_scale(rewards, legal, args.scale_rewards, env_ids)  # (N, 1)
            p, advantage = regularised_advantages(rewards, legal, logp_all, scale, args.beta, ref_all)
            every = step_targets(args.dense_update, p, advantage, legal).tolist()
        return _Draw(
            logp_all=logp_all,
            ref_all=ref_all,
            rewards=rewards,
            sampled=sampled,
            expected=expected,
            width=width,
            dense=dense,
            n_legal=legal.sum(-1).tolist(),
            entropy=act_entropy(logp_all, legal).tolist(),
            regret=regret.tolist(),
            dense_step=dense_step.tolist(),
            actions=[a[:w] for a, w in zip(actions.tolist(), width)],
            logp_act=[lp[:w] for lp, w in zip(logp_all.gather(1, actions).tolist(), width)],
            every=every,
        )

    def _made_row(self, wave: Wave, i: int, draw: _Draw, branch_values: list[float] | None, step: int):
        """The row of the wave's decision ``i``, after its env was stepped with the action it advances by (``None``
        when the env failed and was reset)."""
        ep, n_legal = wave.episodes[i], draw.n_legal[i]
        ref_logp = draw.ref_all[i, :n_legal].clone() if draw.ref_all is not None else None  # its own storage
        self.stats[f"env/{ep.env_name}/entropy"].append(draw.entropy[i])
        made = dict(
            env_index=self.env_index[ep.env_name], packed=wave.packed[i], targets=wave.targets[i], ref_logps=ref_logp
        )
        if draw.dense[i]:
            self.stats[f"env/{ep.env_name}/regret"].append(draw.regret[i])
            ep.policy_ret += float(draw.expected[i])  # a return only when the env's action_rewards are step rewards
            row = DecisionRow(**made, actions=draw.actions[i], old_logps=draw.logp_act[i])
            if draw.every is not None:
                row.action_advantages = draw.every[i][:n_legal]
                row.old_logps_all = draw.logp_all[i, :n_legal].tolist()
                row.action_values = draw.rewards[i, :n_legal].tolist()
            action = draw.dense_step[i]
        elif branch_values is not None:  # valued now: k actions, the episode goes on with the first
            row = DecisionRow(**made, actions=draw.actions[i], old_logps=draw.logp_act[i], outcome=True, step=step)
            action = draw.actions[i][0]
        else:  # one action (the first of the row's draws), valued when the episode ends
            action = draw.actions[i][0]
            row = DecisionRow(
                **made,
                actions=[action],
                old_logps=[draw.logp_act[i][0]],
                outcome=True,
                step=step,
                ready=False,
                t=ep.n_decisions,
            )
        return row if self._step(ep, action, row) else None

    def _branch(
        self, wave: Wave, dense: list[bool], actions: list[list[int]], continuation_logits: Callable | None
    ) -> list[list[float] | None]:
        """Branch returns of the k sampled actions of the wave's outcome decisions (``None`` where not branched)."""
        out: list[list[float] | None] = [None] * len(dense)
        outcome = [i for i, d in enumerate(dense) if not d]
        if self.args.outcome_advantage != "branch" or not outcome or continuation_logits is None:
            return out
        values, answered, forwarded = branch_values(
            [wave.episodes[i] for i in outcome],
            [actions[i] for i in outcome],
            self.observer,
            continuation_logits,
            self.generator,
            self.args.temperature,
            self.args.branch_limit,
            self.branch_fallbacks,
            filters=self.filters,
            reward_weight=self.reward_weight,
            max_rounds=self.args.branch_max_rounds,
            explore=self.args.branch_explore,
        )
        for i, v in zip(outcome, values):
            out[i] = v
        self.stats["branch/decisions"].append(float(sum(v is not None for v in values)))
        self.stats["branch/continuation_decisions"].append(float(answered))
        self.stats["branch/continuation_forwards"].append(float(forwarded))
        for key, n in self.branch_fallbacks.pop_counts().items():
            self.stats[key].append(n)
        return out

    @staticmethod
    def _expected_rewards(wave: Wave, dense: list[bool], shape) -> torch.Tensor:
        """The dense decisions' exact expected rewards, `(N, A)` (zeros for outcome decisions and beyond n_legal)."""
        rewards = np.zeros(tuple(shape), dtype=np.float32)
        for i, r in enumerate(wave.rewards):
            if dense[i]:
                rewards[i, : len(r)] = r
        return torch.from_numpy(rewards)

    def _step(self, ep: Episode, action: int, row: DecisionRow) -> bool:
        """Step ``ep``'s env with ``action``; ``False`` when the env failed and was reset (``on_env_error="skip"``).
        A row valued at the episode's end waits with its episode; a finished episode is recycled and its waiting rows
        queued."""
        try:
            reward, done = ep.env.step(action)
            reward = float(reward)
            if not math.isfinite(reward):
                raise ValueError(f"env {ep.env_name!r}: field 'reward': step() returned {reward}")
        except Exception as err:
            self.observer.env_failed(ep, "step", err)  # the row is dropped with the episode
            return False
        reward *= self.reward_weight
        if not row.ready:
            ep.pending.append(row)
        ep.ret += reward
        ep.rewards.append(reward)
        ep.n_decisions += 1
        if done:
            self._finish(ep)
        return True

    def _set_group_advantages(
        self, wave: Wave, rows: list[DecisionRow | None], values: torch.Tensor, width: list[int]
    ) -> None:
        """Group advantages of the rows valued now (dense, branched) from their sampled actions' values
        `(N, widest)`, each row over its own first ``width[i]`` (its env's k; an env's rows share one k, so a
        ``"batch"`` std taken within rows of one width is its env's)."""
        ready = [i for i, row in enumerate(rows) if row is not None and row.ready]
        for k in sorted({width[i] for i in ready}):
            group = [i for i in ready if width[i] == k]
            r = values[group, :k]  # (D, k)
            env_ids = torch.tensor([self.env_index[wave.episodes[i].env_name] for i in group])
            std = env_batch_std(r, env_ids) if self.args.scale_rewards == "batch" else None
            for i, adv, value in zip(group, group_advantages(r, self.args.scale_rewards, std).tolist(), r.tolist()):
                rows[i].advantages, rows[i].values = adv, value

    def _finish(self, ep: Episode) -> None:
        """Record a finished episode's returns, recycle it, and queue its waiting rows with their advantages.

        ``env/<name>/return`` is the return of the sampled policy: the realised return, except for dense episodes
        advanced by the best of k samples, whose realised return (logged as ``return_best_of_k``) is not the policy's;
        for those it is the sum over the episode's decisions of the policy's expected reward at the states met. That
        sum is a return only when each decision's ``action_rewards`` are that step's rewards: an env whose values are
        returns-to-go (``action_rewards_to_go``, e.g. the Gymnasium adapter's ``Q*``) logs its realised return as
        ``return`` (under best of k, the return of the episode as it was advanced, also ``return_best_of_k``)."""
        pending, name, rewards, dense, policy_ret = ep.pending, ep.env_name, ep.rewards, ep.env.dense, ep.policy_ret
        values_to_go = bool(getattr(ep.env, "action_rewards_to_go", False))
        reached_goal = getattr(ep.env, "reached_goal", None)
        ret = self.pool.finish(ep)
        if reached_goal is not None:
            self.stats[f"env/{name}/goal_share"].append(float(reached_goal))
        if dense and self.args.dense_advance == "best_of_k":
            self.stats[f"env/{name}/return"].append(ret if values_to_go else policy_ret)
            self.stats[f"env/{name}/return_best_of_k"].append(ret)
        else:
            self.stats[f"env/{name}/return"].append(ret)
        if dense:
            return
        scale = self.args.scale_rewards != "none"
        if self.args.outcome_advantage == "episode":
            advantages = [outcome_advantage(ret, self.pool.returns[name], scale)] * len(pending)
            values = [ret] * len(pending)
        else:  # reward-to-go against the env's recent returns-to-go at the same step
            to_go = np.cumsum(rewards[::-1])[::-1].tolist()
            windows = self.pool.record_returns_to_go(name, to_go)
            advantages = [outcome_advantage(to_go[row.t], windows[row.t], scale) for row in pending]
            values = [to_go[row.t] for row in pending]
        for row, adv, value in zip(pending, advantages, values):
            row.advantages, row.values = [adv], [value]
            self.queue.append(row)

    # ------------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Everything needed to continue identically: the pool (envs, generator), the ready queue and the sampler."""
        self.join_prefetch()
        return {
            "pool": self.pool,
            "queue": self.queue,
            "generator": self.generator.get_state(),
            "stats": dict(self.stats),
        }

    def load_state_dict(self, state: dict) -> None:
        self.observer.forget_prefetched()
        self.pool = state["pool"]
        # checkpoints written before the queue moved here kept it on the pool
        self.queue = state["queue"] if "queue" in state else self.pool.__dict__.pop("queue", deque())
        self.generator.set_state(state["generator"])
        self.stats.clear()
        self.stats.update(state["stats"])

    def pop_stats(self) -> dict[str, list[float]]:
        """The statistics recorded since the last call (and forget them)."""
        out = dict(self.stats)
        self.stats.clear()
        return out


__all__ = ["Rollout"]
