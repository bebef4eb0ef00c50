"""Decisions answered by the policy and, when the KL needs it, by the reference policy: the forwards of a training
step, with or without autograd.

Design decisions:
1. Decisions are collated on the device, several per row with ``pack_rows`` (up to the longest decision), and split
   into length-grouped forwards under ``max_batch_tokens`` (:func:`~alea_trl.trainer.chunked_forward.chunked_forward`).
2. The reference's choice logits come without autograd, from the cheapest source that is exact: the policy's own
   frozen trunk in ``heads`` / ``tail`` modes (the reference runs only the layers that train), else the frozen copy,
   else (LoRA) the policy with its adapter disabled.
3. Each call counts the padded tokens of its forwards, for the token metrics.
4. On a sharded model every process runs as many forwards as the process with the most length groups (dummy
   forwards make up the difference, see :mod:`~alea_trl.trainer.even_forwards`); their outputs are kept, times 0,
   in ``dummy_loss`` for the loss.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..collate import collate_segments
from ..packing import PackedRequest
from .chunked_forward import chunked_forward, length_groups
from .even_forwards import EvenForwards, zero_weight
from .loss import act_logits_of
from .shared_trunk import captured_trunk, reference_choice_logits


def act_rows(choice_logits: torch.Tensor, batch) -> torch.Tensor:
    """The act question's logits of every decision, `(N, A)` in float32, ``-inf`` beyond its legal options."""
    return act_logits_of(SimpleNamespace(choice_logits=choice_logits), batch)[0].float()


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
        self.padded_tokens = 0
        self.dummy_loss = None

    def collate(self, packed: list[PackedRequest]):
        """Collate decisions on the device; with ``pack_rows`` several share a row, up to the longest decision."""
        row_tokens = max(len(p) for p in packed) if self.pack_rows else None
        return collate_segments(packed, self.pad_id, row_tokens=row_tokens).to(self.device)

    def __call__(self, model, unwrapped, packed: list[PackedRequest], with_reference: bool):
        """Answer ``packed`` with ``model`` (whose plain module is ``unwrapped``), and with ``with_reference`` the
        reference's choice logits without autograd.

        Returns:
            `(AleaOutput, torch.Tensor | None, batch)`: the outputs, the reference's choice logits, and the batch (its
            ``questions`` in the order of ``packed``). ``padded_tokens`` holds the forwards' padded token count and
            ``dummy_loss`` the zero-weight outputs of dummy forwards (``None`` when none ran with autograd).
        """
        layer = self.shared_trunk_layer
        self.padded_tokens, self.dummy_loss = 0, None
        n_forwards = len(length_groups([len(p) for p in packed], self.max_batch_tokens))
        n_dummy = self.even.largest(n_forwards) - n_forwards if self.even is not None else 0

        def forward(batch):
            self.padded_tokens += batch.input_ids.numel()
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

        result = chunked_forward(forward, self.collate, packed, self.max_batch_tokens)
        padded = self.padded_tokens
        for _ in range(n_dummy):
            self.even.dummy_forwards += 1
            output, _ = forward(self.collate([self.even.dummy]))
            zero = zero_weight(output) if torch.is_grad_enabled() else None
            if zero is not None:
                self.dummy_loss = zero if self.dummy_loss is None else self.dummy_loss + zero
        self.padded_tokens = padded
        return result


__all__ = ["PolicyForward", "act_rows"]
