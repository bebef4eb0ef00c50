"""Time to score: the learning benchmark's curves against seconds, several runs side by side, one panel per env.

What it reads: the JSON files ``benchmarks/learning.py`` writes (``<out>/learning.json``), each with its curves by
optimizer step (``curves``) and the seconds since training began at each evaluation point (``curves_seconds``, the
seed mean). Every run is drawn against seconds, so a run of 1500 steps and a run fitted to a 15-minute budget can be
compared at equal time, which is what a user of a 2-core machine pays. For each env and run the table gives the
seconds from which the curve stays at or above the env's target (dense envs 0.9, outcome envs 0.6) at every later
evaluation ("-" if its last point is below: a curve that touches the target and falls back has not reached it), and the
final score (the mean of the last two evaluations, as ``learning.py``'s).

    python benchmarks/time_to_score.py "1500 steps=runs/long/learning.json" "15 minutes=runs/budget/learning.json" \\
        --out runs/time_to_score.png

Prints the table and, last, one JSON line. Figures of past runs: ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from learning_parts.references import DENSE, ENVS


TARGETS = {env: 0.9 if env in DENSE else 0.6 for env in ENVS}


def load_run(spec: str) -> tuple[str, dict]:
    """``"label=path"`` (or a bare path, labelled by itself) as ``(label, learning.json's content)``."""
    label, _, path = spec.rpartition("=")
    with open(path or spec) as f:
        run = json.load(f)
    if "curves_seconds" not in run:
        raise ValueError(
            f"time_to_score: run {spec!r}: field 'curves_seconds' is missing (a learning.json of an older "
            "benchmark, which did not log seconds)"
        )
    return label or path, run


def holds_from(seconds: list[float], scores: list[float], target: float) -> float | None:
    """The seconds of the first evaluation point from which every point is at or above ``target`` (``None`` when the
    last one is below)."""
    held = None
    for second, score in zip(seconds, scores):
        held = (held if held is not None else second) if score >= target else None
    return held


def summarise(runs: dict[str, dict]) -> dict:
    """Per run and env: the seconds to the target, the final score, the score at the last point and its seconds."""
    out = {}
    for label, run in runs.items():
        seconds = run["curves_seconds"]
        out[label] = {
            env: {
                "seconds_to_target": holds_from(seconds, run["curves"][env], TARGETS[env]),
                "final": float(np.mean(run["curves"][env][-2:])),
                "seconds": seconds[-1],
                "steps": run["curves"]["step"][-1],
            }
            for env in ENVS
            if env in run["curves"]
        }
    return out


def print_table(summary: dict) -> None:
    print("seconds of training from which the target holds (dense 0.9, outcome 0.6) / final score, by run")
    header = f"{'env':<12}" + "".join(f"{label[:24]:>28}" for label in summary)
    print(header)
    print("-" * len(header))
    for env in ENVS:
        row = f"{env:<12}"
        for figures in summary.values():
            if env not in figures:
                row += f"{'':>28}"
                continue
            f = figures[env]
            reach = "-" if f["seconds_to_target"] is None else f"{f['seconds_to_target']:.0f} s"
            row += f"{reach + ' / ' + format(f['final'], '.3f'):>28}"
        print(row)
    ends = (
        f"{label} {next(iter(figures.values()))['seconds']:.0f} s" for label, figures in summary.items() if figures
    )
    print("last evaluation at: " + ", ".join(ends))


def plot(runs: dict[str, dict], path: str) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    envs = [env for env in ENVS if any(env in run["curves"] for run in runs.values())]
    fig = Figure(figsize=(3.2 * len(envs), 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(envs), sharey=True, squeeze=False)[0]
    for ax, env in zip(axes, envs):
        for label, run in runs.items():
            if env in run["curves"]:
                minutes = np.asarray(run["curves_seconds"]) / 60
                ax.plot(minutes, run["curves"][env], "-o", ms=3, lw=1.5, label=label)
        ax.axhline(TARGETS[env], color="gray", ls=":", lw=1.0)
        ax.axhline(0.0, color="dimgray", ls="--", lw=0.8)
        ax.set_title(f"{env} ({'dense' if env in DENSE else 'outcome'})", fontsize=9)
        ax.set_xlabel("minutes of training")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("normalised score")
    fig.legend(
        *axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(runs), frameon=False, fontsize=8
    )
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help='"label=path/to/learning.json", one per run')
    parser.add_argument("--out", default="runs/time_to_score.png", help="the PNG")
    args = parser.parse_args()
    runs = dict(load_run(spec) for spec in args.runs)
    summary = summarise(runs)
    print_table(summary)
    png = plot(runs, args.out)
    print(f"plot: {png}")
    print(json.dumps({"targets": TARGETS, "runs": summary, "png": png}))


if __name__ == "__main__":
    main()
