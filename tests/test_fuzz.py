"""Fuzzing the question protocol and packing with hypothesis.

Every raw input (random unicode, empty, whitespace-only and very long strings, many and duplicate options, wrong
types, NaN/inf/out-of-range targets, wrong-length vectors) must give either a valid object whose normalised invariants
hold, or a ``ValueError`` naming the field; never another exception type. Valid decisions must pack into a request
whose layout invariants hold (or raise a ``ValueError`` with the token count and ``max_len``), and the packed head
outputs must equal separate unpacked forwards.

All property tests are derandomized so CI is reproducible. The ``test_regression_*`` tests at the end of the file pin
one minimal input each for the raw values a check most easily lets through as another exception type or accepts
silently (options that are not a list, ints beyond the float range, numeric strings, lone surrogates); the property
strategies draw such inputs too.
"""

import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from alea_trl.collate import collate_segments
from alea_trl.packing import OPTION_TEMPLATE, QUESTION_TEMPLATE, pack_request, unpacked_sequences
from alea_trl.questions import ACT_QID, QTYPES, Decision, Question, validate_targets

from .test_packing import _packed_answers, _reference_answers


FIELDS = {"qid", "qtype", "text", "options", "n_bins", "state", "questions", "targets", "target"}
FIELD_RE = re.compile(r"field '(\w+)'")

FAST = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------------------------------- strategies

SPECIAL_STRINGS = [
    " ",
    "   ",
    "\t\n\r",
    "\x00",
    "a\x00b",
    "\x07\x1b[31m",
    "\u200b",  # zero-width space
    "\ufeff",  # BOM
    "e\u0301\u0301\u0301",  # combining marks
    "\u202eabc\u202c",  # RTL override
    "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",  # Hebrew + Arabic
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # ZWJ emoji sequence
    "\U0001f600\U0001f3fd",
    "\U0010ffff",
    "<|endoftext|>",
    "<|pad|>",
    "Question: x\nAnswer:",
]

# all unicode categories except lone surrogates (Cs): control chars, NUL, private use, unassigned, marks, ...
_chars = st.characters(exclude_categories=("Cs",))
short_text = st.one_of(st.text(_chars, min_size=1, max_size=40), st.sampled_from(SPECIAL_STRINGS))
long_text = st.builds(lambda s, n: (s * n)[:6000], st.text(_chars, min_size=1, max_size=6), st.integers(400, 1500))
fuzz_text = st.one_of(short_text, short_text, long_text)
"""Non-empty strings: random unicode, whitespace-only, special-token look-alikes, thousands of chars."""

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=4),
    st.lists(st.text(max_size=3), max_size=3),
    st.tuples(st.integers(), st.text(max_size=2)),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
"""Values of the wrong type wherever a string, a list or an int is expected."""


def option_lists(min_size=1, max_size=60, text=short_text):
    return st.lists(text, min_size=min_size, max_size=max_size, unique=True)


@st.composite
def valid_question_kwargs(draw, qid=None, qtype=None, text=fuzz_text, max_options=60):
    qtype = qtype or draw(st.sampled_from(QTYPES))
    kw = {"qid": qid or draw(short_text), "qtype": qtype, "text": draw(text)}
    if qtype == "choice":
        kw["options"] = draw(st.one_of(option_lists(max_size=max_options), option_lists(max_size=4).map(tuple)))
    if qtype == "score":
        kw["n_bins"] = draw(st.one_of(st.integers(2, 64), st.integers(2, 9).map(np.int64)))
    return kw


_raw_options = [
    st.none(),
    st.just([]),
    st.just(()),
    fuzz_text,  # a bare string instead of a list
    option_lists(max_size=60),
    st.lists(st.one_of(short_text, st.just(""), junk), min_size=1, max_size=8),
    option_lists(max_size=6).map(lambda xs: xs + xs[:1]),  # duplicate option
    st.dictionaries(short_text, st.integers(), min_size=1, max_size=3),
    junk,  # scalars and other non-lists (see test_regression_options_not_a_sized_collection)
    junk,
    st.lists(st.text(max_size=3), max_size=3).map(lambda xs: (x for x in xs)),  # a generator: no len()
]

