"""The throughput benchmark's summaries: per-variant medians over measured blocks, the speed-ups of the trainer, the
table, and the figures of the final JSON line."""

from __future__ import annotations

import math
import statistics

from .flops import FlopModel


STOCK_DIFFERS = (
    "trl_stock differs from trl in: option text as the answer (max_completion_length = longest option + EOS; random "
    "weights never sample EOS, so every completion runs to the limit) instead of one letter; all of a step's prompts "
    "generated and trained as one micro-batch (padded to the longest prompt of the five envs) instead of one group "
    "per micro-batch"
)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _median(rs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def rows_per_decision(rs: list[dict]) -> float:
    """Rows the loss forwards per distinct env decision in the long run: 1, plus one replay for every fresh decision
    left waiting for its episode's end (over all of a variant's blocks). Episodes of fixed length end in bursts, so a
    short block may hold mostly replays or none; this ratio does not depend on where a block falls."""
    distinct = sum(r["distinct"] for r in rs)
    return 1.0 + sum(r["deferred"] for r in rs) / distinct if distinct else math.nan


def summarise(runs: dict[str, list[dict]], flop_model: FlopModel) -> dict:
    """Per-variant medians of one k's blocks, and the trainer's speed-ups against each other variant (ratios of
    medians of distinct decisions per second; ``min`` / ``max`` of the per-repeat ratios) and against the best
    unpacked chunk size.

    Distinct decisions per second = rows per second / rows per distinct decision (``rows_per_decision``); tokens
    and FLOPs per decision are per row times the same factor (a replay forwards the very tokens of its decision)."""
    out = {}
    for v, rs in runs.items():
        if not rs:
            continue
        per = rows_per_decision(rs)
        for r in rs:
            r["decisions_per_s"] = r["rows_per_s"] / per
        work_keys = sorted({key for r in rs for key in r["work_per_row"]})
        work = {key: per * statistics.median(r["work_per_row"].get(key, 0.0) for r in rs) for key in work_keys}
        fractions = {
            key: statistics.median(r["fractions"].get(key, 0.0) for r in rs)
            for key in sorted({key for r in rs for key in r["fractions"]})
        }
        rows = sum(r["distinct"] + r["replays"] for r in rs)
        out[v] = {
            "decisions_per_s": spread([r["decisions_per_s"] for r in rs]),
            "rows_per_s": _median(rs, "rows_per_s"),
            "rows_per_decision": per,
            "counted": {
                "decisions_per_s": _median(rs, "counted_decisions_per_s"),
                "distinct": sum(r["distinct"] for r in rs),
                "replays": sum(r["replays"] for r in rs),
                "replay_fraction": sum(r["replays"] for r in rs) / rows,
            },
            "tokens_per_decision": per * _median(rs, "tokens_per_row"),
            "padded_tokens_per_decision": per * _median(rs, "padded_tokens_per_row"),
            "flops_per_decision": flop_model.flops(work),
            "work_per_decision": work,
            "model_time_fraction": spread([r["model_time_fraction"] for r in rs]),
            "model_plus_optimizer_fraction": _median(rs, "model_plus_optimizer_fraction"),
            "fractions": fractions,
            "loss_padding_fraction": _median(rs, "loss_padding_fraction"),
            "others_busy_cores": max(r["others_busy_cores"] for r in rs),
            "process_cpu_per_wall": _median(rs, "process_cpu_per_wall"),
            "steps_measured": [r["steps"] for r in rs],
        }
        if "alea_grad" in fractions:  # AleaModel forward outside the decoder: embedding, mask, heads, read-outs
            outside = fractions.get("alea_grad", 0) + fractions.get("alea_nograd", 0)
            outside -= fractions.get("fwd_grad", 0) + fractions.get("fwd_nograd", 0)
            out[v]["heads_and_readout_fraction"] = max(outside, 0.0)
        for key in ("mean_completion_tokens", "max_completion_tokens", "min_completion_tokens"):
            if key in rs[0]:
                out[v][key] = _median(rs, key)
    trainer = runs.get("trainer", [])
    if not trainer:
        return out
    for other, rs in runs.items():
        if other == "trainer" or not rs:
            continue
        ratio = out["trainer"]["decisions_per_s"]["median"] / out[other]["decisions_per_s"]["median"]
        paired = [a["decisions_per_s"] / b["decisions_per_s"] for a, b in zip(trainer, rs)]
        out[f"speedup_vs_{other}"] = {"median_ratio": ratio, "min": min(paired), "max": max(paired)}
    unpacked = [v for v in out if v.startswith("unpacked@")]
    if unpacked:
        best = max(unpacked, key=lambda v: out[v]["decisions_per_s"]["median"])
        out["speedup_vs_unpacked"] = dict(out[f"speedup_vs_{best}"], best_variant=best)
    return out


def print_table(k: int, summary: dict, variants: list[str], decisions: int) -> None:
    print(
        f"\nk = {k}: {decisions} rows (decisions, replays included) per optimizer step; dec/s: distinct env decisions"
    )
    head = (
        f"{'variant':<15}{'dec/s':>8}{'min-max':>14}{'rows/s':>8}{'row/dec':>8}{'tok/dec':>9}{'padded':>8}"
        f"{'GFLOP/dec':>10}{'model':>7}{'+optim':>7}{'fwd':>6}{'fwd-ng':>7}{'bwd':>6}{'heads':>6}{'optim':>6}"
        f"{'other':>6}{'pad':>6}"
    )
    print(head)
    print("-" * len(head))
    for v in variants:
        if v not in summary:
            continue
        s = summary[v]
        d, f = s["decisions_per_s"], s["fractions"]
        print(
            f"{v:<15}{d['median']:>8.2f}{d['min']:>7.2f}-{d['max']:<6.2f}{s['rows_per_s']:>8.2f}"
            f"{s['rows_per_decision']:>8.2f}{s['tokens_per_decision']:>9.0f}{s['padded_tokens_per_decision']:>8.0f}"
            f"{s['flops_per_decision']['total'] / 1e9:>10.2f}{s['model_time_fraction']['median']:>7.2f}"
            f"{s['model_plus_optimizer_fraction']:>7.2f}{f.get('fwd_grad', 0):>6.2f}{f.get('fwd_nograd', 0):>7.2f}"
            f"{f.get('backward', 0):>6.2f}{s.get('heads_and_readout_fraction', math.nan):>6.2f}"
            f"{f.get('optimizer', 0) + f.get('clip', 0):>6.2f}{f.get('other', 0):>6.2f}"
            f"{s.get('loss_padding_fraction', math.nan):>6.2f}"
        )
    for name, r in summary.items():
        if name.startswith("speedup_vs_"):
            best = f" (best: {r['best_variant']})" if "best_variant" in r else ""
            print(f"{name}: {r['median_ratio']:.2f}x (per-repeat {r['min']:.2f}-{r['max']:.2f}){best}")
    for v in ("trl", "trl_stock"):
        if v in summary:
            t = summary[v]
            print(
                f"{v}: completions of {t['min_completion_tokens']:.0f}-{t['max_completion_tokens']:.0f} tokens "
                f"(mean {t['mean_completion_tokens']:.1f})"
            )


def print_notes(stock: bool) -> None:
    """What the table's columns mean (and, with the stock row, how it differs)."""
    if stock:
        print(STOCK_DIFFERS)
    print(
        "columns: rows = distinct + replayed decisions forwarded; row/dec = rows per distinct decision in the long run "
        "(1 + the share of fresh decisions replayed later); dec/s = rows/s / row/dec; tok/dec = real tokens through "
        "the backbone per distinct decision (generation, loss forward and replays included), padded = with padding; "
        "GFLOP/dec = model FLOPs (matmuls, LM head); model = (backbone fwd + bwd) / step; +optim adds optimizer step "
        "and clipping; fwd / fwd-ng = backbone forward with / without grad; heads = AleaModel forward outside the "
        "decoder (embedding, mask, heads, read-outs); pad = padding share of the loss forward's tokens"
    )


def final_result(summaries: dict[int, dict], variants: list[str], base: dict) -> dict:
    """The JSON line: the speed-ups at every k (``speedup_vs_<variant>_k<k>``), the trainer's decisions/s and share
    of the step in the backbone at the first k, and everything per k under ``by_k``."""
    ks = sorted(summaries)
    main_k = 8 if 8 in ks else ks[0]
    s = summaries[main_k]
    trainer = s.get("trainer", {})
    result = {
        "k": main_k,
        "decisions_per_s": trainer.get("decisions_per_s", {}).get("median", math.nan),
        "model_time_fraction": trainer.get("model_time_fraction", {}).get("median", math.nan),
        "model_plus_optimizer_fraction": trainer.get("model_plus_optimizer_fraction", math.nan),
        "heads_and_readout_fraction": trainer.get("heads_and_readout_fraction", math.nan),
        "rows_per_decision": trainer.get("rows_per_decision", math.nan),
    }
    for k in ks:
        for name, r in summaries[k].items():
            if name.startswith("speedup_vs_"):
                result[f"{name}_k{k}"] = r["median_ratio"]
    result["medians_decisions_per_s"] = {
        f"{v}_k{k}": summaries[k][v]["decisions_per_s"]["median"] for k in ks for v in variants if v in summaries[k]
    }
    result["tokens_per_decision"] = {
        f"{v}_k{k}": summaries[k][v]["tokens_per_decision"] for k in ks for v in variants if v in summaries[k]
    }
    result["gflop_per_decision"] = {
        f"{v}_k{k}": summaries[k][v]["flops_per_decision"]["total"] / 1e9
        for k in ks
        for v in variants
        if v in summaries[k]
    }
    result.update(base)
    result["by_k"] = {str(k): summaries[k] for k in ks}
    return result
