"""Build `recipes/assets/tiny-qwen3/`: a tiny Qwen3 config and a byte-level BPE tokenizer trained on env decisions.

The quickstart builds its backbone from this config (random weights) and uses this tokenizer, so it runs offline.
Re-run after changing an env's text: `python recipes/assets/build_tiny_assets.py`.
"""

from pathlib import Path

import numpy as np

from alea_trl.envs import BUILTIN_ENVS, make_env
from alea_trl.packing import OPTION_TEMPLATE, QUESTION_TEMPLATE
from alea_trl.testing import tiny_backbone_config, train_bpe_tokenizer


OUT = Path(__file__).with_name("tiny-qwen3")


def corpus(episodes_per_env: int = 200, seed: int = 0):
    """Every state, question and option text of random-action episodes of the built-in envs."""
    for e, name in enumerate(BUILTIN_ENVS):
        env, pick = make_env(name), np.random.default_rng([seed, e, 1])
        for i in range(episodes_per_env):
            env.reset(np.random.default_rng([seed, e, i]))
            while not env.done:
                d = env.observe()
                yield d.state
                for q in d.questions:
                    yield QUESTION_TEMPLATE.format(text=q.text)
                    for o in q.options or ():
                        yield OPTION_TEMPLATE.format(option=o)
                env.step(int(pick.integers(d.n_legal)))


def main(vocab_size: int = 2048) -> None:
    fast = train_bpe_tokenizer(corpus(), vocab_size=vocab_size, split_digits=True)  # digits one by one, as Qwen3
    OUT.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(OUT)
    config = tiny_backbone_config("qwen3", vocab_size=len(fast), hidden_size=128, num_layers=4)
    config.pad_token_id, config.eos_token_id = fast.pad_token_id, fast.eos_token_id
    config.save_pretrained(OUT)
    print(f"wrote {OUT}: vocab {len(fast)}, hidden {config.hidden_size}, layers {config.num_hidden_layers}")


if __name__ == "__main__":
    main()
