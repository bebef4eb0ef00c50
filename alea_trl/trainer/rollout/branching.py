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
4. Cost: about k x (decisions left in the episode) continuation decisions without autograd per branched decision,
   but a round answers each distinct packed decision once (:func:`distinct_logits`): the k copies of a decision start
   from one state, the envs' shared randomness keeps copies that took the same actions in the same state, and a
   near-deterministic policy keeps taking the same actions, so many of a round's decisions repeat (``branch/
   continuation_forwards`` counts the rows answered, ``branch/continuation_decisions`` the decisions). ``branch_limit``
   caps the decisions branched per call and ``branch_max_rounds`` the continuation rounds of a call (an episode with
   no horizon under a policy that never ends it would otherwise loop inside one training step); a decision whose
   branches are still running at the cap is counted (``branch/capped``) and valued by reward-to-go when its episode
   ends, as are the decisions not branched.
5. A decision whose branching fails is valued by reward-to-go too, and never silently: :class:`BranchFallbacks`
   counts it by cause (``branch/failed/<cause>``: the env's deep copy failed, a copy's ``step`` raised or returned a
   non-finite reward, a copy's ``observe`` raised or its decision did not validate, or it did not fit ``max_len``) and
   warns once per env and cause. With ``on_env_error="raise"`` an exception in a copy's ``step`` or ``observe`` (and a
   decision that does not validate) raises a ``ValueError`` naming the env, as in the episode itself; a decision
   longer than ``max_len`` and an env that cannot be deep-copied are never errors (the episode itself skips the
   first, and the second only rules out branching).
6. ``branch_explore`` (default 0) mixes uniform play into the continuations. A branch values its action under the
   policy that plays on; once that policy is near-deterministic and wrong in a sparse, all-or-nothing env, every
   branch of every action is worth the same (0), and the decision carries no signal. With a share of uniform play an
   action that keeps the episode winnable is worth more than one that loses it. The values are then those of the
   mixed continuation policy, not of the policy the loss trains: they favour actions that stay good under some
   random play later.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..act import host_log_probs, sampling_probs


FAILURE_CAUSES = ("copy", "step", "observe", "max_len")
"""Why a decision's branching failed (``branch/failed/<cause>``): its env's deep copy, a copy's ``step``, a copy's
``observe`` or the validation of its decision, a copy's decision longer than ``max_len``."""


@dataclass
class BranchFallbacks:
    """The decisions whose branching failed or hit ``branch_max_rounds`` since the last :meth:`pop_counts`, counted by
    cause; each cause warns once per env.

    Args:
        on_env_error (`str`, defaults to `"raise"`): ``"raise"``: an exception in a copy's ``step`` or ``observe``
            (or a copy's decision that does not validate) raises a ``ValueError`` naming the env; ``"skip"``: the
            decision is counted and valued by reward-to-go.
    """

    on_env_error: str = "raise"
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_CAUSES, 0))
    capped: int = 0
    not_copyable: set[str] = field(default_factory=set)  # envs whose deep copy failed: never branched again
    warned: set[tuple[str, str]] = field(default_factory=set)

    def fail(self, env: str, cause: str, detail: str, where: str | None = None) -> None:
        """Count one decision of ``env`` whose branching failed for ``cause``; with ``on_env_error="raise"``, raise
        instead when ``cause`` is an env error (``"step"`` or ``"observe"``; ``where`` says which decision)."""
        if self.on_env_error == "raise" and cause in ("step", "observe"):
            raise ValueError(
                f"env {env!r}, {where}, during {cause}() in a deep copy of the env (a branch valuing a sampled "
                f"action): {detail} (set on_env_error='skip' to value such decisions by reward-to-go and keep "
                "training)"
            )
        self.failed[cause] += 1
        self._warn_once(env, cause, f"branching failed ({cause}: {detail})", f"branch/failed/{cause}")

    def cap(self, env: str, max_rounds: int) -> None:
        """Count one decision of ``env`` whose branches were still running after ``max_rounds`` rounds."""
        self.capped += 1
        self._warn_once(
            env, "max_rounds", f"its branches were still running after branch_max_rounds={max_rounds}", "branch/capped"
        )

    def _warn_once(self, env: str, cause: str, what: str, metric: str) -> None:
        if (env, cause) not in self.warned:
            self.warned.add((env, cause))
            warnings.warn(
                f"env {env!r}: {what}; such decisions are valued by reward-to-go instead of branching and counted in "
                f"the metric {metric!r} (this warning is shown once per env)",
                stacklevel=3,
            )

    def pop_counts(self) -> dict[str, float]:
        """``branch/failed`` (all causes), ``branch/failed/<cause>`` and ``branch/capped`` since the last call."""
        out = {f"branch/failed/{cause}": float(n) for cause, n in self.failed.items()}
        out["branch/failed"] = float(sum(self.failed.values()))
        out["branch/capped"] = float(self.capped)
        self.failed, self.capped = dict.fromkeys(FAILURE_CAUSES, 0), 0
        return out


