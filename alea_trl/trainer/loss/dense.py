"""The dense envs' updates over every legal action (``dense_update``): a dense env reports the exact expected
reward of every legal action, not only of the k sampled ones, so a dense decision's act trains on all of them.
Their advantages and steps are computed when the decision is made
(:mod:`~alea_trl.trainer.rollout.advantages`: ``all_action_advantages``, ``step_targets``); the losses are here.

The default is ``dense_update="all_actions_ascent"`` (9-12): every legal action trains toward the all-actions step (2)
on the regularised advantages (5), repaired into an ascent step of GRPO's objective ``J`` and fitted by the bounded
regression loss of ``"mirror"`` (7-8; its bound under the default's cap: 12).

``dense_update="all_actions"`` (opt-in; the step the default repairs): every legal action's exact expected reward
trains the act head, and an action better than the policy's average gets a step that does not shrink with its
probability.

1. A dense env reports the exact expected reward ``Q(a)`` of every legal action, not only of the k sampled ones. The
   advantage of action ``a`` is ``(Q(a) - V) / scale`` with ``V = sum_b p(b) Q(b)`` the behaviour policy's expected
   reward, and ``scale`` as ``scale_rewards`` says: the std of the decision's legal ``Q`` ("group"), the std of every
   legal ``Q`` of that env's decisions in the wave ("batch": envs report rewards in their own units) or 1 ("none").
   A decision whose legal actions are all worth the same has none.
2. A decision's term is ``-sum_{A_a > 0} A_a log p(a) - sum_{A_a < 0} A_a p(a)``. The sampled policy gradient is in
   expectation ``sum_a p(a) A_a grad log p(a)``: it shrinks with an action's probability (Mei et al. 2020), so a state
   that took a neighbour's action through shared features can lose its best action for good (once its probability is
   near 0 the k samples never contain it and the group carries no signal). Here an action better than average moves
   its logit by ``A_a (1 - p(a))`` whatever its probability, as the natural policy gradient of a softmax does (Kakade
   2001; Agarwal et al. 2021); an action worse than average takes the exact expected gradient, which fades as its
   probability does, so an action already ruled out is not pushed further and the loss stays bounded. Both fade at
   the deterministic optimum (there ``V`` is the best action's value: no action is better than average).
3. PPO's clip per action on its ratio to the behaviour policy (``num_iterations > 1``): an action whose advantage is
   positive and ratio above ``1 + epsilon_high`` (negative and below ``1 - epsilon_low``) stops training on this
   batch.
4. Each decision is one term, whatever its number of legal actions, and the terms are summed and divided by the rows
   of the micro-batch, as the sampled update's per-decision means are (:func:`~alea_trl.trainer.loss.policy.policy_loss`):
   a decision weighs the same whatever shares its micro-batch.

``dense_update="mirror"``: the act is trained toward a mirror-descent target over its legal actions (5-8).
The objective of one dense decision is GRPO's, over the legal actions and with the exact expected rewards the env
reports: ``J(pi) = sum_a pi(a) Q(a) / s - beta KL(pi || pi_ref)`` (``s`` the reward scale of ``scale_rewards``).

5. The regularised reward of action ``a`` is ``r(a) = Q(a) / s - beta log(pi_old(a) / pi_ref(a))`` and its advantage
   ``A(a) = r(a) - sum_b pi_old(b) r(b)``. The gradient of ``J`` with respect to the act logits at ``pi_old`` is
   ``pi_old * A``; the KL to the reference is folded in here, so these decisions take no separate ``beta`` x KL term.
6. The step on the log-probs is ``g(a) = w(a) A(a)`` minus its mean over the legal actions (a shift of every logit
   changes no probability), with ``w(a) = 1 / sqrt(n)`` (``n`` legal actions) for an action at least as good as the
   policy's average and ``min(1, n pi_old(a)) / sqrt(n)`` for a worse one. With every ``w = 1`` it would be the
   natural policy gradient of a softmax, ``Delta z = A`` (Kakade 2001), the step of policy mirror descent with a KL
   proximity term. Its inner product with the gradient of ``J`` is ``sum_a pi_old(a) w(a) A(a)^2 >= 0``: every step
   ascends ``J`` to first order, whatever the policy. Every weight is positive, so the step is zero exactly when
   ``A = 0`` on every legal action, i.e. at ``pi*(a) ~ pi_ref(a) exp(Q(a) / (s beta))``, the optimum of ``J`` (at
   ``beta = 0`` the step never vanishes until the policy is greedy). The weights' squares sum to at most 1, so ``|g|
   <= max |A|`` whatever the number of actions. An action better than the policy's average moves its log-probability
   by ``A / sqrt(n)`` whatever its probability (the sampled gradient ``pi * A`` fades with it: an improbable best
   action is never sampled, and never learnt); a worse action's push fades once it is rarer than under uniform play,
   so the step stops spending the model on actions already ruled out.
7. The loss regresses the centred log-probs onto the target ``log pi_old + g`` (centred): ``1/2 sum_a (lp(a) -
   lp_old(a) - g(a))^2``. Its gradient at ``pi_old`` is ``-g``; its value is the squared logit distance still to go
   (``1/2 |g|^2`` on the first pass, at most ``max A^2 / 2``), bounded and zero at the target; with
   ``num_iterations > 1`` later passes approach the same target and stop there, so no ratio clip is needed.
8. ``temperature`` divides the logits before the softmax (as in TRL): the target is on the log-probs of the sampled
   policy, so its logit gradient scales by ``1 / temperature``.

``dense_update="all_actions_ascent"`` (the default): the all-actions step, repaired into a step on the same objective
``J`` and fitted as the mirror step is (7, 8): no ratio clip, and ``beta`` acts through the steps, not a KL term.

9. The step starts from all-actions' logit step on the regularised advantages of 5: ``w(a) = A(a)`` for a better
   action, ``A(a) pi_old(a)`` for a worse one, and ``g = w - pi_old sum_b w(b)``. Its shift ``- pi_old sum_b w(b)``
   cuts a mode's logit by the advantages of the actions better than it, a push away from a mode that better actions
   beat which the natural-gradient step of 6 gives only through the mode's own advantage; on newsvendor that push is
   what takes the policy past its best state-blind order (``benchmarks/RESULTS.md``).
10. Ascent: where the cosine of ``g`` with the gradient of ``J``, ``pi_old * A``, is under ``ASCENT_MIN_COSINE``
   (0.1), the multiple of ``pi_old * A`` that brings it to 0.1 exactly is added (its component across the gradient
   is kept). So every step ascends ``J`` (all-actions alone did not on about one random decision in ten).
11. Fixed point: with the KL folded into the advantages, ``g`` is zero exactly where ``A`` is zero on every legal
   action (a better action's ``w = A > 0`` cannot be balanced by the shift unless every ``A`` is 0), i.e. at
   ``pi*(a) ~ pi_ref(a) exp(Q(a) / (s beta))`` (greedy at ``beta = 0``); all-actions with a separate KL term settled
   greedier than ``pi*``.
12. Size: the centred step is scaled down to at most ``ASCENT_MAX_STEP`` (``sqrt(2)``) times the largest advantage
   ``max |A|``, the length of a two-action step ``(a, -a)`` with ``|a| = max |A|``. A two-action decision's
   all-actions step is never longer than that (nor lifted: it is along the gradient), so it is kept whole; a wider
   decision's step grows with the number of actions as all-actions' does up to the cap, then stops (all-actions keeps
   growing; the figures are in ``tests/trainer/test_mirror_update.py``'s size test). An improbable better action
   keeps a step of about ``A``, as under all-actions, so it does not stall; a ruled-out action's push fades with its
   probability, and the loss is bounded by ``max A^2`` (mirror's, whose cap is ``max |A|``, by ``max A^2 / 2``).
"""

