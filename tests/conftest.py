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
