"""Training throughput: packed Alea GRPO vs the same model unpacked vs stock TRL GRPO generating the action as text.

Variants, all in one process on copies of the same seeded random weights:

(a) ``packed``: the real ``AleaEnvGRPOTrainer.train()`` on the five-env mix (hmm, kelly, newsvendor, bandit, nim),
    ``per_device_train_batch_size = 16`` decisions per optimizer step, ``num_generations = k``, ``--train_mode``
    (see below),
    ``beta = 0.0`` by default (``--beta 0.05`` adds the reference forward; 0 matches (c), which has no reference
    either), no gradient checkpointing, fp32, the trainer's defaults otherwise (AdamW fused on CPU, grad-norm clip
    1.0, ``eps_per_env = 16``, ``sample_in_loss_forward`` and ``pack_rows`` on) and ``max_batch_tokens = 1536``
    (``--max_batch_tokens``). With ``num_iterations = 1`` a step answers its 16 decisions (outcome decisions whose
    episode ended, replayed, and fresh ones, whose actions are sampled from the detached act logits of that same
    forward before their envs are stepped) in forwards with autograd grouped by length within the token budget,
    then one backward and the optimizer step.
(b) ``unpacked``: the same ``AleaModel`` and decisions from the same episode pool, seed and ``Rollout`` code, but every
    question and every option is its own causal sequence ``state + question (+ option)``
    (``alea_trl.packing.unpacked_sequences``), right-padded, plain causal mask (a 2D padding mask; transformers adds
    the causal part), heads read at each sequence's last token. Like (a), actions are sampled from the detached act
    logits of the loss forward (``Rollout.observe_wave`` / ``advance`` / ``fused_inputs``, the trainer's own code),
    so each decision is forwarded once. The same loss terms as the trainer
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
- each variant trains in its own greenlet (one trainer or loop per variant and k for the whole benchmark; all in
  the main OS thread, see ``Runner``); the main greenlet lets one variant run at a time, interleaved a, b, c, a, b,
  c, ... for ``--repeats`` measured blocks, so slow drifts of the machine hit every variant alike. A variant is
  paused inside its ``on_step_end`` callback while the others run, and its block's clock starts when it resumes. The first ``--warmup`` steps of each variant
  (construction, lazy optimizer state, first-call overheads) are dropped. A block lasts at least ``--measure_s``
  seconds and ``--min_steps`` steps ((a)) or ``--min_steps_slow`` steps ((b), (c)).
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

Needs the ``bench`` extra (``pip install -e ".[bench]"``: Qwen's tokenizer files and ``greenlet``). Run
``python benchmarks/throughput.py --quick`` (a few minutes on 2 CPU cores), ``--k 16``, or ``--both_k`` for k = 8 and
16. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import math
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from types import SimpleNamespace

import greenlet
import numpy as np
import torch
from datasets import Dataset
from transformers import PrinterCallback, Qwen3Config, Qwen3ForCausalLM, Trainer, TrainerCallback

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.envs import BUILTIN_ENVS, make_env
from alea_trl.packing import unpacked_sequences
from alea_trl.testing import build_qwen_tokenizer
from alea_trl.trainer.loss import act_logits_of, policy_loss, report_losses
from alea_trl.trainer.model_setup import apply_train_mode, param_groups
from alea_trl.trainer.pool import EpisodePool
from alea_trl.trainer.rollout import Rollout, act_index, fused_inputs, np_rng_for_rank


VARIANTS = ("packed", "unpacked", "trl")
LEARNING_RATE = 1e-5
CPU_RUN = dict(  # what (a), (b) and (c) share: fp32 on the CPU, no checkpointing, saving or progress bars
    gradient_checkpointing=False,
    use_cpu=True,
    bf16=False,
    report_to="none",
    save_strategy="no",
    logging_steps=10,
    disable_tqdm=True,
    learning_rate=LEARNING_RATE,
    lr_scheduler_type="constant",
)
MAX_STEPS = 20_000  # runs are stopped by their Runner


# ----------------------------------------------------------------------------------------------------- timing
class Probe:
    """Accumulates wall time per category; forward hooks on a backbone, wrappers around backward and clipping."""

    def __init__(self):
        self.times: dict[str, float] = defaultdict(float)
        self._fwd_start: float | None = None
        self._opt_start: float | None = None

    def reset(self) -> None:
        self.times = defaultdict(float)

    def attach_backbone(self, module: torch.nn.Module) -> None:
        def pre(mod, args):
            self._fwd_start = time.perf_counter()

        def post(mod, args, output):
            if self._fwd_start is not None:
                key = "fwd_grad" if torch.is_grad_enabled() else "fwd_nograd"
                self.times[key] += time.perf_counter() - self._fwd_start
                self._fwd_start = None

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def wrap(self, obj, name: str, key: str) -> None:
        """Replace ``obj.name`` (a bound method) by a timed version on the instance."""
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.times[key] += time.perf_counter() - t

        setattr(obj, name, timed)

    @contextlib.contextmanager
    def time(self, key: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.times[key] += time.perf_counter() - t

    def opt_begin(self) -> None:
        self._opt_start = time.perf_counter()

    def opt_end(self) -> None:
        if self._opt_start is not None:
            self.times["optimizer"] += time.perf_counter() - self._opt_start
            self._opt_start = None


class Runner:
    """One variant's training, run in its own greenlet and paused between measured blocks.

    ``body(runner)`` builds the model (and trainer) and trains, calling ``runner.step_end()`` after every optimizer
    step and returning once it answers True. The first ``warmup`` steps are dropped; then each call of
    ``run_block()`` (from the main greenlet) lets training continue until ``min_steps`` steps and ``measure_s``
    seconds were measured, and returns that block's measurements. A variant is paused (suspended in ``step_end``)
    while the others run, so each block's window starts when it is resumed.

    Greenlets, not threads: every variant runs in the main OS thread. On this machine a second live thread that owns
    an OpenMP team (a paused variant) makes torch's intra-op parallelism in the running thread 1.5-2.5x slower, which
    biased earlier, thread-based versions of this benchmark against whichever variant ran small ops.
    """

    def __init__(self, name: str, body, blocks: int, warmup: int, measure_s: float, min_steps: int, decisions: int):
        self.name, self.body, self.blocks_left = name, body, blocks
        self.warmup, self.measure_s, self.min_steps, self.decisions = warmup, measure_s, min_steps, decisions
        self.probe = Probe()
        self.measuring = False
        self.tokens: list[float] = []
        self.extra: dict[str, list[float]] = defaultdict(list)
        self.results: list[dict] = []
        self._steps = 0
        self._error: BaseException | None = None
        self._greenlet = greenlet.greenlet(self._main)

    def _main(self) -> None:
        try:
            self.body(self)
        except BaseException as err:  # handed to the main greenlet
            self._error = err
        finally:
            self.blocks_left = 0

    def run_block(self) -> dict:
        """Resume training for one measured block (main greenlet); returns the block's result."""
        n = len(self.results)
        self._greenlet.switch()
        if self._error is not None:
            raise RuntimeError(f"variant {self.name!r} failed") from self._error
        if len(self.results) == n:
            raise RuntimeError(f"variant {self.name!r} stopped before finishing a measured block")
        return self.results[-1]

    def join(self) -> None:
        while not self._greenlet.dead:  # let a finished variant's train() return
            self._greenlet.switch()

    def _start_block(self) -> None:
        self.probe.reset()
        self.tokens, self.extra = [], defaultdict(list)
        self._block_steps = 0
        self._t0, self._c0 = time.perf_counter(), time.process_time()
        self.measuring = True

    def step_end(self) -> bool:
        """Called by the worker after every optimizer step; True when training should stop."""
        now = time.perf_counter()
        self._steps += 1
        if not self.measuring:
            if self._steps >= self.warmup:
                self._start_block()
            return False
        self._block_steps += 1
        if self._block_steps < self.min_steps or now - self._t0 < self.measure_s:
            return False
        self.measuring = False
        self.results.append(self._result(now - self._t0, time.process_time() - self._c0))
        self.blocks_left -= 1
        if self.blocks_left <= 0:
            return True
        assert torch.is_grad_enabled()  # grad mode is per OS thread: the switch must not leak a no_grad block
        self._greenlet.parent.switch()
        self._start_block()
        return False

    def _result(self, wall: float, cpu: float) -> dict:
        t = self.probe.times
        model = t["fwd_grad"] + t["fwd_nograd"] + t["backward"]
        optim = t["optimizer"] + t["clip"]
        out = {
            "steps": self._block_steps,
            "wall_s": wall,
            "decisions_per_s": self.decisions * self._block_steps / wall,
            "process_cpu_per_wall": cpu / wall,
            "tokens_per_decision": float(np.mean(self.tokens)) if self.tokens else float("nan"),
            "model_time_fraction": model / wall,
            "model_plus_optimizer_fraction": (model + optim) / wall,
            "fractions": {k: v / wall for k, v in sorted(t.items())},
        }
        out["fractions"]["other"] = 1.0 - (model + optim) / wall
        out.update({k: float(np.mean(v)) for k, v in self.extra.items()})
        return out


