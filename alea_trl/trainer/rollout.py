"""Rollouts: turn live episodes into rows for the GRPO loss.

Design decisions:
1. A wave takes decisions from the pool (fair across envs) and packs them (``observe_wave``); ``advance`` samples
   their actions from the act head's logits at ``temperature`` with the rollout's own ``torch.Generator``
   (checkpointed with the pool) and steps the envs. The logits come either from the loss forward itself (the
   trainer's ``sample_in_loss_forward``, see ``fused_inputs``) or from a separate no-grad forward (``wave``: up to
   ``max_batch`` decisions).
2. Dense decisions: k actions from one set of act logits; their exact expected rewards ``action_rewards()[a]`` give
   the group advantage ``(r - mean) / (std + 1e-4)`` (``scale_rewards``: "group", "batch" or "none"; "batch" takes
   the std over the wave's rewards of the same env, see ``env_batch_std``). The episode advances by the best of the k
   (the seed's) or by the first sample.
3. Outcome decisions: one action, stored with its behaviour log-prob; when the episode ends each stored decision
   becomes a row whose advantage is the return normalised against the env's recent returns. The behaviour log-prob
   lets the loss importance-correct a replay that happens after the policy moved.
4. Every row carries the reference policy's log-probs over its legal actions (the reference is frozen, so computing
   them at decision time is exact) and the decision's validated report targets.
5. Observing is host work (env oracles, the tokenizer) that can overlap the backward pass: after a wave's envs are
   stepped, their next decisions are observed and packed in one background thread (``prefetch_observations``). The
   thread has no side effects (it never resets an episode, records a statistic or raises); an entry is used only
   while its env still returns the very same ``Decision`` object (an ``AleaEnv`` caches it until ``step``), and the
   main thread waits for the thread before it steps, resets or checkpoints any env.
6. Bad input never passes silently: a decision that does not fit ``max_len`` resets its episode and is counted; a
   malformed decision, target or reward raises a ``ValueError`` naming the env (or, with ``on_env_error="skip"``,
   resets and is counted).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..envs.base import AleaEnv
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


def group_advantages(
    rewards: torch.Tensor, scale_rewards: str, batch_std: float | torch.Tensor | None = None
) -> torch.Tensor:
    """GRPO advantages of the k rewards of a decision (the last dimension; a `(D, k)` tensor holds D decisions):
    centred on their mean, scaled as ``scale_rewards`` says. A group whose rewards are all equal has no signal and
    gets exactly zero (rounding in the mean would otherwise be amplified by the scaling). With ``"batch"``,
    ``batch_std`` is one float or a `(D, 1)` tensor (each decision's env's std, see `env_batch_std`)."""
    centred = rewards - rewards.mean(-1, keepdim=True)
    if scale_rewards == "group":
        centred = centred / (rewards.std(-1, keepdim=True) + 1e-4)
    elif scale_rewards == "batch":
        centred = centred / ((batch_std if batch_std is not None else 0.0) + 1e-4)
    no_signal = (rewards == rewards[..., :1]).all(-1, keepdim=True)
    return centred.masked_fill(no_signal, 0.0)


def env_batch_std(rewards: torch.Tensor, env_ids: torch.Tensor) -> torch.Tensor:
    """The std of all the sampled rewards in a batch that belong to the same env, for each decision: `(D, 1)` from
    `(D, k)` rewards and `(D,)` env ids. It is TRL's ``scale_rewards="batch"`` taken per env: the envs of a mix
    report rewards in their own units (newsvendor in money, kelly in log growth), so one std over all of them would
    leave every env but the largest-scale one with near-zero advantages."""
    out = torch.empty(rewards.shape[0], 1, dtype=rewards.dtype)
    for env in env_ids.unique().tolist():
        rows = env_ids == env
        out[rows] = rewards[rows].std() if rewards[rows].numel() > 1 else 0.0
    return out


def _log_probs(logits, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Host log-probs `(N, A)` at ``temperature`` of act logits given as `(N, A)` (``-inf`` beyond the legal options)
    or as a list of `(n_legal,)` tensors, and the legal mask."""
    if not isinstance(logits, torch.Tensor):
        logits = torch.nn.utils.rnn.pad_sequence(
            [x.detach().reshape(-1) for x in logits], batch_first=True, padding_value=float("-inf")
        )
    logits = logits.detach().float().cpu()
    return torch.log_softmax(logits / temperature, -1), torch.isfinite(logits)


