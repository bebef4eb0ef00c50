"""Variants (a) ``packed`` (the real ``AleaEnvGRPOTrainer``) and (b) ``unpacked`` (the same model, decisions and loss
with every question and option as its own sequence) of the throughput benchmark."""

from __future__ import annotations

import tempfile
from types import SimpleNamespace

import torch
from transformers import PrinterCallback, Trainer

from alea_trl import AleaEnvGRPOConfig, AleaEnvGRPOTrainer, AleaModel
from alea_trl.envs import BUILTIN_ENVS, make_env
from alea_trl.packing import unpacked_sequences
from alea_trl.trainer.loss import act_logits_of, policy_loss, report_losses
from alea_trl.trainer.model_setup import apply_train_mode, param_groups
from alea_trl.trainer.pool import EpisodePool
from alea_trl.trainer.rollout import Rollout, act_index, fused_inputs, np_rng_for_rank

from .models import CPU_RUN, LEARNING_RATE, MAX_STEPS, Models
from .timing import Probe, Runner, RunnerCallback


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
            rows = rollout.advance(sub, act[fresh])
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
            rollout.prefetch(sub.episodes)  # as the trainer does: their next decisions observed during backward
            with self.probe.time("backward"):
                loss.backward()
        with self.probe.time("clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        with self.probe.time("optimizer"):
            self.optimizer.step()
        self.optimizer.zero_grad()
        rollout.join_prefetch()
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
