"""Answer one decision of every built-in env with an untrained tiny model, next to the exact oracle answers.

Runs offline on a CPU in seconds: the backbone is a tiny Qwen3 built from a config and the tokenizer is trained
locally. With a real checkpoint, replace both with ``AleaModel.from_pretrained(path)`` and its tokenizer.
"""

import numpy as np
import torch

from alea_trl import AleaModel
from alea_trl.envs import BUILTIN_ENVS, make_env
from alea_trl.packing import pack_request
from alea_trl.testing import build_tiny_tokenizer, tiny_backbone_config


def fmt(x) -> str:
    arr = np.atleast_1d(np.asarray(x, dtype=float))
    if arr.size > 6:
        return "[" + ", ".join(f"{v:.2f}" for v in arr[:3]) + ", ..., " + ", ".join(f"{v:.2f}" for v in arr[-2:]) + "]"
    return "[" + ", ".join(f"{v:.2f}" for v in arr) + "]"


def main() -> None:
    torch.manual_seed(0)
    tokenizer = build_tiny_tokenizer()
    model = AleaModel.from_backbone(tiny_backbone_config(vocab_size=len(tokenizer)))
    rng = np.random.default_rng(0)
    for name in BUILTIN_ENVS:
        env = make_env(name).reset(rng)
        decision = env.observe()
        packed = pack_request(tokenizer, decision.state, decision.questions)
        unpacked = len(packed) + packed.n_state_tokens * (
            len(decision.questions) - 1 + sum(len(q.options or ()) for q in decision.questions)
        )
        answers = model.predict([decision], tokenizer)[0]
        targets = env.oracle_targets()
        print(
            f"\n=== {name} ({'dense' if env.dense else 'outcome'}): {len(packed)} tokens packed, {unpacked} unpacked"
        )
        print(decision.state[:200] + ("..." if len(decision.state) > 200 else ""))
        for q in decision.questions:
            oracle = env.action_rewards() if q.qid == "act" else targets.get(q.qid)
            label = "expected rewards" if q.qid == "act" else "oracle"
            print(
                f"  {q.qid:<12} {q.qtype:<8} model {fmt(answers[q.qid]):<40} {label} {fmt(oracle) if oracle is not None else '-'}"
            )
        print(f"  oracle action: {decision.act.options[env.oracle_action()]!r}")


if __name__ == "__main__":
    main()