def _absent(ref_logits) -> bool:
    return ref_logits is None or (not isinstance(ref_logits, torch.Tensor) and all(r is None for r in ref_logits))


@dataclass
class Wave:
    """Decisions observed together: their episodes, packings, validated targets and (dense) expected rewards."""

    episodes: list[Episode]
    packed: list[PackedRequest]
    targets: list[dict]
    rewards: list[list[float] | None]

    def subset(self, indices: list[int]) -> Wave:
        """The decisions at ``indices``, in that order."""
        return Wave(*([getattr(self, f)[i] for i in indices] for f in ("episodes", "packed", "targets", "rewards")))


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
        self._prefetched: dict[int, tuple] = {}  # id(episode) -> (decision, (packed, targets, rewards))
        self._prefetch: Future | None = None
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------------------------------------- collection
    def collect(self, n_rows: int, logits_fn: Callable) -> list[DecisionRow]:
        """Run waves until ``n_rows`` rows are ready; return the oldest ``n_rows``.

        Args:
            n_rows (`int`): rows wanted.
            logits_fn (`Callable`): ``list[PackedRequest] -> (act, ref)``: the policy's act logits (`(N, A)` with
                ``-inf`` beyond the legal options, or one `(n_legal,)` tensor per decision) and the reference
                policy's (``None`` when ``beta == 0``); see :meth:`advance`.
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

    def _prepare(self, env, name: str):
        """Observe, validate and pack ``env``'s decision without side effects: ``(None, (packed, targets, rewards),
        decision)``, or ``(where, error, decision)`` with ``where`` "observe" (a malformed decision, target or
        reward, or an error inside the env) or "pack" (the decision does not fit ``max_len``)."""
        decision = None
        try:
            decision = env.observe()
            targets = validate_targets(decision, env.oracle_targets(), env=name)
            rewards = validate_action_rewards(decision, env.action_rewards(), env=name) if env.dense else None
            if decision.n_legal < 1:
                raise ValueError(f"env {name!r}: question 'act', field 'options': no legal action")
        except Exception as err:
            return "observe", err, decision
        try:
            packed = pack_request(
                self.tokenizer, decision.state, decision.questions, max_len=self.args.max_len, env=name
            )
        except ValueError as err:
            return "pack", err, decision
        _ = packed.arrays  # the arrays collation reads, made here (in the background thread when prefetching)
        return None, (packed, targets, rewards), decision

    def _observe(self, episode: Episode):
        """Observe, validate and pack one episode's decision; ``None`` when it was skipped (episode reset)."""
        cached = self._prefetched.pop(id(episode), None)
        if cached is not None and cached[0] is episode.env.observe():  # the env has not moved since
            return cached[1]
        where, value, _ = self._prepare(episode.env, episode.env_name)
        if where == "observe":
            self._env_failed(episode, "observe", value)
            return None
        if where == "pack":  # oversize: reset the episode and count it, never truncate
            self.stats["skipped_decisions"].append(1.0)
            self.pool.reset_episode(episode)
            return None
        return value

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
                where, value, decision = self._prepare(ep.env, ep.env_name)
            except Exception:  # left for the main thread, which raises it where it belongs
                continue
            if where is None:
                self._prefetched[id(ep)] = (decision, value)

    def join_prefetch(self) -> None:
        """Wait for the background observations (before any env is stepped, reset or saved)."""
        if self._prefetch is not None:
            self._prefetch.result()
            self._prefetch = None

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

    def observe_wave(self, limit: int) -> Wave:
        """Up to ``limit`` decisions from the pool (fair across envs), observed, validated and packed."""
        self.join_prefetch()
        wave = Wave([], [], [], [])
        for ep in self.pool.schedule(limit):
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

    def wave(self, logits_fn: Callable) -> int:
        """One wave of decisions answered by ``logits_fn``; returns how many rows it added to the queue."""
        wave = self.observe_wave(self.args.max_batch)
        if not wave.episodes:
            return 0
        logits, ref_logits = logits_fn(wave.packed)
        before = len(self.pool.queue)
        rows = self.advance(wave, logits, ref_logits)
        self.prefetch(wave.episodes)
        self.pool.queue.extend(row for row, ep in zip(rows, wave.episodes) if row is not None and ep.env.dense)
        return len(self.pool.queue) - before

    def advance(self, wave: Wave, logits, ref_logits=None) -> list[DecisionRow | None]:
        """Sample actions for a wave from the policy's act logits, step the envs, and return one row per decision
        (``None`` where the env failed and ``on_env_error="skip"`` reset it).

        Dense rows come back with their k actions and group advantages. An outcome row holds its one action and is
        also kept with its episode: when the episode ends, it goes to the pool's queue with the return's advantage.
        The sampling and the advantages are computed for the whole wave at once (one ``(N, k)`` draw from the
        generator); only the env steps run per decision.

        Args:
            wave (`Wave`): the decisions.
            logits (`torch.Tensor` or `list[torch.Tensor]`): the policy's act logits (no gradient needed), either
                `(N, A)` with ``-inf`` beyond each decision's legal options, or one `(n_legal,)` tensor per decision.
            ref_logits (`torch.Tensor`, `list`, *optional*): the reference policy's, in the same form; ``None`` (or a
                list of ``None``) when ``beta == 0``.
        """
        self.join_prefetch()
        args = self.args
        logp_all, legal = _log_probs(logits, args.temperature)  # (N, A) on the host
        ref_all = None if _absent(ref_logits) else _log_probs(ref_logits, args.temperature)[0]
        probs = logp_all.exp()
        entropy = -torch.where(legal, probs * logp_all, 0.0).sum(-1)
        actions = torch.multinomial(probs, args.num_generations, replacement=True, generator=self.generator)
        dense = [ep.env.dense for ep in wave.episodes]
        rewards = np.zeros(tuple(logp_all.shape), dtype=np.float32)  # dense decisions' expected rewards, (N, A)
        for i, r in enumerate(wave.rewards):
            if dense[i]:
                rewards[i, : len(r)] = r
        rewards = torch.from_numpy(rewards)
        sampled = rewards.gather(1, actions)  # (N, k)
        best = rewards.masked_fill(~legal, float("-inf")).amax(-1)
        regret = best - (probs * rewards).sum(-1)
        if args.dense_advance == "best_of_k":
            dense_step = actions.gather(1, sampled.argmax(-1, keepdim=True))[:, 0]
        else:
            dense_step = actions[:, 0]
        n_legal = legal.sum(-1).tolist()
        h, reg, act, step_a = entropy.tolist(), regret.tolist(), actions.tolist(), dense_step.tolist()
        logp_act = logp_all.gather(1, actions).tolist()

        rows: list[DecisionRow | None] = []
        dense_rows: list[int] = []
        for i, ep in enumerate(wave.episodes):
            ref_logp = ref_all[i, : n_legal[i]].clone() if ref_all is not None else None  # its own storage
            self.stats[f"env/{ep.env_name}/entropy"].append(h[i])
            idx = self.env_index[ep.env_name]
            if dense[i]:
                self.stats[f"env/{ep.env_name}/regret"].append(reg[i])
                row = DecisionRow(idx, wave.packed[i], wave.targets[i], act[i], [], logp_act[i], ref_logp)
                advance = step_a[i]
            else:  # one action: the first of the row's draws
                advance = act[i][0]
                row = DecisionRow(idx, wave.packed[i], wave.targets[i], [advance], [], [logp_act[i][0]], ref_logp)
            try:
                reward, done = ep.env.step(advance)
                reward = float(reward)
                if not math.isfinite(reward):
                    raise ValueError(f"env {ep.env_name!r}: field 'reward': step() returned {reward}")
            except Exception as err:
                self._env_failed(ep, "step", err)  # the row is dropped with the episode
                rows.append(None)
                continue
            if dense[i]:
                dense_rows.append(i)
            else:
                ep.pending.append(row)
            rows.append(row)
            ep.ret += reward
            ep.n_decisions += 1
            if done:
                self._finish(ep)

        if dense_rows:
            r = sampled[dense_rows]  # (D, k)
            batch_std = None
            if args.scale_rewards == "batch":
                env_ids = torch.tensor([self.env_index[wave.episodes[i].env_name] for i in dense_rows])
                batch_std = env_batch_std(r, env_ids)
            for i, adv in zip(dense_rows, group_advantages(r, args.scale_rewards, batch_std).tolist()):
                rows[i].advantages = adv
        return rows

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
        self.join_prefetch()
        return {"pool": self.pool, "generator": self.generator.get_state(), "stats": dict(self.stats)}

    def load_state_dict(self, state: dict) -> None:
        self.join_prefetch()
        self._prefetched = {}
        self.pool = state["pool"]
        self.generator.set_state(state["generator"])
        self.stats = defaultdict(list, state["stats"])

    def pop_stats(self) -> dict[str, list[float]]:
        out = self.stats
        self.stats = defaultdict(list)
        return dict(out)


