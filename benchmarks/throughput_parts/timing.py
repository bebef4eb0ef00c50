"""Timing of the throughput benchmark: per-category wall time (``Probe``) and one variant's training run in its own
greenlet, paused between measured blocks (``Runner``), fed by a ``TrainerCallback`` (``RunnerCallback``)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import greenlet
import numpy as np
import torch
from transformers import TrainerCallback


class Probe:
    """Accumulates wall time per category; forward hooks on a backbone, wrappers around backward and clipping."""

    def __init__(self):
        self.times: dict[str, float] = defaultdict(float)
        self._fwd_start: float | None = None
        self._opt_start: float | None = None

    def reset(self) -> None:
        self.times = defaultdict(float)

    def attach_backbone(self, module: torch.nn.Module) -> None:
        def pre(mod, args):
            self._fwd_start = time.perf_counter()

        def post(mod, args, output):
            if self._fwd_start is not None:
                key = "fwd_grad" if torch.is_grad_enabled() else "fwd_nograd"
                self.times[key] += time.perf_counter() - self._fwd_start
                self._fwd_start = None

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def wrap(self, obj, name: str, key: str) -> None:
        """Replace ``obj.name`` (a bound method) by a timed version on the instance."""
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.times[key] += time.perf_counter() - t

        setattr(obj, name, timed)

    @contextlib.contextmanager
    def time(self, key: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.times[key] += time.perf_counter() - t

    def opt_begin(self) -> None:
        self._opt_start = time.perf_counter()

    def opt_end(self) -> None:
        if self._opt_start is not None:
            self.times["optimizer"] += time.perf_counter() - self._opt_start
            self._opt_start = None


class Runner:
    """One variant's training, run in its own greenlet and paused between measured blocks.

    ``body(runner)`` builds the model (and trainer) and trains, calling ``runner.step_end()`` after every optimizer
    step and returning once it answers True. The first ``warmup`` steps are dropped; then each call of
    ``run_block()`` (from the main greenlet) lets training continue until ``min_steps`` steps and ``measure_s``
    seconds were measured, and returns that block's measurements. A variant is paused (suspended in ``step_end``)
    while the others run, so each block's window starts when it is resumed.

    Greenlets, not threads: every variant runs in the main OS thread. A second live thread that owns an OpenMP team
    (a paused variant) slows torch's intra-op parallelism in the running thread, which would bias a thread-based
    comparison against whichever variant runs small ops (figures in ``benchmarks/RESULTS.md``).
    """

    def __init__(self, name: str, body, blocks: int, warmup: int, measure_s: float, min_steps: int, decisions: int):
        self.name, self.body, self.blocks_left = name, body, blocks
        self.warmup, self.measure_s, self.min_steps, self.decisions = warmup, measure_s, min_steps, decisions
        self.probe = Probe()
        self.measuring = False
        self.tokens: list[float] = []
        self.extra: dict[str, list[float]] = defaultdict(list)
        self.results: list[dict] = []
        self._steps = 0
        self._error: BaseException | None = None
        self._greenlet = greenlet.greenlet(self._main)

    def _main(self) -> None:
        try:
            self.body(self)
        except BaseException as err:  # handed to the main greenlet
            self._error = err
        finally:
            self.blocks_left = 0

    def run_block(self) -> dict:
        """Resume training for one measured block (main greenlet); returns the block's result."""
        n = len(self.results)
        self._greenlet.switch()
        if self._error is not None:
            raise RuntimeError(f"variant {self.name!r} failed") from self._error
        if len(self.results) == n:
            raise RuntimeError(f"variant {self.name!r} stopped before finishing a measured block")
        return self.results[-1]

    def join(self) -> None:
        while not self._greenlet.dead:  # let a finished variant's train() return
            self._greenlet.switch()

    def _start_block(self) -> None:
        self.probe.reset()
        self.tokens, self.extra = [], defaultdict(list)
        self._block_steps = 0
        self._t0, self._c0 = time.perf_counter(), time.process_time()
        self.measuring = True

    def step_end(self) -> bool:
        """Called by the worker after every optimizer step; True when training should stop."""
        now = time.perf_counter()
        self._steps += 1
        if not self.measuring:
            if self._steps >= self.warmup:
                self._start_block()
            return False
        self._block_steps += 1
        if self._block_steps < self.min_steps or now - self._t0 < self.measure_s:
            return False
        self.measuring = False
        self.results.append(self._result(now - self._t0, time.process_time() - self._c0))
        self.blocks_left -= 1
        if self.blocks_left <= 0:
            return True
        assert torch.is_grad_enabled()  # grad mode is per OS thread: the switch must not leak a no_grad block
        self._greenlet.parent.switch()
        self._start_block()
        return False

    def _result(self, wall: float, cpu: float) -> dict:
        t = self.probe.times
        model = t["fwd_grad"] + t["fwd_nograd"] + t["backward"]
        optim = t["optimizer"] + t["clip"]
        out = {
            "steps": self._block_steps,
            "wall_s": wall,
            "decisions_per_s": self.decisions * self._block_steps / wall,
            "process_cpu_per_wall": cpu / wall,
            "tokens_per_decision": float(np.mean(self.tokens)) if self.tokens else float("nan"),
            "model_time_fraction": model / wall,
            "model_plus_optimizer_fraction": (model + optim) / wall,
            "fractions": {k: v / wall for k, v in sorted(t.items())},
        }
        out["fractions"]["other"] = 1.0 - (model + optim) / wall
        out.update({k: float(np.mean(v)) for k, v in self.extra.items()})
        return out


class RunnerCallback(TrainerCallback):
    """Feeds a Trainer's step ends and optimizer steps to a :class:`Runner`."""

    def __init__(self, runner: Runner):
        self.runner = runner

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.runner.probe.opt_begin()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.runner.probe.opt_end()

    def on_step_end(self, args, state, control, **kwargs):
        if self.runner.step_end():
            control.should_training_stop = True
