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
   options, -1 for padding) and ``option_seg`` (0 for state and question tokens, ``j+1`` for option ``j``); the
   attention masks are built from them (``alea_trl.attention``).
5. ``parent`` gives each token the index of the previous token of its own logical sequence (the last state token
   for a question's first token, the question's last token for an option's first token), so n-gram features see
   the same history packed and unpacked.
6. Collation into batches (several decisions may share a row) is ``alea_trl.collate``.
7. Nothing is truncated silently: a decision longer than ``max_len`` raises ``ValueError`` with the token count and
   the limit, unless ``truncate_state=True`` asks for the state to be cut from the left.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

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


__all__ = ["OPTION_TEMPLATE", "QUESTION_TEMPLATE", "PackedRequest", "pack_request", "unpacked_sequences"]
