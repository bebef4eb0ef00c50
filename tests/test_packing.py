"""Packing contract: the packed forward equals separate forwards of state + question (+ option)."""

import random

import pytest
import torch

from alea_trl.attention import allowed_attention, mask_from_segments
from alea_trl.collate import collate_segments
from alea_trl.packing import OPTION_TEMPLATE, QUESTION_TEMPLATE, pack_request

from .conftest import random_decision


def _encode(tok, text):
    return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]  # as packing does


def _reference_answers(model, tok, decision):
    """Answer each question with its own plain causal forward (no packing, no custom mask)."""
    state = _encode(tok, decision.state)
    out = {}
    for q in decision.questions:
        q_ids = _encode(tok, QUESTION_TEMPLATE.format(text=q.text))
        seqs = [state + q_ids] + [
            state + q_ids + _encode(tok, OPTION_TEMPLATE.format(option=o)) for o in q.options or ()
        ]
        hiddens = []
        for seq in seqs:
            ids = torch.tensor([seq])
            prev = torch.tensor([[-1] + seq[:-1]])
            prev2 = torch.tensor([[-1, -1] + seq[:-2]])
            n = len(seq)
            roles = torch.tensor([[0] * len(state) + [1] * len(q_ids) + [2] * (n - len(state) - len(q_ids))])
            embeds = model._embed(ids, roles, prev, prev2)
            h = model.backbone(inputs_embeds=embeds, position_ids=torch.arange(n)[None]).last_hidden_state
            hiddens.append(h[0, -1])
        qh = hiddens[0]
        if q.qtype == "choice":
            out[q.qid] = torch.stack([model.choice_head(h).squeeze(-1) for h in hiddens[1:]])
        elif q.qtype == "score":
            out[q.qid] = model.score_head(qh)[: q.n_bins]
        elif q.qtype == "noul":
            out[q.qid] = model.noul_head(qh).squeeze(-1)
        else:
            out[q.qid] = model.regress_head(qh[None])[0]
    return out


def _packed_answers(model, tok, decisions, row_tokens=None):
    packed = [pack_request(tok, d.state, d.questions) for d in decisions]
    batch = collate_segments(packed, tok.pad_token_id, row_tokens=row_tokens)
    with torch.no_grad():
        output = model(**batch.model_inputs())
    results, flat = [], 0
    for d in decisions:
        answers = {}
        for q in d.questions:
            if q.qtype == "choice":
                answers[q.qid] = output.choice_logits[flat, : len(q.options)]
            elif q.qtype == "score":
                answers[q.qid] = output.score_logits[flat, : q.n_bins]
            elif q.qtype == "noul":
                answers[q.qid] = output.noul_logits[flat]
            else:
                answers[q.qid] = output.quantiles[flat]
            flat += 1
        results.append(answers)
    return results


@pytest.mark.parametrize("attn,extras", [("sdpa", False), ("eager", False), ("sdpa", True)])
def test_packed_equals_unpacked(make_model, tokenizer, attn, extras):
    model = make_model(attn=attn, use_aux_embed=extras, use_bigram=extras, use_trigram=extras)
    if extras:  # make the extras non-zero so the test sees whether they follow the unpacked history
        for emb in (model.aux_embed, model.bigram, model.trigram):
            torch.nn.init.normal_(emb.weight, std=0.5)
    rng = random.Random(0)
    decisions = [random_decision(rng) for _ in range(4)]
    packed = _packed_answers(model, tokenizer, decisions)  # all four in one padded batch
    for d, got in zip(decisions, packed):
        with torch.no_grad():
            want = _reference_answers(model, tokenizer, d)
        for q in d.questions:
            torch.testing.assert_close(got[q.qid], want[q.qid], atol=1e-5, rtol=0, msg=f"{attn} {q.qid} {q.qtype}")


