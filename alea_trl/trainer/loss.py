"""The Alea GRPO objective: the clipped-ratio policy loss over sampled actions, the exact KL to the reference over
the legal options, and the proper-scoring report losses (the advantages it weighs are ``advantages.py``'s). Pure
tensor functions, tested on hand-built tensors; the trainers and the benchmarks' unpacked loop call the same ones.

Design decisions:
1. The dense envs' samples and the outcome envs' samples are averaged separately (see :func:`policy_loss`).
2. One decision row holds up to k sampled actions (dense) or one replayed action (outcome); ``sample_mask`` marks the
   real ones. The policy loss is the mean over real samples of ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))`` with
   ``r = exp(logp - old_logp)`` (PPO/GRPO, Schulman et al. 2017; Shao et al. 2024).
3. With one action per sample, TRL's loss types (grpo, dapo, dr_grpo, bnpo) coincide up to a constant; the mean over
   samples is used.
4. The KL is exact, ``sum_a p(a) (log p(a) - log p_ref(a))`` over the legal actions, not a sampled estimator; it is a
   mean over the rows whose KL trains in this forward (``kl_report_mask``).
5. Report losses are computed per question with the strictly proper rule of its qtype against the oracle target.
6. Every head takes part in every loss (at weight 0 when it has no term): DDP runs without searching for unused
   parameters.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..collate import PackedBatch
from ..losses import bernoulli_brier, choice_loss, crps_loss, pinball_loss
from ..questions import ACT_QID, QTYPES


# ---------------------------------------------------------------------------------------------------------- terms
@dataclass
class PolicyStats:
    """Diagnostics of the policy loss (no gradient).

    Attributes:
        clip_ratio (`torch.Tensor`): share of real samples whose gradient the clip removed.
        clip_ratio_outcome (`torch.Tensor`): the same over the outcome envs' samples (0 when there is none).
        approx_kl (`torch.Tensor`): ``mean((r - 1) - log r)`` over real samples, an estimate of KL(old || new)
            (Schulman, "Approximating KL divergence", 2020).
        n_outcome (`float`): outcome samples in the batch.
    """

    clip_ratio: torch.Tensor
    clip_ratio_outcome: torch.Tensor
    approx_kl: torch.Tensor
    n_outcome: float


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    sample_mask: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
    outcome_rows: torch.Tensor | None = None,
    outcome_weight: float = 1.0,
) -> tuple[torch.Tensor, PolicyStats]:
    """Clipped-ratio policy loss, with the dense envs' and the outcome envs' samples averaged separately.

    A dense decision carries k samples and an outcome decision one (or k when branched), so one mean over all samples
    would give the outcome envs a share that depends on k and on the batch mix. Each kind's samples are averaged on
    their own and the two means added, the outcome mean weighted by ``outcome_weight``: a kind's gradient scale does
    not depend on whether the other kind is in the batch.

    Args:
        logp, old_logp, advantages (`torch.Tensor` of shape `(N, k)`): current and behaviour log-probs of the sampled
            actions, and their advantages.
        sample_mask (`torch.Tensor` of shape `(N, k)`): which samples are real.
        epsilon_low, epsilon_high (`float`): the ratio clip range.
        delta (`float`, *optional*): TRL's two-sided clip: the unclipped ratio is capped at ``delta``, which bounds the
            loss of a sample with a negative advantage whose ratio grew large (a stale replay).
        outcome_rows (`torch.Tensor` of shape `(N,)`, *optional*): which rows belong to outcome envs (default: none).
        outcome_weight (`float`): weight of the outcome envs' mean.
    """
    ratio = torch.exp(logp - old_logp)  # (N, k)
    capped = ratio if delta is None else torch.clamp(ratio, max=delta)
    pg_loss1 = -advantages * capped
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    pg_loss = torch.max(pg_loss1, pg_loss2)  # (N, k)
    outcome = torch.zeros_like(sample_mask) if outcome_rows is None else outcome_rows[:, None].expand_as(sample_mask)
    loss = pg_loss.new_zeros(())
    for kind, weight in ((sample_mask & ~outcome, 1.0), (sample_mask & outcome, outcome_weight)):
        if outcome_rows is None or kind.any():
            mask = kind.float()
            loss = loss + weight * (pg_loss * mask).sum() / mask.sum().clamp(min=1.0)
    with torch.no_grad():
        clipped = (pg_loss2 > pg_loss1) & sample_mask
        n_real, n_outcome = sample_mask.sum().clamp(min=1), (sample_mask & outcome).sum()
        log_ratio = (logp - old_logp).masked_fill(~sample_mask, 0.0)
        stats = PolicyStats(
            clip_ratio=clipped.float().sum() / n_real,
            clip_ratio_outcome=(clipped & outcome).float().sum() / n_outcome.clamp(min=1),
            approx_kl=((log_ratio.exp() - 1) - log_ratio).sum() / n_real,
            n_outcome=float(n_outcome),
        )
    return loss, stats


def exact_kl(logp: torch.Tensor, ref_logp: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """``sum_a p(a) (log p(a) - log p_ref(a))`` over the legal actions of each row.

    Args:
        logp, ref_logp (`torch.Tensor` of shape `(N, A)`): log-probs (any value where not legal).
        legal (`torch.Tensor` of shape `(N, A)`): which actions are legal.
    Returns:
        `torch.Tensor` of shape `(N,)`.
    """
    diff = torch.where(legal, logp - ref_logp, torch.zeros_like(logp))
    p = torch.where(legal, logp.exp(), torch.zeros_like(logp))
    return (p * diff).sum(-1)


def report_losses(output, batch: PackedBatch, targets: list[dict], taus) -> dict[str, list[torch.Tensor]]:
    """Per-qtype lists of per-question losses of every report question that has a target.

    Questions of one qtype whose answers and targets have the same shape are scored in one call of the proper
    scoring rule (``reduction="none"``), so a batch costs a few calls, not one per question.

    Args:
        output (`AleaOutput`): the model's outputs for ``batch``.
        batch (`PackedBatch`): the packed decisions.
        targets (`list[dict]`): per decision, the validated oracle targets (qid -> normal form).
        taus (`Sequence[float]`): the regress head's quantile levels.
    """
    device = output.noul_logits.device
    groups: dict[tuple, list[tuple[int, object]]] = defaultdict(list)  # (qtype, shape) -> [(flat index, target)]
    flat = 0
    for questions, tgt in zip(batch.questions, targets):
        for q in questions:
            if q.qid != ACT_QID and q.qid in tgt:
                t = tgt[q.qid]
                shape = np.shape(t)
                if q.qtype == "choice":
                    key = ("choice", len(q.options), shape)
                elif q.qtype == "score":
                    key = ("score", q.n_bins, shape)
                else:
                    key = (q.qtype, shape)
                groups[key].append((flat, t))
            flat += 1
    scored: dict[str, list[tuple[int, torch.Tensor]]] = {q: [] for q in QTYPES}
    for key, items in groups.items():
        flat_rows = [i for i, _ in items]
        rows = torch.tensor(flat_rows, device=device)
        qtype = key[0]
        if qtype in ("choice", "score"):
            target = torch.as_tensor(np.asarray([t for _, t in items]), device=device)
            logits = (output.choice_logits if qtype == "choice" else output.score_logits)[rows, : key[1]]
            rule = choice_loss if qtype == "choice" else crps_loss
            losses = rule(logits, target, reduction="none")
        elif qtype == "noul":
            target = torch.tensor([float(t) for _, t in items], device=device)
            losses = bernoulli_brier(output.noul_logits[rows], target, reduction="none")
        else:
            target = torch.as_tensor(np.asarray([t for _, t in items], dtype=np.float32), device=device)
            losses = pinball_loss(output.quantiles[rows], target, taus, reduction="none")
        scored[qtype] += zip(flat_rows, losses.unbind())
    return {q: [loss for _, loss in sorted(scored[q], key=lambda x: x[0])] for q in QTYPES}


def act_logits_of(output, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The act question's option logits of every decision, `(N, A)` padded with ``-inf``, and the legal mask."""
    is_act = torch.tensor([q.qid == ACT_QID for qs in batch.questions for q in qs], device=output.choice_logits.device)
    logits = output.choice_logits[is_act]  # (N, A_max over all choice questions)
    legal = torch.isfinite(logits)
    width = int(legal.sum(-1).max())
    return logits[:, :width], legal[:, :width]


