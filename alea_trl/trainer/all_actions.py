"""The dense envs' all-actions update (``dense_update="all_actions"``): every legal action's exact expected reward
trains the act head, and an action better than the policy's average gets a step that does not shrink with its
probability.

Design decisions:
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
4. Each decision is one term, whatever its number of legal actions: the dense envs' loss is the mean over their
   decisions, as the sampled update's is the mean over their samples.
"""

from __future__ import annotations

import torch


def reward_scale(
    rewards: torch.Tensor, legal: torch.Tensor, scale_rewards: str, env_ids: torch.Tensor
) -> torch.Tensor:
    """Each decision's reward scale `(N, 1)`, as ``scale_rewards`` says: the std of its legal ``Q`` (``"group"``), the
    std of every legal ``Q`` of its env's decisions in the wave (``"batch"``: envs report rewards in their own units),
    or 1 (``"none"``); ``1e-4`` is added to a std.

    Args:
        rewards (`torch.Tensor` of shape `(N, A)`): the exact expected reward of each action.
        legal (`torch.Tensor` of shape `(N, A)`): which actions are legal.
        scale_rewards (`str`): ``"group"``, ``"batch"`` or ``"none"``.
        env_ids (`torch.Tensor` of shape `(N,)`): each decision's env.
    """
    q = rewards.masked_fill(~legal, 0.0)
    if scale_rewards == "group":
        n_legal = legal.sum(-1, keepdim=True)
        mean = q.sum(-1, keepdim=True) / n_legal.clamp(min=1)
        deviation = (q - mean).masked_fill(~legal, 0.0)
        return (deviation.square().sum(-1, keepdim=True) / (n_legal - 1).clamp(min=1)).sqrt() + 1e-4
    scale = torch.ones(len(q), 1)
    if scale_rewards == "batch":
        for env in env_ids.unique().tolist():
            rows = env_ids == env
            values = q[rows][legal[rows]]
            scale[rows] = (values.std() if values.numel() > 1 else 0.0) + 1e-4
    return scale


def all_action_advantages(
    rewards: torch.Tensor, legal: torch.Tensor, logp: torch.Tensor, scale_rewards: str, env_ids: torch.Tensor
) -> torch.Tensor:
    """The advantages of every legal action of each decision (see the module docstring), `(N, A)`, zero where not
    legal.

    Args:
        rewards (`torch.Tensor` of shape `(N, A)`): the exact expected reward of each action.
        legal (`torch.Tensor` of shape `(N, A)`): which actions are legal.
        logp (`torch.Tensor` of shape `(N, A)`): the behaviour policy's log-probs (their baseline ``V``).
        scale_rewards (`str`): ``"group"``, ``"batch"`` or ``"none"`` (see :func:`reward_scale`).
        env_ids (`torch.Tensor` of shape `(N,)`): each decision's env (``"batch"`` takes one std per env).
    """
    n_legal = legal.sum(-1, keepdim=True)
    q = rewards.masked_fill(~legal, 0.0)
    p = logp.exp().masked_fill(~legal, 0.0)
    centred = (q - (p * q).sum(-1, keepdim=True) / p.sum(-1, keepdim=True)).masked_fill(~legal, 0.0)
    scale = reward_scale(rewards, legal, scale_rewards, env_ids)
    no_signal = (q == q[:, :1]).masked_fill(~legal, True).all(-1, keepdim=True) | (n_legal < 2)
    return (centred / scale).masked_fill(no_signal, 0.0)


def all_actions_loss(
    logp_all: torch.Tensor,
    old_logp_all: torch.Tensor,
    advantages: torch.Tensor,
    legal: torch.Tensor,
    rows: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The all-actions policy loss of the decisions in ``rows`` (the mean of their terms, see the module docstring).

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
    old, adv = _fit(old_logp_all, width), _fit(advantages, width)
    terms = legal & rows[:, None]
    logp = logp_all.masked_fill(~terms, 0.0)
    ratio = torch.exp(logp - old.masked_fill(~terms, 0.0))
    clipped = ((adv > 0) & (ratio > 1 + epsilon_high)) | ((adv < 0) & (ratio < 1 - epsilon_low))
    keep = terms & ~clipped
    # A > 0: A log p (a step of A (1 - p) on the logit); A < 0: A p (the exact expected gradient, fading with p)
    objective = torch.where(adv > 0, logp, logp.exp())
    loss = -(adv * objective * keep).sum() / rows.sum().clamp(min=1)
    with torch.no_grad():
        kl = (old.exp() * (old - logp)).masked_fill(~terms, 0.0).sum()
    return loss, (clipped & terms).sum().float(), kl


def _fit(x: torch.Tensor, width: int) -> torch.Tensor:
    x = x.to(torch.float32)
    return x[:, :width] if x.shape[-1] >= width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))


__all__ = ["all_action_advantages", "all_actions_loss", "reward_scale"]