class RunnerCallback(TrainerCallback):
    """Feeds a Trainer's step ends and optimizer steps to a :class:`Runner`."""

    def __init__(self, runner: Runner):
        self.runner = runner

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.runner.probe.opt_begin()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.runner.probe.opt_end()

    def on_step_end(self, args, state, control, **kwargs):
        if self.runner.step_end():
            control.should_training_stop = True


# ----------------------------------------------------------------------------------------------------- models
def backbone_config(vocab_size: int) -> Qwen3Config:
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    return config


class Models:
    """One set of seeded random weights; fresh copies for each run."""

    def __init__(self, tokenizer, seed: int):
        self.config = backbone_config(len(tokenizer))
        self.config.pad_token_id = tokenizer.pad_token_id
        self.config.eos_token_id = tokenizer.eos_token_id
        torch.manual_seed(seed)
        lm = Qwen3ForCausalLM(self.config).float()
        self.lm_state = {k: v.clone() for k, v in lm.state_dict().items()}
        torch.manual_seed(seed + 1)
        alea = AleaModel.from_backbone(self.config, backbone_kwargs={"dtype": torch.float32})
        missing, unexpected = alea.backbone.load_state_dict(
            {k[len("model.") :]: v for k, v in self.lm_state.items() if k.startswith("model.")}, strict=True
        )
        assert not missing and not unexpected
        self.alea = alea

    def fresh_alea(self) -> AleaModel:
        return copy.deepcopy(self.alea).train()

    def fresh_lm(self) -> Qwen3ForCausalLM:
        lm = Qwen3ForCausalLM(self.config).float()
        lm.load_state_dict(self.lm_state)
        lm.tie_weights()
        assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()
        return lm.train()

    def n_params(self) -> dict:
        lm = self.fresh_lm()
        return {
            "alea": sum(p.numel() for p in self.alea.parameters()),
            "causal_lm": sum(p.numel() for p in lm.parameters()),
        }


