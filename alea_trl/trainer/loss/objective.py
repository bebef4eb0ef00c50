"""The Alea GRPO objective: the clipped-ratio policy loss over sampled actions, the exact KL to the reference over
the legal options, and the proper-scoring report losses (the advantages it weighs are
:mod:`~alea_trl.trainer.rollout.advantages`'s). Pure
tensor functions, tested on hand-built tensors; the trainers and the benchmarks' unpacked loop call the same ones.

Design decisions:
1. One decision, one weight: every policy term (a decision's sampled actions, its all-actions or step-target term) and
   every KL term is summed over the decisions and divided by the rows of the micro-batch, ``N``, the same in every
   micro-batch; an outcome env's policy term is multiplied by ``outcome_loss_weight`` (see
   :func:`~alea_trl.trainer.loss.policy.policy_loss`). So a decision's pull does not depend on what shares its
   micro-batch, and at weight 1 a dense and an outcome decision of equal advantages pull equally.
2. One decision row holds up to k sampled actions (dense) or one replayed action (outcome); ``sample_mask`` marks the
   real ones. The default policy loss (``loss_type="grpo"``) is, per decision, the mean over its real samples of
   ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))`` with ``r = exp(logp - old_logp)`` (PPO/GRPO, Schulman et al.
   2017; Shao et al. 2024).
3. The other ``loss_type`` terms and normalisations, the off-policy mask, the high-entropy mask and the entropy bonus
   are TRL's, read over sampled actions (:mod:`~alea_trl.trainer.loss.policy`).
4. The KL is exact, ``sum_a p(a) (log p(a) - log p_ref(a))`` over the legal actions, not a sampled estimator; it is
   summed over the rows whose KL trains in this forward (``kl_report_mask``) and divided by ``N``. The dense rows of
   a step-target ``dense_update`` (the default ``"all_actions_ascent"``, or ``"mirror"``) take no KL term: their
   steps already hold it (:mod:`~alea_trl.trainer.loss.dense`).
5. Report losses are computed per question with the strictly proper rule of its qtype against the oracle target.
6. Every head takes part in every loss (at weight 0 when it has no term): DDP runs without searching for unused
   parameters.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from ...collate import PackedBatch
from ...losses import bernoulli_brier, choice_loss, crps_loss, pinball_loss
from ...questions import ACT_QID, QTYPES
from ..act import act_logits_of, fit_width
from .dense import STEP_TARGET_UPDATES, all_actions_loss, step_target_loss
from .policy import Collectives, PolicyObjective, PolicyStats, act_entropy, high_entropy_samples, policy_loss


# ---------------------------------------------------------------------------------------------------------- terms
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
        entropy_bonus (`tuple[torch.Tensor, torch.Tensor]`, *optional*): with an entropy bonus, the sum of the
            entropies it averaged and their number of decisions (no gradient; the adaptive controller's input).
    """

    policy: torch.Tensor
    kl: torch.Tensor
    report: torch.Tensor
    has_reports: bool
    policy_stats: PolicyStats
    reports: dict[str, list[torch.Tensor]]
    entropy_bonus: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(frozen=True)
class ObjectiveSettings:
    """The settings of :func:`grpo_loss` that stay fixed during a run.

    Attributes:
        temperature (`float`): the sampling temperature (the policy is ``softmax(logits / temperature)``).
        epsilon_low, epsilon_high (`float`): the ratio clip range.
        beta (`float`): weight of the KL term.
        report_w (`float`): weight of the report loss.
        taus (`tuple[float, ...]`): the regress head's quantile levels.
        delta (`float`, *optional*), outcome_weight (`float`): see :func:`~alea_trl.trainer.loss.policy.policy_loss`
            (the rows of outcome envs are ``inputs["outcome_rows"]``).
        dense_update (`str`): how the rows of ``inputs["all_actions_rows"]`` train:
            ``"all_actions"`` (:func:`~alea_trl.trainer.loss.dense.all_actions_loss`), ``"mirror"`` or
            ``"all_actions_ascent"`` (:func:`~alea_trl.trainer.loss.dense.step_target_loss`, whose steps hold the
            reference term: those rows take no separate ``beta`` x KL and no ratio clip). It must be the update the
            rows were made under (their ``action_advantages`` are advantages or steps), so it has no default;
            :meth:`from_args` passes the config's.
        policy (`PolicyObjective`): ``loss_type`` and its settings, the off-policy mask threshold and
            ``top_entropy_quantile``.
    """

    temperature: float
    epsilon_low: float
    epsilon_high: float
    beta: float
    report_w: float
    taus: tuple[float, ...]
    dense_update: str
    delta: float | None = None
    outcome_weight: float = 1.0
    policy: PolicyObjective = field(default_factory=PolicyObjective)

    @classmethod
    def from_args(cls, args, taus, epsilon_low: float, epsilon_high: float) -> ObjectiveSettings:
        """The settings of an ``AleaEnvGRPOConfig`` (the clip range as ``GRPOTrainer`` resolved it)."""
        return cls(
            temperature=args.temperature,
            epsilon_low=epsilon_low,
            epsilon_high=epsilon_high,
            beta=args.beta,
            report_w=args.report_w,
            taus=tuple(taus),
            delta=args.delta,
            outcome_weight=args.outcome_loss_weight,
            dense_update=args.dense_update,
            policy=PolicyObjective.from_args(args),
        )


