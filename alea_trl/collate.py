"""Collation: packed decisions right-padded into one batch of tensors, with flat read-out indices.

Design decisions:
1. One decision per row by default; with ``row_tokens`` several decisions share a row (first-fit decreasing), and the
   per-token label ``doc_seg`` (the decision's index in the batch) keeps them from attending to each other, so a row
   holding many short decisions gives the same outputs as one row per decision, with far less padding.
2. Read-outs are flat and decision-major: every question's ``(row, position)`` and every option's, in the order of
   the packed requests, so the heads' outputs line up with the decisions' questions without a Python loop.
3. All index work is numpy over the decisions' token arrays laid end to end (made once per request), handed to torch
   without copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .packing import ROLE_OPTION, ROLE_QUESTION, ROLE_STATE, PackedRequest


@dataclass
class PackedBatch:
    """Packed decisions collated into padded tensors, with flat read-out indices.

    Attributes:
        input_ids, position_ids, question_seg, option_seg, doc_seg, role_ids, prev_ids, prev2_ids (`torch.LongTensor`
            of shape `(B, L)`): per-token tensors; ``doc_seg`` is the index of the token's decision in the batch (rows
            may hold several decisions); padding has ``question_seg == doc_seg == -1``; ``prev_ids == prev2_ids == -1``
            where no such token exists.
        question_index (`torch.LongTensor` of shape `(NQ, 2)`): ``(row, position)`` of every question read-out,
            decision-major.
        question_type (`torch.LongTensor` of shape `(NQ,)`): index into ``QTYPES``.
        question_bins (`torch.LongTensor` of shape `(NQ,)`): ``n_bins`` of score questions, 0 otherwise.
        question_options (`torch.LongTensor` of shape `(NQ,)`): number of options of choice questions, 0 otherwise.
        question_row (`torch.LongTensor` of shape `(NQ,)`): the decision each question belongs to.
        option_index (`torch.LongTensor` of shape `(NO,)` x 2): ``(row, position)`` of every option read-out.
        option_question (`torch.LongTensor` of shape `(NO,)`): flat index of the question each option belongs to.
        questions (`list[tuple[Question, ...]]`): the questions of each decision.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    question_seg: torch.Tensor
    option_seg: torch.Tensor
    doc_seg: torch.Tensor
    role_ids: torch.Tensor
    prev_ids: torch.Tensor
    prev2_ids: torch.Tensor
    question_index: torch.Tensor
    question_type: torch.Tensor
    question_bins: torch.Tensor
    question_options: torch.Tensor
    question_row: torch.Tensor
    option_index: torch.Tensor
    option_question: torch.Tensor
    questions: list

    _TENSORS = (
        "input_ids",
        "position_ids",
        "question_seg",
        "option_seg",
        "doc_seg",
        "role_ids",
        "prev_ids",
        "prev2_ids",
        "question_index",
        "question_type",
        "question_bins",
        "question_options",
        "question_row",
        "option_index",
        "option_question",
    )

    def to(self, device) -> PackedBatch:
        """Move every tensor to ``device``."""
        moved = {name: getattr(self, name).to(device) for name in self._TENSORS}
        return PackedBatch(**moved, questions=self.questions)

    def model_inputs(self) -> dict:
        """The keyword arguments of :meth:`AleaModel.forward` (everything but the Python metadata)."""
        return {name: getattr(self, name) for name in self._TENSORS}

    @property
    def n_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        return int((self.question_seg >= 0).sum())


def pad_token_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS token, else 0 (padding is never attended
    to, so any id works; a real one keeps embedding look-ups in range)."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0


def _place_rows(lengths: list[int], row_tokens: int | None) -> list[tuple[int, int]]:
    """``(row, offset)`` of each decision: one per row, or first-fit decreasing into rows of ``row_tokens`` tokens
    (at least the longest decision)."""
    if row_tokens is None:
        return [(b, 0) for b in range(len(lengths))]
    capacity = max(row_tokens, max(lengths))
    free: list[int] = []  # tokens used per row
    placed = [(0, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, used in enumerate(free) if used + lengths[i] <= capacity), None)
        if row is None:
            row = len(free)
            free.append(0)
        placed[i] = (row, free[row])
        free[row] += lengths[i]
    return placed


