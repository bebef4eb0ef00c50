"""Decisions answered by the policy and, when the KL needs it, by the reference policy: the forwards of a training
step, with or without autograd.

Design decisions:
1. Decisions are collated on the device, several per row with ``pack_rows`` (up to the longest decision), and split
   into length-grouped forwards under ``max_batch_tokens`` (:func:`~alea_trl.trainer.forward.policy.chunked_forward`).
2. The reference's choice logits come without autograd, from the cheapest source that is exact: the policy's own
   frozen trunk in ``heads`` / ``tail`` modes (the reference runs only the layers that train), else the frozen copy,
   else (LoRA) the policy with its adapter disabled.
3. Each call counts the padded tokens of its forwards, for the token metrics.
4. On a sharded model every process runs as many forwards as the process with the most length groups (dummy
   forwards make up the difference, see :mod:`~alea_trl.trainer.forward.even`); their outputs are kept, times 0,
   in ``dummy_loss`` for the loss.

Length groups (``max_batch_tokens``):
5. Decisions of very different lengths padded into one tensor waste compute on padding (a mix of 330- and
   200-token decisions pads ~30%). With a token budget (``max_batch_tokens``), the decisions are sorted by length
   and cut into consecutive groups whose padded size fits it; each group is one forward.
6. The groups' outputs are merged into one ``AleaOutput`` laid out exactly as a single forward over the decisions
   *in their original order* would lay it out, so the loss code does not know chunking happened: question-level
   tensors and option logits are permuted back, and choice logits are padded with ``-inf`` to a common width.
7. All groups' graphs stay alive until the one backward of the micro-batch (the loss is a mean over all of them);
   the budget bounds each forward's padded size, not the micro-batch's activation memory.
8. When the reference shares the policy's frozen trunk, each group's trunk is captured in its own forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ...collate import PackedBatch, collate_segments
from ...modeling_alea import AleaOutput
from ...packing import PackedRequest
from ..act import act_rows
from .even import EvenForwards, zero_weight
from .reference import captured_trunk, reference_choice_logits


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


@dataclass
class ForwardResult:
    """What one :class:`PolicyForward` call returns.

    Attributes:
        output (`AleaOutput`): the policy's outputs, decisions in the order given.
        ref_choice_logits (`torch.Tensor`, *optional*): the reference's choice logits (no autograd); ``None`` when not
            asked for.
        batch: the collated batch (its ``questions`` in the order of the decisions given).
        padded_tokens (`int`): the padded tokens of the real forwards (for the token metrics).
        dummy_loss (`torch.Tensor`, *optional*): the zero-weight outputs of dummy forwards run with autograd (sharded
            models, see :mod:`~alea_trl.trainer.forward.even`); ``None`` when none ran.
    """

    output: AleaOutput
    ref_choice_logits: torch.Tensor | None
    batch: object
    padded_tokens: int
    dummy_loss: torch.Tensor | None = None

    def act_logits(self) -> torch.Tensor:
        """The policy's act logits `(N, A)` (float32, ``-inf`` beyond the legal options), detached."""
        return act_rows(self.output.choice_logits.detach(), self.batch)

    def ref_act_logits(self) -> torch.Tensor | None:
        """The reference's act logits `(N, A)`, or ``None``."""
        return act_rows(self.ref_choice_logits, self.batch) if self.ref_choice_logits is not None else None


class PolicyForward:
    """Answers packed decisions with the policy (and the reference).

    Args:
        device (`torch.device`): where batches go.
        pad_id (`int`): the padding token.
        pack_rows (`bool`): let several decisions share a row.
        max_batch_tokens (`int`, *optional*): padded tokens per forward; ``None``: one forward per call.
        ref_model (`torch.nn.Module`, *optional*): the frozen reference copy; ``None`` under LoRA (the reference is
            the adapter-disabled policy) or when ``beta == 0``.
        shared_trunk_layer (`int`, *optional*): the first decoder layer the reference must run itself (the layers
            below are the policy's frozen trunk); ``None``: the reference runs whole.
        even (`EvenForwards`, *optional*): keeps the number of forwards equal across processes (sharded models).
    """

    def __init__(
        self,
        device,
        pad_id: int,
        pack_rows: bool,
        max_batch_tokens,
        ref_model=None,
        shared_trunk_layer=None,
        even: EvenForwards | None = None,
    ):
        self.device, self.pad_id, self.pack_rows = device, pad_id, pack_rows
        self.max_batch_tokens = max_batch_tokens
        self.ref_model, self.shared_trunk_layer = ref_model, shared_trunk_layer
        self.even = even
        self.collate_hooks: list[Callable] = []

    def add_collate_hook(self, hook: Callable) -> None:
        """Call ``hook(packed, batch)`` after every collation of real decisions (e.g. to count what the forwards see;
        ``torch.is_grad_enabled()`` tells a loss forward from a no-grad one)."""
        self.collate_hooks.append(hook)

    def collate(self, packed: list[PackedRequest]):
        """Collate decisions on the device; with ``pack_rows`` several share a row, up to the longest decision."""
        batch = self._collated(packed)
        for hook in self.collate_hooks:
            hook(packed, batch)
        return batch

    def _collated(self, packed: list[PackedRequest]):
        row_tokens = max(len(p) for p in packed) if self.pack_rows else None
        return collate_segments(packed, self.pad_id, row_tokens=row_tokens).to(self.device)

    def __call__(self, model, unwrapped, packed: list[PackedRequest], with_reference: bool) -> ForwardResult:
        """Answer ``packed`` with ``model`` (whose plain module is ``unwrapped``), and with ``with_reference`` the
        reference's choice logits without autograd."""
        layer = self.shared_trunk_layer
        padded, dummy_loss = 0, None
        n_forwards = len(length_groups([len(p) for p in packed], self.max_batch_tokens))
        n_dummy = self.even.largest(n_forwards) - n_forwards if self.even is not None else 0

        def forward(batch):
            nonlocal padded
            padded += batch.input_ids.numel()
            if with_reference and layer is not None:
                with captured_trunk(unwrapped, layer) as captured:
                    output = model(**batch.model_inputs())
                return output, reference_choice_logits(self.ref_model, captured, batch, layer)
            output = model(**batch.model_inputs())
            if not with_reference:
                return output, None
            with torch.no_grad():
                if self.ref_model is not None:
                    return output, self.ref_model(**batch.model_inputs()).choice_logits
                with unwrapped.disable_adapter():
                    return output, unwrapped(**batch.model_inputs()).choice_logits

        output, ref_choice, batch = chunked_forward(forward, self.collate, packed, self.max_batch_tokens)
        real_padded = padded
        for _ in range(n_dummy):
            self.even.dummy_forwards += 1
            dummy_output, _ = forward(self._collated([self.even.dummy]))
            zero = zero_weight(dummy_output) if torch.is_grad_enabled() else None
            if zero is not None:
                dummy_loss = zero if dummy_loss is None else dummy_loss + zero
        return ForwardResult(output, ref_choice, batch, real_padded, dummy_loss)


__all__ = ["PolicyForward", "act_rows", "chunked_forward", "length_groups", "merge_outputs"]
