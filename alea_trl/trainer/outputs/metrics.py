"""Training metrics: what the rollout and the loss record, as (sum, count) pairs reduced across processes.

Design decisions:
1. Every metric is a (sum, count) pair per process, and its global mean is ``sum of sums / sum of counts``: a process
   that saw no decision of an env does not pull that env's mean towards zero.
2. One gather per call, keys in the same (sorted) order on every process, so the processes never wait on different
   collectives.
3. The loss terms of a micro-batch are moved to the host in one device sync.

``log_completions``: the actions that train, as TRL's table of completions (parquet files under
``output_dir/completions``, the rich console table, wandb / trackio, the Hub dataset of ``log_completions_hub_repo``).
4. One entry per action that trains, logged when its row is handed to the loss (rows of a separate rollout when
   their generation batch is made; with ``sample_in_loss_forward``, the rows whose actions train in each loss
   forward), so every action is logged once: ``prompt`` is the env name and the start of the state text,
   ``completion`` the option label of the action, ``reward`` the value its advantage was computed from (dense: its
   expected reward; outcome: its branch return, return-to-go or the episode's return), ``advantage``, and an ``env``
   column. The actions that train are a decision's sampled ones, except a dense decision's under a ``dense_update``
   other than ``"sampled"`` (the default ``"all_actions_ascent"`` included): it trains every legal action and its k
   samples only choose how the episode advances, so its entries are its legal actions (a row of n legal actions logs
   n entries, whatever k), each with its expected reward and, in the ``advantage`` column, what it trains by: its
   log-prob step (the default, and ``"mirror"``: computed from the regularised advantages when the decision is made,
   centred over the legal actions) or its advantage (``"all_actions"``).
5. ``GRPOTrainer.log`` writes the table from TRL's ``_logs`` deques; they are sized to hold one generation batch's
   actions (``generation_batch_size x num_generations``), so a table shows the latest ones.
6. The entries of all processes are gathered (``gather_object``): every process calls it at the same points.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque

import torch

from ...questions import ACT_QID, QTYPES
from ..rollout.branching import FAILURE_CAUSES


def gathered_means(accelerator, sums: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Global means of per-process ``(sum, count)`` pairs, in one reduction across processes.

    Every process must call it with the same keys. Keys whose total count is 0 are left out.

    Args:
        accelerator (`accelerate.Accelerator`): the run's accelerator.
        sums (`dict[str, tuple[float, float]]`): metric name -> (sum, count) on this process.
    """
    keys = sorted(sums)
    local = torch.tensor([[sums[k][0], sums[k][1]] for k in keys], dtype=torch.float64, device=accelerator.device)
    total = accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local
    return {k: value / count for k, (value, count) in zip(keys, total.tolist()) if count > 0}


def rollout_sums(stats: dict[str, list[float]], env_names: list[str]) -> dict[str, tuple[float, float]]:
    """(sum, count) pairs of a rollout's statistics: per env the episode return (and the realised return of dense
    episodes advanced by the best of k), the share of episodes that reached their goal (goal-reaching envs), the
    regret and the entropy of the act distribution (means over decisions or episodes), and the totals of skipped
    decisions, env errors, branched decisions, their continuation decisions and the rows answered for those
    (``branch/continuation_forwards``: the distinct decisions of each round), and of the decisions whose branching
    failed (``branch/failed``, and by cause ``branch/failed/<cause>``) or hit ``branch_max_rounds``
    (``branch/capped``)."""
    keys = [
        f"env/{e}/{m}" for e in env_names for m in ("return", "return_best_of_k", "goal_share", "regret", "entropy")
    ]
    sums = {k: (sum(stats.get(k, [])), len(stats.get(k, []))) for k in keys}
    totals = ["skipped_decisions", "env_errors", "branch/decisions", "branch/continuation_decisions"]
    totals += ["branch/continuation_forwards"]
    totals += ["branch/failed", *(f"branch/failed/{cause}" for cause in FAILURE_CAUSES), "branch/capped"]
    for total in totals:
        sums[total] = (sum(stats.get(total, [])), 1.0)
    return sums


def loss_sums(terms, env_index: torch.Tensor, env_names: list[str]) -> dict[str, tuple[float, float]]:
    """(sum, count) pairs of one forward's loss terms (one device sync): the policy, KL and report losses, the clip
    ratio (all samples, and ``clip_ratio/replay`` over the outcome envs' samples), the 90% quantile and the largest
    importance ratio of the outcome envs' samples (``replay/ratio_p90``, ``replay/ratio_max``: how stale replays
    are; each process's figure, averaged over processes), ``approx_kl`` to the behaviour policy, the report loss per
    qtype and the KL per env.

    Args:
        terms (`LossTerms`): the loss's parts (see `alea_trl.trainer.loss.objective.grpo_loss`).
        env_index (`torch.Tensor` of shape `(N,)`, on the host): each row's env index, -1 for rows whose KL did not
            train in this forward.
        env_names (`list[str]`): env index -> name.
    """
    kl = terms.kl.detach()
    n_kl = float((env_index >= 0).sum())
    stats = terms.policy_stats
    names = ["loss/policy", "loss/kl", "loss/report", "clip_ratio", "clip_ratio/replay", "approx_kl"]
    values = [terms.policy.detach(), kl.sum() / max(n_kl, 1.0), terms.report.detach(), stats.clip_ratio]
    values += [stats.clip_ratio_outcome, stats.approx_kl]
    counts = [1.0, 1.0 if n_kl > 0 else 0.0, 1.0 if terms.has_reports else 0.0, 1.0, float(stats.n_outcome > 0), 1.0]
    ratios = stats.ratio_outcome
    has_ratios = ratios is not None and ratios.numel() > 0
    names += ["replay/ratio_p90", "replay/ratio_max"]
    values += [ratios.float().quantile(0.9), ratios.max()] if has_ratios else [kl.new_zeros(()), kl.new_zeros(())]
    counts += [float(has_ratios)] * 2
    for q in QTYPES:
        names.append(f"report/{q}")
        values.append(torch.stack(terms.reports[q]).detach().sum() if terms.reports[q] else kl.new_zeros(()))
        counts.append(float(len(terms.reports[q])))
    on_device = env_index.to(kl.device)
    for i, name in enumerate(env_names):
        names.append(f"env/{name}/kl")
        values.append((kl * (on_device == i)).sum())
        counts.append(float((env_index == i).sum()))
    host = torch.stack([v.float().reshape(()) for v in values]).tolist()
    return {name: (value, count) for name, value, count in zip(names, host, counts)}


