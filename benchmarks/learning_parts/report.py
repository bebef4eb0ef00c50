"""The output of ``benchmarks/learning.py``: curves averaged over seeds with init / final / best (``summarise``), the
table, the PNG of the curves, and the JSON line (``report``)."""

from __future__ import annotations

import json
import math
import os

import numpy as np

from .references import (
    DENSE,
    ENVS,
    SCORE_KEY,
    SMALL,
    best_constant,
    hmm_next_regime_skill,
    hmm_reference_policies,
)


def summarise(runs: list[list[tuple[int, dict[str, float], float]]]) -> dict:
    """Curves averaged over seeds, init / final (mean of the last two evaluations) / best, and the targets."""
    steps = [p[0] for p in runs[0]]
    curves = {env: [float(np.mean([run[i][1][env] for run in runs])) for i in range(len(steps))] for env in ENVS}
    init = {env: curves[env][0] for env in ENVS}
    final = {env: float(np.mean(curves[env][-2:])) if len(steps) > 2 else curves[env][-1] for env in ENVS}
    best = {env: max(curves[env][1:] or curves[env]) for env in ENVS}
    improved = {env: final[env] > init[env] for env in ENVS}
    return {
        "steps": steps[-1],
        "eval_steps": steps,
        "init": init,
        "final": final,
        "best": best,
        "improved": improved,
        "dense_reach_0.5": all(final[env] >= 0.5 for env in DENSE if env in ENVS),
        "curves": curves,
    }


def print_table(summary: dict) -> None:
    steps = summary["eval_steps"]
    header = f"{'env':<12}" + "".join(f"{s:>8}" for s in steps)
    header += f"{'final':>8}{'best':>8}{'improved':>10}{'const':>8}"
    print(
        "\nnormalised score (policy - random) / (oracle - random), greedy, by optimizer step; dense envs (*) from the "
        "exact expected rewards of the actions taken (expected_score), outcome envs from realised returns"
    )
    print(header)
    print("-" * len(header))
    for env in ENVS:
        row = f"{env + ('*' if env in DENSE else ''):<12}" + "".join(f"{v:>8.3f}" for v in summary["curves"][env])
        row += f"{summary['final'][env]:>8.3f}{summary['best'][env]:>8.3f}{str(summary['improved'][env]):>10}"
        row += f"{summary['best_constant'][env]:>8.3f}"
        print(row)
    print(
        "* dense env (target >= 0.5); final = mean of the last two evaluations; const = best state-blind policy "
        "('always option i') on the same episodes"
    )


def plot(summary: dict, runs: list, path: str, title: str) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = summary["eval_steps"]
    colors = dict(zip(ENVS, ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]))
    for env in ENVS:
        marker = "o" if env in DENSE else "s"
        label = f"{env} ({'dense' if env in DENSE else 'outcome'})"
        ax.plot(steps, summary["curves"][env], "-", marker=marker, ms=5, lw=1.8, color=colors[env], label=label)
        if len(runs) > 1:
            for run in runs:
                ax.plot(steps, [p[1][env] for p in run], "-", color=colors[env], alpha=0.25, lw=0.8)
    if "best_constant" in summary:  # the best state-blind policy: a tick per env just right of the last step
        x = steps[-1] + 0.03 * (steps[-1] - steps[0] or 1)
        for env in ENVS:
            ax.plot([x], [summary["best_constant"][env]], marker=4, ms=9, color=colors[env], ls="none")
        ax.plot([], [], marker=4, ms=9, color="gray", ls="none", label="best state-blind policy")
    ax.axhline(0.0, color="dimgray", ls="--", lw=1.2, zorder=0)
    ax.axhline(1.0, color="black", ls="--", lw=1.2, zorder=0)
    ax.axhline(0.5, color="gray", ls=":", lw=1.0, zorder=0)
    edge = ax.get_yaxis_transform()  # x in axes units, y in data units: labels just right of the plot
    for y, text, color in ((0.0, "random", "dimgray"), (1.0, "oracle", "black"), (0.5, "dense\ntarget", "gray")):
        ax.text(1.01, y, text, transform=edge, va="center", ha="left", color=color, fontsize=8)
    lo = min(min(v) for v in summary["curves"].values())
    ax.set_ylim(min(-0.25, math.floor(lo * 4) / 4), 1.1)
    ax.set_xticks(steps)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("normalised score  (policy - random) / (oracle - random)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", fontsize=8, ncols=3, frameon=False)
    fig.savefig(path, dpi=120)
    return path


