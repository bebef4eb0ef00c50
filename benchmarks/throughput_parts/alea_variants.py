"""Variants (a) ``trainer`` (the real ``AleaEnvGRPOTrainer``) and (b) ``unpacked`` (the same model, decisions and loss
with every question and option as its own sequence) of the throughput benchmark."""

from __future__ import annotations

import tempfile
from types import SimpleNamespace

import torch
from transformers import PrinterCallback, Trainer

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.collate import pad_token_id
from alea_trl.envs import BUILTIN_ENVS, make_env
from alea_trl.packing import unpacked_sequences
from alea_trl.questions import ACT_QID
from alea_trl.trainer import param_groups
from alea_trl.trainer.act import act_logits_of
from alea_trl.trainer.loss import ObjectiveSettings, grpo_loss
from alea_trl.trainer.rollout import EpisodePool, Rollout, Wave, np_rng_for_rank, sampled_forward_inputs

from .models import CPU_RUN, LEARNING_RATE, MAX_STEPS, Models
from .timing import Runner, RunnerCallback


def act_index(packed) -> int:
    """Position of the act question among a packed decision's questions."""
    return next(i for i, q in enumerate(packed.questions) if q.qid == ACT_QID)


def wave_subset(wave: Wave, indices: list[int]) -> Wave:
    """The decisions of ``wave`` at ``indices``, in that order."""
    return Wave(*([getattr(wave, f)[i] for i in indices] for f in ("episodes", "packed", "targets", "rewards")))


def prefill(rollout: Rollout, waves: int) -> None:
    """Bring the episode pipeline to its steady state without the model: ``waves`` rollout waves with a uniform
    policy (zero logits; no forward), then drop the rows they made ready. Open outcome episodes keep their pending
    decisions, as they would after a long run, so a short measured window sees the steady-state ratio of rollout
    decisions to rows consumed instead of the start-up transient (where outcome decisions produce no rows yet)."""

    def uniform(packed):
        logits = [torch.zeros(len(p.option_readout[act_index(p)])) for p in packed]
        return logits, logits  # policy and reference (used when beta != 0)

    for _ in range(waves):
        rollout.run_wave(uniform)
    rollout.queue.clear()
    rollout.pop_stats()


def alea_args(out_dir: str, k: int, opts, max_steps: int, max_batch_tokens: int | None = None) -> AleaEnvGRPOConfig:
    """The trainer's settings for (a), and the loop's for (b): every built-in env, the same learning rate for every
    parameter group, ``opts``' ``beta``, ``train_mode``, ``outcome_advantage``, ``dense_update`` and decisions per
    step; the longest decision of the five envs is ~340 tokens (``max_len`` 1024)."""
    run = {"output_dir": out_dir, "envs": list(BUILTIN_ENVS), "max_steps": max_steps, "seed": opts.seed}
    algorithm = {"num_generations": k, "beta": opts.beta, "train_mode": opts.train_mode, "lr_head": LEARNING_RATE}
    algorithm |= {"outcome_advantage": opts.outcome_advantage, "dense_update": opts.dense_update}
    batches = {"per_device_train_batch_size": opts.decisions, "max_len": 1024, "max_batch_tokens": max_batch_tokens}
    return AleaEnvGRPOConfig(**(CPU_RUN | run | algorithm | batches | {"lr_aux": LEARNING_RATE}))


def packed_lengths(packed) -> tuple[list[int], list[int]]:
    """Tokens of packed decisions and the keys their tokens attend in total (``position + 1`` per token)."""
    return [len(p) for p in packed], [sum(p.position_ids) + len(p) for p in packed]


def deferred_rows(rows) -> int:
    """The fresh decisions of ``rows`` left waiting for their episode's end (replayed once later)."""
    return sum(1 for row in rows if row is not None and not row.ready)