def rows_to_inputs(
    rows: list[DecisionRow], k: int, policy_terms: list[bool] | None = None, other_terms: list[bool] | None = None
) -> dict:
    """Stack rows into the dict TRL's buffering splits and shuffles (tensors first: TRL sizes batches by the first
    value).

    Args:
        rows (`list[DecisionRow]`): the rows.
        k (`int`): the widest row (``num_generations``).
        policy_terms (`list[bool]`, *optional*): per row, whether its actions enter the policy loss (default: all).
        other_terms (`list[bool]`, *optional*): per row, whether its KL and report terms enter the loss (default:
            all). When actions are sampled from the loss forward, an outcome decision is trained on its reports and
            KL when it is made, and on its action when its episode ends and it is replayed.
    """
    n = len(rows)
    policy_terms = [True] * n if policy_terms is None else policy_terms
    other_terms = [True] * n if other_terms is None else other_terms
    actions = torch.zeros(n, k, dtype=torch.long)
    mask = torch.zeros(n, k, dtype=torch.bool)
    adv = torch.zeros(n, k)
    old = torch.zeros(n, k)
    for i, row in enumerate(rows):
        if not policy_terms[i]:
            continue
        m = len(row.actions)
        if not all(math.isfinite(a) for a in row.advantages):
            raise ValueError("rollout: a non-finite advantage was produced (check the env's rewards)")
        actions[i, :m] = torch.tensor(row.actions)
        mask[i, :m] = True
        adv[i, :m] = torch.tensor(row.advantages, dtype=torch.float32)
        old[i, :m] = torch.tensor(row.old_logps, dtype=torch.float32)
    return {
        "actions": actions,
        "sample_mask": mask,
        "advantages": adv,
        "old_logps": old,
        "kl_weight": torch.tensor(other_terms, dtype=torch.float32),
        "env_index": torch.tensor([row.env_index for row in rows], dtype=torch.long),
        "packed": [row.packed for row in rows],
        "targets": [row.targets if use else {} for row, use in zip(rows, other_terms)],
        "ref_logps": [row.ref_logps if use else None for row, use in zip(rows, other_terms)],
    }