RAW = {
    "qid": st.one_of(st.just(""), st.just(ACT_QID), fuzz_text, junk),
    "qtype": st.one_of(st.sampled_from(QTYPES + ("Choice", "choice ", "", "regression", "bool")), junk),
    "text": st.one_of(st.just(""), fuzz_text, junk),
    "options": st.one_of(*_raw_options),
    "n_bins": st.one_of(
        st.none(),
        st.integers(-5, 100),
        st.integers(10**18, 10**30),
        st.booleans(),
        st.floats(allow_nan=True),
        st.integers(-2, 9).map(np.int64),
        st.just(np.bool_(True)),
        st.text(max_size=2),
    ),
    "env": st.one_of(st.none(), short_text),
}


@st.composite
def raw_question_kwargs(draw):
    """Valid kwargs with 0-2 fields replaced by raw junk (so that every check of ``Question`` is reached)."""
    kw = draw(valid_question_kwargs(qtype=draw(st.sampled_from(("choice",) + QTYPES))))
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(["options", "qid", "qtype", "text", "options", "n_bins", "env"]))
        kw[name] = draw(RAW[name])
    return kw


@st.composite
def valid_decisions(draw, text=fuzz_text, state=fuzz_text, min_reports=0, max_reports=5, max_options=60):
    act = Question(**draw(valid_question_kwargs(qid=ACT_QID, qtype="choice", text=text, max_options=max_options)))
    reports = draw(
        st.lists(
            valid_question_kwargs(text=text, max_options=max_options).filter(lambda kw: kw["qid"] != ACT_QID),
            min_size=min_reports,
            max_size=max_reports,
            unique_by=lambda kw: kw["qid"],
        )
    )
    questions = [act] + [Question(**kw) for kw in reports]
    questions = draw(st.permutations(questions))
    return Decision(draw(state), questions, env=draw(RAW["env"]))


@st.composite
def raw_decision_args(draw):
    """State, questions and env for ``Decision``, valid or broken in one of many ways."""
    d = draw(valid_decisions(max_reports=4, max_options=8))
    state, questions = d.state, list(d.questions)
    how = draw(st.sampled_from(["valid", "state", "questions", "item", "dupe", "no_act", "act_type", "two_acts"]))
    if how == "state":
        state = draw(st.one_of(st.just(""), junk))
    elif how == "questions":
        questions = draw(st.one_of(junk, fuzz_text, st.just(questions[0]), st.just(iter(questions))))
    elif how == "item":
        questions.insert(draw(st.integers(0, len(questions))), draw(st.one_of(junk, fuzz_text, st.just(d))))
    elif how == "dupe":
        questions.append(draw(st.sampled_from(questions)))
    elif how == "no_act":
        questions = [q for q in questions if q.qid != ACT_QID]
    elif how == "act_type":
        kw = draw(valid_question_kwargs(qid=ACT_QID, qtype=draw(st.sampled_from(QTYPES[1:]))))
        questions = [Question(**kw) if q.qid == ACT_QID else q for q in questions]
    elif how == "two_acts":
        questions.append(Question(ACT_QID, "choice", "again?", options=["a", "b"]))
    return state, questions, d.env


def _normalise(w):
    total = sum(w)
    return [x / total for x in w] if total > 0 else [1.0] + [0.0] * (len(w) - 1)


def _prob_vector(n):
    return st.lists(st.floats(0, 1), min_size=n, max_size=n).map(_normalise)


@st.composite
def raw_target(draw, question):
    """A target for ``question``: valid in its normal or shorthand form, or wrong in value, shape or type."""
    n = question.n_answers or 1
    floats = st.floats(allow_nan=True, allow_infinity=True)
    options = [
        st.integers(-3, n + 3),
        st.booleans(),
        st.none(),
        floats,
        st.floats(-1, 2),
        st.text(max_size=4),
        st.sampled_from(["0.5", "1", "nan", "inf", "one"]),
        st.lists(floats, max_size=70),
        st.lists(st.floats(0, 1), min_size=max(n - 1, 0), max_size=n + 1),
        _prob_vector(n),
        _prob_vector(n).map(np.asarray),
        _prob_vector(n).map(lambda p: [p]),  # 2-D
        _prob_vector(n).map(lambda p: [x + 5e-5 for x in p]),  # sum within / just outside the tolerance
        st.just([[1.0], [1.0, 2.0]]),  # ragged
        st.just([]),
        st.dictionaries(st.text(max_size=2), st.floats(), max_size=2),
        st.lists(st.integers(-(10**9), 10**9), min_size=1, max_size=4),
        st.integers(10**309, 10**400),  # beyond the float range (see test_regression_huge_int_target)
    ]
    return draw(st.one_of(*options))