def branch_values(
    episodes: list,
    actions: list[list[int]],
    observer,
    continuation_logits: Callable,
    generator: torch.Generator,
    temperature: float,
    limit: int,
    fallbacks: BranchFallbacks,
    filters: tuple[int, float, float | None] = (0, 1.0, None),
    reward_weight: float = 1.0,
    max_rounds: int | None = None,
    explore: float = 0.0,
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
        fallbacks (`BranchFallbacks`): counts (and warns about, or raises for) the decisions whose branching failed
            or hit ``max_rounds``; remembers the envs that cannot be deep-copied.
        filters (`tuple`, defaults to `(0, 1.0, None)`): ``(top_k, top_p, min_p)`` of the continuation draws (see
            :func:`~alea_trl.trainer.act.filter_action_logits`).
        reward_weight (`float`, defaults to `1.0`): multiplies every reward of a branch (``reward_weights``).
        max_rounds (`int`, *optional*): most continuation rounds (forwards) of this call; ``None``: until every
            copy's episode ends.
        explore (`float`, defaults to `0.0`): the share of uniform play in the continuations: each continuation
            action is drawn from ``(1 - explore) x`` the (filtered) policy ``+ explore x`` uniform over the legal
            actions (see the module docstring).

    Returns:
        `(list[list[float] | None], int, int)`: per decision its k branch returns, or ``None`` where it was not
        branched; the number of continuation decisions answered; the number of rows the policy answered for them
        (the distinct ones of each round).
    """
    values: list[list[float] | None] = [None] * len(episodes)
    live = []  # [decision, branch, env copy]
    for i, (ep, acts) in enumerate(zip(episodes, actions)):
        if limit <= 0:
            continue
        if ep.env_name in fallbacks.not_copyable:
            fallbacks.fail(ep.env_name, "copy", "its env cannot be deep-copied (an earlier copy failed)")
            continue
        try:
            copies = [copy.deepcopy(ep.env) for _ in acts]
        except Exception as err:
            fallbacks.not_copyable.add(ep.env_name)
            fallbacks.fail(ep.env_name, "copy", f"its env cannot be deep-copied ({type(err).__name__}: {err})")
            continue
        limit -= 1
        values[i] = [0.0] * len(acts)
        live += [[i, j, env] for j, env in enumerate(copies)]

    def where(i: int, j: int) -> str:
        return f"decision {episodes[i].n_decisions} of its episode, branch {j} of {len(actions[i])}"

    failed: set[int] = set()  # decisions valued otherwise (failed or capped)
    answered = forwarded = rounds = 0
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
            except Exception as err:
                failed.add(i)
                fallbacks.fail(episodes[i].env_name, "step", _detail(err), where(i, j))
                continue
            values[i][j] += reward * reward_weight
            if not done:
                live.append((i, j, env))
        prepared = []  # (packed decision, branch)
        for i, j, env in live:
            if i in failed:
                continue
            cause, value, _ = observer.prepare(env, episodes[i].env_name, act_only=True)
            if cause is not None:  # a copy's decision that does not validate or fit: value this decision otherwise
                failed.add(i)
                fallbacks.fail(
                    episodes[i].env_name, "max_len" if cause == "pack" else cause, _detail(value), where(i, j)
                )
            else:
                prepared.append((value[0], (i, j, env)))
        prepared = [(p, branch) for p, branch in prepared if branch[0] not in failed]
        if not prepared:
            break
        if max_rounds is not None and rounds >= max_rounds:
            for i in sorted({branch[0] for _, branch in prepared}):
                failed.add(i)
                fallbacks.cap(episodes[i].env_name, max_rounds)
            break
        packed, kept = [p for p, _ in prepared], [branch for _, branch in prepared]
        logits, n_distinct = distinct_logits(continuation_logits, packed)
        logp = host_log_probs(logits, temperature)[0]  # (M, A)
        rounds += 1
        answered += len(kept)
        forwarded += n_distinct
        probs = sampling_probs(logp, *filters)
        if explore > 0.0:
            legal = torch.isfinite(logp)
            probs = (1.0 - explore) * probs + explore * legal / legal.sum(-1, keepdim=True)
        drawn = torch.multinomial(probs, 1, generator=generator)[:, 0].tolist()
        pending = [(i, j, env, a) for (i, j, env), a in zip(kept, drawn)]
    for i in failed:
        values[i] = None
    return values, answered, forwarded


def distinct_logits(logits_fn: Callable, packed: list) -> tuple[torch.Tensor, int]:
    """``logits_fn`` answers each distinct packed decision of ``packed`` once; its rows are repeated for the copies.

    Two packed decisions are the same when every field that the forward reads (tokens, positions, segments, parents,
    read-out indices, questions) is equal, so a repeated row is the row its own forward would give (up to the float
    order of a differently shaped batch).

    Args:
        logits_fn (`Callable`): ``list[PackedRequest] -> (M, A)`` logits, one row per request.
        packed (`list[PackedRequest]`): the decisions to answer.

    Returns:
        `(torch.Tensor, int)`: the logits, one row per entry of ``packed``; the number of rows ``logits_fn`` answered.
    """
    index: dict[tuple, int] = {}
    distinct, rows = [], []
    for p in packed:
        key = (
            tuple(p.input_ids),
            tuple(p.position_ids),
            tuple(p.question_seg),
            tuple(p.option_seg),
            tuple(p.parent),
            tuple(p.question_readout),
            tuple(map(tuple, p.option_readout)),
            p.questions,
        )
        if key not in index:
            index[key] = len(distinct)
            distinct.append(p)
        rows.append(index[key])
    logits = logits_fn(distinct)
    if len(distinct) == len(packed):
        return logits, len(distinct)
    return logits[torch.tensor(rows, device=logits.device)], len(distinct)


def _detail(err: Exception) -> str:
    return str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"


__all__ = ["FAILURE_CAUSES", "BranchFallbacks", "branch_values", "distinct_logits"]
