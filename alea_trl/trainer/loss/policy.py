"""The policy loss over sampled actions (:func:`policy_loss`), with TRL's ``loss_type`` formulas: the per-sample term
of each loss, its normalisation, and the off-policy mask. One sampled action stands in the place of one completion (a
one-token sequence).

Design decisions:
1. The per-sample terms are ``GRPOTrainer._compute_loss``'s, with ``r = exp(logp - old_logp)`` and ``A`` the sample's
   advantage: the clipping losses (grpo, bnpo, dr_grpo, dapo, luspo) ``-min(r' A, clip(r, 1 - eps_low, 1 + eps_high)
   A)`` with ``r'`` = ``r`` capped at ``delta`` when set; cispo ``-min(r, eps_high).detach() A logp``; sapo
   ``-sigmoid(t (r - 1)) 4 / t A`` with ``t`` the temperature of the advantage's sign; vespo ``-phi(r) A logp`` with
   TRL's gamma weight ``phi`` (``GRPOTrainer.get_gamma_weights``, called with one sample per row).
2. Normalisation: one decision (a row of the micro-batch) stands where TRL has one completion sequence, and one
   sampled action where TRL has one completion token, so TRL's formulas apply with rows for sequences and samples for
   tokens. ``N`` is the number of rows of the micro-batch (every decision it answers, whether or not its action trains
   now: a fresh outcome decision that waits for its episode's end trains later, as a replay) and is the same in every
   micro-batch of a run, as TRL's sequences per micro-batch are. grpo and sapo take each row's mean over its real
   samples and sum the rows divided by ``N`` (TRL: the mean over sequences of each sequence's token mean): every
   decision weighs ``1 / N`` whatever its number of samples and whatever shares its micro-batch; luspo sums each row's
   samples and divides by ``N``; bnpo divides the sum by the real samples of the micro-batch (TRL: its tokens);
   dr_grpo divides the sum by the constant ``N x k`` (TRL: ``B x max_completion_length``), so a replayed outcome
   decision with one action weighs 1/k of a decision with k; dapo, cispo and vespo divide the sum by the real samples
   of the micro-batch summed over all processes, divided by their number (TRL counts the tokens of the whole
   generation batch; here actions can be sampled in the loss forward itself, so the count is the micro-batch's). An
   outcome env's row is multiplied by ``outcome_weight``, a dense env's by 1: at weight 1 a dense and an outcome
   decision of equal advantages pull equally.
3. The off-policy mask (DeepSeek-V3.2, TRL's ``get_off_policy_mask``, ``off_policy_mask_threshold``) keeps a sample
   unless its advantage is negative and ``old_logp - logp`` exceeds the threshold; masks zero terms, they do not
   change the normalisers (as TRL).

Entropy of the act distribution: the high-entropy sample mask (``top_entropy_quantile``), the entropy bonus
(``entropy_coef``) and its adaptive controller (``use_adaptive_entropy``, run by the trainer).
4. A decision's entropy is that of its act distribution over its legal actions at ``temperature``,
   ``-sum_a p(a) log p(a)``; every sample of the decision carries it (TRL's per-token entropy, one token per sample).
5. ``top_entropy_quantile`` (TRL's ``get_high_entropy_mask``, "Beyond the 80/20 rule"): the threshold is the
   ``1 - rho`` quantile of the entropies of all processes' real samples of the micro-batch; samples below it leave
   the policy loss (and the bonus). It is a gather: every process calls it once per micro-batch.
6. The bonus is ``-coef x`` the mean entropy of the decisions whose actions train in the forward (those kept by the
   entropy mask), gradient through the policy's act distribution.
7. The adaptive controller is TRL's (Skywork-OR1) on TRL's own trainer attributes (``entropy_coef``,
   ``_last_world_entropy``, ``_entropy_window_stats``, ``_entropy_bonus_enabled``), so ``GRPOTrainer``'s checkpoint
   save and resume of its state covers it: the coefficient applies while the last optimizer step's entropy of all
   processes is at most ``entropy_target``, and moves by ``entropy_coef_delta`` towards more bonus below the target
   and less above it, within ``[entropy_coef_min, entropy_coef_max]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from trl import GRPOTrainer


CLIPPING_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
GLOBAL_COUNT_LOSSES = ("dapo", "cispo", "vespo")  # normalised by the real samples of all processes


_PAD = -1e9  # the padding of gathered 1-D tensors: below any value gathered (entropies are >= 0)


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass
class Collectives:
    """The cross-process operations the loss needs; on one process they return their input.

    Attributes:
        sum (`Callable`): a tensor summed over processes (every process calls it with the same shape).
        gather (`Callable`): a 1-D tensor of each process (values > -1e9), concatenated (lengths may differ).
        num_processes (`int`): how many processes train.
    """

    sum: Callable[[torch.Tensor], torch.Tensor] = _same
    gather: Callable[[torch.Tensor], torch.Tensor] = _same
    num_processes: int = 1

    @classmethod
    def of(cls, accelerator) -> Collectives:
        """The collectives of ``accelerator``'s processes (padded to one length and gathered, as TRL's
        ``get_high_entropy_mask`` gathers entropies)."""
        if accelerator.num_processes == 1:
            return cls()

        def gather(values: torch.Tensor) -> torch.Tensor:
            everyone = accelerator.gather(accelerator.pad_across_processes(values, dim=0, pad_index=_PAD))
            return everyone[everyone != _PAD]

        return cls(lambda t: accelerator.reduce(t, reduction="sum"), gather, accelerator.num_processes)


@dataclass
class PolicyObjective:
    """The ``GRPOConfig`` fields that shape the policy loss (their defaults are GRPOConfig's; ``loss_type`` defaults
    to ``"grpo"``, the mean over samples)."""

    loss_type: str = "grpo"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    off_policy_mask_threshold: float | None = None
    top_entropy_quantile: float = 1.0

    @classmethod
    def from_args(cls, args) -> PolicyObjective:
        """The objective an ``AleaEnvGRPOConfig`` asks for."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def per_sample_loss(
    objective: PolicyObjective,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's policy term under ``objective.loss_type`` (see the module docstring), and which samples the loss
    clipped (the clipping losses: the clip removed the gradient; cispo: the weight was capped with ``A > 0``, TRL's
    ``cispo_clip_ratio``; sapo and vespo never clip).

    Args:
        objective (`PolicyObjective`): the loss type and its settings.
        logp, old_logp, advantages (`torch.Tensor` of shape `(N, k)`): current and behaviour log-probs of the sampled
            actions and their advantages.
        epsilon_low, epsilon_high (`float`): the clip range (cispo: ``epsilon_high`` caps its weight).
        delta (`float`, *optional*): the cap of the unclipped ratio (clipping losses only).

    Returns:
        `(torch.Tensor, torch.Tensor)`: the terms `(N, k)` and the clipped mask `(N, k)` (no gradient).
    """
    loss_type = objective.loss_type
    ratio = torch.exp(logp - old_logp)
    if loss_type in CLIPPING_LOSSES:
        capped = ratio if delta is None else torch.clamp(ratio, max=delta)
        pg_loss1 = -advantages * capped
        pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
        return torch.max(pg_loss1, pg_loss2), (pg_loss2 > pg_loss1).detach()
    if loss_type == "cispo":
        weight = torch.clamp(ratio, max=epsilon_high).detach()
        return -weight * advantages * logp, ((ratio > epsilon_high) & (advantages > 0)).detach()
    no_clip = torch.zeros_like(logp, dtype=torch.bool)
    if loss_type == "sapo":
        t = torch.where(advantages > 0, objective.sapo_temperature_pos, objective.sapo_temperature_neg)
        return -torch.sigmoid(t * (ratio - 1)) * 4 / t * advantages, no_clip
    if loss_type == "vespo":
        phi = GRPOTrainer.get_gamma_weights(
            advantages=advantages.reshape(-1, 1),
            log_ratio_per_token=(logp - old_logp).reshape(-1, 1),
            mask=torch.ones_like(logp).reshape(-1, 1),
            importance_sampling_ratio=None,
            k_pos=objective.vespo_k_pos,
            lambda_pos=objective.vespo_lambda_pos,
            k_neg=objective.vespo_k_neg,
            lambda_neg=objective.vespo_lambda_neg,
        ).reshape(logp.shape)
        return -phi * advantages * logp, no_clip
    raise ValueError(f"per_sample_loss: field 'loss_type': unknown {loss_type!r}")


def off_policy_keep(
    advantages: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, sample_mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """TRL's off-policy sequence mask per sample, `(N, k)` float: 1 where ``A >= 0`` or ``old_logp - logp <= threshold``
    (the behaviour policy's log-prob of the action is not much above the current one's), else 0."""
    keep = GRPOTrainer.get_off_policy_mask(
        advantages=advantages.reshape(-1, 1),
        per_token_logps=logp.reshape(-1, 1),
        sampling_per_token_logps=old_logp.reshape(-1, 1),
        mask=sample_mask.reshape(-1, 1).float(),
        off_policy_threshold=threshold,
    )
    return keep.reshape(logp.shape)


def decision_normaliser(
    loss_type: str, sample_mask: torch.Tensor, collectives: Collectives
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """How ``loss_type`` normalises the weighted policy terms of a micro-batch (see the module docstring).

    Args:
        loss_type (`str`): the loss type.
        sample_mask (`torch.Tensor` of shape `(N, k)`): the real samples of the micro-batch's ``N`` rows.
        collectives (`Collectives`): the cross-process sum (dapo, cispo, vespo: one call on every process, once per
            micro-batch, whether or not the process holds samples).

    Returns:
        `(torch.Tensor | None, torch.Tensor)`: the per-row divisor of each row's sum over its samples (`(N,)`, ``None``
        for a plain sum), and the divisor of the sum over rows (a scalar).
    """
    n_rows, k = sample_mask.shape
    rows = torch.tensor(float(max(n_rows, 1)), device=sample_mask.device)
    if loss_type in ("grpo", "sapo"):
        return sample_mask.sum(-1).clamp(min=1).float(), rows
    if loss_type == "luspo":
        return None, rows
    if loss_type == "bnpo":
        return None, sample_mask.sum().clamp(min=1).float()
    if loss_type == "dr_grpo":
        return None, rows * k
    if loss_type in GLOBAL_COUNT_LOSSES:
        total = collectives.sum(sample_mask.sum().float().reshape(1))[0]
        return None, total.clamp(min=1.0) / collectives.num_processes
    raise ValueError(f"decision_normaliser: field 'loss_type': unknown {loss_type!r}")


@dataclass
class PolicyStats:
    """Diagnostics of the policy loss (no gradient).

    Attributes:
        clip_ratio (`torch.Tensor`): share of real samples whose gradient the clip removed (cispo: whose weight was
            capped with a positive advantage; sapo and vespo do not clip: 0).
        clip_ratio_outcome (`torch.Tensor`): the same over the outcome envs' samples (0 when there is none).
        approx_kl (`torch.Tensor`): ``mean((r - 1) - log r)`` over real samples, an estimate of KL(old || new)
            (Schulman, "Approximating KL divergence", 2020).
        n_outcome (`float`): outcome samples in the batch.
        n_samples (`torch.Tensor`): real samples in the batch (the denominator of ``clip_ratio`` and ``approx_kl``).
        ratio_outcome (`torch.Tensor`, *optional*): the importance ratios ``r`` of the outcome envs' real samples
            (replays, whose behaviour policy may be several steps old, and branched decisions), `(n_outcome,)`.
    """

    clip_ratio: torch.Tensor
    clip_ratio_outcome: torch.Tensor
    approx_kl: torch.Tensor
    n_outcome: float
    n_samples: torch.Tensor | None = None
    ratio_outcome: torch.Tensor | None = None


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
    *,
    objective: PolicyObjective | None = None,
    keep: torch.Tensor | None = None,
    collectives: Collectives | None = None,
) -> tuple[torch.Tensor, PolicyStats]:
    """Policy loss over sampled actions: one decision, one weight.

    A dense decision carries k samples and an outcome decision one (or k when branched). Under the default loss
    (``"grpo"``) each decision's term is the mean over its samples and the terms are summed and divided by the rows of
    the micro-batch, an outcome env's term times ``outcome_weight``: a decision's weight does not depend on its
    number of samples, on what shares its micro-batch or on the batch order (the other loss types: see the module
    docstring and :func:`decision_normaliser`).

    Args:
        logp, old_logp, advantages (`torch.Tensor` of shape `(N, k)`): current and behaviour log-probs of the sampled
            actions, and their advantages.
        sample_mask (`torch.Tensor` of shape `(N, k)`): which samples are real.
        epsilon_low, epsilon_high (`float`): the ratio clip range.
        delta (`float`, *optional*): TRL's two-sided clip: the unclipped ratio is capped at ``delta``, which bounds the
            loss of a sample with a negative advantage whose ratio grew large (a stale replay).
        outcome_rows (`torch.Tensor` of shape `(N,)`, *optional*): which rows belong to outcome envs (default: none).
        outcome_weight (`float`): weight of an outcome env's decision relative to a dense env's.
        objective (`PolicyObjective`, *optional*): ``loss_type`` and its settings, and the off-policy mask threshold
            (default: ``"grpo"``, no mask).
        keep (`torch.Tensor` of shape `(N, k)`, *optional*): samples whose terms count (the others' are zeroed, the
            normalisers unchanged, as TRL's masks); e.g. the high-entropy samples.
        collectives (`Collectives`, *optional*): cross-process operations (the global sample counts of dapo, cispo
            and vespo); default: one process.
    """
    objective = objective or PolicyObjective()
    pg_loss, clipped = per_sample_loss(objective, logp, old_logp, advantages, epsilon_low, epsilon_high, delta)
    if objective.off_policy_mask_threshold is not None:
        pg_loss = pg_loss * off_policy_keep(
            advantages, logp, old_logp, sample_mask, objective.off_policy_mask_threshold
        )
    if keep is not None:
        pg_loss = pg_loss * keep
    outcome_rows = torch.zeros_like(sample_mask[:, 0]) if outcome_rows is None else outcome_rows
    outcome = outcome_rows[:, None].expand_as(sample_mask)
    row_weight = torch.where(outcome_rows, outcome_weight, 1.0).to(pg_loss.dtype)  # (N,)
    per_row, total = decision_normaliser(objective.loss_type, sample_mask, collectives or Collectives())
    row_sums = (pg_loss * sample_mask).sum(-1)  # (N,)
    if per_row is not None:
        row_sums = row_sums / per_row
    loss = (row_weight * row_sums).sum() / total
    with torch.no_grad():
        clipped = clipped & sample_mask
        n_real, n_outcome = sample_mask.sum().clamp(min=1), (sample_mask & outcome).sum()
        log_ratio = (logp - old_logp).masked_fill(~sample_mask, 0.0)
        stats = PolicyStats(
            clip_ratio=clipped.float().sum() / n_real,
            clip_ratio_outcome=(clipped & outcome).float().sum() / n_outcome.clamp(min=1),
            approx_kl=((log_ratio.exp() - 1) - log_ratio).sum() / n_real,
            n_outcome=float(n_outcome),
            n_samples=sample_mask.sum(),
            ratio_outcome=log_ratio[sample_mask & outcome].exp(),
        )
    return loss, stats


def act_entropy(logp_all: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Each row's entropy ``-sum_a p(a) log p(a)`` over its legal actions, `(N,)`, from log-probs `(N, A)` that are
    ``-inf`` where not legal (differentiable: the illegal entries give no NaN gradient)."""
    logp = logp_all.masked_fill(~legal, 0.0)
    return -torch.where(legal, logp.exp() * logp, 0.0).sum(-1)


def high_entropy_samples(
    entropy: torch.Tensor, sample_mask: torch.Tensor, rho: float, gather: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """The real samples whose decision's entropy is at least the ``1 - rho`` quantile of all processes' real samples.

    Args:
        entropy (`torch.Tensor` of shape `(N,)`): each decision's entropy (no gradient needed).
        sample_mask (`torch.Tensor` of shape `(N, k)`): the real samples.
        rho (`float`): ``top_entropy_quantile``, the share of samples kept.
        gather (`Callable`): all processes' 1-D tensors concatenated (see `Collectives`).

    Returns:
        `torch.Tensor` of shape `(N, k)` (bool).
    """
    per_sample = entropy.detach().float()[:, None].expand_as(sample_mask)
    everyone = gather(per_sample[sample_mask])
    if everyone.numel() == 0:
        return torch.zeros_like(sample_mask)
    threshold = torch.quantile(everyone, 1.0 - rho)
    return (per_sample >= threshold) & sample_mask


__all__ = [
    "CLIPPING_LOSSES",
    "Collectives",
    "GLOBAL_COUNT_LOSSES",
    "PolicyObjective",
    "PolicyStats",
    "act_entropy",
    "decision_normaliser",
    "high_entropy_samples",
    "off_policy_keep",
    "per_sample_loss",
    "policy_loss",
]