def report(args, seeds, runs, realised, skills, baselines, wall, n_processes) -> None:
    """The table, the PNG and the JSON line of the runs (one per seed)."""
    n_out = args.eval_episodes_outcome or args.eval_episodes
    runs = [run[: min(len(r) for r in runs)] for run in runs]  # a run stopped by the time budget is shorter
    summary = summarise(runs)
    summary["best_constant"] = best_constant(args.episodes, baselines, args.env_kwargs)
    print_table(summary)
    hmm_ref = hmm_reference_policies(args.episodes["hmm"], args.env_kwargs) if "hmm" in ENVS else {}
    hmm_skill = hmm_next_regime_skill(args.episodes["hmm"], args.env_kwargs) if "hmm" in ENVS else {}
    if hmm_ref:
        print("hmm hand-written policies on the same episodes:", ", ".join(f"{k} {v:.3f}" for k, v in hmm_ref.items()))
        print("hmm next_regime forecast skill:", ", ".join(f"{k} {v:.3f}" for k, v in hmm_skill.items()))
    n_points = len(summary["eval_steps"])
    report_skill = {  # seed mean per evaluation point: does the backbone read the state the reports ask about?
        env: {q: [float(np.mean([s[i][env][q] for s in skills])) for i in range(n_points)] for q in skills[0][0][env]}
        for env in ENVS
    }
    print(
        "report skill 1 - loss / no-skill loss (init -> final evaluation; the oracle's own skill is below 1):",
        "; ".join(
            f"{e} " + ", ".join(f"{q} {v[0]:+.2f}->{v[-1]:+.2f}" for q, v in report_skill[e].items()) for e in ENVS
        ),
    )
    print(
        "env instances (training and evaluation):",
        ", ".join(f"{e} {kw}" for e, kw in args.env_kwargs.items()) or "-",
        "(others: library defaults)",
    )

    instances = "small (SMALL)" if args.env_kwargs == SMALL else "custom" if args.env_kwargs else "library defaults"
    title = (
        f"tiny Qwen3 ({args.layers}x{args.hidden}, random init), GRPO on CPU: {summary['steps']} steps, lr {args.lr:g}, "
        f"{args.batch_size * n_processes} decisions/step\ngreedy eval on {args.eval_episodes} paired episodes per env "
        f"(outcome envs {n_out}), seeds {','.join(map(str, seeds))}; env instances: {instances}"
    )
    png = plot(summary, runs, os.path.join(args.out, "learning_curves.png"), title)
    eval_s = sum(p[2] for run in runs for p in run)
    print(f"\nwall {wall:.0f}s (evaluation {eval_s:.0f}s); curves: {png}")
    result = {
        "steps": summary["steps"],
        "init": summary["init"],
        "final": summary["final"],
        "best": summary["best"],
        "improved": summary["improved"],
        "dense_reach_0.5": summary["dense_reach_0.5"],
        "curves": {"step": summary["eval_steps"], **summary["curves"]},
        # time to score: seconds since training began at each evaluation point (seed mean), beside the steps
        "curves_seconds": [float(np.mean([run[i][3] for run in runs])) for i in range(len(summary["eval_steps"]))],
        "fitted_schedule": getattr(args, "fitted", None),
        "png": png,
        "best_constant": summary["best_constant"],
        "hmm_reference": hmm_ref,
        "hmm_next_regime_skill": hmm_skill,
        "eval": "greedy",
        "score": SCORE_KEY,
        "curves_realised": {  # normalized_score of the realised returns (the dense envs' noisy figure), seed mean
            env: [float(np.mean([r[i][env] for r in realised])) for i in range(len(summary["eval_steps"]))]
            for env in ENVS
        },
        "report_skill": report_skill,
        "eval_episodes": args.episodes,
        "seeds": seeds,
        "env_kwargs": args.env_kwargs,
        "wall_s": round(wall, 1),
        "processes": n_processes,
        "hparams": {k: getattr(args, k) for k in args.hparam_names},
    }
    with open(os.path.join(args.out, "learning.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))
