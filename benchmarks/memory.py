"""Bounded memory: peak RSS over a long GRPO run on the outcome envs (bandit, nim) must stay flat.

Outcome envs keep every decision of a live episode (packed tokens, targets, behaviour log-prob) until the episode
ends, then queue it as a row for the loss. This benchmark trains a tiny random Qwen3 backbone (hidden 64, 2 layers,
fp32, CPU, offline tokenizer) for ``--steps`` optimizer steps and samples, every ``--sample_every`` steps, the
process RSS (``VmRSS``) and its high-water mark (``VmHWM``), the pool's ready-row queue, the stored outcome decisions
(``len(ep.pending)`` over live episodes), the episode returns the pool still holds, and ``len(log_history)``.

Warm-up is the first 10% of steps. The run passes when the peak RSS after warm-up is less than 10% above the RSS at
the end of warm-up; it also reports the least-squares slope of RSS against step after warm-up (KB per 1,000 steps).

    python benchmarks/memory.py                      # 5,000 steps on bandit + nim
    python benchmarks/memory.py --quick              # 500 steps, a smoke run
    python benchmarks/memory.py --envs bandit,nim,kelly --steps 2000
    python benchmarks/memory.py --tracemalloc        # also: what Python objects grew after warm-up (slower)

Prints a table of samples (about every 500 steps) and, last, one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import resource
import sys
import tempfile
import time
import tracemalloc

import numpy as np
import torch
from transformers import TrainerCallback

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.testing import build_tiny_tokenizer, tiny_backbone_config


def read_rss_kb() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KB; falls back to ``ru_maxrss`` for both where /proc is missing."""
    try:
        fields = {}
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0])
        return fields["VmRSS"], fields["VmHWM"]
    except (OSError, KeyError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS, KB on Linux
        return peak, peak


def object_counts() -> collections.Counter:
    """Live objects tracked by the garbage collector, per type name."""
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


class MemorySampler(TrainerCallback):
    """Samples RSS and the trainer's row / decision stores every ``every`` steps (and at the end of warm-up).

    With ``trace`` set, starts ``tracemalloc`` at the end of warm-up and snapshots at the midpoint of the rest of the
    run and at the end, so the two snapshots' difference is what kept growing after warm-up.
    """

    def __init__(self, every: int, warmup: int, trace: bool = False, live_every: int = 0):
        self.every, self.warmup, self.trace, self.live_every = every, warmup, trace, live_every
        self.trainer = None
        self.samples: list[dict] = []
        self.snapshots: dict[int, tracemalloc.Snapshot] = {}
        self.counts: dict[int, collections.Counter] = {}
        self.t0 = time.perf_counter()

    def sample(self, step: int) -> dict:
        rollout = self.trainer.rollout
        pool = rollout.pool
        if step == 0:  # the clock starts with training
            self.t0 = time.perf_counter()
        rss, hwm = read_rss_kb()
        row = {
            "step": step,
            "time_s": time.perf_counter() - self.t0,
            "rss_kb": rss,
            "hwm_kb": hwm,
            "queue": len(rollout.queue),
            "pending": sum(len(ep.pending) for eps in pool.episodes.values() for ep in eps),
            "finished": sum(len(v) for v in pool.returns.values()),  # bounded windows of recent returns
            "log_history": len(self.trainer.state.log_history),
        }
        self.samples.append(row)
        return row

    def on_train_begin(self, args, state, control, **kwargs):
        self.sample(0)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step % self.every == 0 or step == self.warmup:
            row = self.sample(step)
            if self.live_every and step % self.live_every == 0:  # progress on stderr while the run goes on
                print(f"[memory] {json.dumps(row)}", file=sys.stderr, flush=True)
        if not self.trace:
            return
        mid = self.warmup + (state.max_steps - self.warmup) // 2
        if step == self.warmup:
            gc.collect()
            self.counts[step] = object_counts()
            tracemalloc.start(8)
        elif step in (mid, state.max_steps) and tracemalloc.is_tracing():
            gc.collect()
            self.counts[step] = object_counts()
            self.snapshots[step] = tracemalloc.take_snapshot()

    def on_train_end(self, args, state, control, **kwargs):
        if not self.samples or self.samples[-1]["step"] != state.global_step:
            self.sample(state.global_step)


def build_trainer(args, output_dir: str) -> AleaEnvGRPOTrainer:
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(args.seed)
    config = tiny_backbone_config("qwen3", vocab_size=len(tokenizer), hidden_size=64, num_layers=2)
    model = AleaModel.from_backbone(config, backbone_kwargs={"dtype": torch.float32})
    grpo_args = AleaEnvGRPOConfig(
        output_dir=output_dir,
        envs=args.envs,
        max_steps=args.steps,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        disable_tqdm=True,
        per_device_train_batch_size=args.batch_size,
        eps_per_env=args.eps_per_env,
        max_batch=args.max_batch,
        num_generations=4,
        max_len=1024,
        train_mode="full",
        learning_rate=1e-4,
        lr_head=1e-4,
        lr_aux=1e-4,
        lr_scheduler_type="constant",
        logging_steps=100,
        seed=args.seed,
    )
    return AleaEnvGRPOTrainer(model, args=grpo_args, processing_class=tokenizer)


def summarise(samples: list[dict], warmup: int, steps: int) -> dict:
    at_warmup = next(s for s in samples if s["step"] >= warmup)
    after = [s for s in samples if s["step"] >= warmup]
    rss_peak = max(s["rss_kb"] for s in after)
    growth = 100.0 * (rss_peak - at_warmup["rss_kb"]) / at_warmup["rss_kb"]
    # the high-water mark also catches spikes between samples (it is monotone, so compare it with itself)
    hwm_growth = 100.0 * (samples[-1]["hwm_kb"] - at_warmup["hwm_kb"]) / at_warmup["hwm_kb"]
    x = np.array([s["step"] for s in after], dtype=np.float64)
    y = np.array([s["rss_kb"] for s in after], dtype=np.float64)
    slope = float(np.polyfit(x, y, 1)[0] * 1000) if len(after) >= 2 and np.ptp(x) > 0 else 0.0
    return {
        "steps": steps,
        "rss_warmup_mb": round(at_warmup["rss_kb"] / 1024, 2),
        "hwm_warmup_mb": round(at_warmup["hwm_kb"] / 1024, 2),
        "rss_peak_after_warmup_mb": round(rss_peak / 1024, 2),
        "rss_end_mb": round(samples[-1]["rss_kb"] / 1024, 2),
        "growth_pct": round(growth, 3),
        "hwm_end_mb": round(samples[-1]["hwm_kb"] / 1024, 2),
        "hwm_growth_pct": round(hwm_growth, 3),
        "slope_kb_per_1k_steps": round(slope, 1),
        "queue_max": max(s["queue"] for s in samples),
        "pending_max": max(s["pending"] for s in samples),
        "finished_returns_end": samples[-1]["finished"],
        "log_history_end": samples[-1]["log_history"],
    }


def print_table(samples: list[dict], every: int) -> None:
    print(f"{'step':>6}{'time s':>9}{'RSS MB':>9}{'HWM MB':>9}{'queue':>7}{'pending':>9}{'returns':>9}{'logs':>6}")
    last = samples[-1]["step"]
    for s in samples:
        if s["step"] % every == 0 or s["step"] == last:
            print(
                f"{s['step']:>6}{s['time_s']:>9.1f}{s['rss_kb'] / 1024:>9.1f}{s['hwm_kb'] / 1024:>9.1f}"
                f"{s['queue']:>7}{s['pending']:>9}{s['finished']:>9}{s['log_history']:>6}"
            )


def print_growth(sampler: MemorySampler, top: int = 10) -> None:
    """What grew between the two post-warm-up tracemalloc snapshots, and which object types grew in number."""
    steps = sorted(sampler.snapshots)
    if len(steps) == 2:
        first, last = (sampler.snapshots[s] for s in steps)
        print(f"\ntracemalloc: top {top} growth by line, step {steps[0]} -> {steps[1]}")
        for stat in last.compare_to(first, "lineno")[:top]:
            print(f"  {stat}")
        print(f"\ntracemalloc: top {top} by traceback, step {steps[0]} -> {steps[1]}")
        for stat in last.compare_to(first, "traceback")[:top]:
            print(f"  {stat.size_diff / 1024:+.1f} KiB, {stat.count_diff:+d} blocks")
            for line in stat.traceback.format(limit=4):
                print(f"      {line}")
        print(f"\ntracemalloc: top {top} still-allocated since warm-up (step {steps[1]}), by line")
        for stat in last.statistics("lineno")[:top]:
            print(f"  {stat}")
    count_steps = sorted(sampler.counts)
    if len(count_steps) >= 2:
        a, b = sampler.counts[count_steps[0]], sampler.counts[count_steps[-1]]
        diff = sorted(((b[k] - a[k], k) for k in set(a) | set(b)), reverse=True)[:top]
        print(f"\ngc object counts: top {top} growth, step {count_steps[0]} -> {count_steps[-1]}")
        for d, k in diff:
            print(f"  {k:<32}{d:>+9}  (now {b[k]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--quick", action="store_true", help="500 steps, a smoke run")
    parser.add_argument("--envs", default="bandit,nim", help="comma-separated env names")
    parser.add_argument("--sample_every", type=int, default=50)
    parser.add_argument("--table_every", type=int, default=500)
    parser.add_argument("--batch_size", type=int, default=8, help="per_device_train_batch_size (decisions)")
    parser.add_argument("--eps_per_env", type=int, default=8)
    parser.add_argument("--max_batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the model is tiny)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracemalloc", action="store_true", help="diff Python allocations after warm-up (slower)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.table_every = 500, 100
        args.sample_every = min(args.sample_every, 10)
    args.envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    warmup = max(1, args.steps // 10)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="alea_memory_") as output_dir:
        trainer = build_trainer(args, output_dir)
        sampler = MemorySampler(args.sample_every, warmup, trace=args.tracemalloc, live_every=args.table_every)
        sampler.trainer = trainer
        trainer.add_callback(sampler)
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start

    print(
        f"\n{args.steps} steps on {','.join(args.envs)} (batch {args.batch_size}, eps_per_env {args.eps_per_env}, "
        f"max_batch {args.max_batch}, {args.threads} thread(s)), warm-up {warmup} steps, {wall:.0f} s, "
        f"pid {os.getpid()}"
    )
    print_table(sampler.samples, args.table_every)
    if args.tracemalloc:
        print_growth(sampler)
    result = summarise(sampler.samples, warmup, args.steps)
    result["wall_s"] = round(wall, 1)
    result["pass"] = result["growth_pct"] < 10
    print(json.dumps(result))


if __name__ == "__main__":
    main()
