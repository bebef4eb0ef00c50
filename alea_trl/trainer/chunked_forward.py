"""A batch of decisions answered in several forwards grouped by length, merged back into one output.

Design decisions:
1. Decisions of very different lengths padded into one tensor waste compute on padding (a mix of 330- and
   200-token decisions pads ~30%). With a token budget (``max_batch_tokens``), the decisions are sorted by length
   and cut into consecutive groups whose padded size fits it; each group is one forward.
2. The groups' outputs are merged into one ``AleaOutput`` laid out exactly as a single forward over the decisions
   *in their original order* would lay it out, so the loss code does not know chunking happened: question-level
   tensors and option logits are permuted back, and choice logits are padded with ``-inf`` to a common width.
3. All groups' graphs stay alive until the one backward of the micro-batch (the loss is a mean over all of them);
   the budget bounds each forward's padded size, not the micro-batch's activation memory.
4. When the reference shares the policy's frozen trunk, each group's trunk is captured in its own forward.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ..collate import PackedBatch
from ..modeling_alea import AleaOutput
from ..packing import PackedRequest


def length_groups(lengths: list[int], max_tokens: int | None) -> list[list[int]]:
    """Indices sorted by length, cut into consecutive groups whose padded size (longest x count) fits
    ``max_tokens`` (a single decision always forms a group). ``None``: one group in the original order."""
    if max_tokens is None:
        return [list(range(len(lengths)))]
    groups, current, longest = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        new_longest = max(longest, lengths[i])
        if current and new_longest * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, new_longest = [], lengths[i]
        current.append(i)
        longest = new_longest
    if current:
        groups.append(current)
    return groups


def _pad_width(x: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(x, (0, width - x.shape[-1]), value=float("-inf")) if x.shape[-1] < width else x


def merge_outputs(
    packed: list[PackedRequest], groups: list[list[int]], outputs: list[AleaOutput]
) -> tuple[AleaOutput, list[torch.Tensor]]:
    """One ``AleaOutput`` in the original decision order from per-group outputs.

    Returns:
        `(AleaOutput, list[torch.Tensor])`: the merged output and, per group, the permutation that maps the merged
        flat question index to the group-concatenated one (used to merge other question-level tensors alike).
    """
    n_q = [len(p.questions) for p in packed]
    n_o = [sum(len(r) for r in p.option_readout) for p in packed]
    q_start, o_start, q_total, o_total = {}, {}, 0, 0
    for g in groups:  # where each decision's questions / options sit in the group-concatenated tensors
        for d in g:
            q_start[d], o_start[d] = q_total, o_total
            q_total, o_total = q_total + n_q[d], o_total + n_o[d]
    q_perm = torch.tensor([q_start[d] + j for d in range(len(packed)) for j in range(n_q[d])], dtype=torch.long)
    o_perm = torch.tensor([o_start[d] + j for d in range(len(packed)) for j in range(n_o[d])], dtype=torch.long)
    device = outputs[0].noul_logits.device
    q_perm, o_perm = q_perm.to(device), o_perm.to(device)
    width = max(o.choice_logits.shape[-1] for o in outputs)

    def cat(name: str, pad: bool = False) -> torch.Tensor:
        parts = [getattr(o, name) for o in outputs]
        if pad:
            parts = [_pad_width(p, width) for p in parts]
        return torch.cat(parts, 0)

    merged = AleaOutput(
        option_logits=cat("option_logits").index_select(0, o_perm),
        choice_logits=cat("choice_logits", pad=True).index_select(0, q_perm),
        score_logits=cat("score_logits").index_select(0, q_perm),
        noul_logits=cat("noul_logits").index_select(0, q_perm),
        quantiles=cat("quantiles").index_select(0, q_perm),
    )
    return merged, q_perm


def chunked_forward(
    forward: Callable[[PackedBatch], tuple[AleaOutput, torch.Tensor | None]],
    collate: Callable[[list[PackedRequest]], PackedBatch],
    packed: list[PackedRequest],
    max_tokens: int | None,
) -> tuple[AleaOutput, torch.Tensor | None, object]:
    """Answer ``packed`` in length-grouped forwards and merge.

    Args:
        forward (`Callable`): ``batch -> (AleaOutput, reference choice logits or None)`` for one group.
        collate (`Callable`): ``list[PackedRequest] -> PackedBatch`` on the device.
        packed (`list[PackedRequest]`): the decisions.
        max_tokens (`int`, *optional*): padded tokens per forward; ``None``: one forward.

    Returns:
        `(AleaOutput, torch.Tensor | None, batch)`: the merged outputs, the merged reference choice logits, and an
        object with the ``questions`` of every decision in the original order (what the loss reads of a batch).
    """
    groups = length_groups([len(p) for p in packed], max_tokens)
    if len(groups) == 1 and groups[0] == list(range(len(packed))):
        batch = collate(packed)
        output, ref = forward(batch)
        return output, ref, batch
    outputs, refs = [], []
    for g in groups:
        output, ref = forward(collate([packed[i] for i in g]))
        outputs.append(output)
        refs.append(ref)
    merged, q_perm = merge_outputs(packed, groups, outputs)
    ref = None
    if refs[0] is not None:
        width = max(r.shape[-1] for r in refs)
        ref = torch.cat([_pad_width(r, width) for r in refs], 0).index_select(0, q_perm)
    return merged, ref, SimpleNamespace(questions=[p.questions for p in packed])


__all__ = ["chunked_forward", "length_groups", "merge_outputs"]
