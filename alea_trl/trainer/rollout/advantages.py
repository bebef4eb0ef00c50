"""Advantages: how much better than expected each sampled action was.

Design decisions:
1. A group (a dense decision's k samples, or an outcome decision's k branched samples): ``(r - mean) / (std + 1e-4)``
   over the group's values (``scale_rewards`` "group", "batch" or "none"; "batch" takes one std per env, since envs
   report rewards in their own units). A group whose values are all equal has no signal and gets exactly zero.
2. An outcome decision valued when its episode ends: its return (or return-to-go) against a window of that env's
   recent ones (at the same step of an episode, for returns-to-go), leave-one-out: the baseline is the mean of the
   others, so it does not move with the return it judges (with the own return in the mean, an advantage shrinks by
   ``(n - 1) / n`` and is always ``+-1`` x scale at ``n = 2``).
3. A dense decision trained by every legal action (``dense_update``, see :mod:`~alea_trl.trainer.loss.dense`):
   ``all_actions``: the advantage of action ``a`` is ``(Q(a) - V) / scale`` with ``V = sum_b p(b) Q(b)`` the behaviour
   policy's expected reward and ``scale`` as ``scale_rewards`` says (:func:`reward_scale`); a decision whose legal
   actions are all worth the same has none. ``mirror`` and ``all_actions_ascent`` (the default): the log-prob step
   ``g`` each rule takes (:func:`step_targets`), from the advantages of the regularised objective.
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


def env_batch_std(rewards: torch.Tensor, env_ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The std of all the sampled rewards in a batch that belong to the same env, for each decision: `(D, 1)` from
    `(D, k)` rewards and `(D,)` env ids. It is TRL's ``scale_rewards="batch"`` taken per env: the envs of a mix
    report rewards in their own units (newsvendor in money, kelly in log growth), so one std over all of them would
    leave every env but the largest-scale one with near-zero advantages. With ``mask`` `(D, k)`, only the entries it
    marks count (each decision's legal actions)."""
    out = torch.empty(rewards.shape[0], 1, dtype=rewards.dtype)
    for env in env_ids.unique().tolist():
        rows = env_ids == env
        values = rewards[rows] if mask is None else rewards[rows][mask[rows]]
        out[rows] = values.std() if values.numel() > 1 else 0.0
    return out


def outcome_advantage(ret: float, recent_returns: Sequence[float], scale: bool) -> float:
    """Advantage of an outcome episode's return against its env's recent returns (the last of which is its own):
    ``ret`` minus the mean of the *others* (leave-one-out: its own return does not pull the baseline towards it) and,
    with ``scale``, divided by the std of the whole window; 0 while no other return is known."""
    window = np.asarray(recent_returns, dtype=np.float64)
    if len(window) < 2:
        return 0.0
    adv = ret - window[:-1].mean()
    if scale:
        adv /= window.std() + 1e-4
    return float(adv) if math.isfinite(adv) else 0.0


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
    if scale_rewards == "batch":
        return env_batch_std(q, env_ids, legal) + 1e-4
    return torch.ones(len(q), 1)


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


