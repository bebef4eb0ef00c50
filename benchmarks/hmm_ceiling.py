"""hmm's supervised ceiling: what the learning benchmark's backbone reaches on hmm when its act is told the answer.

What it measures: the same tiny random-weight backbone as ``learning.py`` (4 x 128 Qwen3 shape, the same input extras,
the same small hmm instance), trained with ``AleaSFTTrainer`` on hmm decisions alone: the act head imitates the
oracle's act target (a softmax of the exact expected rewards, i.e. of the filtering posterior, at ``act_temperature``
relative to the decision's reward spread) and the report heads their exact targets, at the learning benchmark's
learning rate and schedule. Decisions come from ``collect_decisions`` (a behaviour policy mixing oracle and random
actions); ``--episodes`` of 3 decisions each, so the default 11000 episodes hold about as many hmm decisions as the
learning benchmark trains on (1500 steps x 40 decisions x 9/18 of them hmm = 30000).

Before training and every ``--eval_every`` steps the greedy act head plays the learning benchmark's own evaluation
episodes (``evaluate_policy`` at ``EVAL_SEED``, the same 100 episodes) and the figure is the same normalised score
``(policy - random) / (oracle - random)`` from exact expected rewards, next to hmm's hand-written references
(``learning_parts.references.hmm_reference_policies``: the *prior* reads no symbol).

Why: GRPO in ``learning.py`` can leave hmm's act near the prior's level while the same backbone's question read-outs
learn the emission table. If this supervised run reaches the oracle, the backbone and the option read-out can
represent the lookup in this many decisions, and what stands in the way is the policy-gradient signal, not the model.

    python benchmarks/hmm_ceiling.py             # the full curve, one process
    python benchmarks/hmm_ceiling.py --quick     # a smoke run

Prints the curve as a table and, last, one JSON line. Figures and timings of past runs: ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import time

import learning  # the learning benchmark's model (a sibling script)
import numpy as np
import torch
from learning_parts.references import EVAL_SEED, SMALL, hmm_reference_policies
from transformers import AutoTokenizer, TrainerCallback

from alea_trl import AleaSFTConfig, AleaSFTTrainer
from alea_trl.decision_data import collect_decisions
from alea_trl.envs.registry import RegisteredEnvFactory
from alea_trl.evaluation import evaluate_policy


class GreedyCurve(TrainerCallback):
    """Plays the evaluation episodes greedily (``evaluate_policy``, seeded as ``learning.py``'s) at init and every
    ``every`` steps; keeps ``(step, expected_score)``."""

    def __init__(self, model, tokenizer, factory: dict, episodes: int, every: int):
        self.model, self.tokenizer, self.factory, self.episodes, self.every = (
            model,
            tokenizer,
            factory,
            episodes,
            every,
        )
        self.points: list[tuple[int, float]] = []

    def evaluate(self, step: int) -> None:
        table = evaluate_policy(self.model, self.tokenizer, self.factory, self.episodes, seed=EVAL_SEED)
        score = float(table["hmm"]["expected_score"])
        self.points.append((step, score))
        print(f"  step {step:>5}  hmm act {score:+.3f}", flush=True)

    def on_train_begin(self, args, state, control, **kwargs):
        self.evaluate(0)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.evaluate(state.global_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    parser.add_argument("--batch_size", type=int, default=32, help="decisions per step")
    parser.add_argument("--episodes", type=int, default=11000, help="training episodes (3 decisions each)")
    parser.add_argument("--eval_every", type=int, default=250)
    parser.add_argument("--eval_episodes", type=int, default=100, help="the learning benchmark's evaluation episodes")
    parser.add_argument("--seed", type=int, default=1, help="model initialisation and rollout seed")
    parser.add_argument("--lr", type=float, default=1.5e-3, help="every parameter group (as in learning.py)")
    parser.add_argument("--warmup", type=int, default=24)
    parser.add_argument("--act_temperature", type=float, default=0.1, help="of the act target (collect_decisions)")
    parser.add_argument("--report_w", type=float, default=1.0, help="report loss weight (act weight 1)")
    parser.add_argument("--max_grad_norm", type=float, default=1.0, help="gradient clipping (as in learning.py)")
    learning.add_hparams(parser, learning.MODEL_HPARAMS)
    parser.add_argument("--out", default="runs/bench_hmm_ceiling")
    parser.add_argument("--quick", action="store_true", help="~20-second smoke run")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.episodes, args.eval_every, args.eval_episodes = 20, 200, 10, 20

    t0 = time.perf_counter()
    kwargs = SMALL["hmm"]
    factory = {"hmm": RegisteredEnvFactory("hmm", kwargs)}
    data = collect_decisions(factory, args.episodes, seed=args.seed, act_temperature=args.act_temperature)
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(learning.ASSET)
    model = learning.tiny_model(args)
    args.lr_head, args.lr_aux, args.schedule = args.lr, args.lr, "cosine"  # one learning rate for every group
    config = AleaSFTConfig(
        output_dir=args.out, **learning.optimisation(args), **learning.cpu_run(args.seed, args.steps)
    )
    curve = GreedyCurve(model, tokenizer, factory, args.eval_episodes, args.eval_every)
    trainer = AleaSFTTrainer(model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[curve])
    trainer.train()
    references = hmm_reference_policies(args.eval_episodes, SMALL)

    print(f"\nhmm act score (normalised, exact expected rewards), supervised, {len(data)} decisions:")
    print(f"  {'step':>6}  score")
    for step, score in curve.points:
        print(f"  {step:>6}  {score:+.3f}")
    print("hand-written references on the same episodes: " + ", ".join(f"{k} {v:.3f}" for k, v in references.items()))
    final = float(np.mean([s for _, s in curve.points[-2:]]))
    print(json.dumps({
        "steps": args.steps, "decisions": len(data), "seed": args.seed, "init": curve.points[0][1], "final": final,
        "best": max(s for _, s in curve.points[1:]), "above_prior": final > references["prior"],
        "curve": {"step": [p for p, _ in curve.points], "hmm": [s for _, s in curve.points]},
        "hmm_reference": references, "wall_s": round(time.perf_counter() - t0, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
