"""Entropy of the act distribution in the loss: the high-entropy sample mask (``top_entropy_quantile``), the entropy
bonus (``entropy_coef``) and its adaptive controller (``use_adaptive_entropy``).

Design decisions:
1. A decision's entropy is that of its act distribution over its legal actions at ``temperature``,
   ``-sum_a p(a) log p(a)``; every sample of the decision carries it (TRL's per-token entropy, one token per sample).
2. ``top_entropy_quantile`` (TRL's ``get_high_entropy_mask``, "Beyond the 80/20 rule"): the threshold is the
   ``1 - rho`` quantile of the entropies of all processes' real samples of the micro-batch; samples below it leave
   the policy loss (and the bonus). It is a gather: every process calls it once per micro-batch.
3. The bonus is ``-coef x`` the mean entropy of the decisions whose actions train in the forward (those kept by the
   entropy mask), gradient through the policy's act distribution.
4. The adaptive controller is TRL's (Skywork-OR1) on TRL's own trainer attributes (``entropy_coef``,
   ``_last_world_entropy``, ``_entropy_window_stats``, ``_entropy_bonus_enabled``), so ``GRPOTrainer``'s checkpoint
   save and resume of its state covers it: the coefficient applies while the last optimizer step's entropy of all
   processes is at most ``entropy_target``, and moves by ``entropy_coef_delta`` towards more bonus below the target
   and less above it, within ``[entropy_coef_min, entropy_coef_max]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


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


class EntropyControl:
    """Mixin of the trainer: the entropy bonus coefficient of the current micro-batch, and the adaptive controller's
    update (see the module docstring; the state is ``GRPOTrainer``'s)."""

    def _entropy_coef_now(self) -> float | None:
        """The coefficient of this micro-batch's bonus; ``None`` when no bonus is configured."""
        if not self._entropy_bonus_enabled:
            return None
        if self.use_adaptive_entropy:  # TRL: the bonus applies while the last measured entropy is at most the target
            return self.entropy_coef if self._last_world_entropy <= self.args.entropy_target else 0.0
        return self.entropy_coef

    def _track_entropy(self, bonus: tuple[torch.Tensor, torch.Tensor] | None, mode: str) -> None:
        """Accumulate a micro-batch's ``(entropy sum, decisions)`` of the bonus; at an optimizer step, update the
        adaptive coefficient from all processes' window and log ``entropy_coef`` (as ``GRPOTrainer``)."""
        if bonus is None or mode != "train":
            return
        if self.use_adaptive_entropy:
            stats = torch.stack([b.detach().float() for b in bonus])
            window = self._entropy_window_stats
            self._entropy_window_stats = stats if window is None else window + stats
            if self.accelerator.sync_gradients:
                total = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                world_entropy = (total[0] / total[1].clamp(min=1.0)).item()
                args = self.args
                if world_entropy <= args.entropy_target:
                    self.entropy_coef = min(self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
                else:
                    self.entropy_coef = max(self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
                self._last_world_entropy = world_entropy
                self._entropy_window_stats = None
        if self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)


__all__ = ["EntropyControl", "act_entropy", "high_entropy_samples"]
