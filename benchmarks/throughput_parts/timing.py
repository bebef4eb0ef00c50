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

from .flops import Work
from .machine import LoadMeter


class Probe:
    """Accumulates wall time per category (forward hooks on modules, wrappers around methods) and the padded tokens
    of the backbone's forwards."""

    def __init__(self):
        self.times: dict[str, float] = defaultdict(float)
        self.padded: dict[str, float] = defaultdict(float)
        self._start: dict[str, float] = {}
        self._opt_start: float | None = None

    def reset(self) -> None:
        self.times = defaultdict(float)
        self.padded = defaultdict(float)

    def attach(self, module: torch.nn.Module, key: str) -> None:
        """Time ``module``'s forwards as ``<key>_grad`` / ``<key>_nograd`` (by autograd mode)."""

        def pre(mod, args):
            self._start[key] = time.perf_counter()

        def post(mod, args, output):
            start = self._start.pop(key, None)
            if start is not None:
                mode = "grad" if torch.is_grad_enabled() else "nograd"
                self.times[f"{key}_{mode}"] += time.perf_counter() - start

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def attach_backbone(self, module: torch.nn.Module) -> None:
        """Time the decoder's forwards (``fwd_grad`` / ``fwd_nograd``) and count their padded tokens."""
        self.attach(module, "fwd")

        def count(mod, args, kwargs):
            x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
            if x is None and args:
                x = args[0]
            if x is not None:
                self.padded["grad" if torch.is_grad_enabled() else "nograd"] += float(x.shape[0] * x.shape[1])

        module.register_forward_pre_hook(count, with_kwargs=True)

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
    step and returning once it answers True; during a step it reports the decisions it answered
    (``runner.count(distinct, replays)``) and its work (``runner.work``). The first ``warmup`` steps are dropped;
    then each call of ``run_block()`` (from the main greenlet) lets training continue until ``min_steps`` steps and
    ``measure_s`` seconds were measured, and returns that block's measurements. A variant is paused (suspended in
    ``step_end``) while the others run, so each block's window starts when it is resumed.

    Greenlets, not threads: every variant runs in the main OS thread. A second live thread that owns an OpenMP team
    (a paused variant) slows torch's intra-op parallelism in the running thread, which would bias a thread-based
    comparison against whichever variant runs small ops (figures in ``benchmarks/RESULTS.md``).
    """

    def __init__(self, name: str, body, blocks: int, warmup: int, measure_s: float, min_steps: int):
        self.name, self.body, self.blocks_left = name, body, blocks
        self.warmup, self.measure_s, self.min_steps = warmup, measure_s, min_steps
        self.probe = Probe()
        self.measuring = False
        self.work = Work()
        self.extra: dict[str, list[float]] = defaultdict(list)
        self.results: list[dict] = []
        self.load = LoadMeter()
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

    def count(self, distinct: int, replays: int = 0) -> None:
        """Rows the loss of this step answers: ``distinct`` env decisions forwarded for the first time, ``replays``
        forwarded again (outcome decisions replayed when their episode ended)."""
        self.work.add("distinct", distinct)
        self.work.add("replays", replays)

    def deferred(self, n: int) -> None:
        """``n`` of this step's fresh decisions wait for their episode's end and will be replayed once."""
        self.work.add("deferred", n)

    def _start_block(self) -> None:
        self.probe.reset()
        self.work, self.extra = Work(), defaultdict(list)
        self._block_steps = 0
        self.load.start()
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
        sums = dict(self.work.sums)
        counts = {key: sums.pop(key, 0.0) for key in ("distinct", "replays", "deferred")}
        rows = counts["distinct"] + counts["replays"]
        if rows <= 0:
            raise RuntimeError(f"variant {self.name!r}: a measured block answered no decision")
        padded = self.probe.padded
        out = {
            "steps": self._block_steps,
            "wall_s": wall,
            **counts,
            "rows_per_s": rows / wall,
            "counted_decisions_per_s": counts["distinct"] / wall,
            "process_cpu_per_wall": cpu / wall,
            "others_busy_cores": self.load.others_busy_cores(),
            "tokens_per_row": self.work.tokens() / rows,
            "padded_tokens_per_row": (padded["grad"] + padded["nograd"]) / rows,
            # the padding share of the forwards with autograd (the loss forwards)
            "loss_padding_fraction": 1.0 - sums.get("tokens_grad_all", 0.0) / max(padded["grad"], 1.0),
            "work_per_row": {k: v / rows for k, v in sorted(sums.items())},
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
