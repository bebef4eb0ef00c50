"""Shared-prefix packing: one decision (a state and all its questions and options) becomes one sequence.

Design decisions:
1. Layout ``[state][q1][q1.opt1][q1.opt2]...[q2]...``. The state is paid once; every question and option is a short
   segment after it.
2. Position ids: the state is ``0..S-1``; every question restarts at ``S`` and its options continue after it, so each
   question is positioned as if it came straight after the state.
3. Attention (causal inside each segment): state -> state; question -> state + itself; option -> state + its
   question + itself. Nothing sees a sibling question or option. Hence the packed forward gives every question and
   option exactly the hidden states of a separate forward of ``state + question (+ option)``: this is the module's
   contract and its main test.
4. Two per-token labels describe the structure: ``question_seg`` (0 for the state, ``i+1`` for question ``i`` and its
   options, -1 for padding) and ``option_seg`` (0 for state and question tokens, ``j+1`` for option ``j``). Both the
   dense additive mask and the FlexAttention ``BlockMask`` are built from them, so the two paths cannot disagree.
5. ``parent`` gives each token the index of the previous token of its own logical sequence (the last state token
   for a question's first token, the question's last token for an option's first token), so n-gram features see
   the same history packed and unpacked.
6. Several decisions may share one row of a batch (``collate_segments(..., row_tokens=...)``): a third label,
   ``doc_seg`` (the decision's index in the batch), keeps them apart, so a row holding many short decisions gives the
   same outputs as one row per decision, with far less padding.
7. Nothing is truncated silently: a decision longer than ``max_len`` raises ``ValueError`` with the token count and
   the limit, unless ``truncate_state=True`` asks for the state to be cut from the left.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from .questions import QTYPES, Question


QUESTION_TEMPLATE = "\nQuestion: {text}\nAnswer:"
"""How a question segment reads after the state."""

OPTION_TEMPLATE = " {option}"
"""How an option segment reads after its question."""

ROLE_STATE, ROLE_QUESTION, ROLE_OPTION = 0, 1, 2


@dataclass
class PackedRequest:
    """One decision packed into one token sequence (plain Python lists; see :func:`collate_segments`).

    Attributes:
        input_ids (`list[int]`): the packed tokens.
        position_ids (`list[int]`): restarted positions (see the module docstring).
        question_seg (`list[int]`): 0 for state tokens, ``i+1`` for tokens of question ``i`` and its options.
        option_seg (`list[int]`): 0 for state and question tokens, ``j+1`` for tokens of option ``j``.
        parent (`list[int]`): index of the previous token of the same logical sequence, -1 for the first token.
        questions (`tuple[Question, ...]`): the questions, in packing order.
        question_readout (`list[int]`): index of the last token of each question.
        option_readout (`list[list[int]]`): per question, the index of the last token of each option (empty for
            non-choice questions).
        n_state_tokens (`int`): tokens of the state (after any requested truncation).
        n_state_dropped (`int`): state tokens dropped from the left because ``truncate_state=True``.

    A packed request is read-only once built: :func:`collate_segments` reads it through arrays made once per request
    (``arrays``; the trainer makes them while observing, off the training thread), so a later edit of its lists
    would not be seen.
    """

    input_ids: list[int]
    position_ids: list[int]
    question_seg: list[int]
    option_seg: list[int]
    parent: list[int]
    questions: tuple[Question, ...]
    question_readout: list[int]
    option_readout: list[list[int]]
    n_state_tokens: int
    n_state_dropped: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    @cached_property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """int64 arrays of the request, made once: tokens `(5, n)` (``input_ids``, ``position_ids``,
        ``question_seg``, ``option_seg``, ``parent``), questions `(4, n_questions)` (read-out index, qtype index,
        bins, number of options) and options `(2, n_options)` (read-out index, index of the option's question)."""
        tokens = np.array(
            [self.input_ids, self.position_ids, self.question_seg, self.option_seg, self.parent], dtype=np.int64
        )
        questions = np.array(
            [
                self.question_readout,
                [QTYPES.index(q.qtype) for q in self.questions],
                [q.n_bins or 0 for q in self.questions],
                [len(r) for r in self.option_readout],
            ],
            dtype=np.int64,
        ).reshape(4, len(self.questions))
        options = np.array(
            [[o for r in self.option_readout for o in r], [i for i, r in enumerate(self.option_readout) for _ in r]],
            dtype=np.int64,
        ).reshape(2, -1)
        return tokens, questions, options

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("arrays", None)  # made again on demand: pickles (checkpointed episode pools) stay lean
        return state


_SEGMENT_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SEGMENT_CACHE_SIZE = 65536


def _encode_many(tokenizer, texts: list[str], cached_from: int = 1) -> list[list[int]]:
    """Token ids of every segment (each encoded on its own, exactly as one call each would), in one tokenizer call
    for those not cached. ``split_special_tokens``: env text that spells ``<|endoftext|>`` is text, never the EOS id.

    Segments from ``cached_from`` on (the question and option texts, which repeat from decision to decision) are
    remembered per tokenizer (up to 65,536 texts; the cache starts over when the tokenizer's vocabulary size
    changes); the state text (segment 0) is always encoded."""
    try:
        size, cache = _SEGMENT_CACHE.get(tokenizer, (None, None))
        if size != len(tokenizer) or len(cache) > _SEGMENT_CACHE_SIZE:
            size, cache = len(tokenizer), {}
            _SEGMENT_CACHE[tokenizer] = (size, cache)
    except TypeError:  # a tokenizer that cannot be weakly referenced: no cache
        cache = {}
    missing = [i for i, text in enumerate(texts) if i < cached_from or text not in cache]
    fresh: dict[int, list[int]] = {}
    if missing:
        encoded = tokenizer([texts[i] for i in missing], add_special_tokens=False, split_special_tokens=True)
        fresh = dict(zip(missing, encoded["input_ids"]))
        for i, ids in fresh.items():
            if i >= cached_from:
                cache[texts[i]] = list(ids)
    return [list(fresh[i]) if i in fresh else list(cache[text]) for i, text in enumerate(texts)]


def pack_request(
    tokenizer,
    state: str,
    questions: Sequence[Question],
    max_len: int | None = None,
    truncate_state: bool = False,
    env: str | None = None,
) -> PackedRequest:
    """Pack a state and its questions into one sequence.

    Args:
        tokenizer: a Hugging Face tokenizer (called with ``add_special_tokens=False``).
        state (`str`): the state text.
        questions (`Sequence[Question]`): the questions (a `Decision`'s ``questions``).
        max_len (`int`, *optional*): the most tokens the packed sequence may have.
        truncate_state (`bool`, defaults to `False`): when the sequence is too long, drop state tokens from the left
            until it fits (never the questions or options) instead of raising.
        env (`str`, *optional*): env name for error messages.

    Returns:
        `PackedRequest`

    Raises:
        ValueError: when the packed sequence is longer than ``max_len`` (the message gives both numbers), or a
            question or option encodes to no tokens.
    """
    where = f"env {env!r}: " if env is not None else ""
    texts = [state]
    for q in questions:
        texts.append(QUESTION_TEMPLATE.format(text=q.text))
        texts += [OPTION_TEMPLATE.format(option=opt) for opt in q.options or ()]
    encoded = iter(_encode_many(tokenizer, texts))
    state_ids = next(encoded)
    if not state_ids:
        raise ValueError(f"{where}field 'state': encodes to no tokens")
    q_ids, o_ids = [], []
    for q in questions:
        ids = next(encoded)
        if not ids:
            raise ValueError(f"{where}question {q.qid!r}, field 'text': encodes to no tokens")
        q_ids.append(ids)
        opts = []
        for opt in q.options or ():
            ids = next(encoded)
            if not ids:
                raise ValueError(f"{where}question {q.qid!r}, field 'options': option {opt!r} encodes to no tokens")
            opts.append(ids)
        o_ids.append(opts)
    tail = sum(len(a) for a in q_ids) + sum(len(b) for opts in o_ids for b in opts)
    dropped = 0
    if max_len is not None and len(state_ids) + tail > max_len:
        total = len(state_ids) + tail
        if not truncate_state or tail >= max_len:
            raise ValueError(
                f"{where}field 'state': the decision packs to {total} tokens ({len(state_ids)} state + {tail} "
                f"questions and options), more than max_len={max_len}"
            )
        dropped = total - max_len
        state_ids = state_ids[dropped:]

    n_state = len(state_ids)
    input_ids = list(state_ids)
    position_ids = list(range(n_state))
    question_seg = [0] * n_state
    option_seg = [0] * n_state
    parent = [-1] + list(range(n_state - 1))
    question_readout, option_readout = [], []
    for qi, (qids, opts) in enumerate(zip(q_ids, o_ids)):
        start = len(input_ids)
        input_ids += qids
        position_ids += range(n_state, n_state + len(qids))
        question_seg += [qi + 1] * len(qids)
        option_seg += [0] * len(qids)
        parent += [n_state - 1] + list(range(start, start + len(qids) - 1))
        q_last = len(input_ids) - 1
        question_readout.append(q_last)
        readouts = []
        for oi, oids in enumerate(opts):
            ostart = len(input_ids)
            input_ids += oids
            pos0 = n_state + len(qids)
            position_ids += range(pos0, pos0 + len(oids))
            question_seg += [qi + 1] * len(oids)
            option_seg += [oi + 1] * len(oids)
            parent += [q_last] + list(range(ostart, ostart + len(oids) - 1))
            readouts.append(len(input_ids) - 1)
        option_readout.append(readouts)
    return PackedRequest(
        input_ids=input_ids,
        position_ids=position_ids,
        question_seg=question_seg,
        option_seg=option_seg,
        parent=parent,
        questions=tuple(questions),
        question_readout=question_readout,
        option_readout=option_readout,
        n_state_tokens=n_state,
        n_state_dropped=dropped,
    )


def unpacked_sequences(packed: PackedRequest) -> list[tuple[list[int], int]]:
    """The separate sequences the packed one stands for: ``(tokens, readout index)`` for every question read-out
    (``state + question``) and every option read-out (``state + question + option``), in packing order.

    This is what packing replaces, kept for the equivalence test and the unpacked benchmark.
    """
    s = packed.n_state_tokens
    state = packed.input_ids[:s]
    seqs = []
    for qi in range(len(packed.question_readout)):
        q_tokens = [
            t
            for t, qs, os in zip(packed.input_ids, packed.question_seg, packed.option_seg)
            if qs == qi + 1 and os == 0
        ]
        seqs.append((state + q_tokens, s + len(q_tokens) - 1))
        for oi in range(len(packed.option_readout[qi])):
            o_tokens = [
                t
                for t, qs, os in zip(packed.input_ids, packed.question_seg, packed.option_seg)
                if qs == qi + 1 and os == oi + 1
            ]
            seq = state + q_tokens + o_tokens
            seqs.append((seq, len(seq) - 1))
    return seqs


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


__all__ = [
    "OPTION_TEMPLATE",
    "QUESTION_TEMPLATE",
    "PackedBatch",
    "PackedRequest",
    "allowed_attention",
    "block_mask_from_segments",
    "collate_segments",
    "mask_from_segments",
    "pack_request",
    "unpacked_sequences",
]
