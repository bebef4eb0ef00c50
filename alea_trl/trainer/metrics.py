"""Training metrics: what the rollout and the loss record, as (sum, count) pairs reduced across processes.

Design decisions:
1. Every metric is a (sum, count) pair per process, and its global mean is ``sum of sums / sum of counts``: a process
   that saw no decision of an env does not pull that env's mean towards zero.
2. One gather per call, keys in the same (sorted) order on every process, so the processes never wait on different
   collectives.
3. The loss terms of a micro-batch are moved to the host in one device sync.
"""

from __future__ import annotations

import math

import torch

from ..questions import QTYPES
from .branching import FAILURE_CAUSES


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
    episodes advanced by the best of k), the regret and the entropy of the act distribution (means over decisions or
    episodes), and the totals of skipped decisions, env errors, branched decisions and their continuation decisions,
    and of the decisions whose branching failed (``branch/failed``, and by cause ``branch/failed/<cause>``) or hit
    ``branch_max_rounds`` (``branch/capped``)."""
    keys = [f"env/{e}/{m}" for e in env_names for m in ("return", "return_best_of_k", "regret", "entropy")]
    sums = {k: (sum(stats.get(k, [])), len(stats.get(k, []))) for k in keys}
    totals = ["skipped_decisions", "env_errors", "branch/decisions", "branch/continuation_decisions"]
    totals += ["branch/failed", *(f"branch/failed/{cause}" for cause in FAILURE_CAUSES), "branch/capped"]
    for total in totals:
        sums[total] = (sum(stats.get(total, [])), 1.0)
    return sums


def loss_sums(terms, env_index: torch.Tensor, env_names: list[str]) -> dict[str, tuple[float, float]]:
    """(sum, count) pairs of one forward's loss terms (one device sync): the policy, KL and report losses, the clip
    ratio (all samples, and ``clip_ratio/replay`` over the outcome envs' samples), ``approx_kl`` to the behaviour
    policy, the report loss per qtype and the KL per env.

    Args:
        terms (`LossTerms`): the loss's parts (see `alea_trl.trainer.loss.grpo_loss`).
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


__all__ = ["gathered_means", "loss_sums", "rollout_sums", "staleness_sums", "stop_if_not_finite", "token_sums"]
