"""Rollouts: turn live episodes into rows for the GRPO loss, with one no-grad packed forward per wave of decisions.

Design decisions:
1. A wave takes up to ``max_batch`` decisions from the pool (fair across envs), packs them, and answers them in
   forwards capped by ``max_batch_tokens``; actions are sampled from the act head at ``temperature`` with the
   rollout's own ``torch.Generator`` (checkpointed with the pool).
2. Dense decisions: k actions from one set of act logits; their exact expected rewards ``action_rewards()[a]`` give
   the group advantage ``(r - mean) / (std + 1e-4)`` (``scale_rewards``: "group", "batch" or "none"). The episode
   advances by the best of the k (the seed's) or by the first sample.
3. Outcome decisions: one action, stored with its behaviour log-prob; when the episode ends each stored decision
   becomes a row whose advantage is the return normalised against the env's recent returns. The behaviour log-prob
   lets the loss importance-correct a replay that happens after the policy moved.
4. Every row carries the reference policy's log-probs over its legal actions (the reference is frozen, so computing
   them at decision time is exact) and the decision's validated report targets.
5. Bad input never passes silently: a decision that does not fit ``max_len`` resets its episode and is counted; a
   malformed decision, target or reward raises a ``ValueError`` naming the env (or, with ``on_env_error="skip"``,
   resets and is counted).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..packing import PackedRequest, pack_request
from ..questions import ACT_QID, validate_action_rewards, validate_targets
from .pool import Episode, EpisodePool


@dataclass
class DecisionRow:
    """One decision ready for the loss: its packing, targets, sampled actions and their advantages."""

    env_index: int
    packed: PackedRequest
    targets: dict
    actions: list[int]
    advantages: list[float]
    old_logps: list[float]
    ref_logps: torch.Tensor | None


def act_index(packed: PackedRequest) -> int:
    """Position of the act question among a packed decision's questions."""
    return next(i for i, q in enumerate(packed.questions) if q.qid == ACT_QID)


def chunk_by_tokens(packed: list[PackedRequest], max_batch_tokens: int | None) -> list[list[int]]:
    """Split indices into consecutive chunks whose padded size (longest x count) stays within the budget."""
    if max_batch_tokens is None:
        return [list(range(len(packed)))]
    chunks, current, longest = [], [], 0
    for i, p in enumerate(packed):
        new_longest = max(longest, len(p))
        if current and new_longest * (len(current) + 1) > max_batch_tokens:
            chunks.append(current)
            current, new_longest = [], len(p)
        current.append(i)
        longest = new_longest
    if current:
        chunks.append(current)
    return chunks


def group_advantages(rewards: torch.Tensor, scale_rewards: str, batch_std: float | None = None) -> torch.Tensor:
    """GRPO advantages of the k rewards of one decision: centred on their mean, scaled as ``scale_rewards`` says."""
    if bool((rewards == rewards[0]).all()):  # no signal; exactly zero (rounding in the mean would be amplified)
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    if scale_rewards == "group":
        return centred / (rewards.std() + 1e-4)
    if scale_rewards == "batch":
        return centred / ((batch_std or 0.0) + 1e-4)
    return centred


