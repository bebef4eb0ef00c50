"""The question protocol rejects malformed decisions and targets with errors that say where."""

import numpy as np
import pytest

from alea_trl.questions import (
    Decision,
    Question,
    validate_action_rewards,
    validate_targets,
)


def _act(**kw):
    return Question("act", "choice", "Which?", options=["a", "b", "c"], **kw)


def _decision():
    return Decision(
        "A state.",
        [
            _act(),
            Question("p", "noul", "Yes?"),
            Question("s", "score", "How many?", n_bins=4),
            Question("c", "choice", "Which colour?", options=["red", "blue"]),
            Question("r", "regress", "How much?"),
        ],
        env="toy",
    )


def test_valid_decision_and_targets_normalised():
    d = _decision()
    assert d.n_legal == 3 and d.act.qid == "act" and [q.qid for q in d.reports] == ["p", "s", "c", "r"]
    t = validate_targets(d, {"p": 0.25, "s": 2, "c": [0.3, 0.7], "r": [1.0, 2.0, 3.0]})
    np.testing.assert_allclose(t["s"], [0, 0, 1, 0])  # index -> one-hot
    np.testing.assert_allclose(t["c"], [0.3, 0.7])
    assert t["p"] == 0.25 and t["r"].shape == (3,)
    assert validate_targets(d, {"r": 4.5})["r"].tolist() == [4.5]  # a float is one sample


@pytest.mark.parametrize(
    "build, qid, field",
    [
        (lambda: Decision("s", [Question("x", "noul", "Q?")], env="toy"), "act", "questions"),
        (lambda: Decision("s", [_act(), _act()], env="toy"), "act", "qid"),
        (
            lambda: Decision("s", [_act(), Question("p", "noul", "Q?"), Question("p", "noul", "R?")], env="toy"),
            "p",
            "qid",
        ),
        (lambda: Decision("s", [Question("act", "noul", "Q?")], env="toy"), "act", "qtype"),
        (lambda: Question("c", "choice", "Q?", options=[], env="toy"), "c", "options"),
        (lambda: Question("c", "choice", "Q?", env="toy"), "c", "options"),
        (lambda: Question("c", "choice", "Q?", options=["a", "a"], env="toy"), "c", "options"),
        (lambda: Question("s", "score", "Q?", env="toy"), "s", "n_bins"),
        (lambda: Question("s", "score", "Q?", n_bins=1, env="toy"), "s", "n_bins"),
        (lambda: Question("n", "noul", "Q?", n_bins=3, env="toy"), "n", "n_bins"),
        (lambda: Question("n", "guess", "Q?", env="toy"), "n", "qtype"),
        (lambda: Decision("", [_act()], env="toy"), None, "state"),
    ],
)
def test_bad_decisions_name_env_question_field(build, qid, field):
    with pytest.raises(ValueError) as err:
        build()
    msg = str(err.value)
    assert "env 'toy'" in msg and f"field '{field}'" in msg
    if qid is not None:
        assert f"question '{qid}'" in msg


@pytest.mark.parametrize(
    "targets, qid, needle",
    [
        ({"c": [0.2, 0.3, 0.5]}, "c", "length 2"),  # wrong length
        ({"c": [1.2, -0.2]}, "c", "[0, 1]"),  # outside [0, 1]
        ({"c": [0.2, 0.3]}, "c", "sum to 1"),  # not summing to 1
        ({"s": 7}, "s", "out of range"),
        ({"p": 1.5}, "p", "[0, 1]"),
        ({"p": float("nan")}, "p", "finite"),
        ({"p": [0.1, 0.2]}, "p", "one probability"),
        ({"r": []}, "r", "non-empty"),
        ({"r": [1.0, float("inf")]}, "r", "finite"),
        ({"zzz": 0.5}, "zzz", "does not ask"),
        ({"act": 0}, "act", "action_rewards"),
    ],
)
def test_bad_targets_name_env_question_field(targets, qid, needle):
    with pytest.raises(ValueError) as err:
        validate_targets(_decision(), targets)
    msg = str(err.value)
    assert "env 'toy'" in msg and f"question '{qid}'" in msg and needle in msg


def test_action_rewards_checked():
    d = _decision()
    np.testing.assert_allclose(validate_action_rewards(d, [1, 2, 3]), [1, 2, 3])
    for bad in ([1, 2], [1, 2, float("nan")]):
        with pytest.raises(ValueError, match="field 'action_rewards'"):
            validate_action_rewards(d, bad)