# ----------------------------------------------------------------------------------------------------- (a)
def prefill(rollout: Rollout, waves: int) -> None:
    """Bring the episode pipeline to its steady state without the model: ``waves`` rollout waves with a uniform
    policy (zero logits; no forward), then drop the rows they made ready. Open outcome episodes keep their pending
    decisions, as they would after a long run, so a short measured window sees the steady-state ratio of rollout
    decisions to rows consumed instead of the start-up transient (where outcome decisions produce no rows yet)."""

    def uniform(packed):
        logits = [torch.zeros(len(p.option_readout[act_index(p)])) for p in packed]
        return logits, logits  # policy and reference (used when beta != 0)

    for _ in range(waves):
        rollout.wave(uniform)
    rollout.pool.queue.clear()
    rollout.pop_stats()


def alea_args(
    out_dir: str,
    k: int,
    beta: float,
    seed: int,
    max_steps: int,
    decisions: int,
    train_mode: str,
    max_batch_tokens: int | None = None,
) -> AleaEnvGRPOConfig:
    return AleaEnvGRPOConfig(
        output_dir=out_dir,
        envs=list(BUILTIN_ENVS),
        per_device_train_batch_size=decisions,
        num_generations=k,
        train_mode=train_mode,
        beta=beta,
        **CPU_RUN,
        lr_head=LEARNING_RATE,
        lr_aux=LEARNING_RATE,
        max_len=1024,  # the longest decision of the five envs is ~340 tokens
        max_batch_tokens=max_batch_tokens,
        max_steps=max_steps,
        seed=seed,
    )


