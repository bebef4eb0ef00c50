"""Advantages: how much better than expected each sampled action was.

Design decisions:
1. A group (a dense decision's k samples, or an outcome decision's k branched samples): ``(r - mean) / (std + 1e-4)``
   over the group's values (``scale_rewards`` "group", "batch" or "none"; "batch" takes one std per env, since envs
   report rewards in their own units). A group whose values are all equal has no signal and gets exactly zero.
2. An outcome decision valued when its episode ends: its return (or return-to-go) against a window of that env's
   recent ones (at the same step of an episode, for returns-to-go).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch


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


def outcome_advantage(ret: float, recent_returns: Sequence[float], scale: bool) -> float:
    """Advantage of an outcome episode's return against its env's recent returns (which include it): centred on
    their mean and, with ``scale``, divided by their std; 0 while fewer than two returns are known."""
    window = np.asarray(recent_returns, dtype=np.float64)
    if len(window) < 2:
        return 0.0
    adv = ret - window.mean()
    if scale:
        adv /= window.std() + 1e-4
    return float(adv) if math.isfinite(adv) else 0.0


__all__ = ["env_batch_std", "group_advantages", "outcome_advantage"]