def test_batching_changes_nothing(make_model, tokenizer):
    model = make_model()
    rng = random.Random(1)
    decisions = [random_decision(rng) for _ in range(5)]
    together = _packed_answers(model, tokenizer, decisions)
    for d, got in zip(decisions, together):
        alone = _packed_answers(model, tokenizer, [d])[0]
        for qid in alone:
            torch.testing.assert_close(got[qid], alone[qid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn,extras", [("sdpa", False), ("eager", True)])
def test_decisions_sharing_a_row_equal_one_per_row(make_model, tokenizer, attn, extras):
    """Several decisions in one row (``row_tokens``) answer exactly as with one decision per row, and padding
    shrinks."""
    model = make_model(attn=attn, use_aux_embed=extras, use_bigram=extras, use_trigram=extras)
    if extras:
        for emb in (model.aux_embed, model.bigram, model.trigram):
            torch.nn.init.normal_(emb.weight, std=0.5)
    rng = random.Random(5)
    decisions = [random_decision(rng) for _ in range(7)]
    packed = [pack_request(tokenizer, d.state, d.questions) for d in decisions]
    longest = max(len(p) for p in packed)
    one_per_row = collate_segments(packed, tokenizer.pad_token_id)
    shared = collate_segments(packed, tokenizer.pad_token_id, row_tokens=2 * longest)
    assert shared.input_ids.shape[0] < len(decisions)  # rows really are shared
    assert shared.input_ids.numel() < one_per_row.input_ids.numel()
    assert int((shared.doc_seg >= 0).sum()) == sum(len(p) for p in packed)  # every token placed once
    rows = _packed_answers(model, tokenizer, decisions)
    got = _packed_answers(model, tokenizer, decisions, row_tokens=2 * longest)
    for a, b in zip(rows, got):
        for qid in a:
            torch.testing.assert_close(b[qid], a[qid], atol=1e-5, rtol=0, msg=qid)


def test_row_placement_respects_the_budget(tokenizer):
    rng = random.Random(6)
    packed = [pack_request(tokenizer, d.state, d.questions) for d in (random_decision(rng) for _ in range(12))]
    longest = max(len(p) for p in packed)
    for budget in (1, longest, 2 * longest, 10_000):
        batch = collate_segments(packed, tokenizer.pad_token_id, row_tokens=budget)
        assert batch.input_ids.shape[1] <= max(budget, longest)
        # each decision is one contiguous run of its own tokens, in order
        for d, p in enumerate(packed):
            rows, cols = (batch.doc_seg == d).nonzero(as_tuple=True)
            assert len(set(rows.tolist())) == 1 and cols.tolist() == list(range(cols[0], cols[0] + len(p)))
            assert batch.input_ids[rows[0], cols].tolist() == p.input_ids
            assert batch.position_ids[rows[0], cols].tolist() == p.position_ids
    with pytest.raises(ValueError, match="row_tokens"):
        collate_segments(packed, tokenizer.pad_token_id, row_tokens=0)


def test_layout_and_positions(tokenizer):
    rng = random.Random(2)
    d = random_decision(rng)
    p = pack_request(tokenizer, d.state, d.questions)
    s = p.n_state_tokens
    assert p.position_ids[:s] == list(range(s))
    for qi, q_last in enumerate(p.question_readout):
        q_tokens = [i for i, (qs, os) in enumerate(zip(p.question_seg, p.option_seg)) if qs == qi + 1 and os == 0]
        assert [p.position_ids[i] for i in q_tokens] == list(range(s, s + len(q_tokens)))  # restarts at S
        assert q_last == q_tokens[-1]
        assert len(p.option_readout[qi]) == len(d.questions[qi].options or ())


def test_mask_semantics_by_hand():
    # state of 2 tokens, question 1 (2 tokens) with options of 1 and 2 tokens, question 2 (1 token), 1 pad
    qseg = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 2, -1]])
    oseg = torch.tensor([[0, 0, 0, 0, 1, 2, 2, 0, 0]])
    allowed = allowed_attention(qseg, oseg)[0].int()
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 0],  # option 1: state + question + itself
            [1, 1, 1, 1, 0, 1, 0, 0, 0],  # option 2 does not see option 1
            [1, 1, 1, 1, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 1, 0],  # question 2 sees only the state and itself
            [0, 0, 0, 0, 0, 0, 0, 0, 1],  # padding sees only itself
        ]
    )
    assert torch.equal(allowed, expected)
    mask = mask_from_segments(qseg, oseg, torch.bfloat16)
    assert mask.dtype == torch.bfloat16 and mask.shape == (1, 1, 9, 9)
    assert torch.equal(mask[0, 0] == 0, expected.bool())
    # two one-token-state decisions in one row never see each other
    two = allowed_attention(
        torch.tensor([[0, 1, 0, 1]]), torch.zeros(1, 4, dtype=torch.long), torch.tensor([[0, 0, 1, 1]])
    )
    assert torch.equal(two[0].int(), torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]))
    two_mask = mask_from_segments(
        torch.tensor([[0, 1, 0, 1]]), torch.zeros(1, 4, dtype=torch.long), torch.float32, torch.tensor([[0, 0, 1, 1]])
    )
    assert torch.equal(two_mask[0, 0] == 0, two[0])


def test_too_long_raises_with_counts(tokenizer):
    rng = random.Random(3)
    d = random_decision(rng)
    n = len(pack_request(tokenizer, d.state, d.questions))
    with pytest.raises(ValueError, match=rf"{n} tokens.*max_len={n - 1}"):
        pack_request(tokenizer, d.state, d.questions, max_len=n - 1, env="kelly")
    cut = pack_request(tokenizer, d.state, d.questions, max_len=n - 3, truncate_state=True)
    assert len(cut) == n - 3 and cut.n_state_dropped == 3