@st.composite
def raw_targets(draw, decision):
    """Mostly a dict over report qids (so every target check is reached); sometimes a bad key or not a dict."""
    reports = [q.qid for q in decision.reports]
    keys = draw(st.lists(st.sampled_from(reports), unique=True)) if reports else []
    if draw(st.integers(0, 5)) == 3:  # the action question, an unknown qid, or an unhashable-free junk key
        keys.append(draw(st.one_of(st.just(ACT_QID), st.sampled_from(["nope", ""]), junk)))
    targets = {}
    for k in keys:
        if k.__hash__ is None:
            continue
        q = next((q for q in decision.questions if q.qid == k), None)
        targets[k] = draw(raw_target(q)) if q is not None else draw(st.one_of(junk, st.floats(0, 1)))
    if draw(st.integers(0, 9)) == 3:
        return draw(st.one_of(junk, st.just(list(targets)), st.just(list(targets.items()))))
    return targets


# ------------------------------------------------------------------------------------------------------ checks


def _assert_names_field(err: ValueError, env=None):
    msg = str(err)
    found = FIELD_RE.findall(msg)
    assert found and found[0] in FIELDS, f"ValueError does not name a field: {msg!r}"
    event(f"ValueError field {found[0]!r}")
    if env is not None:
        assert msg.startswith(f"env {env!r}"), f"ValueError does not name env {env!r}: {msg!r}"


def _assert_valid_question(q: Question):
    assert isinstance(q.qid, str) and q.qid
    assert q.qtype in QTYPES and isinstance(q.qtype, str)
    assert isinstance(q.text, str) and q.text
    if q.qtype == "choice":
        assert isinstance(q.options, tuple) and len(q.options) >= 1
        assert all(isinstance(o, str) and o for o in q.options)
        assert len(set(q.options)) == len(q.options)
        assert q.n_answers == len(q.options)
    else:
        assert q.options is None
    if q.qtype == "score":
        assert type(q.n_bins) is int and q.n_bins >= 2 and q.n_answers == q.n_bins
    else:
        assert q.n_bins is None
    if q.qtype in ("noul", "regress"):
        assert q.n_answers is None


def _assert_valid_decision(d: Decision):
    assert isinstance(d.state, str) and d.state
    assert isinstance(d.questions, tuple) and all(isinstance(q, Question) for q in d.questions)
    qids = [q.qid for q in d.questions]
    assert len(set(qids)) == len(qids)
    assert qids.count(ACT_QID) == 1 and d.act.qtype == "choice" and d.n_legal == len(d.act.options)
    assert len(d.reports) == len(d.questions) - 1


def _assert_normal_targets(decision, targets, out):
    assert set(out) == set(targets) and ACT_QID not in out
    for qid, value in out.items():
        q = decision.question(qid)
        if q.qtype in ("choice", "score"):
            assert isinstance(value, np.ndarray) and value.dtype == np.float64 and value.shape == (q.n_answers,)
            assert np.all(value >= 0) and np.all(value <= 1) and abs(value.sum() - 1.0) < 1e-9
        elif q.qtype == "noul":
            assert isinstance(value, float) and 0.0 <= value <= 1.0
        else:
            assert isinstance(value, np.ndarray) and value.dtype == np.float64
            assert value.ndim == 1 and value.shape[0] >= 1 and np.all(np.isfinite(value))


def _segment(p, qi, oi):
    """Indices of the tokens of question ``qi`` (``oi == 0``) or of its option ``oi - 1``."""
    return [i for i, (qs, os) in enumerate(zip(p.question_seg, p.option_seg)) if qs == qi + 1 and os == oi]


def _encode(tok, text):
    return list(tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])  # as packing does