def count_trainer_work(trainer: AleaEnvGRPOTrainer, runner: Runner) -> None:
    """Record what the trainer's steps answer, from the rollout's and the policy forward's public hooks: per step, the
    fresh env decisions and the replayed ones each loss forward takes, their packed tokens, the fresh ones left
    waiting to be replayed; the reference's forwards (``beta != 0``) and branch continuations (the no-grad
    forwards: actions are sampled from the loss forward, so the only no-grad forwards are continuations)."""
    shared = trainer.policy_forward.shared_trunk_layer

    def loss_forward(replay, wave):
        if runner.measuring:
            runner.count(len(wave.packed), len(replay))
            lengths, ctx = packed_lengths([row.packed for row in replay] + wave.packed)
            runner.work.forward(lengths, grad=True, ctx=ctx)
            if trainer.beta != 0.0:  # the reference: the trained layers on the policy's trunk, else a whole copy
                runner.work.forward(lengths, grad=False, ctx=ctx, layers="all" if shared is None else "trained")

    def deferred(rows):
        if runner.measuring:
            runner.deferred(deferred_rows(rows))

    def continuations(packed, batch):
        if runner.measuring and not torch.is_grad_enabled():
            lengths, ctx = packed_lengths(packed)
            runner.work.forward(lengths, grad=False, ctx=ctx)
            runner.work.add("continuation_decisions", len(packed))

    trainer.rollout.add_hook("forward", loss_forward)
    trainer.rollout.add_hook("advanced", deferred)
    trainer.policy_forward.add_collate_hook(continuations)


def packed_body(models: Models, tokenizer, k: int, opts):
    def body(runner: Runner) -> None:
        with tempfile.TemporaryDirectory() as out_dir:
            args = alea_args(out_dir, k, opts, MAX_STEPS, max_batch_tokens=opts.max_batch_tokens or None)
            model = models.fresh_alea(args.train_mode, args.tail_k)
            trainer = AleaEnvGRPOTrainer(
                model, args=args, processing_class=tokenizer, callbacks=[RunnerCallback(runner)]
            )
            trainer.remove_callback(PrinterCallback)
            probe = runner.probe
            probe.attach_backbone(model.backbone)
            probe.attach(model, "alea")  # the whole AleaModel forward: backbone + embedding, mask, heads, read-outs
            if getattr(trainer, "ref_model", None) is not None:  # beta != 0: the reference's forwards are model time
                probe.attach_backbone(trainer.accelerator.unwrap_model(trainer.ref_model).backbone)
            probe.wrap(trainer.accelerator, "backward", "backward")
            probe.wrap(trainer.accelerator, "clip_grad_norm_", "clip")
            count_trainer_work(trainer, runner)
            prefill(trainer.rollout, opts.prefill_waves)
            trainer.train()

    return body


