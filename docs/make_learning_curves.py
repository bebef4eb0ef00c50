"""Draw docs/learning_curves.png from the figures recorded in benchmarks/RESULTS.md.

    python docs/make_learning_curves.py

1. The figures come from docs/learning_curves.json, copied by hand from RESULTS.md's "Today's results" (its
   ``source`` field names the sections, each part its ``command``). No run is repeated here, and nothing is filled
   in: a point RESULTS.md does not record is not drawn.
2. Three panels: the learning benchmark's recorded evaluation curves, its final score per env and seed, and the
   Gymnasium benchmark's curves. Scores are normalised: 0 is random play, 1 the oracle's.
"""

import json
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


HERE = Path(__file__).resolve().parent
COLORS = {
    "hmm": "tab:blue",
    "kelly": "tab:orange",
    "newsvendor": "tab:green",
    "bandit": "tab:red",
    "nim": "tab:purple",
    "FrozenLake 4x4": "tab:cyan",
    "Blackjack": "tab:brown",
}
SEED_MARKERS = {"0": "o", "1": "s", "2": "^", "3": "D"}


def draw_curves(ax, part: dict, title: str) -> None:
    for seed, envs in part["curves"].items():
        for env, scores in envs.items():
            points = [(s, v) for s, v in zip(part["steps"], scores) if v is not None]
            steps, values = zip(*points)
            ax.plot(steps, values, color=COLORS[env], marker=SEED_MARKERS[seed], markersize=4, linewidth=1.2)
    ax.axhline(0, color="grey", linewidth=0.6)
    ax.axhline(1, color="grey", linewidth=0.6, linestyle="--")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("training step", fontsize=8)
    ax.set_ylabel("normalised score", fontsize=8)
    ax.tick_params(labelsize=7)
    for env in sorted({env for envs in part["curves"].values() for env in envs}, key=list(COLORS).index):
        ax.plot([], [], color=COLORS[env], label=env)
    ax.legend(fontsize=7, loc="lower right")


def draw_finals(ax, part: dict) -> None:
    envs = list(part["final"])
    for i, env in enumerate(envs):
        for j, value in enumerate(part["final"][env]):
            ax.plot(i + (j - 1.5) * 0.12, value, color=COLORS[env], marker=SEED_MARKERS[str(j)], markersize=5)
        if env in part["best_state_blind"]:
            ax.hlines(part["best_state_blind"][env], i - 0.3, i + 0.3, color="black", linewidth=1)
    ax.axhline(1, color="grey", linewidth=0.6, linestyle="--")
    ax.set_xticks(range(len(envs)), envs, fontsize=7)
    ax.set_ylim(-0.1, 1.1)
    ax.set_title("learning.py: final score, seeds 0-3\n(black bar: best state-blind policy)", fontsize=9)
    ax.tick_params(labelsize=7)
    for seed, marker in SEED_MARKERS.items():
        ax.plot([], [], color="grey", marker=marker, linestyle="none", label=f"seed {seed}")
    ax.legend(fontsize=7, loc="lower left")


def main() -> None:
    data = json.loads((HERE / "learning_curves.json").read_text())
    fig = Figure(figsize=(12, 3.8), dpi=90)
    FigureCanvasAgg(fig)
    left, middle, right = fig.subplots(1, 3)
    draw_curves(
        left,
        data["learning"],
        "learning.py: the curves recorded (hmm: seed 2 only;\nbandit seed 1: last two; kelly, newsvendor: none)",
    )
    draw_finals(middle, data["learning"])
    draw_curves(right, data["learning_gym"], "learning_gym.py: curves, seeds 0-3")
    fig.suptitle(
        "Normalised score (0 random play, 1 oracle) as recorded in benchmarks/RESULTS.md; markers: seed", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(HERE / "learning_curves.png")


if __name__ == "__main__":
    main()