class Rollout:
    """Collects rows from an :class:`EpisodePool`.

    Args:
        pool (`EpisodePool`): the live episodes.
        tokenizer: the model's tokenizer.
        args: an ``AleaEnvGRPOConfig`` (``num_generations``, ``temperature``, ``max_batch``, ``max_batch_tokens``,
            ``max_len``, ``dense_advance``, ``scale_rewards``, ``on_env_error``).
        seed (`int`): seed of the action-sampling generator.
    """

    def __init__(self, pool: EpisodePool, tokenizer, args, seed: int):
        self.pool = pool
        self.tokenizer = tokenizer
        self.args = args
        self.env_index = {name: i for i, name in enumerate(pool.env_names)}
        self.generator = torch.Generator().manual_seed(seed)
        self.stats: dict[str, list[float]] = defaultdict(list)

    # ------------------------------------------------------------------------------------------------- collection
    def collect(self, n_rows: int, logits_fn: Callable) -> list[DecisionRow]:
        """Run waves until ``n_rows`` rows are ready; return the oldest ``n_rows``.

        Args:
            n_rows (`int`): rows wanted.
            logits_fn (`Callable`): ``list[PackedRequest] -> (act, ref)``: the policy's act logits, one tensor
                `(n_legal,)` per decision, and the reference policy's (``None`` when ``beta == 0``).
        """
        stalled = 0
        while len(self.pool.queue) < n_rows:
            produced = self.wave(logits_fn)
            stalled = 0 if produced else stalled + 1
            if stalled > 1000:
                raise RuntimeError(
                    "rollout: 1000 waves produced no row; every decision is being skipped (see skipped_decisions)"
                )
        return self.pool.take(n_rows)

    def _observe(self, episode: Episode):
        """Observe, validate and pack one episode's decision; ``None`` when it was skipped (episode reset)."""
        name, env = episode.env_name, episode.env
        try:
            decision = env.observe()
            targets = validate_targets(decision, env.oracle_targets(), env=name)
            rewards = validate_action_rewards(decision, env.action_rewards(), env=name) if env.dense else None
            if decision.n_legal < 1:
                raise ValueError(f"env {name!r}: question 'act', field 'options': no legal action")
        except Exception as err:
            self._env_failed(episode, "observe", err)
            return None
        try:
            packed = pack_request(
                self.tokenizer, decision.state, decision.questions, max_len=self.args.max_len, env=name
            )
        except ValueError:
            # oversize: reset the episode and count it, never truncate
            self.stats["skipped_decisions"].append(1.0)
            self.pool.reset_episode(episode)
            return None
        return packed, targets, rewards

    def _env_failed(self, episode: Episode, where: str, err: Exception) -> None:
        """A malformed decision, target or reward, or an exception inside the env: raise a ``ValueError`` naming the
        env, the decision and what failed, or (``on_env_error="skip"``) reset the episode and count it."""
        name = episode.env_name
        if self.args.on_env_error == "skip":
            self.stats["skipped_decisions"].append(1.0)
            self.stats["env_errors"].append(1.0)
            self.pool.reset_episode(episode)
            return
        detail = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        raise ValueError(
            f"env {name!r}, decision {episode.n_decisions} of its episode, during {where}(): {detail} "
            f"(set on_env_error='skip' to reset such episodes and keep training)"
        ) from err

    def wave(self, logits_fn: Callable) -> int:
        """One wave of decisions; returns how many rows it added to the queue."""
        args = self.args
        episodes = self.pool.schedule(args.max_batch)
        live, packed, targets, rewards = [], [], [], []
        for ep in episodes:
            got = self._observe(ep)
            if got is None:
                continue
            live.append(ep)
            packed.append(got[0])
            targets.append(got[1])
            rewards.append(got[2])
        if not live:
            return 0
        self.stats["skipped_decisions"].append(0.0)
        logits, ref_logits = [], []
        for chunk in chunk_by_tokens(packed, args.max_batch_tokens):
            sub = [packed[i] for i in chunk]
            act, ref = logits_fn(sub)
            logits += act
            ref_logits += ref if ref is not None else [None] * len(sub)

        before = len(self.pool.queue)
        dense_groups = []
        for i, ep in enumerate(live):
            logp_all = torch.log_softmax(logits[i].float().cpu() / args.temperature, -1)  # (n_legal,)
            probs = logp_all.exp()
            ref_logp = None
            if ref_logits[i] is not None:
                ref_logp = torch.log_softmax(ref_logits[i].float().cpu() / args.temperature, -1)
            entropy = float(-(probs * logp_all).sum())
            self.stats[f"env/{ep.env_name}/entropy"].append(entropy)
            idx = self.env_index[ep.env_name]
            if ep.env.dense:
                k = args.num_generations
                actions = torch.multinomial(probs, k, replacement=True, generator=self.generator)  # (k,)
                r_all = torch.as_tensor(rewards[i], dtype=torch.float32)
                r = r_all[actions]  # (k,)
                self.stats[f"env/{ep.env_name}/regret"].append(float(r_all.max() - (probs * r_all).sum()))
                row = DecisionRow(
                    idx, packed[i], targets[i], actions.tolist(), [], logp_all[actions].tolist(), ref_logp
                )
                dense_groups.append((row, r))
                advance = int(actions[r.argmax()]) if args.dense_advance == "best_of_k" else int(actions[0])
            else:
                advance = int(torch.multinomial(probs, 1, generator=self.generator))
                ep.pending.append(
                    DecisionRow(idx, packed[i], targets[i], [advance], [], [float(logp_all[advance])], ref_logp)
                )
            try:
                reward, done = ep.env.step(advance)
                reward = float(reward)
                if not math.isfinite(reward):
                    raise ValueError(f"env {ep.env_name!r}: field 'reward': step() returned {reward}")
            except Exception as err:
                if ep.env.dense:  # its row is already built: drop it with the episode
                    dense_groups.pop()
                self._env_failed(ep, "step", err)
                continue
            ep.ret += reward
            ep.n_decisions += 1
            if done:
                self._finish(ep)

        batch_std = None
        if args.scale_rewards == "batch" and dense_groups:
            batch_std = float(torch.cat([r for _, r in dense_groups]).std())
        for row, r in dense_groups:
            row.advantages = group_advantages(r, args.scale_rewards, batch_std).tolist()
            self.pool.queue.append(row)
        return len(self.pool.queue) - before

    def _finish(self, ep: Episode) -> None:
        pending, name = ep.pending, ep.env_name
        ret = self.pool.finish(ep)
        self.stats[f"env/{name}/return"].append(ret)
        if pending:
            adv = self.pool.normalise(name, ret, scale=self.args.scale_rewards != "none")
            for row in pending:
                row.advantages = [adv]
                self.pool.queue.append(row)

    # ------------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Everything needed to continue identically: the pool (envs, generator, queue) and the sampler."""
        return {"pool": self.pool, "generator": self.generator.get_state(), "stats": dict(self.stats)}

    def load_state_dict(self, state: dict) -> None:
        self.pool = state["pool"]
        self.generator.set_state(state["generator"])
        self.stats = defaultdict(list, state["stats"])

    def pop_stats(self) -> dict[str, list[float]]:
        out = self.stats
        self.stats = defaultdict(list)
        return dict(out)