# ----------------------------------------------------------------------------------------------------- (b)
class UnpackedLoop:
    """The same model, decisions and loss as (a), with every question and option as its own sequence."""

    def __init__(self, model: AleaModel, tokenizer, k: int, opts, args: AleaEnvGRPOConfig, chunk_tokens: int):
        self.model, self.tokenizer, self.k = model, tokenizer, k
        self.args = args
        self.decisions = opts.decisions
        self.chunk_tokens = chunk_tokens
        self.pad_id = pad_token_id(tokenizer)
        factories = {name: (lambda n=name: make_env(n)) for name in BUILTIN_ENVS}
        torch.manual_seed(opts.seed)
        pool = EpisodePool(factories, self.args.eps_per_env, np_rng_for_rank(self.args.seed, 0))
        self.rollout = Rollout(pool, tokenizer, self.args, seed=self.args.seed * 1_000_003)
        optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args, model)
        optimizer_kwargs.pop("lr", None)
        groups = param_groups(model, self.args)
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        self.runner: Runner | None = None
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

    def step(self) -> None:
        """One optimizer step over ``decisions`` decisions, sampling from the loss forward as (a) does: outcome
        decisions whose episode ended (replayed, policy term only), then fresh decisions, sorted by length and
        forwarded in chunks; each chunk's fresh actions are sampled from its detached act logits, its envs stepped,
        and its share of the step's loss (the library's ``grpo_loss``, weighted by its share of the step's policy
        samples and report terms) back-propagated."""
        model, args, rollout = self.model, self.args, self.rollout
        model.train()
        replay, wave = rollout.replays_and_wave(self.decisions)
        packed = [row.packed for row in replay] + wave.packed
        n_replay = len(replay)
        runner = self.runner
        # loss normalisers over the whole step: every real policy sample and every report term
        n_samples = n_replay + self.k * sum(ep.env.dense for ep in wave.episodes)
        n_reports = sum(1 for p, t in zip(wave.packed, wave.targets) for q in p.questions if q.qid in t)
        per_decision = [self._decision_sequences(p) for p in packed]
        lengths = [max(len(s) for s in seqs) * len(seqs) for seqs, *_ in per_decision]
        order = sorted(range(len(packed)), key=lambda i: max(len(s) for s in per_decision[i][0]))
        if runner.measuring:
            runner.count(len(wave.packed), n_replay)
            runner.work.forward([len(s) for seqs, *_ in per_decision for s in seqs], grad=True)
        for chunk in _chunks([lengths[i] for i in order], self.chunk_tokens, by_sum=True):
            # replayed decisions first, then fresh ones: the order of the loss inputs
            idx = sorted((order[i] for i in chunk), key=lambda d: d >= n_replay)
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
            batch = SimpleNamespace(questions=questions)
            # sample the chunk's fresh decisions from its own forward and step their envs
            chunk_replay = [replay[d] for d in idx if d < n_replay]
            sub = wave_subset(wave, [d - n_replay for d in idx if d >= n_replay])
            act, _ = act_logits_of(out.choice_logits, batch)
            rows = rollout.advance(sub, act[len(chunk_replay) :])
            inputs = sampled_forward_inputs(chunk_replay, sub, rows, self.k, rollout.env_index)
            settings = ObjectiveSettings(
                temperature=args.temperature,
                epsilon_low=args.epsilon,
                epsilon_high=self.epsilon_high,
                beta=0.0,
                report_w=args.report_w,
                taus=tuple(model.config.taus),
                dense_update=args.dense_update,  # the rows carry what the rollout computed for this update
            )
            _, terms = grpo_loss(out, batch, inputs, settings)
            loss = terms.policy * (float(inputs["sample_mask"].sum()) / max(n_samples, 1))
            n_terms = sum(len(ts) for ts in terms.reports.values())
            if n_terms:
                loss = loss + args.report_w * terms.report * (n_terms / n_reports)
            rollout.prefetch(sub.episodes)  # as the trainer does: their next decisions observed during backward
            with runner.probe.time("backward"):
                loss.backward()
        with runner.probe.time("clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        with runner.probe.time("optimizer"):
            self.optimizer.step()
        self.optimizer.zero_grad()
        rollout.join_prefetch()


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


def unpacked_body(models: Models, tokenizer, k: int, opts, chunk_tokens: int):
    # the loop's settings, built (and their device set up) now: TrainingArguments' device set-up resets accelerate's
    # global state, which would pull it from under a trainer already running in another greenlet
    args = alea_args(tempfile.gettempdir(), k, opts, 1)
    assert args.device.type == "cpu"

    def body(runner: Runner) -> None:
        model = models.fresh_alea(args.train_mode, args.tail_k)  # trains what the trainer trains in (a)
        loop = UnpackedLoop(model, tokenizer, k, opts, args, chunk_tokens)
        loop.runner = runner

        def deferred(rows):
            if runner.measuring:
                runner.deferred(deferred_rows(rows))

        loop.rollout.add_hook("advanced", deferred)
        runner.probe.attach_backbone(model.backbone)
        runner.probe.attach(model, "alea")
        prefill(loop.rollout, opts.prefill_waves)
        while True:
            loop.step()
            if runner.step_end():
                break

    return body
