"""The machine's load: how many cores other processes keep busy, before and during a measurement.

A core that another process holds changes wall-clock ratios by a large factor (one busy core of two moved the TRL
ratio tenfold in an earlier run), so the benchmark measures the load before it starts and during every block. Busy
cores of others = the whole machine's busy CPU time (``psutil.cpu_times``: all but idle and iowait) minus this
process's own CPU time (all its threads), over the wall time.
"""

from __future__ import annotations

import os
import time

import psutil


BUSY_CORES = 0.5
"""Other processes using at least this many cores on average count as holding a core."""


class LoadMeter:
    """CPU time of the machine and of this process since the last ``start()``."""

    def __init__(self):
        self.process = psutil.Process()
        self.start()

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def _own(self) -> float:
        t = self.process.cpu_times()
        return t.user + t.system

    def start(self) -> None:
        self._t0, self._busy0, self._own0 = time.perf_counter(), self._busy(), self._own()

    def others_busy_cores(self) -> float:
        """Cores other processes used on average since ``start()``."""
        wall = time.perf_counter() - self._t0
        if wall <= 0:
            return 0.0
        return max(0.0, ((self._busy() - self._busy0) - (self._own() - self._own0)) / wall)


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``)."""
    return [round(x, 2) for x in os.getloadavg()]


def check_quiet(seconds: float, allow_busy: bool) -> dict:
    """Measure other processes' load for ``seconds`` while this one idles; warn loudly when they hold a core, and
    stop the run unless ``allow_busy``. Returns the figures for the JSON line."""
    meter = LoadMeter()
    time.sleep(seconds)
    others = meter.others_busy_cores()
    out = {"cpus": psutil.cpu_count(), "loadavg_before": loadavg(), "others_busy_cores_before": round(others, 2)}
    if others >= BUSY_CORES:
        warn(
            f"other processes keep {others:.2f} cores busy (load average {out['loadavg_before']}) on a "
            f"{out['cpus']}-core machine: wall-clock ratios measured now are not comparable"
        )
        if not allow_busy:
            raise SystemExit("refusing to measure on a busy machine; --allow_busy measures anyway (and says so)")
    return out


def warn(message: str) -> None:
    bar = "!" * 100
    print(f"\n{bar}\nWARNING: {message}\n{bar}\n", flush=True)
