"""The learning benchmark's schedule in seconds: warm-up, peak, a decay that ends with the budget, evaluations spaced
in time, and one clock for every process."""

import math
import sys
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from learning_parts import time_schedule  # noqa: E402
from learning_parts.time_schedule import TimeSchedule  # noqa: E402


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class OneProcess:
    @staticmethod
    def reduce(tensor, reduction):
        return tensor


class SkewedProcesses:
    """A process whose own figures (clock, evaluation time) are ``skew`` below its mate's: both read the mean."""

    def __init__(self, skew):
        self.skew = skew

    def reduce(self, tensor, reduction):
        assert reduction == "mean"
        return tensor + self.skew / 2


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time_schedule.time, "perf_counter", clock)
    return clock


def run(schedule, clock, step_s, accelerator=None):
    """Steps of ``step_s`` seconds until the schedule stops: the factors, the evaluation steps and the stop step."""
    accelerator = accelerator or OneProcess()
    factors, evaluations, step = [], [], 0
    while True:
        step += 1
        factors.append(schedule.factor(step))
        clock.now += step_s(step)
        evaluate, stop = schedule.tick(accelerator)
        if evaluate:
            evaluations.append((step, round(clock.now)))
        if stop:
            return factors, evaluations, step


def test_the_rate_warms_up_holds_then_decays_to_zero_at_the_end_of_the_budget(clock):
    schedule = TimeSchedule(budget_s=840, warmup=10, decay_share=0.2, evals=6, margin_s=10)
    clock.now = 15.0  # the initial evaluation
    schedule.set_end(15.0, OneProcess())
    assert schedule.end == 840 - 15 - 10
    factors, evaluations, last = run(schedule, clock, lambda step: 1.0)
    assert factors[:10] == pytest.approx([s / 10 for s in range(1, 11)])
    peak_until = int(0.8 * schedule.end) - 15  # steps of one second after the initial evaluation
    assert all(f == 1.0 for f in factors[10 : peak_until - 1])
    decay = factors[peak_until + 1 :]
    assert all(a >= b for a, b in zip(decay, decay[1:])) and decay[-1] < 1e-3
    assert clock.now == pytest.approx(schedule.end, abs=1.0)  # it stops when the training time is spent
    # six evaluations, evenly spaced in seconds, the last where it stops
    assert [t for _, t in evaluations] == [math.ceil(k * schedule.end / 6) for k in range(1, 7)]
    assert evaluations[-1][0] == last


def test_steps_that_speed_up_still_end_on_time(clock):
    """Steps that get 3x faster over the run: a step count fitted from the first steps would end far too early."""
    schedule = TimeSchedule(budget_s=600, warmup=5, decay_share=0.25, evals=4)
    schedule.set_end(0.0, OneProcess())
    factors, evaluations, last = run(schedule, clock, lambda step: max(0.5, 1.5 - step / 400))
    assert clock.now == pytest.approx(schedule.end, abs=1.5)
    assert len(evaluations) == 4 and last > schedule.end / 1.5
    assert max(factors) == 1.0 and factors[-1] < 0.01  # its decay ended with it


def test_processes_whose_clocks_differ_read_the_same_factor(clock):
    """Under DDP every process must apply the same rate: the factor is read off the reduced (mean) clock."""
    a, b = (TimeSchedule(budget_s=100, warmup=0, decay_share=0.5, evals=2, margin_s=0) for _ in range(2))
    a.set_end(9.0, SkewedProcesses(skew=+2.0))  # each timed its own initial evaluation: 9 s here, 11 s there
    b.set_end(11.0, SkewedProcesses(skew=-2.0))
    assert a.end == b.end == 90.0
    clock.now = 70.0
    a.tick(SkewedProcesses(skew=+4.0))  # this process's clock is 4 s behind its mate's
    clock.now = 74.0
    b.tick(SkewedProcesses(skew=-4.0))
    assert a.elapsed == b.elapsed == 72.0 and a.factor(50) == b.factor(50) < 1.0


def test_a_budget_that_one_evaluation_fills_is_refused(clock):
    schedule = TimeSchedule(budget_s=30, warmup=1, decay_share=0.2, evals=6)
    clock.now = 15.0
    with pytest.raises(SystemExit, match="budget_s 30"):
        schedule.set_end(15.0, OneProcess())
    with pytest.raises(ValueError, match="decay_share"):
        TimeSchedule(budget_s=30, warmup=1, decay_share=1.5, evals=6)