def rows_to_inputs(rows: list[DecisionRow], k: int) -> dict:
    """Stack rows into the dict TRL's buffering splits and shuffles (tensors first: TRL sizes batches by the first
    value)."""
    n = len(rows)
    actions = torch.zeros(n, k, dtype=torch.long)
    mask = torch.zeros(n, k, dtype=torch.bool)
    adv = torch.zeros(n, k)
    old = torch.zeros(n, k)
    for i, row in enumerate(rows):
        m = len(row.actions)
        actions[i, :m] = torch.tensor(row.actions)
        mask[i, :m] = True
        adv[i, :m] = torch.tensor(row.advantages, dtype=torch.float32)
        old[i, :m] = torch.tensor(row.old_logps, dtype=torch.float32)
    if not all(math.isfinite(a) for row in rows for a in row.advantages):
        raise ValueError("rollout: a non-finite advantage was produced (check the env's rewards)")
    return {
        "actions": actions,
        "sample_mask": mask,
        "advantages": adv,
        "old_logps": old,
        "env_index": torch.tensor([row.env_index for row in rows], dtype=torch.long),
        "packed": [row.packed for row in rows],
        "targets": [row.targets for row in rows],
        "ref_logps": [row.ref_logps for row in rows],
    }


def np_rng_for_rank(seed: int, rank: int) -> np.random.Generator:
    """The pool generator of one process."""
    return np.random.default_rng([seed, rank])


__all__ = [
    "DecisionRow",
    "EpisodePool",
    "Rollout",
    "act_index",
    "chunk_by_tokens",
    "group_advantages",
    "rows_to_inputs",
]
