"""A dense decision's act trained toward a mirror-descent target over its legal actions (``dense_update="mirror"``).

The objective of one dense decision is GRPO's, over the legal actions and with the exact expected rewards the env
reports: ``J(pi) = sum_a pi(a) Q(a) / s - beta KL(pi || pi_ref)`` (``s`` the reward scale of ``scale_rewards``).

Design decisions:
1. The regularised reward of action ``a`` is ``r(a) = Q(a) / s - beta log(pi_old(a) / pi_ref(a))`` and its advantage
   ``A(a) = r(a) - sum_b pi_old(b) r(b)``. The gradient of ``J`` with respect to the act logits at ``pi_old`` is
   ``pi_old * A``; the KL to the reference is folded in here, so these decisions take no separate ``beta`` x KL term.
2. The step on the log-probs is ``g(a) = w(a) A(a)`` with ``w(a) = (pi_old(a) + 1 / n) / 2`` (``n`` legal actions),
   minus its mean over the legal actions (a shift of every logit changes no probability). Its inner product with the
   gradient of ``J`` is ``sum_a pi_old(a) w(a) A(a)^2 >= 0``: every step ascends ``J`` to first order, whatever the
   policy. It is zero exactly when ``A = 0`` on every legal action, i.e. at ``pi*(a) ~ pi_ref(a) exp(Q(a) / (s beta))``,
   the optimum of ``J`` (at ``beta = 0`` the step never vanishes until the policy is greedy). The weights sum to 1 over
   the legal actions, so ``|g| <= max |A|`` whatever their number; each action's weight is at least ``1 / (2 n)``, so
   an action better than the policy's average gains on the others at a rate that does not fade with its probability
   (the sampled gradient ``pi * A`` does: an improbable best action is never sampled, and never learnt).
3. The loss regresses the centred log-probs onto the target ``log pi_old + g`` (centred): ``1/2 sum_a (lp(a) -
   lp_old(a) - g(a))^2``. Its gradient at ``pi_old`` is ``-g``; its value is the squared logit distance still to go
   (``1/2 |g|^2`` on the first pass, at most ``max A^2 / 2``), bounded and zero at the target; with
   ``num_iterations > 1`` later passes approach the same target and stop there, so no ratio clip is needed.
4. ``temperature`` divides the logits before the softmax (as in TRL): the target is on the log-probs of the sampled
   policy, so its logit gradient scales by ``1 / temperature``.
"""

from __future__ import annotations

import torch

from .all_actions import _fit


def mirror_steps(
    rewards: torch.Tensor,
    legal: torch.Tensor,
    old_logp: torch.Tensor,
    scale: torch.Tensor,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """The log-prob step ``g`` of each decision (see the module docstring), `(N, A)`, zero where not legal.

    Args:
        rewards (`torch.Tensor` of shape `(N, A)`): the exact expected reward ``Q`` of each action.
        legal (`torch.Tensor` of shape `(N, A)`): which actions are legal.
        old_logp (`torch.Tensor` of shape `(N, A)`): the behaviour policy's log-probs over the legal actions.
        scale (`torch.Tensor` of shape `(N, 1)`): each decision's reward scale ``s``.
        beta (`float`, defaults to `0.0`): weight of ``KL(pi || pi_ref)``.
        ref_logp (`torch.Tensor` of shape `(N, A)`, *optional*): the reference policy's log-probs (needed when
            ``beta != 0``).
    """
    if beta != 0.0 and ref_logp is None:
        raise ValueError("mirror_steps: field 'ref_logp': needed when beta != 0")
    old_logp = old_logp.float().masked_fill(~legal, 0.0)
    p = old_logp.exp().masked_fill(~legal, 0.0)  # (N, A)
    r = rewards.float().masked_fill(~legal, 0.0) / scale  # (N, A)
    if beta != 0.0:
        r = r - beta * (old_logp - ref_logp.float().masked_fill(~legal, 0.0))
    advantage = (r - (p * r).sum(-1, keepdim=True) / p.sum(-1, keepdim=True)).masked_fill(~legal, 0.0)  # (N, A)
    n_legal = legal.sum(-1, keepdim=True).clamp(min=1)  # (N, 1)
    weight = ((p + 1.0 / n_legal) / 2).masked_fill(~legal, 0.0)  # (N, A), sums to 1 over the legal actions
    step = weight * advantage
    step = step - step.sum(-1, keepdim=True) / n_legal  # a common shift of the logits moves no probability
    return step.masked_fill(~legal | (n_legal < 2), 0.0)


def mirror_loss(
    logp_all: torch.Tensor, old_logp_all: torch.Tensor, steps: torch.Tensor, legal: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mirror loss of the decisions in ``rows``: the mean over them of ``1/2 |lp - lp_old - g|^2`` on centred
    log-probs of the legal actions.

    Args:
        logp_all (`torch.Tensor` of shape `(N, A)`): current log-probs (with autograd).
        old_logp_all, steps (`torch.Tensor` of shape `(N, A')`): behaviour log-probs and the steps of
            :func:`mirror_steps`, zero-padded (``A'`` may differ from ``A``: the widest row of another batch).
        legal (`torch.Tensor` of shape `(N, A)`): which actions are legal.
        rows (`torch.Tensor` of shape `(N,)`): the decisions trained by this update.

    Returns:
        `(torch.Tensor, torch.Tensor)`: the loss (a scalar) and the sum over the decisions of the exact
        KL(behaviour || current) (no gradient).
    """
    width = logp_all.shape[-1]
    old_logp_all, steps = _fit(old_logp_all, width), _fit(steps, width)
    terms = legal & rows[:, None]
    n_legal = legal.sum(-1, keepdim=True).clamp(min=1)
    moved = (logp_all - old_logp_all.float()).masked_fill(~legal, 0.0)  # (N, A)
    moved = (moved - moved.sum(-1, keepdim=True) / n_legal).masked_fill(~legal, 0.0)  # centred: shift-free
    residual = (moved - steps).masked_fill(~terms, 0.0)
    loss = 0.5 * residual.square().sum() / rows.sum().clamp(min=1)
    with torch.no_grad():
        old = old_logp_all.float()
        kl = (old.exp() * (old - logp_all)).masked_fill(~terms, 0.0).sum()
    return loss, kl


__all__ = ["mirror_loss", "mirror_steps"]