def grpo_loss(
    output,
    batch: PackedBatch,
    inputs: dict,
    settings: ObjectiveSettings,
    *,
    entropy_coef: float | None = None,
    collectives: Collectives | None = None,
) -> tuple[torch.Tensor, LossTerms]:
    """The whole objective of one forward: policy loss (- ``entropy_coef`` x the act entropy) + ``beta`` x exact KL +
    ``report_w`` x report loss.

    Args:
        output (`AleaOutput`): the model's outputs for ``batch`` (with autograd).
        batch (`PackedBatch`): the decisions (only their ``questions`` are read).
        inputs (`dict`): the loss inputs of the rows (see :func:`~alea_trl.trainer.rollout.rows.rows_to_inputs`):
            ``actions``, ``sample_mask``, ``old_logps``, ``advantages`` `(N, k)`; ``kl_report_mask`` `(N,)`;
            ``ref_logps`` `(N, A)`; ``targets`` (one dict per row).
        settings (`ObjectiveSettings`): temperature, clip range, weights and the update of each kind of row.
        entropy_coef (`float`, *optional*): weight of the entropy bonus, the mean act entropy of the decisions whose
            actions train here (and pass the high-entropy mask); ``None``: no bonus.
        collectives (`Collectives`, *optional*): cross-process operations (global sample counts, the entropy
            quantile); every process must call this function once per micro-batch. Default: one process.

    Returns:
        `(torch.Tensor, LossTerms)`: the loss and its parts.
    """
    temperature, epsilon_low, epsilon_high = settings.temperature, settings.epsilon_low, settings.epsilon_high
    beta, report_w, taus, dense_update = settings.beta, settings.report_w, settings.taus, settings.dense_update
    objective = settings.policy
    device = output.choice_logits.device
    act_logits, legal = act_logits_of(output.choice_logits, batch)  # (N, A)
    logp_all = torch.log_softmax(act_logits.float() / temperature, -1)  # (N, A)
    logp = logp_all.gather(1, inputs["actions"].to(device))  # (N, k)
    old_logp, advantages = inputs["old_logps"].to(device), inputs["advantages"].to(device)
    sample_mask, outcome_rows = inputs["sample_mask"].to(device), inputs["outcome_rows"].to(device)
    all_rows = inputs["all_actions_rows"].to(device) if "all_actions_rows" in inputs else None
    if all_rows is not None:  # dense_update other than "sampled": these rows' act trains by every legal action
        sample_mask = sample_mask & ~all_rows[:, None]
    collectives = collectives or Collectives()
    entropy = act_entropy(logp_all, legal) if entropy_coef is not None or objective.top_entropy_quantile < 1 else None
    keep = None
    if objective.top_entropy_quantile < 1.0:
        keep = high_entropy_samples(entropy, sample_mask, objective.top_entropy_quantile, collectives.gather)
    pg_loss, stats = policy_loss(
        logp, old_logp, advantages, sample_mask, epsilon_low, epsilon_high, settings.delta, outcome_rows,
        settings.outcome_weight,
        objective=objective, keep=keep, collectives=collectives,
    )  # fmt: skip
    target_rows = all_rows if all_rows is not None and dense_update in STEP_TARGET_UPDATES else None
    if target_rows is not None and bool(target_rows.any()):
        dense_loss, kl_sum = step_target_loss(
            logp_all, inputs["old_logps_all"].to(device), inputs["action_advantages"].to(device), legal, target_rows
        )
        n_clipped = torch.zeros((), device=device)  # the loss stops at its target: nothing to clip
        pg_loss, stats = pg_loss + dense_loss, with_all_actions(stats, n_clipped, (legal & all_rows[:, None]).sum(),
                                                               kl_sum, all_rows.sum())  # fmt: skip
    elif all_rows is not None and bool(all_rows.any()):
        dense_loss, n_clipped, kl_sum = all_actions_loss(
            logp_all, inputs["old_logps_all"].to(device), inputs["action_advantages"].to(device), legal, all_rows,
            epsilon_low, epsilon_high,
        )  # fmt: skip
        pg_loss, stats = pg_loss + dense_loss, with_all_actions(stats, n_clipped, (legal & all_rows[:, None]).sum(),
                                                               kl_sum, all_rows.sum())  # fmt: skip
    loss, bonus = pg_loss, None
    if entropy_coef is not None:
        rows = (sample_mask if keep is None else keep).any(-1)  # decisions whose actions train here
        rows = (rows if all_rows is None else rows | all_rows).float()
        bonus = ((entropy.detach() * rows).sum(), rows.sum())
        loss = loss - entropy_coef * (entropy * rows).sum() / rows.sum().clamp(min=1.0)
    kl_report_mask = inputs["kl_report_mask"].to(device)  # (N,): rows whose KL and reports train here
    kl = torch.zeros(len(inputs["packed"]), device=device)  # (N,)
    if beta != 0.0:
        ref_logp = fit_width(inputs["ref_logps"].to(device), logp_all.shape[-1])  # (N, A)
        kl = exact_kl(logp_all, ref_logp, legal) * kl_report_mask
        kl_mask = kl_report_mask if target_rows is None else kl_report_mask * ~target_rows  # folded into the steps
        loss = loss + beta * (kl * kl_mask).sum() / max(len(kl_mask), 1)  # one decision, one weight (as the policy)
    reports = report_losses(output, batch, inputs["targets"], taus)
    report_loss, has_reports = mean_report_loss(reports, device)
    loss = loss + report_w * report_loss
    # every head takes part in every step (DDP without find_unused_parameters): zero-weight touch
    touch = output.option_logits.sum() + output.noul_logits.sum() + output.quantiles.sum()
    touch = touch + output.score_logits.masked_fill(~torch.isfinite(output.score_logits), 0.0).sum()
    loss = loss + 0.0 * touch
    return loss, LossTerms(pg_loss, kl, report_loss, has_reports, stats, reports, bonus)


