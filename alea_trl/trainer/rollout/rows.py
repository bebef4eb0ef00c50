"""Loss inputs: decision rows stacked into the dict that TRL's generation buffer splits and shuffles, and that
:func:`~alea_trl.trainer.loss.objective.grpo_loss` reads.

Design decisions:
1. One row is one decision: up to k sampled actions with their advantages and behaviour log-probs (dense), or one
   replayed action (outcome). Per-sample tensors are `(N, k)` with a ``sample_mask``.
2. Two per-row switches say which terms a row trains in this forward: ``trains_action`` (its actions enter the policy
   loss) and ``trains_kl_and_reports`` (its KL and report terms do). When actions are sampled in the loss forward, an
   outcome decision trains its KL and reports when it is made and its action when its episode ends and it is
   replayed, so each term is trained once.
3. Every value that TRL must split by row is a tensor or a list of the same length; tensors come first (TRL sizes a
   batch by the first value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ...packing import PackedRequest


@dataclass(kw_only=True)
class DecisionRow:
    """One decision ready for the loss: its packing, targets, sampled actions and their advantages (built by keyword;
    the advantages of a row valued later are filled in then)."""

    env_index: int
    packed: PackedRequest
    targets: dict
    actions: list[int]
    old_logps: list[float]
    ref_logps: torch.Tensor | None = None
    advantages: list[float] = field(default_factory=list)
    outcome: bool = False
    step: int = 0  # the optimizer step at which its actions were sampled
    ready: bool = True  # its advantages were known when it was made (dense, or outcome valued by branching)
    t: int = 0  # outcome rows valued at the episode's end: the decision's index in its episode
    # what each action's advantage was computed from: its expected reward (dense), its branch return, its
    # return-to-go or the episode's return (outcome); None until known (and in rows of older checkpoints)
    values: list[float] | None = None
    # dense_update other than "sampled": per legal action its advantage ("all_actions") or its log-prob step (the
    # step-target updates, the default "all_actions_ascent" among them), and its behaviour log-prob (None otherwise)
    action_advantages: list[float] | None = None
    old_logps_all: list[float] | None = None
    # dense_update other than "sampled": every legal action's expected reward, the value its advantage or step came
    # from (logged)
    action_values: list[float] | None = None


def rows_to_inputs(
    rows: list[DecisionRow],
    k: int,
    trains_action: list[bool] | None = None,
    trains_kl_and_reports: list[bool] | None = None,
) -> dict:
    """Stack rows into loss inputs.

    Args:
        rows (`list[DecisionRow]`): the rows.
        k (`int`): the widest row (``num_generations``).
        trains_action (`list[bool]`, *optional*): per row, whether its actions enter the policy loss (default: all).
        trains_kl_and_reports (`list[bool]`, *optional*): per row, whether its KL and report terms enter the loss
            (default: all).

    Returns:
        `dict`: ``actions``, ``sample_mask``, ``advantages``, ``old_logps``, ``values`` (what each advantage was
        computed from, see `DecisionRow`) `(N, k)`; ``kl_report_mask`` `(N,)` (float); ``env_index``,
        ``outcome_rows`` (rows of outcome envs), ``sampled_at_step`` `(N,)`; ``ref_logps`` `(N, A)` (the reference's
        log-probs over each row's legal actions, zero-padded; zero for rows without them); ``all_actions_rows``
        `(N,)` (rows whose act trains by every legal action: dense rows under a ``dense_update`` other than
        ``"sampled"``) with their ``action_advantages`` (advantages, or log-prob steps under a step-target update),
        ``old_logps_all`` and ``action_values`` `(N, A)` (zero-padded; the values are logged, not trained on);
        ``packed`` and ``targets`` (lists).
    """
    n = len(rows)
    trains_action = [True] * n if trains_action is None else trains_action
    trains_kl_and_reports = [True] * n if trains_kl_and_reports is None else trains_kl_and_reports
    actions = torch.zeros(n, k, dtype=torch.long)
    mask = torch.zeros(n, k, dtype=torch.bool)
    adv = torch.zeros(n, k)
    old = torch.zeros(n, k)
    values = torch.zeros(n, k)
    for i, row in enumerate(rows):
        if not trains_action[i]:
            continue
        m = len(row.actions)
        if not all(math.isfinite(a) for a in row.advantages):
            raise ValueError("rollout: a non-finite advantage was produced (check the env's rewards)")
        actions[i, :m] = torch.tensor(row.actions)
        mask[i, :m] = True
        adv[i, :m] = torch.tensor(row.advantages, dtype=torch.float32)
        old[i, :m] = torch.tensor(row.old_logps, dtype=torch.float32)
        values[i, :m] = torch.tensor(row.values if row.values is not None else row.advantages, dtype=torch.float32)
    refs = [
        row.ref_logps if use and row.ref_logps is not None else None for row, use in zip(rows, trains_kl_and_reports)
    ]
    ref = torch.zeros(n, max((r.shape[0] for r in refs if r is not None), default=0))
    for i, r in enumerate(refs):
        if r is not None:
            ref[i, : r.shape[0]] = r
    all_rows = [use and row.action_advantages is not None for row, use in zip(rows, trains_action)]
    width = max((len(row.action_advantages) for row, use in zip(rows, all_rows) if use), default=0)
    action_adv, old_all, action_values = torch.zeros(n, width), torch.zeros(n, width), torch.zeros(n, width)
    for i, row in enumerate(rows):
        if all_rows[i]:
            action_adv[i, : len(row.action_advantages)] = torch.tensor(row.action_advantages, dtype=torch.float32)
            old_all[i, : len(row.old_logps_all)] = torch.tensor(row.old_logps_all, dtype=torch.float32)
            if row.action_values is not None:  # rows of older checkpoints have none
                action_values[i, : len(row.action_values)] = torch.tensor(row.action_values, dtype=torch.float32)
    return {
        "actions": actions,
        "sample_mask": mask,
        "advantages": adv,
        "old_logps": old,
        "values": values,
        "kl_report_mask": torch.tensor(trains_kl_and_reports, dtype=torch.float32),
        "env_index": torch.tensor([row.env_index for row in rows], dtype=torch.long),
        "outcome_rows": torch.tensor([row.outcome for row in rows], dtype=torch.bool),
        "sampled_at_step": torch.tensor([row.step for row in rows], dtype=torch.long),
        "ref_logps": ref,
        "all_actions_rows": torch.tensor(all_rows, dtype=torch.bool),
        "action_advantages": action_adv,
        "old_logps_all": old_all,
        "action_values": action_values,
        "packed": [row.packed for row in rows],
        "targets": [row.targets if use else {} for row, use in zip(rows, trains_kl_and_reports)],
    }


def sampled_forward_inputs(replay: list[DecisionRow], wave, rows: list[DecisionRow | None], k: int, env_index) -> dict:
    """Loss inputs of a forward whose fresh decisions were just sampled from it (``sample_in_loss_forward``).

    Args:
        replay (`list[DecisionRow]`): outcome decisions whose episodes ended: their actions enter the policy loss
            (their KL and reports were trained when they were made).
        wave (`Wave`): the fresh decisions, after ``replay`` in the forward.
        rows (`list[DecisionRow | None]`): :meth:`Rollout.advance`'s rows for ``wave``: a row whose advantages are
            known (dense, or outcome valued by branching) enters every term; another outcome row its KL and reports
            (its action waits for the return); ``None`` (a skipped env failure) nothing.
        k (`int`): ``num_generations``.
        env_index (`dict[str, int]`): env name -> index.
    """
    full, trains_action, trains_kl_and_reports = list(replay), [True] * len(replay), [False] * len(replay)
    for ep, packed, row in zip(wave.episodes, wave.packed, rows):
        made = row is not None
        full.append(
            row
            if made
            else DecisionRow(env_index=env_index[ep.env_name], packed=packed, targets={}, actions=[], old_logps=[])
        )
        trains_action.append(made and row.ready)
        trains_kl_and_reports.append(made)
    return rows_to_inputs(full, k, trains_action, trains_kl_and_reports)


__all__ = ["DecisionRow", "rows_to_inputs", "sampled_forward_inputs"]
