"""Does pretraining help? SmolLM2-135M-Instruct's pretrained weights against random weights, same everything else.

What it measures: for each seed, two models are trained with ``AleaEnvGRPOTrainer`` on the dense envs (hmm, kelly,
newsvendor: the instances of ``recipes/configs/smollm2_135m.yaml``) with the same settings, the same tokenizer (the
real 49,152-token one) and the same architecture (the first ``--layers`` of the 30 Llama layers, hidden 576):

- ``pretrained``: the layers of the fetched checkpoint (``python -m alea_trl.models fetch smollm2-135m-instruct``);
- ``random``: the same config with random weights (transformers' Llama initialisation, std 0.02, seeded).

By default only the heads train (``--train_mode heads``: the backbone is frozen, so no backward pass runs through it
and a step is cheap); ``--train_mode tail`` trains the last ``--tail_k`` layers too, and ``--train_mode full`` every
layer and the embeddings, as the recipe does (``--layers 4 --train_mode full --lr 5e-4 --lr_head 1e-3 --report_w 5``
are the recipe's settings). Before training and every ``--eval_every`` steps the greedy policy plays
``--eval_episodes`` seeded episodes per env (the same episodes at every point, and for both weights), giving per env
the normalised score from exact expected rewards (``expected_score``, free of outcome noise), from realised returns
(``normalized_score``) and the report skill per qtype (``1 - loss / no-skill loss``). The x axes of the curves are
decisions trained on and training seconds (the evaluations' own time left out).

Output: a table (final figures, mean over seeds, and each seed), ``pretrained.png`` (curves of every env's expected
score against decisions and against seconds, pretrained vs random) in ``--out``, and, last, one JSON line.

    python benchmarks/pretrained.py                       # 2 seeds x 2 weights, heads only (about 26 min quiet)
    # the recipe's mode (about 23 min quiet)
    python benchmarks/pretrained.py --layers 4 --train_mode full --lr 5e-4 --lr_head 1e-3 --report_w 5
    python benchmarks/pretrained.py --steps 4 --eval_every 2 --eval_episodes 2 --seeds 0   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from transformers import AutoConfig, AutoTokenizer, TrainerCallback

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.envs.registry import RegisteredEnvFactory
from alea_trl.evaluation import evaluate_policy
from alea_trl.models import fetch


ENVS = ["hmm", "kelly", "newsvendor"]
# the recipe's env instances (recipes/configs/smollm2_135m.yaml): hmm as the learning benchmark's small instance
ENV_KWARGS = {"hmm": {"n_regimes": 2, "n_symbols": 2, "emit_alpha": 0.3, "horizon": 3}}
EVAL_SEED = 12345  # the evaluation episodes: apart from the training pool's seed, the same at every point
WEIGHTS = ("pretrained", "random")


class CurveCallback(TrainerCallback):
    """Evaluates the greedy policy at init and every ``every`` steps; training seconds exclude the evaluations."""

    def __init__(self, ref: dict, tokenizer, every: int, episodes: int, batch_size: int):
        self.ref, self.tokenizer, self.every, self.episodes, self.batch_size = (
            ref,
            tokenizer,
            every,
            episodes,
            batch_size,
        )
        self.points: list[dict] = []  # {"step", "seconds", env: {figure: value}}
        self.train_seconds, self.t0 = 0.0, None

    def evaluate(self, step: int) -> None:
        trainer = self.ref["trainer"]
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        factories = {env: RegisteredEnvFactory(env, ENV_KWARGS.get(env)) for env in ENVS}
        table = evaluate_policy(
            model, self.tokenizer, factories, episodes=self.episodes, seed=EVAL_SEED, batch_size=self.batch_size
        )
        model.train(was_training)
        point = {"step": step, "seconds": round(self.train_seconds, 1)}
        for env in ENVS:
            row = table[env]
            point[env] = {
                "expected_score": float(row["expected_score"]),
                "normalized_score": float(row["normalized_score"]),
            }
            point[env] |= {k: float(v) for k, v in row.items() if k.startswith("skill/")}
        self.points.append(point)
        shown = "  ".join(f"{e} {point[e]['expected_score']:+.3f}" for e in ENVS)
        print(f"    step {step:>4}  {shown}  (train {self.train_seconds:.0f}s)", flush=True)

    def on_train_begin(self, args, state, control, **kwargs):
        self.evaluate(0)
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.train_seconds += time.perf_counter() - self.t0
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.evaluate(state.global_step)
        self.t0 = time.perf_counter()


def build_model(path: str, weights: str, layers: int, seed: int) -> AleaModel:
    """The first ``layers`` Llama layers of the checkpoint at ``path``, with its weights or random ones, fresh heads."""
    torch.manual_seed(seed)
    if weights == "pretrained":
        return AleaModel.from_backbone(path, backbone_kwargs={"num_hidden_layers": layers, "dtype": torch.float32})
    config = AutoConfig.from_pretrained(path, num_hidden_layers=layers)
    return AleaModel.from_backbone(config, backbone_kwargs={"dtype": torch.float32})


def train_one(args, path: str, tokenizer, weights: str, seed: int) -> list[dict]:
    model = build_model(path, weights, args.layers, seed)
    config = AleaEnvGRPOConfig(
        output_dir=os.path.join(args.out, f"{weights}_seed{seed}"),
        envs=ENVS,
        env_kwargs=ENV_KWARGS,
        train_mode=args.train_mode,
        tail_k=args.tail_k,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_head=args.lr_head,
        lr_scheduler_type="constant",
        beta=0.0,  # no reference: the comparison is about what the heads can read, not about staying near a policy
        num_generations=8,
        eps_per_env=8,
        max_batch=args.batch_size,
        per_device_train_batch_size=args.batch_size,
        max_len=512,
        report_w=args.report_w,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        logging_steps=max(args.steps, 1),
        report_to="none",
        disable_tqdm=True,
        seed=seed,
    )
    ref: dict = {}
    callback = CurveCallback(ref, tokenizer, args.eval_every, args.eval_episodes, args.batch_size)
    trainer = AleaEnvGRPOTrainer(model, args=config, processing_class=tokenizer, callbacks=[callback])
    ref["trainer"] = trainer
    trainer.train()
    return callback.points


def summarise(runs: dict[str, dict[int, list[dict]]]) -> dict:
    """Final figures per weights and env: the mean over seeds of each figure at the last point, and the seeds'."""
    out: dict = {}
    for weights, by_seed in runs.items():
        out[weights] = {}
        for env in ENVS:
            finals = [points[-1][env] for points in by_seed.values()]
            keys = sorted({k for f in finals for k in f})
            out[weights][env] = {k: float(np.mean([f[k] for f in finals if k in f])) for k in keys}
            out[weights][env]["expected_score_seeds"] = [f["expected_score"] for f in finals]
            out[weights][env]["init_expected_score"] = float(
                np.mean([points[0][env]["expected_score"] for points in by_seed.values()])
            )
    return out