def _assert_layout(p, decision, tok):
    n = len(p)
    assert all(len(x) == n for x in (p.position_ids, p.question_seg, p.option_seg, p.parent))
    s = p.n_state_tokens
    assert s >= 1
    assert p.position_ids[:s] == list(range(s)) and p.parent[:s] == [-1] + list(range(s - 1))
    assert p.question_seg[:s] == [0] * s and p.option_seg[:s] == [0] * s
    assert p.questions == decision.questions
    assert len(p.question_readout) == len(p.option_readout) == len(decision.questions)
    cursor = s  # segments follow one another with no gap and no overlap
    for qi, q in enumerate(decision.questions):
        q_idx = _segment(p, qi, 0)
        assert q_idx == list(range(cursor, cursor + len(q_idx))) and q_idx
        assert [p.input_ids[i] for i in q_idx] == _encode(tok, QUESTION_TEMPLATE.format(text=q.text))
        assert [p.position_ids[i] for i in q_idx] == list(range(s, s + len(q_idx)))  # restarts at S
        assert [p.parent[i] for i in q_idx] == [s - 1] + q_idx[:-1]
        assert p.question_readout[qi] == q_idx[-1]
        cursor += len(q_idx)
        assert len(p.option_readout[qi]) == len(q.options or ())
        for oi, opt in enumerate(q.options or ()):
            o_idx = _segment(p, qi, oi + 1)
            assert o_idx == list(range(cursor, cursor + len(o_idx))) and o_idx
            assert [p.input_ids[i] for i in o_idx] == _encode(tok, OPTION_TEMPLATE.format(option=opt))
            pos0 = s + len(q_idx)
            assert [p.position_ids[i] for i in o_idx] == list(range(pos0, pos0 + len(o_idx)))
            assert [p.parent[i] for i in o_idx] == [q_idx[-1]] + o_idx[:-1]
            assert p.option_readout[qi][oi] == o_idx[-1]
            cursor += len(o_idx)
    assert cursor == n
    seqs = unpacked_sequences(p)
    assert len(seqs) == sum(1 + len(q.options or ()) for q in decision.questions)
    assert all(idx == len(seq) - 1 for seq, idx in seqs)


# ------------------------------------------------------------------------------------------ property 1: protocol


@FAST
@given(raw_question_kwargs())
def test_question_fuzz(kwargs):
    try:
        q = Question(**kwargs)
    except ValueError as err:
        _assert_names_field(err, kwargs.get("env"))
        return
    _assert_valid_question(q)


@FAST
@given(raw_decision_args())
def test_decision_fuzz(args):
    state, questions, env = args
    try:
        d = Decision(state, questions, env=env)
    except ValueError as err:
        _assert_names_field(err, env)
        return
    _assert_valid_decision(d)


@FAST
@given(st.data())
def test_targets_fuzz(data):
    decision = data.draw(valid_decisions(min_reports=1, max_reports=5, max_options=12))
    targets = data.draw(raw_targets(decision))
    try:
        out = validate_targets(decision, targets)
    except ValueError as err:
        _assert_names_field(err, decision.env)
        return
    _assert_normal_targets(decision, targets, out)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_protocol_end_to_end_fuzz(data):
    """Questions, decision and targets from raw inputs in one go: the first error is a named ValueError."""
    raw_qs = data.draw(st.lists(raw_question_kwargs(), min_size=1, max_size=5))
    state = data.draw(st.one_of(fuzz_text, RAW["text"]))
    try:
        decision = Decision(state, [Question(**kw) for kw in raw_qs])
        targets = data.draw(raw_targets(decision))
        out = validate_targets(decision, targets)
    except ValueError as err:
        _assert_names_field(err)
        return
    _assert_valid_decision(decision)
    _assert_normal_targets(decision, targets, out)


# ------------------------------------------------------------------------------------------- property 2: packing


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_packing_fuzz(tokenizer, data):
    decision = data.draw(valid_decisions())
    full = pack_request(tokenizer, decision.state, decision.questions)
    _assert_layout(full, decision, tokenizer)
    n, tail = len(full), len(full) - full.n_state_tokens
    max_len = data.draw(
        st.one_of(
            st.integers(-2, n + 5),
            st.integers(max(tail - 2, -2), n + 5),
            st.integers(n - 3, n + 3),
            st.sampled_from([n - 1, n, tail, tail + 1]),
        ),
        "max_len",
    )
    truncate = data.draw(st.booleans(), "truncate_state")
    try:
        p = pack_request(tokenizer, decision.state, decision.questions, max_len=max_len, truncate_state=truncate)
    except ValueError as err:
        assert n > max_len and (not truncate or tail >= max_len), f"raised although it fits: {err}"
        assert re.search(rf"\b{n} tokens.*max_len={max_len}\b", str(err)), str(err)
        assert "field 'state'" in str(err)
        event("too long: raised")
        return
    event("fits" if n <= max_len else "truncated")
    assert len(p) <= max_len
    _assert_layout(p, decision, tokenizer)
    if n <= max_len:
        assert p.input_ids == full.input_ids and p.n_state_dropped == 0
    else:
        assert truncate and len(p) == max_len and p.n_state_dropped == n - max_len
        assert p.input_ids == full.input_ids[n - max_len :]  # the state is cut from the left, nothing else
    # collating with another request keeps the per-question bookkeeping consistent
    batch = collate_segments([p, full], tokenizer.pad_token_id)
    n_opts = [len(q.options or ()) for q in decision.questions]
    assert batch.question_options.tolist() == n_opts * 2
    assert batch.option_index.shape[0] == 2 * sum(n_opts)
    assert batch.question_index[: len(n_opts), 1].tolist() == p.question_readout


