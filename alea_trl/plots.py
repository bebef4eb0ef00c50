"""Figures of an evaluation: a reliability diagram of the noul forecasts and per-env score bars.

Design decisions:
1. matplotlib is imported inside the plotting functions, so ``import alea_trl`` stays light; figures are built with
   the object API on an Agg canvas (no pyplot: no global backend switch, renders headless, nothing left open), and
   every function writes a PNG and returns its path.
2. Noul targets are exact oracle probabilities, not 0/1 outcomes, so a bin's "observed frequency" is the mean target
   of its forecasts and the Brier score is ``mean((p_yes - target) ** 2)``, the same loss ``evaluate_policy`` reports.
3. Reliability bins are equal-width on [0, 1] (``p == 1`` falls in the last bin); empty bins stay in the arrays, as
   NaN means with count 0, so bin ``i`` is always ``[i / n_bins, (i + 1) / n_bins)``.
4. Scores and skills can be far below 0 (an untrained model on a sharp target): bars are clipped to a fixed display
   range, hatched, and labelled with their true value, so one bad env does not flatten the others.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict

import numpy as np


QTYPE_ORDER = ("choice", "score", "noul", "regress")
DPI = 120  # figures are exactly figsize * DPI pixels (constrained layout, no tight bbox)


def reliability_bins(p, y, n_bins: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bin forecasts by their value and compare each bin's mean forecast with its mean target.

    Args:
        p (`array-like` of shape `(N,)`): forecast probabilities in [0, 1].
        y (`array-like` of shape `(N,)`): targets in [0, 1] (oracle probabilities, or 0/1 outcomes).
        n_bins (`int`, defaults to 10): equal-width bins on [0, 1]; bin ``i`` holds ``i / n_bins <= p < (i + 1) /
            n_bins``, and ``p == 1`` falls in the last bin.

    Returns:
        `tuple[np.ndarray, np.ndarray, np.ndarray]`: ``(mean_p, mean_y, count)``, each of shape `(n_bins,)`. Empty
        bins have count 0 and NaN means.
    """
    p, y = np.asarray(p, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if p.shape != y.shape:
        raise ValueError(f"reliability_bins: p has {p.size} values but y has {y.size}; pass one target per forecast")
    if p.size and (p.min() < 0 or p.max() > 1 or np.isnan(p).any()):
        raise ValueError("reliability_bins: forecasts must lie in [0, 1]")
    idx = np.clip(np.floor(p * n_bins).astype(int), 0, n_bins - 1)  # (N,)
    count = np.bincount(idx, minlength=n_bins)  # (n_bins,)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.bincount(idx, weights=p, minlength=n_bins) / count
        mean_y = np.bincount(idx, weights=y, minlength=n_bins) / count
    return mean_p, mean_y, count


def _figure(**kwargs):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path) -> str:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def reliability_diagram(forecasts, path, n_bins: int = 10, title: str | None = None) -> str:
    """Write a reliability diagram of noul forecasts as a PNG: one line per env, with a histogram strip below.

    Args:
        forecasts (`list[tuple[str, str, float, float]]`): ``(env, qid, p_yes, target)`` tuples, as collected by
            ``evaluate_policy(..., forecasts=...)``.
        path (`str` or `os.PathLike`): where to write the PNG (parent folders are created).
        n_bins (`int`, defaults to 10): equal-width bins on [0, 1] (see [`reliability_bins`]).
        title (`str`, *optional*): first part of the title; the overall Brier score is appended.

    Returns:
        `str`: the path written.
    """
    by_env: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for env, _, p_yes, target in forecasts:
        by_env[env].append((p_yes, target))
    p_all = np.array([f[2] for f in forecasts], dtype=float)
    y_all = np.array([f[3] for f in forecasts], dtype=float)

    fig = _figure(figsize=(6.4, 7.0), layout="constrained")
    ax, hist = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [4, 1]})
    fig.get_layout_engine().set(hspace=0.0)
    ax.plot([0, 1], [0, 1], ls="--", color="0.6", lw=1, label="perfect calibration")
    counts = [reliability_bins(*np.array(v).T, n_bins=n_bins)[2].max() for v in by_env.values()]
    max_count = max(counts, default=1)
    edges = np.linspace(0, 1, n_bins + 1)
    for i, (env, pairs) in enumerate(by_env.items()):
        p, y = np.array(pairs).T
        mean_p, mean_y, count = reliability_bins(p, y, n_bins)
        keep, color = count > 0, f"C{i % 10}"
        brier = float(np.mean((p - y) ** 2))
        ax.plot(mean_p[keep], mean_y[keep], color=color, lw=1.5, label=f"{env} (n={len(p)}, Brier {brier:.4f})")
        ax.scatter(
            mean_p[keep],
            mean_y[keep],
            s=15 + 185 * count[keep] / max_count,
            color=color,
            alpha=0.8,
            zorder=3,
            edgecolor="white",
            linewidth=0.5,
        )
    if by_env:
        colors = [f"C{i % 10}" for i in range(len(by_env))]
        hist.hist([np.array(v)[:, 0] for v in by_env.values()], bins=edges, stacked=True, color=colors)
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="oracle probability")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9, title="marker area ~ bin count", title_fontsize=8)
    hist.set(xlabel="forecast p_yes", ylabel="count")
    hist.grid(alpha=0.3)
    if p_all.size:
        brier, flat = float(np.mean((p_all - y_all) ** 2)), float(np.mean((0.5 - y_all) ** 2))
        summary = f"Brier {brier:.4f} (always 1/2: {flat:.4f}), n={p_all.size}"
    else:
        summary = "no noul forecasts"
    ax.set_title(f"{title or 'Reliability of noul forecasts'}\n{summary}", fontsize=11)
    return _save(fig, path)


