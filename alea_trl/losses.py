"""Strictly proper scoring rules for the four question types, batched with a leading batch dimension.

Design decisions:
1. Each rule is minimised in expectation by the true distribution: log score (choice), ranked probability score
   (score), Brier score (noul), pinball loss averaged over quantile levels (regress).
2. Targets are either a distribution (probability vector, probability, or a set of samples) or a realised outcome
   (index); a distribution target gives the expected loss over outcomes (up to a constant for RPS), so training on
   exact oracle targets has lower variance than training on sampled outcomes and the same minimiser.
3. Logits may be padded with ``-inf`` (options or bins a question does not have); targets are zero there and
   contribute nothing. Everything is computed in float32 and stays finite at logits of +-50 and one-hot targets.
4. Every function returns the batch mean, so callers can weight and add them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def _as_probs(target: torch.Tensor, n: int) -> torch.Tensor:
    if target.dim() == 1 and not torch.is_floating_point(target):
        return F.one_hot(target.long(), n).float()
    return target.float()


def _reduce(per_row: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return per_row.mean()
    if reduction == "none":
        return per_row
    raise ValueError(f"losses: field 'reduction': must be 'mean' or 'none', got {reduction!r}")


def choice_loss(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Log score (cross-entropy) of a categorical forecast.

    Args:
        logits (`torch.Tensor` of shape `(B, n)`): option logits (``-inf`` for padding).
        target (`torch.Tensor` of shape `(B, n)` probabilities, or `(B,)` indices).
        reduction (`str`, defaults to `"mean"`): `"mean"` over the batch, or `"none"` (one loss per row).

    Returns:
        `torch.Tensor`: the mean over the batch of ``-sum_i target_i * log softmax(logits)_i``.
    """
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, n)
    t = _as_probs(target, logits.shape[-1])  # (B, n)
    per_row = -torch.where(t > 0, t * logp, torch.zeros_like(logp)).sum(-1)  # (B,)
    return _reduce(per_row, reduction)


def crps_loss(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Ranked probability score (discrete CRPS) of an ordinal forecast.

    ``sum_k (F_k - G_k)^2 / (n - 1)`` over the cumulative distributions ``F`` (forecast) and ``G`` (target) of the
    first ``n - 1`` levels. For a target distribution this is the expected RPS over outcomes minus a term that does
    not depend on the forecast.

    Args:
        logits (`torch.Tensor` of shape `(B, n)`): level logits (``-inf`` for levels a question does not have).
        target (`torch.Tensor` of shape `(B, n)` probabilities, or `(B,)` indices).
        reduction (`str`, defaults to `"mean"`): `"mean"` over the batch, or `"none"` (one loss per row).
    """
    n = logits.shape[-1]
    probs = F.softmax(logits.float(), dim=-1)  # (B, n)
    t = _as_probs(target, n)  # (B, n)
    cdf_p = probs.cumsum(-1)[:, :-1]  # (B, n-1)
    cdf_t = t.cumsum(-1)[:, :-1]  # (B, n-1)
    return _reduce(((cdf_p - cdf_t) ** 2).sum(-1).div(max(n - 1, 1)), reduction)


def bernoulli_brier(logit: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Brier score ``(sigmoid(logit) - target)^2`` of a yes/no forecast.

    Args:
        logit (`torch.Tensor` of shape `(B,)`): the forecast's logit.
        target (`torch.Tensor` of shape `(B,)`): the probability (or outcome in {0, 1}) of "yes".
        reduction (`str`, defaults to `"mean"`): `"mean"` over the batch, or `"none"` (one loss per row).
    """
    p = torch.sigmoid(logit.float())  # (B,)
    return _reduce((p - target.float()) ** 2, reduction)


def pinball_loss(
    quantiles: torch.Tensor,
    target: torch.Tensor,
    taus: Sequence[float] | torch.Tensor,
    sample_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Pinball (quantile) loss averaged over the levels ``taus`` and over target samples.

    Args:
        quantiles (`torch.Tensor` of shape `(B, T)`): forecast quantiles at ``taus``.
        target (`torch.Tensor` of shape `(B,)` values or `(B, S)` samples of the true distribution).
        taus (`Sequence[float]` of length `T`): the quantile levels.
        sample_mask (`torch.Tensor` of shape `(B, S)`, *optional*): which samples are real when rows have
            different numbers of samples (padding is ignored; each row is averaged over its own samples).
        reduction (`str`, defaults to `"mean"`): `"mean"` over the batch, or `"none"` (one loss per row).
    """
    q = quantiles.float()
    y = target.float()
    if y.dim() == 1:
        y = y[:, None]
    tau = torch.as_tensor(taus, dtype=torch.float32, device=q.device)  # (T,)
    u = y[:, None, :] - q[:, :, None]  # (B, T, S)
    loss = torch.maximum(tau[None, :, None] * u, (tau[None, :, None] - 1.0) * u)  # (B, T, S)
    if sample_mask is None:
        return _reduce(loss.mean((1, 2)), reduction)  # every row has T x S terms: the mean of row means
    m = sample_mask.float()[:, None, :]  # (B, 1, S)
    per_row = (loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # (B, T)
    return _reduce(per_row.mean(-1), reduction)


__all__ = ["bernoulli_brier", "choice_loss", "crps_loss", "pinball_loss"]
