"""Sparse credit assignment: how fast the default trainer learns ``three_in_a_row`` (three decisions, return 1 only if
all three pick the colour the state names; chance 1/27), per model seed and learning rate, on one thread.

It is the run of ``tests/trainer/test_credit_assignment.py::test_a_sparse_three_decision_env_is_learnt`` (the tiny
two-layer backbone, 16 decisions a step, branching, ``beta = 0``), with p(right) — the mean probability of the named
colour over 200 fresh decisions at every round — measured every ``--every`` steps. It prints a table and a final JSON
line; the test's learning rate is the one with a margin over its threshold (0.8) on every seed.

    python benchmarks/sparse_credit.py --seeds 0 1 2 3 4 --lrs 5e-4 1e-3 --steps 1200
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel  # noqa: E402
from alea_trl.testing import build_tiny_tokenizer, tiny_backbone_config  # noqa: E402
from tests.trainer.conftest import TOY_FACTORIES  # noqa: E402
from tests.trainer.test_credit_assignment import _p_right  # noqa: E402


def curve(seed: int, lr: float, steps: int, every: int, tokenizer, env: dict, extra: dict) -> tuple[list, float]:
    """p(right) every ``every`` steps of one run, and its wall time (``env``: ``ThreeInARowEnv``'s arguments;
    ``extra``: config fields)."""
    p_right = functools.partial(_p_right, n_options=env["n_options"], n_rounds=env["n_rounds"])
    factories = {"three_in_a_row": functools.partial(TOY_FACTORIES["three_in_a_row"], **env)}
    torch.manual_seed(seed)
    config = tiny_backbone_config("qwen3", vocab_size=len(tokenizer), num_layers=2)
    model = AleaModel.from_backbone(config, backbone_kwargs={"dtype": torch.float32})
    points = [p_right(model, tokenizer)]

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every == 0:
                points.append(p_right(model, tokenizer))

    with tempfile.TemporaryDirectory() as out:
        args = AleaEnvGRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
            gradient_checkpointing=False, eps_per_env=16, max_batch=16, per_device_train_batch_size=16,
            num_generations=4, max_len=1024, learning_rate=lr, lr_head=lr, lr_aux=lr, lr_scheduler_type="constant",
            logging_steps=steps, max_steps=steps, train_mode="full", disable_tqdm=True, envs=["three_in_a_row"],
            seed=0, **{"beta": 0.0, **extra},
        )  # fmt: skip
        start = time.perf_counter()
        trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer, env_factories=factories)
        trainer.remove_callback(PrinterCallback)  # quiet: the table is the output
        trainer.add_callback(Probe())
        trainer.train()
    return points, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--lrs", type=float, nargs="+", default=[5e-4, 1e-3])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--options", type=int, default=3, help="options per decision")
    parser.add_argument("--rounds", type=int, default=3, help="decisions per episode")
    parser.add_argument("--immediate", action="store_true", help="reward each right pick at once (dense credit)")
    parser.add_argument("--set", nargs="*", default=[], help="config fields, name=value (JSON values)")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(opts.threads))
    tokenizer = build_tiny_tokenizer()
    rows = []
    marks = list(range(0, opts.steps + 1, opts.every))
    print(f"{'lr':>8} {'seed':>5} " + " ".join(f"{m:>6}" for m in marks) + f" {'s':>6}")
    for lr in opts.lrs:
        for seed in opts.seeds:
            env = {"n_options": opts.options, "n_rounds": opts.rounds, "immediate": opts.immediate}
            extra = {k: json.loads(v) for k, v in (item.split("=", 1) for item in opts.set)}
            points, seconds = curve(seed, lr, opts.steps, opts.every, tokenizer, env, extra)
            rows.append({"lr": lr, "seed": seed, "steps": marks, "p_right": points, "seconds": round(seconds, 1)})
            print(f"{lr:>8.0e} {seed:>5} " + " ".join(f"{p:>6.3f}" for p in points) + f" {seconds:>6.0f}", flush=True)
    summary = {
        str(lr): min(r["p_right"][-1] for r in rows if r["lr"] == lr) for lr in opts.lrs
    }  # the worst final p(right) per learning rate
    setting = {"options": opts.options, "rounds": opts.rounds, "immediate": opts.immediate, "set": opts.set}
    print(
        json.dumps(
            {"benchmark": "sparse_credit", "threads": opts.threads, **setting, "worst_final": summary, "runs": rows}
        )
    )


if __name__ == "__main__":
    main()