def fused_inputs(replay: list[DecisionRow], wave: Wave, rows: list[DecisionRow | None], k: int, env_index) -> dict:
    """Loss inputs of a forward whose fresh decisions were just sampled from it (``sample_in_loss_forward``).

    Args:
        replay (`list[DecisionRow]`): outcome decisions whose episodes ended: their actions enter the policy loss
            (their KL and reports were trained when they were made).
        wave (`Wave`): the fresh decisions, after ``replay`` in the forward.
        rows (`list[DecisionRow | None]`): :meth:`Rollout.advance`'s rows for ``wave``: a dense row enters every
            term; an outcome row its KL and reports (its action waits for the return); ``None`` (a skipped env
            failure) nothing.
        k (`int`): ``num_generations``.
        env_index (`dict[str, int]`): env name -> index.
    """
    full, policy_terms, other_terms = list(replay), [True] * len(replay), [False] * len(replay)
    for ep, packed, row in zip(wave.episodes, wave.packed, rows):
        made = row is not None
        full.append(row if made else DecisionRow(env_index[ep.env_name], packed, {}, [], [], [], None))
        policy_terms.append(made and ep.env.dense)
        other_terms.append(made)
    return rows_to_inputs(full, k, policy_terms, other_terms)


def np_rng_for_rank(seed: int, rank: int) -> np.random.Generator:
    """The pool generator of one process."""
    return np.random.default_rng([seed, rank])


__all__ = [
    "DecisionRow",
    "EpisodePool",
    "Rollout",
    "Wave",
    "act_index",
    "env_batch_std",
    "fused_inputs",
    "group_advantages",
    "rows_to_inputs",
]