def with_all_actions(stats: PolicyStats, n_clipped, n_terms, kl_sum, n_rows) -> PolicyStats:
    """``stats`` of the sampled actions merged with those of the decisions trained over every legal action:
    ``clip_ratio`` over all the terms (samples, and each such decision's legal actions; the step-target updates clip
    none), ``approx_kl`` over the samples and decisions (such a decision gives its exact KL(behaviour || current))."""
    n_samples = stats.n_samples.float()
    return PolicyStats(
        clip_ratio=(stats.clip_ratio * n_samples.clamp(min=1) + n_clipped) / (n_samples + n_terms).clamp(min=1),
        clip_ratio_outcome=stats.clip_ratio_outcome,
        approx_kl=(stats.approx_kl * n_samples.clamp(min=1) + kl_sum) / (n_samples + n_rows).clamp(min=1),
        n_outcome=stats.n_outcome,
        n_samples=stats.n_samples,
        ratio_outcome=stats.ratio_outcome,
    )


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
    act_logits, _ = act_logits_of(output.choice_logits, batch)  # (N, A)
    act_t = torch.nn.utils.rnn.pad_sequence([t.float().to(act_logits.device) for t in act_targets], batch_first=True)
    if act_t.shape[-1] > act_logits.shape[-1]:
        raise ValueError(
            f"supervised_loss: field 'act_targets': a target has {act_t.shape[-1]} entries, more than the "
            f"{act_logits.shape[-1]} legal actions of the widest decision"
        )
    act_loss = choice_loss(act_logits, fit_width(act_t, act_logits.shape[-1]))
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
    "ObjectiveSettings",
    "exact_kl",
    "grpo_loss",
    "policy_loss",
    "mean_report_loss",
    "report_losses",
    "supervised_loss",
]
