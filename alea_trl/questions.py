"""The question protocol: what an environment asks at a decision point, and what a valid answer target is.

Design decisions:
1. A decision is a state (text) plus a list of questions about it. Exactly one question has ``qid == "act"`` and
   ``qtype == "choice"``: its options are the legal actions. Every other question is a *report* whose exact answer the
   environment knows (its oracle).
2. Four question types cover what environments forecast: ``choice`` (a categorical over named options), ``score``
   (an ordinal scale 0..n_bins-1), ``noul`` (a yes/no event, one probability) and ``regress`` (a real quantity,
   answered with quantiles at the fixed levels :data:`TAUS`).
3. Everything is validated at construction. A bad question, decision or target raises :class:`ValueError` whose
   message names the env (when known), the question and the field, so a broken user environment fails where it is
   broken and not three stack frames deep inside a loss.
4. Targets are normalised once by :func:`validate_targets` (probability vectors as float arrays, indices turned
   into one-hot vectors, samples as float arrays), so losses never see a malformed target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


ACT_QID = "act"
"""The qid of the action question of every decision."""

QTYPES = ("choice", "score", "noul", "regress")
"""The four question types, in the order used for integer codes (``QTYPES.index(qtype)``)."""

TAUS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)
"""The quantile levels at which ``regress`` questions are answered."""

PROB_ATOL = 1e-4
"""Tolerance for a probability vector to count as summing to one."""


def _where(env: str | None, qid: str | None, field_name: str) -> str:
    parts = []
    if env is not None:
        parts.append(f"env {env!r}")
    if qid is not None:
        parts.append(f"question {qid!r}")
    parts.append(f"field {field_name!r}")
    return ", ".join(parts)


def _fail(env: str | None, qid: str | None, field_name: str, message: str) -> ValueError:
    return ValueError(f"{_where(env, qid, field_name)}: {message}")


def _check_text(value, env: str | None, qid: str | None, field_name: str, what: str) -> None:
    """A non-empty string that encodes to UTF-8 (no lone surrogates)."""
    if not isinstance(value, str) or not value:
        raise _fail(env, qid, field_name, f"{what} must be a non-empty string, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise _fail(env, qid, field_name, f"{what} is not valid UTF-8 text ({err.reason} at {err.start})") from None


@dataclass(frozen=True)
class Question:
    """One question asked at a decision point.

    Args:
        qid (`str`):
            Identifier, unique within its decision. ``"act"`` marks the action question.
        qtype (`str`):
            One of ``"choice"``, ``"score"``, ``"noul"``, ``"regress"``.
        text (`str`):
            The question as the model reads it.
        options (`Sequence[str]`, *optional*):
            The option strings of a ``choice`` question (required and non-empty for ``choice``, forbidden otherwise).
        n_bins (`int`, *optional*):
            The number of levels of a ``score`` question (required, at least 2, for ``score``; forbidden otherwise).
        env (`str`, *optional*):
            Name of the environment that asks it; only used to make error messages say where a problem comes from.
    """

    qid: str
    qtype: str
    text: str
    options: tuple[str, ...] | None = None
    n_bins: int | None = None
    env: str | None = field(default=None, compare=False)

    def __post_init__(self):
        env, qid = self.env, self.qid if isinstance(self.qid, str) else None
        _check_text(self.qid, env, None, "qid", "the qid")
        if not isinstance(self.qtype, str) or self.qtype not in QTYPES:
            raise _fail(env, qid, "qtype", f"must be one of {QTYPES}, got {self.qtype!r}")
        _check_text(self.text, env, qid, "text", "the text")
        if self.qtype == "choice":
            if not isinstance(self.options, (list, tuple)) or len(self.options) == 0:
                raise _fail(
                    env,
                    qid,
                    "options",
                    f"a choice question needs a non-empty list of option strings, got {self.options!r}",
                )
            options = tuple(self.options)
            for i, opt in enumerate(options):
                _check_text(opt, env, qid, "options", f"option {i}")
            if len(set(options)) != len(options):
                raise _fail(env, qid, "options", f"options must be distinct, got {list(options)}")
            object.__setattr__(self, "options", options)
        elif self.options is not None:
            raise _fail(env, qid, "options", f"only choice questions have options, this one is {self.qtype!r}")
        if self.qtype == "score":
            if isinstance(self.n_bins, bool) or not isinstance(self.n_bins, (int, np.integer)) or self.n_bins < 2:
                raise _fail(env, qid, "n_bins", f"a score question needs an integer n_bins >= 2, got {self.n_bins!r}")
            object.__setattr__(self, "n_bins", int(self.n_bins))
        elif self.n_bins is not None:
            raise _fail(env, qid, "n_bins", f"only score questions have n_bins, this one is {self.qtype!r}")

    @property
    def n_answers(self) -> int | None:
        """Length of a target distribution: options for ``choice``, bins for ``score``, ``None`` otherwise."""
        if self.qtype == "choice":
            return len(self.options)
        if self.qtype == "score":
            return self.n_bins
        return None


@dataclass(frozen=True)
class Decision:
    """A decision point: the state text and the questions about it.

    Args:
        state (`str`):
            Everything the model is told about the situation.
        questions (`Sequence[Question]`):
            The questions, exactly one of which is the action question (``qid == "act"``, ``qtype == "choice"``);
            qids are unique.
        env (`str`, *optional*):
            Name of the environment that emitted it, for error messages.
    """

    state: str
    questions: tuple[Question, ...]
    env: str | None = field(default=None, compare=False)

    def __post_init__(self):
        env = self.env
        _check_text(self.state, env, None, "state", "the state")
        if isinstance(self.questions, (str, Question)) or not isinstance(self.questions, Sequence):
            raise _fail(env, None, "questions", f"must be a list of Question, got {type(self.questions).__name__}")
        questions = tuple(self.questions)
        for i, q in enumerate(questions):
            if not isinstance(q, Question):
                raise _fail(env, None, "questions", f"item {i} is a {type(q).__name__}, not a Question")
        qids = [q.qid for q in questions]
        dupes = sorted({qid for qid in qids if qids.count(qid) > 1})
        if dupes:
            raise _fail(env, dupes[0], "qid", f"qids must be unique within a decision, duplicated: {dupes}")
        acts = [q for q in questions if q.qid == ACT_QID]
        if not acts:
            raise _fail(env, ACT_QID, "questions", f"a decision needs exactly one question with qid {ACT_QID!r}")
        if acts[0].qtype != "choice":
            raise _fail(env, ACT_QID, "qtype", f"the action question must be a choice question, got {acts[0].qtype!r}")
        object.__setattr__(self, "questions", questions)

    @property
    def act(self) -> Question:
        """The action question."""
        return self.question(ACT_QID)

    @property
    def n_legal(self) -> int:
        """Number of legal actions (options of the action question)."""
        return len(self.act.options)

    def question(self, qid: str) -> Question:
        """The question with this qid (raises `KeyError` when there is none)."""
        for q in self.questions:
            if q.qid == qid:
                return q
        raise KeyError(qid)

    @property
    def reports(self) -> tuple[Question, ...]:
        """The report (non-action) questions."""
        return tuple(q for q in self.questions if q.qid != ACT_QID)


def _finite_array(value, env, qid, field_name) -> np.ndarray:
    try:
        raw = np.asarray(value)
        if raw.dtype.kind not in "biuf":  # no strings, objects or ragged nests: numbers only
            raise TypeError(f"dtype {raw.dtype}")
        arr = raw.astype(np.float64)
    except (TypeError, ValueError, OverflowError) as err:
        raise _fail(env, qid, field_name, f"must be numeric, got {value!r}") from err
    if not np.all(np.isfinite(arr)):
        raise _fail(env, qid, field_name, f"must be finite, got {value!r}")
    return arr


def validate_target(question: Question, target, env: str | None = None):
    """Check one oracle target against its question and return it in normal form.

    Normal forms: ``choice``/``score`` -> float64 probability vector of length ``n_answers`` (an integer index becomes
    one-hot); ``noul`` -> float in [0, 1]; ``regress`` -> float64 array of samples (a float becomes one sample).

    Raises:
        ValueError: naming the env, the question and the field ``target``.
    """
    env = env if env is not None else question.env
    qid = question.qid
    if question.qtype in ("choice", "score"):
        n = question.n_answers
        if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
            if not 0 <= int(target) < n:
                raise _fail(env, qid, "target", f"index {int(target)} is out of range for {n} answers")
            out = np.zeros(n)
            out[int(target)] = 1.0
            return out
        arr = _finite_array(target, env, qid, "target")
        if arr.ndim != 1 or arr.shape[0] != n:
            raise _fail(env, qid, "target", f"expected a probability vector of length {n}, got shape {arr.shape}")
        if np.any(arr < 0) or np.any(arr > 1):
            raise _fail(env, qid, "target", f"probabilities must lie in [0, 1], got {arr.tolist()}")
        if abs(arr.sum() - 1.0) > PROB_ATOL:
            raise _fail(env, qid, "target", f"probabilities must sum to 1, they sum to {arr.sum():.6g}")
        return arr / arr.sum()
    if question.qtype == "noul":
        arr = _finite_array(target, env, qid, "target")
        if arr.ndim != 0:
            raise _fail(env, qid, "target", f"a noul target is one probability, got shape {arr.shape}")
        p = float(arr)
        if not 0.0 <= p <= 1.0:
            raise _fail(env, qid, "target", f"a probability must lie in [0, 1], got {p}")
        return p
    # regress
    arr = _finite_array(target, env, qid, "target")
    if arr.ndim == 0:
        return arr.reshape(1)
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise _fail(env, qid, "target", f"a regress target is a float or a non-empty list of samples, got {arr.shape}")
    return arr


def validate_targets(decision: Decision, targets: Mapping, env: str | None = None) -> dict:
    """Check an env's ``oracle_targets()`` against its decision and return them in normal form.

    Every key must be the qid of a report question; a report question without a target is allowed (it is then not
    trained). The action question takes no target here: its learning signal is the reward.

    Returns:
        `dict[str, Any]`: qid -> normalised target (see :func:`validate_target`).
    """
    env = env if env is not None else decision.env
    if not isinstance(targets, Mapping):
        raise _fail(env, None, "targets", f"oracle_targets() must return a dict qid -> target, got {type(targets)}")
    out = {}
    for qid, target in targets.items():
        try:
            question = decision.question(qid)
        except KeyError:
            raise _fail(env, qid, "targets", "target given for a question the decision does not ask") from None
        if qid == ACT_QID:
            raise _fail(env, qid, "targets", "the action question takes no oracle target; use action_rewards()")
        out[qid] = validate_target(question, target, env=env)
    return out


def validate_action_rewards(decision: Decision, rewards, env: str | None = None) -> np.ndarray:
    """Check a dense env's ``action_rewards()``: one finite expected reward per legal action."""
    env = env if env is not None else decision.env
    arr = _finite_array(rewards, env, ACT_QID, "action_rewards")
    if arr.ndim != 1 or arr.shape[0] != decision.n_legal:
        raise _fail(env, ACT_QID, "action_rewards", f"expected {decision.n_legal} rewards, got shape {arr.shape}")
    return arr


__all__ = [
    "ACT_QID",
    "QTYPES",
    "TAUS",
    "Decision",
    "Question",
    "validate_action_rewards",
    "validate_target",
    "validate_targets",
]