from __future__ import annotations

import torch

from ..act import fit_width


STEP_TARGET_UPDATES = ("mirror", "all_actions_ascent")
"""The ``dense_update`` values whose decisions are fitted to a log-prob step computed when the decision is made
(:func:`step_target_loss`)."""


def all_actions_loss(
    logp_all: torch.Tensor,
    old_logp_all: torch.Tensor,
    advantages: torch.Tensor,
    legal: torch.Tensor,
    rows: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The all-actions policy loss of the decisions in ``rows``: the sum of their terms divided by the number of rows
    (``N``, the micro-batch's decisions; see the module docstring).

    Args:
        logp_all (`torch.Tensor` of shape `(N, A)`): current log-probs of the legal actions (with autograd).
        old_logp_all, advantages (`torch.Tensor` of shape `(N, A')`): behaviour log-probs and advantages of each
            row's legal actions, zero-padded (``A'`` may differ from ``A``: the widest row of another batch).
        legal (`torch.Tensor` of shape `(N, A)`): which actions are legal.
        rows (`torch.Tensor` of shape `(N,)`): the decisions trained by this update.
        epsilon_low, epsilon_high (`float`): the ratio clip range.

    Returns:
        `(torch.Tensor, torch.Tensor, torch.Tensor)`: the loss (a scalar), the number of (decision, legal action)
        terms the clip stopped and the sum over the decisions of the exact KL(behaviour || current) (no gradient).
    """
    width = logp_all.shape[-1]
    old, adv = fit_width(old_logp_all, width), fit_width(advantages, width)
    terms = legal & rows[:, None]
    logp = logp_all.masked_fill(~terms, 0.0)
    ratio = torch.exp(logp - old.masked_fill(~terms, 0.0))
    clipped = ((adv > 0) & (ratio > 1 + epsilon_high)) | ((adv < 0) & (ratio < 1 - epsilon_low))
    keep = terms & ~clipped
    # A > 0: A log p (a step of A (1 - p) on the logit); A < 0: A p (the exact expected gradient, fading with p)
    objective = torch.where(adv > 0, logp, logp.exp())
    loss = -(adv * objective * keep).sum() / max(rows.shape[0], 1)
    with torch.no_grad():
        kl = (old.exp() * (old - logp)).masked_fill(~terms, 0.0).sum()
    return loss, (clipped & terms).sum().float(), kl


def step_target_loss(
    logp_all: torch.Tensor, old_logp_all: torch.Tensor, steps: torch.Tensor, legal: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step-target loss of the decisions in ``rows`` (``mirror`` and ``all_actions_ascent``): the sum over them of ``1/2 |lp - lp_old - g|^2`` on centred
    log-probs of the legal actions, divided by the number of rows (``N``, the micro-batch's decisions).

    Args:
        logp_all (`torch.Tensor` of shape `(N, A)`): current log-probs (with autograd).
        old_logp_all, steps (`torch.Tensor` of shape `(N, A')`): behaviour log-probs and the steps of
            :func:`~alea_trl.trainer.rollout.advantages.step_targets`, zero-padded (``A'`` may differ from ``A``: the widest row of another batch).
        legal (`torch.Tensor` of shape `(N, A)`): which actions are legal.
        rows (`torch.Tensor` of shape `(N,)`): the decisions trained by this update.

    Returns:
        `(torch.Tensor, torch.Tensor)`: the loss (a scalar) and the sum over the decisions of the exact
        KL(behaviour || current) (no gradient).
    """
    width = logp_all.shape[-1]
    old_logp_all, steps = fit_width(old_logp_all, width), fit_width(steps, width)
    terms = legal & rows[:, None]
    n_legal = legal.sum(-1, keepdim=True).clamp(min=1)
    moved = (logp_all - old_logp_all.float()).masked_fill(~legal, 0.0)  # (N, A)
    moved = (moved - moved.sum(-1, keepdim=True) / n_legal).masked_fill(~legal, 0.0)  # centred: shift-free
    residual = (moved - steps).masked_fill(~terms, 0.0)
    loss = 0.5 * residual.square().sum() / max(rows.shape[0], 1)
    with torch.no_grad():
        old = old_logp_all.float()
        kl = (old.exp() * (old - logp_all)).masked_fill(~terms, 0.0).sum()
    return loss, kl


__all__ = ["STEP_TARGET_UPDATES", "all_actions_loss", "step_target_loss"]
