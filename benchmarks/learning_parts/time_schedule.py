"""A learning-rate schedule in seconds: how the learning benchmark's default run fits its time budget.

A run's steps do not take a fixed time. Branch continuations are most of a step's cost, and they shrink as the policy
sharpens (copies that take the same actions stand in the same position and share a forward), so a step count fitted
from a timing run of the first steps ends minutes before its budget. Here the schedule is a function of the seconds
the run has spent: a linear warm-up over the first ``warmup`` steps, the peak rate until ``1 - decay_share`` of the
training time, then a cosine decay that reaches 0 when the training time ends, with the evaluations at evenly spaced
seconds and the last one at the end. The training time is the budget less the first evaluation's duration (the last
evaluation runs after it) and a margin for the report. Every process reads the same clock (the mean of the
processes' seconds at the end of each step), so they apply the same rate and stop at the same step.

transformers' schedulers are functions of the step, so this one is a ``LambdaLR`` whose factor reads that clock,
set through :meth:`~transformers.Trainer.create_scheduler` (see ``TimeScheduledTrainer`` in ``learning.py``).
"""

from __future__ import annotations

import math
import time

import torch


class TimeSchedule:
    """The learning-rate factor and the evaluation and stopping times of a run with a budget in seconds.

    Args:
        budget_s (`float`): seconds for the whole run, from this object's creation to its last evaluation.
        warmup (`int`): steps of linear warm-up.
        decay_share (`float`): the share of the training time, at its end, over which the rate decays to 0.
        evals (`int`): evaluations after the initial one; the last is at the end of the training time.
        margin_s (`float`, defaults to `10.0`): seconds kept for what follows the last evaluation (the report).
    """

    def __init__(self, budget_s: float, warmup: int, decay_share: float, evals: int, margin_s: float = 10.0):
        if not 0.0 <= decay_share <= 1.0:
            raise ValueError(f"learning benchmark: field 'decay_share' must be in [0, 1], got {decay_share}")
        self.budget_s, self.warmup, self.decay_share, self.evals = budget_s, warmup, decay_share, evals
        self.margin_s = margin_s
        self.start = time.perf_counter()
        self.elapsed = 0.0  # seconds since start at the end of the last step (mean over the processes)
        self.end: float | None = None  # seconds at which training ends, set once the first evaluation is timed
        self.evaluated = 0  # evaluations after the initial one so far

    def set_end(self, eval_s: float, accelerator) -> None:
        """Fix the end of the training time, once the initial evaluation took ``eval_s`` seconds on this process:
        every process gets the same end (from the mean of their evaluation times and clocks)."""
        here = torch.tensor([eval_s, self.elapsed_now()], dtype=torch.float64)
        eval_s, elapsed = accelerator.reduce(here, reduction="mean").tolist()
        self.end = self.budget_s - eval_s - self.margin_s
        if self.end <= elapsed:
            raise SystemExit(
                f"--budget_s {self.budget_s:.0f}: an evaluation takes {eval_s:.0f} s and {elapsed:.0f} s are spent "
                "already; give a larger budget"
            )

    def elapsed_now(self) -> float:
        return time.perf_counter() - self.start

    def factor(self, step: int) -> float:
        """The learning rate's multiple at ``step`` (the ``lr_lambda`` of a ``LambdaLR``)."""
        warm = min(1.0, step / self.warmup) if self.warmup > 0 else 1.0
        if self.end is None or self.decay_share == 0.0:
            return warm if self.end is None or self.elapsed < self.end else 0.0
        into_decay = (self.elapsed / self.end - (1.0 - self.decay_share)) / self.decay_share
        if into_decay <= 0.0:
            return warm
        return warm * 0.5 * (1.0 + math.cos(math.pi * min(1.0, into_decay)))

    def tick(self, accelerator) -> tuple[bool, bool]:
        """At the end of a step: read the shared clock; return whether to evaluate now and whether to stop."""
        here = torch.tensor([self.elapsed_now()], dtype=torch.float64)
        self.elapsed = float(accelerator.reduce(here, reduction="mean"))
        if self.end is None:
            return False, False
        stop = self.elapsed >= self.end
        reached = self.evals if stop else int(self.elapsed * self.evals / self.end)  # evaluation times passed
        due, self.evaluated = reached > self.evaluated, max(self.evaluated, reached)
        return due or stop, stop

    def summary(self) -> dict:
        """What the JSON records of the schedule."""
        return {
            "budget_s": self.budget_s,
            "training_end_s": round(self.end, 1) if self.end is not None else None,
            "decay_share": self.decay_share,
            "warmup": self.warmup,
            "evals": self.evals,
        }
