"""Monte Carlo branching: the value of each sampled action at an outcome decision, from deep copies of its env.

Design decisions:
1. Envs are seeded and deep-copyable (a deep copy mid-episode continues identically), so at an outcome decision each
   of its k sampled actions can be tried in a copy of the env, and the current policy plays the copy to the end
   (VinePPO, Kazemnejad et al. 2024). The k branch returns (reward of the action and every later reward) value the k
   actions, so the decision becomes a GRPO group like a dense one, trained at once instead of waiting for the
   episode's return.
2. A copy carries its env's generator, so the k branches of a decision share the env's future randomness (common
   random numbers: their differences come from the actions and the policy's later choices), and branching never
   advances the pool's own stream.
3. The branches of all decisions of a wave advance together: each round observes every live branch, answers them in
   one no-grad forward (``continuation_logits``) and samples one action each. Only the act is packed and
   answered there (``Observer.prepare(act_only=True)``): the reports' tokens and oracle targets would go unused.
4. Cost: about k x (decisions left in the episode) forwards without autograd per branched decision. ``branch_limit``
   caps the decisions branched per call; the others (and those whose env cannot be copied or fails in a copy) are
   valued by reward-to-go when their episode ends.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable

import torch

from .sampling import sampling_probs


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.detach().float().cpu() / temperature, -1)


def branch_values(
    episodes: list,
    actions: list[list[int]],
    observer,
    continuation_logits: Callable,
    generator: torch.Generator,
    temperature: float,
    limit: int,
    not_copyable: set[str],
    filters: tuple[int, float, float | None] = (0, 1.0, None),
    reward_weight: float = 1.0,
) -> tuple[list[list[float] | None], int]:
    """Branch returns of the sampled actions of outcome decisions.

    Args:
        episodes (`list[Episode]`): the outcome decisions' episodes (their envs not yet stepped).
        actions (`list[list[int]]`): each decision's k sampled actions.
        observer (`Observer`): observes, validates and packs a copy's decisions (``prepare``).
        continuation_logits (`Callable`): ``list[PackedRequest] -> (M, A)`` act logits of the current policy, no
            gradient, ``-inf`` beyond each decision's legal options.
        generator (`torch.Generator`): draws the continuation actions.
        temperature (`float`): the sampling temperature.
        limit (`int`): most decisions branched in this call.
        not_copyable (`set[str]`): env names whose envs failed to copy (updated; each warns once).
        filters (`tuple`, defaults to `(0, 1.0, None)`): ``(top_k, top_p, min_p)`` of the continuation draws (see
            :func:`~alea_trl.trainer.sampling.filter_action_logits`).
        reward_weight (`float`, defaults to `1.0`): multiplies every reward of a branch (``reward_weights``).

    Returns:
        `(list[list[float] | None], int)`: per decision its k branch returns, or ``None`` where it was not branched;
        and the number of continuation decisions answered.
    """
    values: list[list[float] | None] = [None] * len(episodes)
    live = []  # [decision, branch, env copy]
    for i, (ep, acts) in enumerate(zip(episodes, actions)):
        if limit <= 0 or ep.env_name in not_copyable:
            continue
        try:
            copies = [copy.deepcopy(ep.env) for _ in acts]
        except Exception as err:
            not_copyable.add(ep.env_name)
            warnings.warn(
                f"env {ep.env_name!r} cannot be deep-copied ({type(err).__name__}: {err}); its outcome decisions are "
                "valued by reward-to-go instead of branching",
                stacklevel=2,
            )
            continue
        limit -= 1
        values[i] = [0.0] * len(acts)
        live += [[i, j, env] for j, env in enumerate(copies)]
    failed: set[int] = set()
    answered = 0
    pending = [(i, j, env, actions[i][j]) for i, j, env in live]
    while pending:
        live = []
        for i, j, env, action in pending:
            if i in failed:
                continue
            try:
                reward, done = env.step(action)
                reward = float(reward)
                if not math.isfinite(reward):
                    raise ValueError(f"field 'reward': step() returned {reward}")
            except Exception:
                failed.add(i)
                continue
            values[i][j] += reward * reward_weight
            if not done:
                live.append((i, j, env))
        prepared = []  # (packed decision, branch)
        for i, j, env in live:
            where, value, _ = observer.prepare(env, episodes[i].env_name, act_only=True)
            if where is not None:  # a copy whose decision does not validate or fit: value this decision otherwise
                failed.add(i)
            else:
                prepared.append((value[0], (i, j, env)))
        prepared = [(p, branch) for p, branch in prepared if branch[0] not in failed]
        if not prepared:
            break
        packed, kept = [p for p, _ in prepared], [branch for _, branch in prepared]
        logp = _log_probs(continuation_logits(packed), temperature)  # (M, A)
        answered += len(kept)
        drawn = torch.multinomial(sampling_probs(logp, *filters), 1, generator=generator)[:, 0].tolist()
        pending = [(i, j, env, a) for (i, j, env), a in zip(kept, drawn)]
    for i in failed:
        values[i] = None
    return values, answered


__all__ = ["branch_values"]
