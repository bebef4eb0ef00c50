"""Shared fixtures: a tokenizer trained locally and tiny random backbones (nothing is downloaded)."""

import random

import pytest
import torch

from alea_trl import AleaModel, Decision, Question
from alea_trl.testing import build_tiny_tokenizer, tiny_backbone_config


@pytest.fixture(scope="session")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture
def make_model(tokenizer):
    """Build a tiny fp32 AleaModel: ``make_model(family="qwen3", attn="sdpa", seed=0, **head_kwargs)``."""

    def _make(family="qwen3", attn="sdpa", seed=0, **head_kwargs):
        torch.manual_seed(seed)
        config = tiny_backbone_config(family, vocab_size=len(tokenizer), attn_implementation=attn)
        model = AleaModel.from_backbone(
            config, backbone_kwargs={"dtype": torch.float32, "attn_implementation": attn}, **head_kwargs
        )
        return model.eval()

    return _make


WORDS = "the coin pays two to one bankroll round demand price arm pile stones regime calm up down".split()


def random_text(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    words.insert(rng.randint(0, len(words)), f"{rng.random() * 100:.2f}")
    return " ".join(words)


def random_decision(rng: random.Random) -> Decision:
    """3-6 questions covering all four qtypes, choice questions with 2-12 options, varied lengths."""
    n_q = rng.randint(3, 6)
    qtypes = ["score", "noul", "regress"] + [
        rng.choice(["choice", "score", "noul", "regress"]) for _ in range(n_q - 3)
    ]
    rng.shuffle(qtypes)
    questions = [
        Question(
            "act",
            "choice",
            random_text(rng, 2, 8),
            options=[f"{w} {i}" for i, w in enumerate(rng.choices(WORDS, k=rng.randint(2, 12)))],
        )
    ]
    for i, qt in enumerate(qtypes):
        kw = {}
        if qt == "choice":
            kw["options"] = [f"opt {random_text(rng, 0, 3)} {j}" for j in range(rng.randint(2, 12))]
        if qt == "score":
            kw["n_bins"] = rng.randint(2, 12)
        questions.append(Question(f"q{i}", qt, random_text(rng, 2, 10), **kw))
    rng.shuffle(questions)
    return Decision(random_text(rng, 5, 60), questions)


@pytest.fixture
def tiny_model_factory(tokenizer):
    """``tiny_model_factory(seed=0)``: a tiny fp32 Qwen3-backbone AleaModel for training tests."""

    def _make(seed=0):
        torch.manual_seed(seed)
        config = tiny_backbone_config("qwen3", vocab_size=len(tokenizer))
        return AleaModel.from_backbone(config, backbone_kwargs={"dtype": torch.float32})

    return _make


# A reloaded model's weights are compared bit for bit; its answers to float32 rounding only. safetensors hands back
# weights at whatever offsets the file has (seen here: addresses 8, 12, 16 or 44 mod 64), and the CPU matmul kernels
# take another code path for unaligned buffers, which moves a probability by ~1e-8 (the same model with its weights
# cloned to fresh, aligned memory answers bit-identically).
RELOAD_ATOL = 1e-6


def assert_reloads_identically(loaded, model, decisions, tokenizer) -> None:
    """``loaded`` (a reloaded checkpoint) holds exactly ``model``'s weights and gives its answers on ``decisions``."""
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=0, rtol=0, msg=name)
    for x, y in zip(model.predict(decisions, tokenizer), loaded.predict(decisions, tokenizer), strict=True):
        assert x.keys() == y.keys()
        for qid in x:
            torch.testing.assert_close(torch.as_tensor(y[qid]), torch.as_tensor(x[qid]), atol=RELOAD_ATOL, rtol=0)