def print_table(summary: dict) -> None:
    qtypes = sorted({k[6:] for w in summary.values() for row in w.values() for k in row if k.startswith("skill/")})
    head = f"{'env':<12}{'weights':<12}{'init':>8}{'exp.score':>11}{'seeds':>18}{'norm.score':>12}"
    head += "".join(f"{'skill/' + q:>15}" for q in qtypes)
    print(head)
    print("-" * len(head))
    for env in ENVS:
        for weights, rows in summary.items():
            row = rows[env]
            seeds = " ".join(f"{s:.2f}" for s in row["expected_score_seeds"])
            line = f"{env:<12}{weights:<12}{row['init_expected_score']:>8.3f}{row['expected_score']:>11.3f}"
            line += f"{seeds:>18}{row['normalized_score']:>12.3f}"
            line += "".join(f"{row[f'skill/{q}']:>15.3f}" if f"skill/{q}" in row else f"{'-':>15}" for q in qtypes)
            print(line)


def plot(runs: dict, batch_size: int, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(ENVS), figsize=(4.2 * len(ENVS), 7), squeeze=False)
    colours = {"pretrained": "tab:blue", "random": "tab:orange"}
    for col, env in enumerate(ENVS):
        for row, x_key in enumerate(("decisions", "seconds")):
            ax = axes[row][col]
            for weights, by_seed in runs.items():
                for i, points in enumerate(by_seed.values()):
                    x = [p["step"] * batch_size if x_key == "decisions" else p["seconds"] for p in points]
                    y = [p[env]["expected_score"] for p in points]
                    ax.plot(x, y, color=colours[weights], alpha=0.8, label=weights if i == 0 else None)
            ax.axhline(0, color="grey", lw=0.5)
            ax.set_xlabel(f"training {x_key}")
            ax.set_title(f"{env}: expected score")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="first Llama layers kept (of 30)")
    parser.add_argument("--train_mode", default="heads", choices=["heads", "tail", "full"], help="what trains")
    parser.add_argument("--tail_k", type=int, default=2, help="layers trained under --train_mode tail")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per run")
    parser.add_argument("--batch_size", type=int, default=16, help="decisions per step")
    parser.add_argument("--lr", type=float, default=1e-4, help="backbone learning rate (tail and full modes)")
    parser.add_argument("--lr_head", type=float, default=3e-3, help="heads learning rate")
    parser.add_argument("--report_w", type=float, default=1.0, help="weight of the report losses")
    parser.add_argument("--eval_every", type=int, default=25, help="evaluate every this many steps")
    parser.add_argument("--eval_episodes", type=int, default=20, help="evaluation episodes per env")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", default="runs/pretrained", help="folder of the PNG and the runs")
    args = parser.parse_args()
    for name in ("layers", "steps", "batch_size", "eval_every", "eval_episodes"):
        if getattr(args, name) < 1:
            raise ValueError(f"pretrained.py: field '{name}': must be >= 1, got {getattr(args, name)}")
    os.makedirs(args.out, exist_ok=True)
    path = fetch("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    runs: dict[str, dict[int, list[dict]]] = {w: {} for w in WEIGHTS}
    started = time.perf_counter()
    for seed in args.seeds:
        for weights in WEIGHTS:
            print(f"seed {seed}, {weights} weights, {args.layers} layers, train_mode {args.train_mode}", flush=True)
            runs[weights][seed] = train_one(args, path, tokenizer, weights, seed)
    summary = summarise(runs)
    print()
    print_table(summary)
    png = plot(runs, args.batch_size, os.path.join(args.out, "pretrained.png"))
    print(f"\ncurves: {png}")
    record = {
        "benchmark": "pretrained",
        "model": "smollm2-135m-instruct",
        "layers": args.layers,
        "train_mode": args.train_mode,
        "lr": args.lr,
        "lr_head": args.lr_head,
        "report_w": args.report_w,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seeds": args.seeds,
        "eval_episodes": args.eval_episodes,
        "final": summary,
        "curves": {w: {str(s): pts for s, pts in by_seed.items()} for w, by_seed in runs.items()},
        "seconds": round(time.perf_counter() - started, 1),
        "png": png,
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
