"""The Alea GRPO loss: clipped-ratio policy gradient over sampled actions, exact KL to the reference over the legal
options, and proper-scoring report losses. Pure tensor functions, tested on hand-built tensors.

Design decisions:
1. One decision row holds up to k sampled actions (dense) or one replayed action (outcome); ``sample_mask`` marks the
   real ones. The policy loss is the mean over real samples of ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))`` with
   ``r = exp(logp - old_logp)`` (PPO/GRPO, Schulman et al. 2017; Shao et al. 2024).
2. With one action per sample, TRL's loss types (grpo, dapo, dr_grpo, bnpo) coincide up to a constant; the mean over
   samples is used.
3. The KL is exact, ``sum_a p(a) (log p(a) - log p_ref(a))`` over the legal actions, not a sampled estimator.
4. Report losses are computed per question with the strictly proper rule of its qtype against the oracle target.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from ..losses import bernoulli_brier, choice_loss, crps_loss, pinball_loss
from ..packing import PackedBatch
from ..questions import ACT_QID, QTYPES


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    sample_mask: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped-ratio policy loss and the fraction of samples whose ratio was clipped.

    Args:
        logp, old_logp, advantages (`torch.Tensor` of shape `(N, k)`): current and behaviour log-probs of the sampled
            actions, and their advantages.
        sample_mask (`torch.Tensor` of shape `(N, k)`): which samples are real.
    """
    mask = sample_mask.float()
    ratio = torch.exp(logp - old_logp)  # (N, k)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    pg_loss = torch.max(pg_loss1, pg_loss2)  # (N, k)
    denom = mask.sum().clamp(min=1.0)
    with torch.no_grad():  # the share of samples whose gradient the clip removed
        clipped = ((pg_loss2 > pg_loss1) & sample_mask).float().sum() / denom
    return (pg_loss * mask).sum() / denom, clipped


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


__all__ = ["act_logits_of", "exact_kl", "policy_loss", "report_losses"]