def packed_body(models: Models, tokenizer, k: int, opts):
    def body(runner: Runner) -> None:
        with tempfile.TemporaryDirectory() as out_dir:
            args = alea_args(
                out_dir,
                k,
                opts.beta,
                opts.seed,
                MAX_STEPS,
                decisions=opts.decisions,
                train_mode=opts.train_mode,
                max_batch_tokens=opts.max_batch_tokens or None,
            )
            model = models.fresh_alea()
            trainer = AleaEnvGRPOTrainer(
                model, args=args, processing_class=tokenizer, callbacks=[RunnerCallback(runner)]
            )
            trainer.remove_callback(PrinterCallback)
            probe = runner.probe
            probe.attach_backbone(model.backbone)
            if getattr(trainer, "ref_model", None) is not None:  # beta != 0: the reference's forwards are model time
                probe.attach_backbone(trainer.accelerator.unwrap_model(trainer.ref_model).backbone)
            probe.wrap(trainer.accelerator, "backward", "backward")
            probe.wrap(trainer, "_clip_grad_norm", "clip")
            collate = trainer._collate

            def recorded_collate(packed):
                batch = collate(packed)
                if runner.measuring and torch.is_grad_enabled():  # the loss forwards (not a no-grad rollout)
                    lengths = [len(p) for p in packed]
                    runner.tokens.extend(lengths)
                    runner.extra["loss_padding_fraction"].append(1.0 - sum(lengths) / batch.input_ids.numel())
                return batch

            trainer._collate = recorded_collate
            prefill(trainer.rollout, opts.prefill_waves)
            trainer.train()

    return body