def test_flex_attention_block_mask_matches_dense(make_model, tokenizer):
    """The FlexAttention path (the GPU fast path) gives the same answers as the dense mask."""
    rng = random.Random(4)
    decisions = [random_decision(rng) for _ in range(3)]
    dense = _packed_answers(make_model(attn="sdpa"), tokenizer, decisions)
    flex_model = make_model(attn="flex_attention")
    assert flex_model.backbone.config._attn_implementation == "flex_attention"
    got = _packed_answers(flex_model, tokenizer, decisions, row_tokens=10_000)  # all in one row
    for a, b in zip(dense, got):
        for qid in a:
            torch.testing.assert_close(b[qid], a[qid], atol=1e-4, rtol=0)


def test_special_token_text_in_a_state_is_text(tokenizer):
    from alea_trl.questions import Decision, Question

    d = Decision("Say <|endoftext|> and <|pad|> out loud.", [Question("act", "choice", "Which?", options=["a", "b"])])
    p = pack_request(tokenizer, d.state, d.questions)
    assert tokenizer.eos_token_id not in p.input_ids and tokenizer.pad_token_id not in p.input_ids


def test_mask_equals_the_parent_chains_of_shared_rows(tokenizer):
    """Query i may attend key j exactly when j lies on i's own logical sequence (i itself or an ancestor through
    ``parent``), in rows shared by several decisions, and padding attends only to itself."""
    rng = random.Random(7)
    packed = [pack_request(tokenizer, d.state, d.questions) for d in (random_decision(rng) for _ in range(7))]
    batch = collate_segments(packed, tokenizer.pad_token_id, row_tokens=2 * max(len(p) for p in packed))
    assert batch.input_ids.shape[0] < len(packed)  # rows really are shared
    B, L = batch.input_ids.shape
    expected = torch.zeros(B, L, L, dtype=torch.bool)
    placed = {}  # (row, column) of each decision's tokens, read back from doc_seg
    for b in range(B):
        for d in batch.doc_seg[b].unique().tolist():
            if d >= 0:
                placed[d] = (b, int((batch.doc_seg[b] == d).nonzero()[0]))
    for d, p in enumerate(packed):
        b, start = placed[d]
        for i in range(len(p)):
            j = i
            while j >= 0:
                expected[b, start + i, start + j] = True
                j = p.parent[j]
    pad = batch.question_seg < 0
    expected |= torch.diag_embed(pad)
    assert torch.equal(allowed_attention(batch.question_seg, batch.option_seg, batch.doc_seg), expected)
    mask = mask_from_segments(batch.question_seg, batch.option_seg, torch.float32, batch.doc_seg)
    assert torch.equal(mask[:, 0] == 0, expected)


def test_cached_question_and_option_tokens_stay_exact():
    """Question and option texts are encoded once per tokenizer and reused; a vocabulary change starts over."""
    from alea_trl.questions import Decision, Question
    from alea_trl.testing import build_tiny_tokenizer

    tok = build_tiny_tokenizer()  # a private copy: this test changes its vocabulary
    d = Decision("A coin was flipped.", [Question("act", "choice", "Heads zyx?", options=["zyx", "tails"])])
    first = pack_request(tok, d.state, d.questions)
    assert pack_request(tok, d.state, d.questions) == first  # from the cache
    tok.add_tokens(["zyx"])
    again = pack_request(tok, d.state, d.questions)
    assert again.input_ids == [
        i for text in _segments(d) for i in _encode(tok, text)
    ]  # the new token is used, not the stale ids
    assert len(again) < len(first)


def _segments(decision):
    texts = [decision.state]
    for q in decision.questions:
        texts.append(QUESTION_TEMPLATE.format(text=q.text))
        texts += [OPTION_TEMPLATE.format(option=o) for o in q.options or ()]
    return texts


def test_collation_arrays_are_made_once_and_left_out_of_pickles(tokenizer):
    """Collation reads each request's arrays (made once); a pickled request leaves them out and collates the same."""
    import pickle

    rng = random.Random(11)
    packed = [pack_request(tokenizer, d.state, d.questions) for d in (random_decision(rng) for _ in range(5))]
    batch = collate_segments(packed, tokenizer.pad_token_id, row_tokens=300)
    assert all("arrays" in p.__dict__ for p in packed)
    first = packed[0].arrays
    collate_segments(packed, tokenizer.pad_token_id)
    assert packed[0].arrays is first  # not made again
    restored = pickle.loads(pickle.dumps(packed))
    assert all("arrays" not in p.__dict__ for p in restored)
    again = collate_segments(restored, tokenizer.pad_token_id, row_tokens=300)
    for name in batch._TENSORS:
        assert torch.equal(getattr(batch, name), getattr(again, name)), name
    assert again.questions == batch.questions
