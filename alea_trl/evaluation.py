"""Policy evaluation on environments: returns against random and oracle play, regret, report proper scores.

Design decisions:
1. The policy, the random policy and the oracle policy play the same seeded episodes, so their returns are paired and
   the normalised score ``(policy - random) / (oracle - random)`` is 0 for random play and 1 for oracle play.
2. The policy is the model's act head, greedy (argmax) by default or sampled; every decision is answered in batched
   packed forwards (``AleaModel.predict``), all episodes of an env advancing together.
3. Report questions are scored with the same strictly proper rules as training, against the oracle targets.
4. Results come as (sum, count) pairs so processes can split episodes and add their sums; ``evaluate_policy`` turns
   them into means.
5. Dense envs also get ``expected_score``: the same normalisation with every realised reward replaced by the exact
   expected reward (``action_rewards``) of the action taken, and the random / oracle returns by the mean / best
   expected reward at the same decisions. Its expectation is that of ``normalized_score`` when the decisions the
   policy meets do not depend on its actions' payoffs (true of hmm, kelly, newsvendor: the state's information does
   not depend on the action), and it is free of the outcome noise (kelly's log growth, newsvendor's demand), which
   for a few hundred decisions is larger than the gap between two policies.
6. ``episodes`` may give each env its own count (a mapping); each env is then played exactly as a call on that env
   alone would play it, so one call replaces a loop of per-env calls with the same figures.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import torch

from .envs.play import baseline_return
from .envs.registry import env_factories
from .losses import bernoulli_brier, choice_loss, crps_loss, pinball_loss
from .questions import ACT_QID, validate_targets


def _report_loss(question, answer, target, taus) -> float:
    if question.qtype == "choice":
        return float(choice_loss(answer.clamp_min(1e-12).log()[None], torch.as_tensor(target)[None]))
    if question.qtype == "score":
        return float(crps_loss(answer.clamp_min(1e-12).log()[None], torch.as_tensor(target)[None]))
    if question.qtype == "noul":
        p = torch.tensor([min(max(answer, 1e-7), 1 - 1e-7)])
        return float(bernoulli_brier(torch.logit(p), torch.tensor([target])))
    return float(pinball_loss(answer[None].float(), torch.as_tensor(target, dtype=torch.float32)[None], taus))


def _baseline_loss(question, target, taus, climatology) -> float:
    """Loss of the no-skill forecast: uniform for choice / score, 1/2 for noul, the pooled target quantiles of the
    question (climatology) for regress."""
    if question.qtype in ("choice", "score"):
        n = len(target)
        return _report_loss(question, torch.full((n,), 1.0 / n), target, taus)
    if question.qtype == "noul":
        return _report_loss(question, 0.5, target, taus)
    return _report_loss(question, climatology, target, taus)


def _episode_counts(episodes, factories: dict) -> dict[str, int]:
    """Episodes per env from ``episodes`` (one int for every env, or env name -> int); each must be an int >= 1."""
    if isinstance(episodes, Mapping):
        for name in factories:
            if name not in episodes:
                raise ValueError(
                    f"evaluation_sums: env {name!r}: field 'episodes': the mapping has no count for it (it has "
                    f"{sorted(episodes)})"
                )
        counts = {name: episodes[name] for name in factories}
    else:
        counts = dict.fromkeys(factories, episodes)
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"evaluation_sums: env {name!r}: field 'episodes': must be an integer >= 1, got {n!r}")
    return {name: int(n) for name, n in counts.items()}


@torch.no_grad()
def evaluation_sums(
    model,
    tokenizer,
    envs,
    episodes: int | Mapping[str, int] = 100,
    seed: int = 0,
    greedy: bool = True,
    max_len: int | None = None,
    batch_size: int = 16,
    forecasts: list | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, tuple[float, float]]:
    """(sum, count) of every evaluation figure (``"<env>/<metric>"``); :func:`evaluate_policy` turns them into means.

    Args:
        model (`AleaModel`): the model (its ``predict`` answers decisions).
        tokenizer: its tokenizer.
        envs (`list[str]` or `dict[str, Callable]`): registered env names, or name -> factory.
        episodes (`int` or `Mapping[str, int]`, defaults to 100): episodes per env, or env name -> episodes (names
            not evaluated are ignored). With an int, episode ``i`` of the ``k``-th env is seeded ``[seed, k, i]``;
            with a mapping, every env is played exactly as a call on that env alone would play it (episode ``i``
            seeded ``[seed, 0, i]``, its own sampler), so the figures equal those of one call per env.
        seed (`int`, defaults to 0): seed of the episodes (shared by the policy, random and oracle play) and of the
            sampler of ``greedy=False``.
        greedy (`bool`, defaults to `True`): argmax actions; otherwise sample from the act head.
        max_len (`int`, *optional*): decisions packing to more tokens end their episode (counted as ``skipped``);
            for an `AleaModel`, by default the backbone's ``max_position_embeddings``, and a larger one raises.
        batch_size (`int`, defaults to 16): decisions per forward.
        forecasts (`list`, *optional*): when given, every noul forecast is appended as ``(env, qid, p_yes, target)``
            (the input of a reliability diagram).
        shard (`tuple[int, int]`, defaults to `(0, 1)`): ``(i, n)`` plays the episodes whose index is ``i`` modulo
            ``n``, so ``n`` processes can split the episodes and add their sums.

    Returns:
        `dict[str, tuple[float, float]]`: ``(sum, count)`` per figure.
    """
    rank, world = shard
    if hasattr(model, "decision_len_limit"):  # an AleaModel: a max_len past its positions raises, not skips them all
        max_len = model.decision_len_limit(max_len)
    taus = list(model.config.taus)
    factories = env_factories(envs)
    counts = _episode_counts(episodes, factories)
    sampler = torch.Generator().manual_seed(seed)
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def add(key, value):
        sums[key][0] += value
        sums[key][1] += 1.0

    for env_idx, (name, factory) in enumerate(factories.items()):
        if isinstance(episodes, Mapping):  # as a call on this env alone: seeds [seed, 0, i] and a fresh sampler
            env_idx, sampler = 0, torch.Generator().manual_seed(seed)
        mine = [i for i in range(counts[name]) if i % world == rank]
        for i in mine:
            for policy in ("random", "oracle"):
                rng, pick = np.random.default_rng([seed, env_idx, i]), np.random.default_rng([seed, env_idx, i, 1])
                add(f"{name}/{policy}", baseline_return(factory(), rng, policy, pick))
        live = [factory().reset(np.random.default_rng([seed, env_idx, i])) for i in mine]
        returns, dropped = [0.0] * len(live), set()
        regress_seen: list = []  # (question, answer, target) of regress questions, scored against climatology below
        while True:
            idx = [j for j, env in enumerate(live) if not env.done and j not in dropped]
            if not idx:
                break
            decisions = [live[j].observe() for j in idx]
            try:
                answers = model.predict(decisions, tokenizer, max_len=max_len, batch_size=batch_size)
            except ValueError:  # an oversize decision: answer one by one and drop the episodes that do not fit
                answers = []
                for d in decisions:
                    try:
                        answers += model.predict([d], tokenizer, max_len=max_len)
                    except ValueError:
                        answers.append(None)
            for j, d, ans in zip(idx, decisions, answers):
                env = live[j]
                if ans is None:
                    add(f"{name}/skipped", 1.0)
                    dropped.add(j)
                    continue
                targets = validate_targets(d, env.oracle_targets(), env=name)
                for q in d.reports:
                    if q.qid in targets:
                        add(f"{name}/report/{q.qtype}", _report_loss(q, ans[q.qid], targets[q.qid], taus))
                        if q.qtype == "regress":
                            regress_seen.append((q, targets[q.qid]))
                        else:
                            add(f"{name}/baseline/{q.qtype}", _baseline_loss(q, targets[q.qid], taus, None))
                        if forecasts is not None and q.qtype == "noul":
                            forecasts.append((name, q.qid, float(ans[q.qid]), float(targets[q.qid])))
                probs = ans[ACT_QID]
                a = int(probs.argmax()) if greedy else int(torch.multinomial(probs, 1, generator=sampler))
                if env.dense:
                    r = np.asarray(env.action_rewards(), dtype=float)
                    add(f"{name}/regret", float(r.max() - r[a]))
                    add(f"{name}/expected/policy", float(r[a]))
                    add(f"{name}/expected/random", float(r.mean()))
                    add(f"{name}/expected/oracle", float(r.max()))
                reward, _ = env.step(a)
                returns[j] += reward
        for j in range(len(live)):
            if j not in dropped:
                add(f"{name}/return", returns[j])
                if live[j].reached_goal is not None:  # goal-reaching envs: the share of episodes that reach it
                    add(f"{name}/goal_share", float(live[j].reached_goal))
        for qid in {q.qid for q, _ in regress_seen}:
            pooled = np.concatenate([t for q, t in regress_seen if q.qid == qid])
            climatology = torch.tensor(np.quantile(pooled, taus), dtype=torch.float32)
            for q, t in regress_seen:
                if q.qid == qid:
                    add(f"{name}/baseline/regress", _baseline_loss(q, t, taus, climatology))
    return {k: (v[0], v[1]) for k, v in sums.items()}


def evaluate_policy(model, tokenizer, envs, *args, **kwargs) -> dict[str, dict[str, float]]:
    """Evaluate a model's policy and forecasts on environments.

    Args:
        model, tokenizer, envs: as in :func:`evaluation_sums`, which plays the episodes; this returns the means of
            its figures.
        *args, **kwargs: the further arguments of :func:`evaluation_sums`, in its order: ``episodes`` (an int, or
            env name -> count), ``seed``, ``greedy``, ``max_len``, ``batch_size``, ``forecasts`` and ``shard``.

    Returns:
        `dict[str, dict[str, float]]`: per env ``return`` (policy), ``random``, ``oracle``, ``normalized_score``
        ``(return - random) / (oracle - random)``, ``regret`` (dense envs: mean per decision of the best expected
        reward minus that of the chosen action), ``expected_score`` (dense envs: the normalised score from exact
        expected rewards at the decisions the policy met: ``(E[r(a)] - mean_a E[r]) / (max_a E[r] - mean_a E[r])``
        summed over those decisions; free of outcome noise), ``report/<qtype>`` (mean proper score against the oracle),
        ``baseline/<qtype>`` (the same for the no-skill forecast: uniform, 1/2, or the pooled target quantiles of
        the question for regress) and ``skill/<qtype>`` ``= 1 - report / baseline`` (1 is perfect, 0 no skill).
    """
    sums = evaluation_sums(model, tokenizer, envs, *args, **kwargs)
    return table_from_means({key: total / count if count else float("nan") for key, (total, count) in sums.items()})


def table_from_means(means: dict[str, float]) -> dict[str, dict[str, float]]:
    """Turn the means of :func:`evaluation_sums`' figures (``"<env>/<metric>"``) into per-env rows with the derived
    figures: ``normalized_score``, ``expected_score`` (dense envs) and ``skill/<qtype>``."""
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for key, value in means.items():
        env, metric = key.split("/", 1)
        table[env][metric] = value
    for row in table.values():
        for qtype in [k.split("/")[1] for k in row if k.startswith("report/")]:
            base = row.get(f"baseline/{qtype}", float("nan"))
            row[f"skill/{qtype}"] = 1.0 - row[f"report/{qtype}"] / base if base > 0 else float("nan")
        spread = row.get("oracle", float("nan")) - row.get("random", float("nan"))
        gain = row.get("return", float("nan")) - row.get("random", float("nan"))
        row["normalized_score"] = gain / spread if abs(spread) > 1e-12 else float("nan")
        if "expected/policy" in row:  # means over the same decisions: their ratio is the ratio of the sums
            gap = row["expected/oracle"] - row["expected/random"]
            gain = row["expected/policy"] - row["expected/random"]
            row["expected_score"] = gain / gap if abs(gap) > 1e-12 else float("nan")
    return dict(table)


def table_metrics(table: dict[str, dict[str, float]], prefix: str = "eval") -> dict[str, float]:
    """A table as flat metrics: ``<prefix>_<env>/<figure>`` (undefined figures, NaN, left out) and
    ``<prefix>_normalized_score``, the mean over envs of the defined normalised scores."""
    metrics = {f"{prefix}_{env}/{k}": v for env, row in table.items() for k, v in row.items() if v == v}
    scores = [v for row in table.values() if (v := row.get("normalized_score", float("nan"))) == v]
    if scores:
        metrics[f"{prefix}_normalized_score"] = sum(scores) / len(scores)
    return metrics


def format_table(table: dict[str, dict[str, float]]) -> str:
    """A plain-text table of :func:`evaluate_policy` results: one row per env, returns and normalised score, dense
    envs' expected score and regret, and the skill of each report qtype."""
    qtypes = ("choice", "score", "noul", "regress")
    goals = any("goal_share" in row for row in table.values())  # a column only when an env has a goal
    header = f"{'env':<12}{'policy':>10}{'random':>10}{'oracle':>10}{'norm.score':>11}{'exp.score':>10}{'regret':>9}"
    header += f"{'goal':>8}" if goals else ""
    header += "".join(f"{'skill/' + q:>15}" for q in qtypes)
    lines = [header, "-" * len(header)]

    def cell(row, key, width, fmt=".3f"):
        value = row.get(key)
        return f"{'-':>{width}}" if value is None or value != value else f"{value:>{width}{fmt}}"

    for env, row in table.items():
        line = f"{env:<12}" + cell(row, "return", 10) + cell(row, "random", 10) + cell(row, "oracle", 10)
        line += cell(row, "normalized_score", 11) + cell(row, "expected_score", 10) + cell(row, "regret", 9)
        line += cell(row, "goal_share", 8) if goals else ""
        line += "".join(cell(row, f"skill/{q}", 15) for q in qtypes)
        lines.append(line)
    return "\n".join(lines)


__all__ = ["evaluate_policy", "evaluation_sums", "format_table", "table_from_means", "table_metrics"]