def _clipped_bars(ax, x, values, width, lo, hi, label_all=False, **kwargs) -> None:
    """Bars of ``values`` at ``x`` clipped to ``[lo, hi]``; clipped bars are hatched and labelled with their value
    (every bar is labelled when ``label_all``)."""
    values = np.asarray(values, dtype=float)
    bars = ax.bar(x, np.clip(values, lo, hi), width, **kwargs)
    for bar, value in zip(bars, values):
        cut = value < lo or value > hi
        if cut:
            bar.set_hatch("//")
        if cut or label_all:
            up = value >= 0
            end = min(max(value, lo), hi)
            ax.annotate(
                f"{value:.3g}" if cut else f"{value:.2f}",
                (bar.get_x() + bar.get_width() / 2, end),
                xytext=(0, 2 if up else -2),
                textcoords="offset points",
                ha="center",
                va="bottom" if up else "top",
                fontsize=7 if cut else 8,
            )


def env_scores_bar(table: dict[str, dict[str, float]], path, title: str | None = None) -> str:
    """Write per-env score bars as a PNG: the normalised score of the policy (top) and the skill of every report
    qtype (bottom).

    Args:
        table (`dict[str, dict[str, float]]`): the output of ``evaluate_policy``: per env ``return``, ``random``,
            ``oracle``, ``normalized_score`` and ``skill/<qtype>``; missing or NaN entries are skipped.
        path (`str` or `os.PathLike`): where to write the PNG (parent folders are created).
        title (`str`, *optional*): the figure title.

    Returns:
        `str`: the path written. Scores are shown clipped to [-1.5, 1.5] and skills to [-1, 1]; clipped bars are
        hatched and labelled with their value.
    """
    from matplotlib.patches import Patch

    envs = list(table)
    x = np.arange(len(envs))
    fig = _figure(figsize=(max(6.4, 1.4 * len(envs) + 2.5), 7.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)

    def get(env, key):
        value = table[env].get(key)
        return float("nan") if value is None else float(value)

    scores = np.array([get(env, "normalized_score") for env in envs])
    ok = ~np.isnan(scores)
    _clipped_bars(top, x[ok], scores[ok], 0.6, -1.5, 1.5, label_all=True, color="C0")
    for xi in x[~ok]:
        top.annotate("n/a", (xi, 0), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8, color="0.3")
    for level, name in ((0, "random"), (1, "oracle")):
        top.axhline(level, ls="--", color="0.4", lw=1)
        top.annotate(
            name,
            (1.0, level),
            xycoords=("axes fraction", "data"),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            color="0.3",
        )
    top.set(ylim=(-1.7, 1.7), ylabel="normalised score")
    top.set_title("policy return, 0 = random, 1 = oracle", fontsize=10)
    top.grid(axis="y", alpha=0.3)

    qtypes = [q for q in QTYPE_ORDER if any(not math.isnan(get(env, f"skill/{q}")) for env in envs)]
    width = 0.8 / max(len(qtypes), 1)
    for xi, env in zip(x, envs):
        present = [q for q in qtypes if not math.isnan(get(env, f"skill/{q}"))]
        for k, q in enumerate(present):
            offset = (k - (len(present) - 1) / 2) * width
            color = f"C{QTYPE_ORDER.index(q) + 1}"
            _clipped_bars(bottom, [xi + offset], [get(env, f"skill/{q}")], width * 0.9, -1, 1, True, color=color)
    bottom.axhline(0, ls="--", color="0.4", lw=1)
    bottom.axhline(1, ls=":", color="0.4", lw=1)
    bottom.set(ylim=(-1.3, 1.3), ylabel="report skill")
    bottom.set_title("1 - loss / no-skill loss (1 = perfect, 0 = no skill)", fontsize=10)
    bottom.grid(axis="y", alpha=0.3)
    if qtypes:
        handles = [Patch(color=f"C{QTYPE_ORDER.index(q) + 1}", label=q) for q in qtypes]
        bottom.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(qtypes), fontsize=8)
    labels = [f"{env}\n{get(env, 'return'):.3g} | {get(env, 'random'):.3g} | {get(env, 'oracle'):.3g}" for env in envs]
    bottom.set_xticks(x, labels, fontsize=8)
    bottom.set_xlabel("env (return: policy | random | oracle)", fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


__all__ = ["env_scores_bar", "reliability_bins", "reliability_diagram"]
