"""benchmarks/readout_probe.py's method, on a tiny Llama: the features it probes are the ones the choice head reads,
the probe recovers a rule planted in its features, and its score puts random play at 0 and the oracle at 1."""

import sys
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import readout_probe  # noqa: E402

from alea_trl import AleaModel  # noqa: E402
from alea_trl.testing import build_tiny_tokenizer  # noqa: E402


def test_the_deepest_features_are_what_the_choice_head_reads():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    model = AleaModel.from_backbone(config, backbone_kwargs={"dtype": torch.float32}).eval()
    tokenizer = build_tiny_tokenizer()
    decisions, rewards, _ = readout_probe.play_decisions("kelly", 5, seed=0)
    read: list[torch.Tensor] = []
    hook = model.choice_head.register_forward_hook(lambda _m, args, _out: read.append(args[0].detach()))
    try:
        feats = readout_probe.option_features(model, tokenizer, decisions, [1, 3], batch_size=2)
    finally:
        hook.remove()
    assert [f.shape[0] for f in feats[3]] == [len(q) for q in rewards]
    torch.testing.assert_close(torch.cat(feats[3]), torch.cat(read))
    assert not torch.allclose(torch.cat(feats[1]), torch.cat(feats[3]))  # an earlier depth is another read-out


def planted(n: int, width: int, informative: bool, seed: int) -> tuple[list[torch.Tensor], list[np.ndarray]]:
    """Decisions of ``width`` options whose 16 features hold each option's reward in feature 0 (or not at all)."""
    rng = np.random.default_rng(seed)
    feats, rewards = [], []
    for _ in range(n):
        q = rng.normal(size=width)
        f = rng.normal(size=(width, 16))
        if informative:
            f[:, 0] = q + 0.05 * rng.normal(size=width)
        feats.append(torch.tensor(f, dtype=torch.float32))
        rewards.append(q)
    return feats, rewards


def test_the_probe_reads_a_planted_rule_and_nothing_from_noise():
    train_f, train_q = planted(300, 4, informative=True, seed=0)
    test_f, test_q = planted(200, 4, informative=True, seed=1)
    found = readout_probe.run_probe(train_f, train_q, test_f, test_q, [1e-3, 1e-1])
    assert found["test"] > 0.95
    train_f, train_q = planted(300, 4, informative=False, seed=0)
    test_f, test_q = planted(200, 4, informative=False, seed=1)
    noise = readout_probe.run_probe(train_f, train_q, test_f, test_q, [1e-3, 1e-1])
    assert abs(noise["test"]) < 0.25  # features independent of the rewards: about random play
    assert noise["train"] > noise["test"]  # what it fits on noise does not carry over


def test_the_score_is_zero_for_random_play_and_one_for_the_best_action():
    _, rewards = planted(2000, 5, informative=False, seed=2)
    best = [int(np.argmax(q)) for q in rewards]
    assert readout_probe.score(best, rewards) == 1.0
    random_picks = np.random.default_rng(3).integers(0, 5, size=len(rewards))
    assert abs(readout_probe.score(list(random_picks), rewards)) < 0.05