def collate_segments(packed: Sequence[PackedRequest], pad_id: int, row_tokens: int | None = None) -> PackedBatch:
    """Right-pad packed requests into one :class:`PackedBatch`.

    Args:
        packed (`Sequence[PackedRequest]`): the decisions; question and option read-outs stay in this order.
        pad_id (`int`): the padding token.
        row_tokens (`int`, *optional*): when given, several decisions share a row of at most this many tokens (or
            the longest decision, if longer), placed first-fit decreasing; ``doc_seg`` keeps them from attending to
            each other. ``None``: one decision per row.
    """
    if not packed:
        raise ValueError("collate_segments: field 'packed': needs at least one packed request")
    if row_tokens is not None and row_tokens < 1:
        raise ValueError(f"collate_segments: field 'row_tokens': must be a positive integer or None, got {row_tokens}")
    lengths = [len(p) for p in packed]
    placed = _place_rows(lengths, row_tokens)
    B = 1 + max(row for row, _ in placed)
    L = max(offset + n for n, (_, offset) in zip(lengths, placed))
    # the decisions' tokens end to end (each request's arrays are made once), then scattered into the (B, L) grid;
    # all in numpy (no per-op thread wake-ups), handed to torch without copies
    arrays = [p.arrays for p in packed]
    ids, pos, qseg, oseg, parent = np.concatenate([a[0] for a in arrays], 1)  # (T,) each
    base = np.array([b * L + start for b, start in placed], dtype=np.int64)  # flat grid index of each first token
    n_q = np.array([a[1].shape[1] for a in arrays])
    n_o = np.array([a[2].shape[1] for a in arrays])
    questions = np.concatenate([a[1] for a in arrays], 1)  # (4, NQ)
    options = np.concatenate([a[2] for a in arrays], 1)  # (2, NO)
    q_first = np.cumsum(n_q) - n_q  # index of each decision's first question in the batch
    n = np.array(lengths)
    doc = np.repeat(np.arange(len(packed)), n)  # (T,) each token's decision
    first = (np.cumsum(n) - n)[doc]  # (T,) index of its decision's first token in the flat list
    dest = base[doc] + np.arange(len(ids)) - first
    parent = np.where(parent >= 0, parent + first, -1)  # flat index of the parent token
    grand = np.where(parent >= 0, parent[np.maximum(parent, 0)], -1)

    def grid(values: np.ndarray, fill: int) -> np.ndarray:
        out = np.full(B * L, fill, dtype=np.int64)
        out[dest] = values
        return out.reshape(B, L)

    position_ids = np.tile(np.arange(L), B)  # padding positions continue counting (padding attends only to itself)
    position_ids[dest] = pos
    question_seg, option_seg = grid(qseg, -1), grid(oseg, 0)
    role_ids = np.where(option_seg > 0, ROLE_OPTION, np.where(question_seg > 0, ROLE_QUESTION, ROLE_STATE))

    def row_and_column(flat: np.ndarray) -> np.ndarray:
        return np.stack([flat // L, flat % L], -1)

    fields = {
        "input_ids": grid(ids, pad_id),
        "position_ids": position_ids.reshape(B, L),
        "question_seg": question_seg,
        "option_seg": option_seg,
        "doc_seg": grid(doc, -1),
        "role_ids": role_ids,
        "prev_ids": grid(np.where(parent >= 0, ids[np.maximum(parent, 0)], -1), -1),
        "prev2_ids": grid(np.where(grand >= 0, ids[np.maximum(grand, 0)], -1), -1),
        "question_index": row_and_column(questions[0] + np.repeat(base, n_q)),
        "question_type": questions[1],
        "question_bins": questions[2],
        "question_options": questions[3],
        "question_row": np.repeat(np.arange(len(packed)), n_q),
        "option_index": row_and_column(options[0] + np.repeat(base, n_o)),
        "option_question": options[1] + np.repeat(q_first, n_o),
    }
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64)) for k, v in fields.items()}
    return PackedBatch(**tensors, questions=[p.questions for p in packed])


__all__ = ["PackedBatch", "collate_segments", "pad_token_id"]
