"""Attention masks of packed batches, built from the per-token segment labels of :mod:`alea_trl.collate`.

Design decisions:
1. Visibility (causal inside each segment): state -> state; question -> state + itself; option -> state + its
   question + itself; nothing sees a sibling question or option or another decision of the same row; padding sees
   only itself, so no softmax row is empty.
2. The dense mask is additive float in the compute dtype: a boolean 4D mask is silently wrong under
   ``attn_implementation="eager"``.
3. The FlexAttention ``BlockMask`` is built from the same labels, so the two paths cannot disagree; on GPU it skips
   fully masked blocks.
"""

from __future__ import annotations

import torch


def allowed_attention(
    question_seg: torch.Tensor, option_seg: torch.Tensor, doc_seg: torch.Tensor | None = None
) -> torch.Tensor:
    """Boolean `(B, L, L)`: may query ``i`` attend key ``j``? (causal, same decision, its state, own question, own
    option; padding attends only to itself so no softmax row is empty). ``doc_seg=None``: one decision per row.

    Built from one integer label per token, its segment ``(decision, question, option)``: a query sees the keys
    (before it) whose segment is its own, its question's text or its decision's state, so the `(B, L, L)` work is
    three comparisons of small integers (in int16 when the labels fit) and one causal ``and``."""
    B, L = question_seg.shape
    q, o = question_seg.long(), option_seg.long()
    d = doc_seg.long() if doc_seg is not None else torch.zeros_like(q)
    n_o, n_q, n_d = (torch.stack([o.max(), q.max(), d.max()]) + 1).tolist()  # one host sync, not three
    real = q >= 0
    own_question = (d * n_q + q) * n_o  # the question's text (for a state token: the state)
    segment = own_question + o  # the token's own segment
    state = d * (n_q * n_o)  # the decision's state
    pad = -1 - torch.arange(L, device=q.device).expand(B, L)  # each padding token is a segment of its own
    small = n_d * n_q * n_o <= torch.iinfo(torch.int16).max and L <= torch.iinfo(torch.int16).max
    label = torch.int16 if small else torch.int64
    segment, own_question, state = (torch.where(real, x, pad).to(label) for x in (segment, own_question, state))
    key = segment[:, None, :]
    seen = key == segment[:, :, None]
    seen |= key == own_question[:, :, None]
    seen |= key == state[:, :, None]
    return seen.logical_and_(torch.ones(L, L, dtype=torch.bool, device=q.device).tril_())


def mask_from_segments(
    question_seg: torch.Tensor, option_seg: torch.Tensor, dtype: torch.dtype, doc_seg: torch.Tensor | None = None
) -> torch.Tensor:
    """The additive float attention mask `(B, 1, L, L)` in the compute ``dtype`` (0 where
    :func:`allowed_attention` allows, the dtype's minimum elsewhere). A boolean 4D mask is not used: it is silently
    wrong under ``attn_implementation="eager"``.

    Built without any boolean `(B, L, L)` intermediate, in two passes over the float mask: every token's segment
    (a run of one decision's state, one question's text or one option) gets its ordinal within the row; a small
    per-query table over those ordinals holds 0 for the query's own segment, its question's text and its decision's
    state (found as the latest question-text and state tokens up to the query: a decision packs its state, then each
    question's text followed by its options); the mask gathers that table at every key's ordinal, and a minimum with
    the causal mask blocks the keys after the query. Padding keys get a column no query allows; padding queries see
    only themselves (the diagonal)."""
    B, L = question_seg.shape
    device = question_seg.device
    q, o = question_seg, option_seg
    d = doc_seg if doc_seg is not None else torch.zeros_like(q)
    real = q >= 0
    change = (q[:, 1:] != q[:, :-1]) | (o[:, 1:] != o[:, :-1]) | (d[:, 1:] != d[:, :-1])
    ordinal = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=device), change.cumsum(1)], 1)  # (B, L)
    text = torch.where(real & (o == 0), ordinal, -1).cummax(1).values  # the query's question text (or state)
    state = torch.where(real & (q == 0), ordinal, -1).cummax(1).values
    n = int(ordinal[:, -1].max()) + 1  # segments per row, at most; the one host sync
    lowest = torch.finfo(dtype).min
    visible = torch.stack([ordinal, text, state], -1)  # (B, L, 3); padding queries: column n + 1, no key's
    visible = torch.where(real[..., None] & (visible >= 0), visible, n + 1)
    table = torch.full((B, L, n + 2), lowest, dtype=dtype, device=device).scatter_(2, visible, 0.0)
    keys = torch.where(real, ordinal, n)  # padding keys: column n, which no query allows
    mask = table.gather(2, keys[:, None, :].expand(B, L, L))
    torch.minimum(mask, torch.full((L, L), lowest, dtype=dtype, device=device).triu_(1), out=mask)
    mask.diagonal(0, 1, 2).fill_(0.0)
    return mask[:, None]


def block_mask_from_segments(
    question_seg: torch.Tensor, option_seg: torch.Tensor, doc_seg: torch.Tensor | None = None
):
    """The FlexAttention ``BlockMask`` equivalent to :func:`mask_from_segments`, for
    ``attn_implementation="flex_attention"`` (the fast path on GPU: fully masked blocks are skipped)."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, L = question_seg.shape
    docs = doc_seg if doc_seg is not None else torch.zeros_like(question_seg)

    def mask_mod(b, h, q_idx, kv_idx):
        qi, qj = question_seg[b, q_idx], question_seg[b, kv_idx]
        oi, oj = option_seg[b, q_idx], option_seg[b, kv_idx]
        visible = (qj == 0) | ((qj == qi) & ((oj == 0) | (oj == oi)))
        real = (qi >= 0) & (qj >= 0) & (docs[b, q_idx] == docs[b, kv_idx])
        return ((q_idx >= kv_idx) & real & visible) | ((qi < 0) & (q_idx == kv_idx))

    return create_block_mask(mask_mod, B, None, L, L, device=question_seg.device)


__all__ = ["allowed_attention", "block_mask_from_segments", "mask_from_segments"]