# ----------------------------------------------------------------------------------------------------- (b)
class UnpackedLoop:
    """The same model, decisions and loss as (a), with every question and option as its own sequence."""

    def __init__(self, model: AleaModel, tokenizer, k: int, opts, args: AleaEnvGRPOConfig):
        self.model, self.tokenizer, self.k = model, tokenizer, k
        self.args = args
        self.decisions = opts.decisions
        self.chunk_tokens = opts.unpacked_chunk_tokens
        self.pad_id = tokenizer.pad_token_id
        factories = {name: (lambda n=name: make_env(n)) for name in BUILTIN_ENVS}
        torch.manual_seed(opts.seed)
        pool = EpisodePool(factories, self.args.eps_per_env, np_rng_for_rank(self.args.seed, 0))
        self.rollout = Rollout(pool, tokenizer, self.args, seed=self.args.seed * 1_000_003)
        optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args, model)
        optimizer_kwargs.pop("lr", None)
        groups = param_groups(model, self.args)
        for g in groups:
            g["weight_decay"] = self.args.weight_decay
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        self.probe: Probe | None = None
        self.epsilon_high = self.args.epsilon_high if self.args.epsilon_high is not None else self.args.epsilon

    def _forward(self, seqs: list[list[int]], q_rows: list[int], o_rows: list[int], o_question: list[int], q_bins):
        """One causal forward over right-padded sequences; heads at each sequence's last token."""
        n, width = len(seqs), max(len(s) for s in seqs)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for i, s in enumerate(seqs):
            input_ids[i, : len(s)] = torch.tensor(s)
            attention[i, : len(s)] = 1
        last = torch.tensor([len(s) - 1 for s in seqs])
        q_rows_t, o_rows_t = torch.tensor(q_rows, dtype=torch.long), torch.tensor(o_rows, dtype=torch.long)
        zeros = torch.zeros_like(input_ids)
        return self.model(
            input_ids=input_ids,
            position_ids=torch.arange(width).expand(n, width),
            question_seg=zeros,
            option_seg=zeros,
            question_index=torch.stack([q_rows_t, last[q_rows_t]], 1),
            question_bins=torch.tensor(q_bins, dtype=torch.long),
            option_index=torch.stack([o_rows_t, last[o_rows_t]], 1),
            option_question=torch.tensor(o_question, dtype=torch.long),
            attention_mask=attention,
        )

    def _decision_sequences(self, p):
        """Unpacked sequences of one decision with the head wiring: questions, then their options."""
        seqs = unpacked_sequences(p)
        q_local, o_local, o_q, i = [], [], [], 0
        for qi in range(len(p.questions)):
            q_local.append(i)
            i += 1
            for _ in p.option_readout[qi]:
                o_local.append(i)
                o_q.append(qi)
                i += 1
        return [s for s, _ in seqs], q_local, o_local, o_q

    def step(self) -> list[int]:
        """One optimizer step over ``decisions`` decisions, sampling from the loss forward as (a) does: outcome
        decisions whose episode ended (replayed, policy term only), then fresh decisions, sorted by length and
        forwarded in chunks; each chunk's fresh actions are sampled from its detached act logits, its envs stepped,
        and its share of the loss back-propagated."""
        model, args, rollout = self.model, self.args, self.rollout
        model.train()
        replay = rollout.pool.take(self.decisions)
        wave = rollout.observe_wave(self.decisions - len(replay))
        packed = [row.packed for row in replay] + wave.packed
        n_replay = len(replay)
        # loss normalisers over the whole step: every real policy sample and every report term
        n_samples = n_replay + self.k * sum(ep.env.dense for ep in wave.episodes)
        n_reports = sum(1 for p, t in zip(wave.packed, wave.targets) for q in p.questions if q.qid in t)
        per_decision = [self._decision_sequences(p) for p in packed]
        lengths = [max(len(s) for s in seqs) * len(seqs) for seqs, *_ in per_decision]
        order = sorted(range(len(packed)), key=lambda i: max(len(s) for s in per_decision[i][0]))
        tokens = [sum(len(s) for s in seqs) for seqs, *_ in per_decision]
        real = padded = 0
        for chunk in _chunks([lengths[i] for i in order], self.chunk_tokens, by_sum=True):
            idx = [order[i] for i in chunk]
            seqs, q_rows, o_rows, o_question, q_bins, questions = [], [], [], [], [], []
            for d in idx:
                s, q_local, o_local, o_q = per_decision[d]
                base, q_base = len(seqs), len(q_rows)
                seqs += s
                q_rows += [base + r for r in q_local]
                o_rows += [base + r for r in o_local]
                o_question += [q_base + q for q in o_q]
                q_bins += [q.n_bins or 0 for q in packed[d].questions]
                questions.append(packed[d].questions)
            out = self._forward(seqs, q_rows, o_rows, o_question, q_bins)
            real += sum(len(x) for x in seqs)
            padded += len(seqs) * max(len(x) for x in seqs)
            batch = SimpleNamespace(questions=questions)
            act, _ = act_logits_of(out, batch)
            # sample the chunk's fresh decisions from its own forward and step their envs
            fresh = [j for j, d in enumerate(idx) if d >= n_replay]
            sub = wave.subset([idx[j] - n_replay for j in fresh])
            legal = [act[j][torch.isfinite(act[j])] for j in fresh]
            rows = rollout.advance(sub, legal, [None] * len(fresh))
            chunk_replay = [replay[d] for d in idx if d < n_replay]
            inputs = fused_inputs(chunk_replay, sub, rows, self.k, rollout.env_index)
            sel = torch.tensor([j for j, d in enumerate(idx) if d < n_replay] + fresh)  # inputs' row order
            logp_all = torch.log_softmax(act[sel].float() / args.temperature, -1)
            mask = inputs["sample_mask"]
            logp = logp_all.gather(1, inputs["actions"])
            pg, _ = policy_loss(logp, inputs["old_logps"], inputs["advantages"], mask, args.epsilon, self.epsilon_high)
            loss = pg * (float(mask.sum()) / max(n_samples, 1))
            chunk_targets = [{} for _ in idx]
            for j, t in zip(sel.tolist(), inputs["targets"]):
                chunk_targets[j] = t
            reports = report_losses(out, batch, chunk_targets, list(model.config.taus))
            terms = [t for ts in reports.values() for t in ts]
            if terms:
                loss = loss + args.report_w * torch.stack(terms).sum() / n_reports
            with self.probe.time("backward"):
                loss.backward()
        with self.probe.time("clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        with self.probe.time("optimizer"):
            self.optimizer.step()
        self.optimizer.zero_grad()
        self.padding_fraction = 1.0 - real / padded
        return tokens


def _chunks(sizes: list[int], budget: int, by_sum: bool = False) -> list[list[int]]:
    """Consecutive index chunks whose padded size (longest x count, or the sum with ``by_sum``) fits the budget."""
    chunks, current, longest, total = [], [], 0, 0
    for i, size in enumerate(sizes):
        cost = total + size if by_sum else max(longest, size) * (len(current) + 1)
        if current and cost > budget:
            chunks.append(current)
            current, longest, total = [], 0, 0
        current.append(i)
        longest, total = max(longest, size), total + size
    if current:
        chunks.append(current)
    return chunks


def unpacked_body(models: Models, tokenizer, k: int, opts):
    # the loop's settings, built (and their device set up) now: TrainingArguments' device set-up resets accelerate's
    # global state, which would pull it from under a trainer already running in another greenlet
    args = alea_args(tempfile.gettempdir(), k, 0.0, opts.seed, 1, decisions=opts.decisions, train_mode=opts.train_mode)
    assert args.device.type == "cpu"

    def body(runner: Runner) -> None:
        model = models.fresh_alea()
        apply_train_mode(model, args.train_mode, args.tail_k)  # what the trainer does in (a)
        loop = UnpackedLoop(model, tokenizer, k, opts, args)
        loop.probe = runner.probe
        runner.probe.attach_backbone(model.backbone)
        prefill(loop.rollout, opts.prefill_waves)
        while True:
            tokens = loop.step()
            if runner.measuring:
                runner.tokens += tokens
                runner.extra["loss_padding_fraction"].append(loop.padding_fraction)
            if runner.step_end():
                break

    return body


# ----------------------------------------------------------------------------------------------------- (c)
def collect_prompts(tokenizer, n: int, seed: int) -> tuple[Dataset, int]:
    """``n`` decisions of the five envs (round-robin, random play) as plain-text prompts with their option rewards."""
    factories = {name: (lambda n_=name: make_env(n_)) for name in BUILTIN_ENVS}
    pool = EpisodePool(factories, 16, np_rng_for_rank(seed, 0))
    pick = np.random.default_rng([seed, 7])
    rows = {"prompt": [], "options": [], "option_rewards": []}
    longest = 0
    while len(rows["prompt"]) < n:
        for ep in pool.schedule(len(BUILTIN_ENVS)):
            d = ep.env.observe()
            act = d.act
            if ep.env.dense:
                rewards = [float(r) for r in ep.env.action_rewards()]
            else:
                best = ep.env.oracle_action()
                rewards = [1.0 if i == best else 0.0 for i in range(d.n_legal)]
            prompt = (
                f"{d.state}\nQuestion: {act.text}\nOptions: {'; '.join(act.options)}\n"
                "Reply with exactly one option, written as above.\nAnswer:"
            )
            rows["prompt"].append(prompt)
            rows["options"].append(list(act.options))
            rows["option_rewards"].append(rewards)
            longest = max(
                [longest] + [len(tokenizer(" " + o, add_special_tokens=False)["input_ids"]) for o in act.options]
            )
            _, done = ep.env.step(int(pick.integers(d.n_legal)))
            if done:
                pool.finish(ep)
    return Dataset.from_dict({key: v[:n] for key, v in rows.items()}), longest + 1


def option_reward(prompts, completions, options, option_rewards, **kwargs) -> list[float]:
    """The exact expected reward of the option the completion names; the lowest reward when it names none."""
    out = []
    for text, opts, rewards in zip(completions, options, option_rewards):
        text = text.strip()
        out.append(float(rewards[opts.index(text)]) if text in opts else float(min(rewards)))
    return out


@contextlib.contextmanager
def trl_compact_lm_head(enabled: bool):
    """TRL 1.16's fused LM head scores only the completion positions on Triton devices, but every position of the
    prompt + completion through the whole vocabulary elsewhere (CPU). With ``enabled``, the CPU run scores only the
    completion positions too, as on GPU (the same torch tile code, just the compact token selection)."""
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    if enabled:
        trl_utils._use_triton = lambda device: True
    try:
        yield
    finally:
        trl_utils._use_triton = original


def trl_body(models: Models, tokenizer, k: int, opts, dataset: Dataset, max_completion_length: int):
    from trl import GRPOConfig, GRPOTrainer

    def body(runner: Runner) -> None:
        with tempfile.TemporaryDirectory() as out_dir:
            args = GRPOConfig(
                output_dir=out_dir,
                per_device_train_batch_size=opts.decisions * k,
                num_generations=k,
                max_completion_length=max_completion_length,
                beta=0.0,
                temperature=1.0,
                **CPU_RUN,
                max_steps=MAX_STEPS,
                seed=opts.seed,
            )
            model = models.fresh_lm()
            if opts.train_mode == "tail":  # the same trainable set as (a) and (b): the (tied) embedding is frozen
                model.model.embed_tokens.weight.requires_grad_(False)
            trainer = GRPOTrainer(
                model=model,
                reward_funcs=option_reward,
                args=args,
                train_dataset=dataset,
                processing_class=tokenizer,
                callbacks=[RunnerCallback(runner)],
            )
            trainer.remove_callback(PrinterCallback)
            probe = runner.probe
            probe.attach_backbone(model.model)
            probe.wrap(trainer.accelerator, "backward", "backward")
            probe.wrap(trainer, "_clip_grad_norm", "clip")
            generate = trainer._generate_and_score_completions

            def timed_generate(batch):
                with probe.time("generation_total"):
                    inputs = generate(batch)
                if runner.measuring:
                    prompt = float(inputs["prompt_mask"].sum()) / k  # every prompt is repeated k times
                    completion = float(inputs["completion_mask"].sum())
                    n = len(batch) / k
                    runner.tokens.append((prompt + completion) / n)
                    runner.extra["processed_tokens_per_decision"].append((k * prompt + completion) / n)
                    runner.extra["mean_completion_tokens"].append(completion / len(batch))
                    runner.extra["max_completion_length"].append(max_completion_length)
                    runner.extra["loss_padding_fraction"].append(
                        1.0
                        - float(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
                        / (inputs["prompt_mask"].numel() + inputs["completion_mask"].numel())
                    )
                return inputs

            trainer._generate_and_score_completions = timed_generate
            with trl_compact_lm_head(not opts.trl_cpu_full_lm_head):
                trainer.train()

    return body


# ----------------------------------------------------------------------------------------------------- report
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
        default=1536,
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
