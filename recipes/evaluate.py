"""Evaluate a saved Alea model on environments: returns against random and oracle play, report skill, and figures.

Usage:

```bash
python recipes/evaluate.py --model_name_or_path runs/quickstart
python recipes/evaluate.py --model_name_or_path runs/alea-qwen3 --envs kelly nim --episodes 200
python recipes/evaluate.py --config recipes/configs/evaluate.yaml --seed 5
```

The model is a full checkpoint or a LoRA output (loaded onto the base its adapter names), local or on the Hub. By
default the envs, episodes and seed are those of the run's own final evaluation (its ``eval_results.json``), so the
table repeats the one in its model card; the script says which it plays. Writes ``eval_results.json`` (the table of
``evaluate_policy``), ``reliability.png`` (noul forecasts against the oracle probabilities) and ``env_scores.png``
(normalised scores and report skills) into ``output_dir``.
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
        envs (`list[str]`, *optional*):
            Registered env names to evaluate on; by default the run's (its ``eval_results.json``), else the five
            built-in envs.
        episodes (`int`, *optional*):
            Episodes per env (the policy, random and oracle play the same seeded episodes); by default the run's,
            else 100.
        seed (`int`, *optional*):
            Seed of the episodes and of sampled actions; by default the run's, else 0.
        greedy (`bool`, *optional*, defaults to `True`):
            Take the argmax action; `--greedy false` samples from the act head.
        max_len (`int`, *optional*):
            Decisions packing to more tokens end their episode (counted as skipped); by default the backbone's
            ``max_position_embeddings``.
        batch_size (`int`, *optional*, defaults to `16`):
            Decisions per forward pass.
        output_dir (`str` or `None`, *optional*, defaults to `None`):
            Where to write the results and figures; `None` means `<model_name_or_path>/eval`.
    """

    model_name_or_path: str = field(
        metadata={"help": "Local directory or Hub id of a saved Alea model (and its tokenizer)."}
    )
    envs: list[str] | None = field(
        default=None,
        metadata={"help": "Registered env names to evaluate on (default: the run's, else the five built-in envs)."},
    )
    episodes: int | None = field(
        default=None,
        metadata={
            "help": "Episodes per env, the same seeded episodes for all three policies (default: the run's, else 100)."
        },
    )
    seed: int | None = field(default=None, metadata={"help": "Seed of the episodes (default: the run's, else 0)."})
    greedy: bool = field(
        default=True, metadata={"help": "Take the argmax action; `--greedy false` samples from the act head."}
    )
    max_len: int | None = field(
        default=None,
        metadata={"help": "Decisions packing to more tokens end their episode (default: the backbone's positions)."},
    )
    batch_size: int = field(default=16, metadata={"help": "Decisions per forward pass."})
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where to write the results and figures; `None` means `<model_name_or_path>/eval`."},
    )

    def __post_init__(self):
        if self.episodes is not None and self.episodes < 1:
            raise ValueError(
                f"EvaluateArguments: field 'episodes': {self.episodes}; evaluate at least one episode per env"
            )
        if self.envs is not None and not self.envs:
            raise ValueError("EvaluateArguments: field 'envs' is empty; name at least one env (e.g. --envs kelly nim)")


def run_settings(model_name_or_path: str) -> dict:
    """How the run's own final evaluation was played (``eval_settings/*`` of its ``eval_results.json``), if the model
    is a local run that has one."""
    path = os.path.join(model_name_or_path, "eval_results.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        saved = json.load(f)
    return {k.split("/", 1)[1]: v for k, v in saved.items() if k.startswith("eval_settings/")}


def resolve_settings(args: EvaluateArguments) -> tuple[list[str], dict, int | dict, int, str]:
    """``(envs, env_kwargs, episodes, seed, where they come from)``: each given argument, else the run's, else the
    default (the built-in envs, 100 episodes, seed 0)."""
    run = run_settings(args.model_name_or_path)
    envs = list(args.envs) if args.envs is not None else run.get("envs", list(BUILTIN_ENVS))
    episodes = args.episodes if args.episodes is not None else run.get("episodes", 100)
    seed = args.seed if args.seed is not None else run.get("seed", 0)
    kwargs = {name: kw for name, kw in run.get("env_kwargs", {}).items() if name in envs}
    taken = [
        name
        for name, given in (("envs", args.envs), ("episodes", args.episodes), ("seed", args.seed))
        if given is None
    ]
    source = "the run's eval_results.json" if run else "the defaults"
    where = f"{', '.join(taken)} from {source}" if taken else "all given"
    return envs, kwargs, episodes, seed, where


def main(args: EvaluateArguments) -> dict[str, dict[str, float]]:
    import torch
    from transformers import AutoTokenizer

    from alea_trl import AleaModel
    from alea_trl.envs import env_factories
    from alea_trl.evaluation import evaluate_policy, format_table
    from alea_trl.plots import env_scores_bar, reliability_diagram

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AleaModel.from_pretrained(args.model_name_or_path).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    envs, env_kwargs, episodes, seed, where = resolve_settings(args)
    print(f"Evaluating {envs}, {episodes} episodes per env, seed {seed} ({where})")

    forecasts: list = []
    table = evaluate_policy(
        model,
        tokenizer,
        env_factories(envs, env_kwargs),
        episodes=episodes,
        seed=seed,
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
        table, os.path.join(output_dir, "env_scores.png"), title=f"{name}: {episodes} episodes per env"
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