def regularised_advantages(
    rewards: torch.Tensor,
    legal: torch.Tensor,
    old_logp: torch.Tensor,
    scale: torch.Tensor,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The behaviour policy's probabilities and each legal action's advantage under GRPO's regularised objective,
    ``A(a) = r(a) - sum_b p(b) r(b)`` with ``r(a) = Q(a) / s - beta log(p(a) / p_ref(a))``, both `(N, A)` in float64
    and zero where not legal (see :mod:`~alea_trl.trainer.loss.dense`).

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
        raise ValueError("regularised_advantages: field 'ref_logp': needed when beta != 0")
    old_logp = old_logp.double().masked_fill(~legal, 0.0)  # float64: p A of an improbable action is tiny
    p = old_logp.exp().masked_fill(~legal, 0.0)  # (N, A)
    q = rewards.double()
    tie = q.masked_fill(~legal, -math.inf).amax(-1, keepdim=True) == q.masked_fill(~legal, math.inf).amin(
        -1, keepdim=True
    )
    # actions all worth the same have no reward advantage: exactly 0, not the rounding residue of Q - sum p Q
    r = q.masked_fill(~legal | tie, 0.0) / scale.double()  # (N, A)
    if beta != 0.0:
        r = r - beta * (old_logp - ref_logp.double().masked_fill(~legal, 0.0))
    advantage = (r - (p * r).sum(-1, keepdim=True) / p.sum(-1, keepdim=True)).masked_fill(~legal, 0.0)
    return p, advantage


def step_targets(update: str, p: torch.Tensor, advantage: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """The log-prob step ``g`` of each decision under a step-target ``dense_update`` (see
    :mod:`~alea_trl.trainer.loss.dense`), `(N, A)` in float32, centred over the legal actions, zero where not legal
    and where fewer than two actions are legal: ``"mirror"`` (:func:`mirror_step`) or ``"all_actions_ascent"``
    (:func:`ascent_step`).

    Args:
        update (`str`): the ``dense_update``.
        p, advantage (`torch.Tensor` of shape `(N, A)`): the behaviour policy's probabilities and the regularised
            advantages, as :func:`regularised_advantages` returns them.
        legal (`torch.Tensor` of shape `(N, A)`): which actions are legal.
    """
    if update not in STEP_RULES:
        raise ValueError(f"step_targets: field 'update': one of {sorted(STEP_RULES)}, got {update!r}")
    step = STEP_RULES[update](p, advantage, legal)
    return step.masked_fill(~legal | (legal.sum(-1, keepdim=True) < 2), 0.0).float()


def _centred(step: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """``step`` minus its mean over the legal actions (a common shift of the logits moves no probability)."""
    step = step.masked_fill(~legal, 0.0)
    return (step - step.sum(-1, keepdim=True) / legal.sum(-1, keepdim=True).clamp(min=1)).masked_fill(~legal, 0.0)


def mirror_step(p: torch.Tensor, advantage: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """``dense_update="mirror"``: the natural-gradient step ``A / sqrt(n)``, a worse action's weight fading once it is
    rarer than under uniform play; centred, `(N, A)` from the probabilities and regularised advantages `(N, A)`."""
    n_legal = legal.sum(-1, keepdim=True).clamp(min=1)  # (N, 1)
    fade = torch.where(advantage < 0, (p * n_legal).clamp(max=1.0), torch.ones_like(p))
    weight = (fade / n_legal.sqrt()).masked_fill(~legal, 0.0)  # (N, A): squares sum to at most 1
    return _centred(weight * advantage, legal)


ASCENT_MIN_COSINE = 0.1
"""``all_actions_ascent``: the least cosine between a step and the gradient of the regularised objective."""

ASCENT_MAX_STEP = math.sqrt(2.0)
"""``all_actions_ascent``: the longest step, in units of the decision's largest advantage ``max |A|``. ``sqrt(2)`` is
the length of the centred step ``(a, -a)`` of a two-action decision: the all-actions step of a two-action decision is
at most that long whatever its probabilities, so such a decision keeps it whole (it is along the gradient, so no lift
either), and a decision with more actions is held to the same length."""


def ascent_step(p: torch.Tensor, advantage: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """``dense_update="all_actions_ascent"``: the all-actions logit step, lifted to a cosine of at least
    :data:`ASCENT_MIN_COSINE` with the objective's gradient ``p A``, centred and capped at :data:`ASCENT_MAX_STEP`
    times the largest advantage (the arguments as :func:`mirror_step`'s)."""
    # the all-actions step on the logits: w = A for a better action, A p for a worse one, minus p sum(w)
    w = torch.where(advantage > 0, advantage, advantage * p).masked_fill(~legal, 0.0)
    step = (w - p * w.sum(-1, keepdim=True)).masked_fill(~legal, 0.0)
    # where its cosine with p A is under the floor, add the multiple of p A that lifts it to the floor exactly (the
    # step's component across the gradient is kept); p A sums to 0, so centring keeps the inner product and can only
    # shorten the step: the cosine stays at least the floor
    gradient = p * advantage
    length = gradient.square().sum(-1, keepdim=True).sqrt()  # (N, 1)
    along = (step * gradient).sum(-1, keepdim=True) / length.clamp(min=1e-30)
    across = (step.square().sum(-1, keepdim=True) - along.square()).clamp(min=0.0).sqrt()
    wanted = ASCENT_MIN_COSINE / math.sqrt(1.0 - ASCENT_MIN_COSINE**2) * across  # the component along it
    lift = ((wanted - along) / length.clamp(min=1e-30)).clamp(min=0.0).masked_fill(length <= 1e-15, 0.0)
    step = _centred(step + lift * gradient, legal)
    # size: at most ASCENT_MAX_STEP x the largest advantage, whatever the number of actions
    cap = ASCENT_MAX_STEP * advantage.abs().amax(-1, keepdim=True)
    norm = step.square().sum(-1, keepdim=True).sqrt()
    return step * (cap / norm.clamp(min=1e-30)).clamp(max=1.0)


STEP_RULES = {"mirror": mirror_step, "all_actions_ascent": ascent_step}
"""The step rule of each step-target ``dense_update`` (``alea_trl.trainer.loss.dense.STEP_TARGET_UPDATES``)."""


__all__ = [
    "ASCENT_MAX_STEP",
    "ASCENT_MIN_COSINE",
    "STEP_RULES",
    "all_action_advantages",
    "ascent_step",
    "env_batch_std",
    "group_advantages",
    "mirror_step",
    "outcome_advantage",
    "regularised_advantages",
    "reward_scale",
    "step_targets",
]