def stop_if_not_finite(sums: dict[str, tuple[float, float]], step: int) -> None:
    """Raise ``FloatingPointError`` when a loss term of :func:`loss_sums` is not finite: called before the backward
    pass, so no weight is changed."""
    for name in ("loss/policy", "loss/kl", "loss/report"):
        value = sums[name][0]
        if not math.isfinite(value):
            raise FloatingPointError(
                f"step {step}: the {name} term of the loss is {value}; training stopped before the backward pass, so "
                "no weight was changed"
            )


def staleness_sums(inputs: dict, step: int) -> dict[str, tuple[float, float]]:
    """``replay/staleness``: optimizer steps between the sampling of the outcome envs' trained actions and ``step``."""
    trained = inputs["outcome_rows"] & inputs["sample_mask"].any(-1)
    age = (step - inputs["sampled_at_step"]).float()
    return {"replay/staleness": (float(age[trained].sum()), float(trained.sum()))}


def token_sums(packed: list, padded_tokens: int, count_padded: bool) -> dict[str, tuple[float, float]]:
    """(sum, count) pairs of one loss forward's tokens: real tokens per decision, the share of padding, and
    ``tokens/counted`` (padded tokens with ``count_padded``, else real ones) for ``state.num_input_tokens_seen``.

    Args:
        packed (`list[PackedRequest]`): the forward's decisions.
        padded_tokens (`int`): the tokens of its (padded) batches.
        count_padded (`bool`): count padding (``include_num_input_tokens_seen="all"``).
    """
    real = sum(len(p) for p in packed)
    return {
        "tokens/per_decision": (float(real), float(len(packed))),
        "tokens/padding_fraction": (1.0 - real / max(padded_tokens, 1), 1.0),
        "tokens/counted": (float(padded_tokens if count_padded else real), 1.0),
    }


STATE_EXCERPT = 200  # characters of the state text in a logged prompt


def decision_entries(inputs: dict, env_names: list[str], tokenizer) -> list[tuple[str, str, float, float, str]]:
    """``(prompt, completion, reward, advantage, env)`` of every action that trains in loss inputs: each real sample,
    or every legal action of a row trained by all its actions (``all_actions_rows``), with its expected reward and
    its ``action_advantages`` entry (its log-prob step under a step-target ``dense_update``, the default included;
    its advantage under ``"all_actions"``).

    Args:
        inputs (`dict`): loss inputs (see `alea_trl.trainer.rollout.rows.rows_to_inputs`).
        env_names (`list[str]`): env index -> name.
        tokenizer: decodes the state tokens.
    """
    entries = []
    mask, actions = inputs["sample_mask"].tolist(), inputs["actions"].tolist()
    values, advantages = inputs["values"].tolist(), inputs["advantages"].tolist()
    every_action = inputs["all_actions_rows"].tolist()
    action_values, action_advantages = inputs["action_values"].tolist(), inputs["action_advantages"].tolist()
    for i, (packed, env) in enumerate(zip(inputs["packed"], inputs["env_index"].tolist())):
        if not any(mask[i]):
            continue
        name = env_names[env]
        state = tokenizer.decode(packed.input_ids[: min(packed.n_state_tokens, STATE_EXCERPT)])
        prompt = f"{name}: {state.strip()[:STATE_EXCERPT]}"
        options = next(q for q in packed.questions if q.qid == ACT_QID).options
        if every_action[i]:  # every legal action trains by its own step or advantage; the samples only advance
            for a, option in enumerate(options):
                entries.append((prompt, str(option), action_values[i][a], action_advantages[i][a], name))
            continue
        for j, real in enumerate(mask[i]):
            if real:
                entries.append((prompt, str(options[actions[i][j]]), values[i][j], advantages[i][j], name))
    return entries


def completion_logs(args) -> dict:
    """TRL's ``_logs`` (the completion table ``GRPOTrainer.log`` writes), sized to one generation batch of actions."""
    n = args.generation_batch_size * max([args.num_generations, *args.num_generations_per_env.values()])
    return {
        "images": deque(maxlen=n),
        "prompt": deque(maxlen=n),
        "completion": deque(maxlen=n),
        "rewards": defaultdict(lambda: deque(maxlen=n)),
        "advantages": deque(maxlen=n),
        "extra": defaultdict(lambda: deque(maxlen=n)),
    }


__all__ = [
    "decision_entries",
    "gathered_means",
    "loss_sums",
    "rollout_sums",
    "staleness_sums",
    "stop_if_not_finite",
    "token_sums",
    "completion_logs",
]