@dataclass
class LossTerms:
    """The parts of one forward's loss, for logging.

    Attributes:
        policy (`torch.Tensor`): the clipped policy loss (a scalar).
        kl (`torch.Tensor` of shape `(N,)`): each row's exact KL, 0 for rows whose KL does not train here.
        report (`torch.Tensor`): the mean report loss (0 when no report has a target).
        has_reports (`bool`): whether any report question had a target.
        policy_stats (`PolicyStats`): the clip ratios and the approximate KL to the behaviour policy.
        reports (`dict[str, list[torch.Tensor]]`): per qtype, the per-question report losses.
    """

    policy: torch.Tensor
    kl: torch.Tensor
    report: torch.Tensor
    has_reports: bool
    policy_stats: PolicyStats
    reports: dict[str, list[torch.Tensor]]


def _fit_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` `(N, W)` cut or zero-padded to `(N, width)`."""
    return x[:, :width] if x.shape[-1] >= width else F.pad(x, (0, width - x.shape[-1]))


def grpo_loss(
    output,
    batch: PackedBatch,
    inputs: dict,
    *,
    temperature: float,
    epsilon_low: float,
    epsilon_high: float,
    beta: float,
    report_w: float,
    taus: Sequence[float],
    delta: float | None = None,
    outcome_weight: float = 1.0,
) -> tuple[torch.Tensor, LossTerms]:
    """The whole objective of one forward: clipped policy loss + ``beta`` x exact KL + ``report_w`` x report loss.

    Args:
        output (`AleaOutput`): the model's outputs for ``batch`` (with autograd).
        batch (`PackedBatch`): the decisions (only their ``questions`` are read).
        inputs (`dict`): the loss inputs of the rows (see `alea_trl.trainer.loss_inputs.rows_to_inputs`):
            ``actions``, ``sample_mask``, ``old_logps``, ``advantages`` `(N, k)`; ``kl_report_mask`` `(N,)`;
            ``ref_logps`` `(N, A)`; ``targets`` (one dict per row).
        temperature (`float`): the sampling temperature (the policy is ``softmax(logits / temperature)``).
        epsilon_low, epsilon_high (`float`): the ratio clip range.
        beta (`float`): weight of the KL term.
        report_w (`float`): weight of the report loss.
        taus (`Sequence[float]`): the regress head's quantile levels.
        delta (`float`, *optional*), outcome_weight (`float`): see :func:`policy_loss` (the rows of outcome envs are
            ``inputs["outcome_rows"]``).

    Returns:
        `(torch.Tensor, LossTerms)`: the loss and its parts.
    """
    device = output.choice_logits.device
    act_logits, legal = act_logits_of(output, batch)  # (N, A)
    logp_all = torch.log_softmax(act_logits.float() / temperature, -1)  # (N, A)
    logp = logp_all.gather(1, inputs["actions"].to(device))  # (N, k)
    old_logp, advantages = inputs["old_logps"].to(device), inputs["advantages"].to(device)
    sample_mask, outcome_rows = inputs["sample_mask"].to(device), inputs["outcome_rows"].to(device)
    pg_loss, stats = policy_loss(
        logp, old_logp, advantages, sample_mask, epsilon_low, epsilon_high, delta, outcome_rows, outcome_weight
    )
    loss = pg_loss
    kl_report_mask = inputs["kl_report_mask"].to(device)  # (N,): rows whose KL and reports train here
    kl = torch.zeros(len(inputs["packed"]), device=device)  # (N,)
    if beta != 0.0:
        ref_logp = _fit_width(inputs["ref_logps"].to(device), logp_all.shape[-1])  # (N, A)
        kl = exact_kl(logp_all, ref_logp, legal) * kl_report_mask
        loss = loss + beta * kl.sum() / kl_report_mask.sum().clamp(min=1.0)
    reports = report_losses(output, batch, inputs["targets"], taus)
    report_loss, has_reports = mean_report_loss(reports, device)
    loss = loss + report_w * report_loss
    # every head takes part in every step (DDP without find_unused_parameters): zero-weight touch
    touch = output.option_logits.sum() + output.noul_logits.sum() + output.quantiles.sum()
    touch = touch + output.score_logits.masked_fill(~torch.isfinite(output.score_logits), 0.0).sum()
    loss = loss + 0.0 * touch
    return loss, LossTerms(pg_loss, kl, report_loss, has_reports, stats, reports)


def supervised_loss(
    output, batch: PackedBatch, act_targets: list[torch.Tensor], targets: list[dict], *, act_w, report_w, taus
) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[torch.Tensor]]]:
    """The supervised objective (the SFT warm start): ``act_w`` x log score of the act head against each decision's
    act target distribution + ``report_w`` x the report losses.

    Args:
        output (`AleaOutput`), batch (`PackedBatch`): the forward and its decisions.
        act_targets (`list[torch.Tensor]`): per decision, a distribution over its legal actions.
        targets (`list[dict]`): per decision, the validated report targets.
        act_w, report_w (`float`): the weights.
        taus (`Sequence[float]`): the regress head's quantile levels.

    Returns:
        `(torch.Tensor, torch.Tensor, dict)`: the loss, the act loss and the per-qtype report losses.
    """
    act_logits, _ = act_logits_of(output, batch)  # (N, A)
    act_t = torch.nn.utils.rnn.pad_sequence([t.float().to(act_logits.device) for t in act_targets], batch_first=True)
    if act_t.shape[-1] > act_logits.shape[-1]:
        raise ValueError(
            f"supervised_loss: field 'act_targets': a target has {act_t.shape[-1]} entries, more than the "
            f"{act_logits.shape[-1]} legal actions of the widest decision"
        )
    act_loss = choice_loss(act_logits, _fit_width(act_t, act_logits.shape[-1]))
    reports = report_losses(output, batch, targets, taus)
    report_loss, _ = mean_report_loss(reports, act_logits.device)
    return act_w * act_loss + report_w * report_loss, act_loss, reports


def mean_report_loss(reports: dict[str, list[torch.Tensor]], device) -> tuple[torch.Tensor, bool]:
    """The mean of all per-question report losses (0 when there is none), and whether there was any."""
    terms = [t for ts in reports.values() for t in ts]
    return (torch.stack(terms).mean() if terms else torch.zeros((), device=device)), bool(terms)


__all__ = [
    "LossTerms",
    "PolicyStats",
    "act_logits_of",
    "exact_kl",
    "grpo_loss",
    "policy_loss",
    "mean_report_loss",
    "report_losses",
    "supervised_loss",
]