# --------------------------------------------------------------------------------- property 3: packed == unpacked

_MODEL = {}
_small_text = st.one_of(st.text(_chars, min_size=1, max_size=24), st.sampled_from(SPECIAL_STRINGS))


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(st.data())
def test_packed_equals_unpacked_fuzz(make_model, tokenizer, data):
    if "model" not in _MODEL:  # one model for all examples (eval mode, no state between forwards)
        model = make_model(use_aux_embed=True, use_bigram=True, use_trigram=True)
        for emb in (model.aux_embed, model.bigram, model.trigram):  # non-zero extras must follow the unpacked history
            torch.nn.init.normal_(emb.weight, std=0.5)
        _MODEL["model"] = model
    model = _MODEL["model"]
    strategy = valid_decisions(
        text=_small_text,
        state=st.one_of(_small_text, st.text(_chars, max_size=80).map(lambda s: s or "x")),
        max_reports=3,
        max_options=10,
    )
    decisions = []
    for _ in range(data.draw(st.integers(1, 2), "batch")):
        d = data.draw(strategy)
        if len(pack_request(tokenizer, d.state, d.questions)) <= 512:
            decisions.append(d)
    event(f"{len(decisions)} decisions fit")
    if not decisions:
        return
    packed = _packed_answers(model, tokenizer, decisions)
    for d, got in zip(decisions, packed):
        with torch.no_grad():
            want = _reference_answers(model, tokenizer, d)
        for q in d.questions:
            torch.testing.assert_close(got[q.qid], want[q.qid], atol=1e-5, rtol=0, msg=f"{q.qid!r} {q.qtype}")


# ---------------------------------------------------------------------------------------------------------------
# Regression tests: minimal raw inputs, one kind per test, that must raise a ValueError naming the field.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [5, True, 2.5, iter(["a", "b"])], ids=["int", "bool", "float", "iterator"])
def test_regression_options_not_a_sized_collection(options):
    # options that are not a list or tuple (a scalar, or an iterator without len()) raise a ValueError naming field
    # 'options', not a TypeError from len()
    with pytest.raises(ValueError, match="field 'options'"):
        Question("act", "choice", "which?", options=options)


@pytest.mark.parametrize(
    "qtype,target",
    [("regress", 10**400), ("regress", [1.0, 10**400]), ("noul", 10**400), ("choice", [10**400, 0.0])],
    ids=["regress-scalar", "regress-list", "noul", "choice"],
)
def test_regression_huge_int_target(qtype, target):
    # a Python int beyond the float range, alone or in a list, raises a ValueError naming field 'target', not the
    # OverflowError of its conversion to float
    q = Question("q", qtype, "how much?", options=["a", "b"] if qtype == "choice" else None)
    decision = Decision("s", [Question("act", "choice", "which?", options=["x"]), q])
    with pytest.raises(ValueError, match="field 'target'"):
        validate_targets(decision, {"q": target})


@pytest.mark.parametrize(
    "qtype,target",
    [("noul", "0.5"), ("regress", "3"), ("regress", ["1", "2"]), ("score", ["0.5", "0.5"])],
    ids=["noul", "regress-scalar", "regress-list", "score"],
)
def test_regression_string_target_accepted(qtype, target):
    # a numeric string (an env that returned text instead of a number) is refused with a ValueError naming field
    # 'target', not parsed as the number it spells
    q = Question("q", qtype, "how much?", n_bins=2 if qtype == "score" else None)
    decision = Decision("s", [Question("act", "choice", "which?", options=["x"]), q])
    with pytest.raises(ValueError, match="field 'target'"):
        validate_targets(decision, {"q": target})


@pytest.mark.parametrize("where", ["state", "text", "options"])
def test_regression_lone_surrogate(tokenizer, where):
    # a str with a lone surrogate (e.g. from json.loads('"\\ud800"') or a bad decode) raises a ValueError naming the
    # field, at construction or at the latest in pack_request, never the tokenizer's TypeError
    bad = "a\ud800b"
    try:
        d = Decision(
            bad if where == "state" else "s",
            [Question("act", "choice", bad if where == "text" else "q", options=[bad if where == "options" else "o"])],
        )
    except ValueError as err:
        assert f"field '{where}'" in str(err)
        return
    with pytest.raises(ValueError, match=f"field '{where}'"):
        pack_request(tokenizer, d.state, d.questions)
