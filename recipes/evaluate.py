"""Evaluate a saved Alea model on environments: returns against random and oracle play, report skill, and figures.

Usage:

```bash
python recipes/evaluate.py --model_name_or_path runs/alea-qwen3 --envs kelly nim --episodes 200
python recipes/evaluate.py --config recipes/configs/evaluate.yaml --seed 1
```

Writes ``eval_results.json`` (the table of ``evaluate_policy``), ``reliability.png`` (noul forecasts against the
oracle probabilities) and ``env_scores.png`` (normalised scores and report skills) into ``output_dir``.
"""

import argparse
import json
import math
import os
from dataclasses import dataclass, field

from alea_trl.envs import BUILTIN_ENVS


@dataclass
class EvaluateArguments:
    """Arguments of the evaluation script.

    Parameters:
        model_name_or_path (`str`):
            Local directory or Hub id of a saved Alea model (and its tokenizer).
        envs (`list[str]`, *optional*, defaults to the five built-in envs):
            Registered env names to evaluate on.
        episodes (`int`, *optional*, defaults to `100`):
            Episodes per env (the policy, random and oracle play the same seeded episodes).
        seed (`int`, *optional*, defaults to `0`):
            Seed of the episodes and of sampled actions.
        greedy (`bool`, *optional*, defaults to `True`):
            Take the argmax action; `--greedy false` samples from the act head.
        max_len (`int`, *optional*, defaults to `2048`):
            Decisions packing to more tokens end their episode (counted as skipped).
        batch_size (`int`, *optional*, defaults to `16`):
            Decisions per forward pass.
        output_dir (`str` or `None`, *optional*, defaults to `None`):
            Where to write the results and figures; `None` means `<model_name_or_path>/eval`.
    """

    model_name_or_path: str = field(
        metadata={"help": "Local directory or Hub id of a saved Alea model (and its tokenizer)."}
    )
    envs: list[str] = field(
        default_factory=lambda: list(BUILTIN_ENVS), metadata={"help": "Registered env names to evaluate on."}
    )
    episodes: int = field(
        default=100,
        metadata={"help": "Episodes per env (the policy, random and oracle play the same seeded episodes)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the episodes and of sampled actions."})
    greedy: bool = field(
        default=True, metadata={"help": "Take the argmax action; `--greedy false` samples from the act head."}
    )
    max_len: int = field(
        default=2048, metadata={"help": "Decisions packing to more tokens end their episode (counted as skipped)."}
    )
    batch_size: int = field(default=16, metadata={"help": "Decisions per forward pass."})
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where to write the results and figures; `None` means `<model_name_or_path>/eval`."},
    )

    def __post_init__(self):
        if self.episodes < 1:
            raise ValueError(f"EvaluateArguments: episodes={self.episodes}; evaluate at least one episode per env")
        if not self.envs:
            raise ValueError("EvaluateArguments: envs is empty; name at least one env (e.g. --envs kelly nim)")


def main(args: EvaluateArguments) -> dict[str, dict[str, float]]:
    import torch
    from transformers import AutoTokenizer

    import alea_trl  # noqa: F401  (registers the Alea config with the Auto classes)
    from alea_trl import AleaModel
    from alea_trl.evaluation import evaluate_policy, format_table
    from alea_trl.plots import env_scores_bar, reliability_diagram

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AleaModel.from_pretrained(args.model_name_or_path).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)

    forecasts: list = []
    table = evaluate_policy(
        model,
        tokenizer,
        list(args.envs),
        episodes=args.episodes,
        seed=args.seed,
        greedy=args.greedy,
        max_len=args.max_len,
        batch_size=args.batch_size,
        forecasts=forecasts,
    )
    print(format_table(table))

    output_dir = args.output_dir or os.path.join(args.model_name_or_path, "eval")
    os.makedirs(output_dir, exist_ok=True)
    results_path = os.path.join(output_dir, "eval_results.json")
    # strict JSON: NaN (e.g. the normalised score of an env whose random and oracle returns tie) is written as null
    clean = {env: {k: (v if math.isfinite(v) else None) for k, v in sorted(row.items())} for env, row in table.items()}
    with open(results_path, "w") as f:
        json.dump(clean, f, indent=2)
    name = os.path.basename(os.path.normpath(args.model_name_or_path))
    reliability = reliability_diagram(
        forecasts, os.path.join(output_dir, "reliability.png"), title=f"{name}: noul reliability"
    )
    scores = env_scores_bar(
        table, os.path.join(output_dir, "env_scores.png"), title=f"{name}: {args.episodes} episodes per env"
    )
    print(f"Results written to {results_path}\nFigures written to {reliability} and {scores}")
    return table


def make_parser(subparsers: argparse._SubParsersAction | None = None):
    from trl import TrlParser

    if subparsers is not None:
        return subparsers.add_parser(
            "evaluate", help="Evaluate a saved Alea model", dataclass_types=(EvaluateArguments,)
        )
    return TrlParser((EvaluateArguments,))


if __name__ == "__main__":
    main(make_parser().parse_args_and_config()[0])
