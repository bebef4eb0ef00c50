"""AleaEnvGRPOTrainer: GRPO over environment decision points, as a TRL ``GRPOTrainer``."""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time
from types import SimpleNamespace

import torch
from datasets import Dataset
from torch.utils.data import SequentialSampler
from transformers import AutoTokenizer, GenerationConfig
from trl import GRPOTrainer
from trl.models import prepare_deepspeed, prepare_fsdp, unwrap_model_for_generation

from ..envs import env_factories as make_env_factories
from ..evaluation import evaluation_sums, format_table, table_from_means
from ..packing import collate_segments
from ..questions import QTYPES
from .checkpointing import COMPLETE_MARKER, POOL_STATE_NAME, CrashSafeCheckpoints, last_complete_checkpoint
from .chunked_forward import chunked_forward
from .config import AleaEnvGRPOConfig
from .loss import act_logits_of, exact_kl, policy_loss, report_losses
from .model_setup import apply_train_mode, grouped_optimizer, lora_config, resolve_model
from .pool import EpisodePool
from .rollout import Rollout, fused_inputs, np_rng_for_rank, rows_to_inputs
from .shared_trunk import (
    captured_trunk,
    first_shared_layer,
    reference_choice_logits,
)


def _rewards_come_from_envs(*args, **kwargs):
    raise RuntimeError("AleaEnvGRPOTrainer takes its rewards from the environments; this placeholder is never called")


class AleaEnvGRPOTrainer(CrashSafeCheckpoints, GRPOTrainer):
    """GRPO over decision points of environments, without text generation.

    What differs from [`~trl.GRPOTrainer`]:
    - there is no dataset and no reward function: an episode pool per process (``eps_per_env`` episodes of each env in
      ``args.envs``) emits decisions; one row of a generation batch is one decision;
    - no ``generate``: actions are sampled from the act head (k per dense decision, one per outcome decision), from
      the detached logits of the loss forward itself when ``num_iterations == 1`` (``sample_in_loss_forward``), else
      from one packed no-grad forward per wave of decisions;
    - advantages: dense decisions use the exact expected rewards of their k actions (group-normalised); outcome
      decisions are replayed when their episode ends, with the per-env normalised return;
    - the loss is the clipped-ratio policy loss + ``beta`` x exact KL over the legal actions + ``report_w`` x
      proper-scoring report losses against the env oracles;
    - checkpoints also carry the episode pool, so ``resume_from_checkpoint`` continues the same episodes;
    - ``evaluate()`` plays ``eval_episodes`` greedy episodes per env and logs return, normalised score and report
      losses.
    Everything else (``train``, ``save_model``, ``push_to_hub``, callbacks, ``report_to``, gradient accumulation,
    ``num_iterations`` buffering, accelerate / DeepSpeed / FSDP placement, PEFT) is TRL's.

    Args:
        model (`str` or `AleaModel`):
            A backbone id or path (fresh heads), an Alea checkpoint, or an `AleaModel`.
        args (`AleaEnvGRPOConfig`, *optional*):
            Training configuration.
        processing_class (`PreTrainedTokenizerBase`, *optional*):
            The tokenizer; loaded from the model's path when omitted.
        env_factories (`dict[str, Callable]`, *optional*):
            Factories for env names in ``args.envs`` that are not registered (or to override registered ones).
        callbacks, optimizers, peft_config:
            As in [`~trl.GRPOTrainer`]. In ``train_mode="lora"`` a ``peft_config`` is built when none is given.
    """

    _tag_names = ["trl", "grpo", "alea"]
    _name = "AleaEnvGRPO"
    # the loss is a per-micro-batch mean: Trainer divides it by the accumulation steps
    loss_is_scaled_for_ga = False

    def __init__(
        self,
        model,
        args: AleaEnvGRPOConfig | None = None,
        processing_class=None,
        env_factories=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
    ):
        if args is None:
            args = AleaEnvGRPOConfig(output_dir="alea-grpo", max_steps=100)
        if not isinstance(args, AleaEnvGRPOConfig):
            raise ValueError(f"AleaEnvGRPOTrainer: field 'args': needs an AleaEnvGRPOConfig, got {type(args)}")
        factories = make_env_factories(args.envs, args.env_kwargs, extra=env_factories)
        from transformers import set_seed

        set_seed(args.seed)
        model = resolve_model(model, args)
        taus = list(model.config.taus)
        if processing_class is None:
            processing_class = AutoTokenizer.from_pretrained(model.config._name_or_path or model.name_or_path)
        if args.train_mode == "lora":
            peft_config = lora_config(model, args, base=peft_config)
        elif peft_config is not None:
            raise ValueError("AleaEnvGRPOTrainer: field 'peft_config': only used with train_mode='lora'")
        else:
            apply_train_mode(model, args.train_mode, args.tail_k)

        # the placeholder dataset only paces Trainer's loop: one pass over it is the whole run
        n_slots = args.generation_batch_size * args.gradient_accumulation_steps * args.num_iterations * args.max_steps
        placeholder = Dataset.from_dict({"decision_slot": list(range(n_slots))})
        with self._grpo_init_guards(model, args):
            super().__init__(
                model=model,
                reward_funcs=_rewards_come_from_envs,
                args=args,
                train_dataset=placeholder,
                processing_class=processing_class,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
            )
        self._undo_fused_lm_head()
        self.beta = args.beta  # GRPOTrainer.__init__ saw the guard's beta of 0
        self._taus = taus
        self.ref_model = self._build_reference() if args.beta != 0.0 and not self._is_peft() else None
        # heads / tail modes: the reference reuses the policy's frozen trunk in rollouts (plain modules only)
        sharded = self.is_deepspeed_enabled or self.is_fsdp_enabled
        self._shared_trunk_layer = (
            None
            if self.ref_model is None or sharded
            else first_shared_layer(self.accelerator.unwrap_model(self.model), args.train_mode, args.tail_k)
        )

        rank = self.accelerator.process_index
        pool = EpisodePool(factories, args.eps_per_env, np_rng_for_rank(args.seed, rank), args.outcome_baseline_window)
        self.rollout = Rollout(pool, self._tokenizer, args, seed=args.seed * 1_000_003 + rank)
        self.env_factories = factories
        self._last_generation_time = None

    # ------------------------------------------------------------------------------------------------------ set-up
    @staticmethod
    @contextlib.contextmanager
    def _grpo_init_guards(model, args):
        """What GRPOTrainer.__init__ assumes of a text LM, satisfied for its duration: a generation config on the
        model, and no reference built from ``config._name_or_path`` (ours is built after, from the model itself)."""
        beta, had_config = args.beta, getattr(model, "generation_config", None) is not None
        if not had_config:
            model.generation_config = GenerationConfig()
        args.beta = 0.0
        try:
            yield
        finally:
            args.beta = beta
            if not had_config:
                del model.generation_config

    def _undo_fused_lm_head(self):
        """GRPOTrainer patches ``model.forward`` with a fused LM-head forward stored on the instance; a copy of the
        patched model would run the policy's weights, and our model has no LM head. Remove the patch."""
        unwrapped = self.accelerator.unwrap_model(self.model)
        for m in (unwrapped, getattr(unwrapped, "get_base_model", lambda: None)()):
            if m is not None and "forward" in m.__dict__:
                del m.__dict__["forward"]

    def _is_peft(self) -> bool:
        from peft import PeftModel

        return isinstance(self.accelerator.unwrap_model(self.model), PeftModel)

    def _build_reference(self):
        ref = copy.deepcopy(self.accelerator.unwrap_model(self.model))
        ref.requires_grad_(False)
        ref.eval()
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(ref, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(ref, self.accelerator)
        return self.accelerator.prepare_model(ref, evaluation_mode=True)

    def create_optimizer(self, model=None):
        """Three parameter groups: heads (``lr_head``), backbone (``learning_rate``), extras (``lr_aux``)."""
        if self.optimizer is None:
            self.optimizer = grouped_optimizer(self)
        return self.optimizer

    def _get_train_sampler(self, dataset=None):
        # rows come from the episode pool; the placeholder dataset only paces the Trainer loop
        return SequentialSampler(dataset if dataset is not None else self.train_dataset)

    # ------------------------------------------------------------------------------------------------ generation
    def _rollout_logits(self, policy, packed) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Act logits `(N, A)` of the policy and (``beta != 0``) of the reference for a no-grad rollout wave: the
        loss's own forwards (``_answer``) without autograd."""
        with torch.no_grad(), self.compute_loss_context_manager():
            output, ref_choice, batch = self._answer(policy, packed, with_reference=self.beta != 0.0)
        ref = self._act_rows(ref_choice, batch) if ref_choice is not None else None
        return self._act_rows(output.choice_logits, batch), ref

    @staticmethod
    def _act_rows(choice_logits: torch.Tensor, batch) -> torch.Tensor:
        """The act question's logits of every decision, `(N, A)`, ``-inf`` beyond its legal options."""
        return act_logits_of(SimpleNamespace(choice_logits=choice_logits), batch)[0].float()

    @contextlib.contextmanager
    def _unwrapped_for_rollout(self):
        """The policy module for no-grad rollout forwards (parameters gathered under DeepSpeed ZeRO-3)."""
        if self._dist.is_zero3:
            with unwrap_model_for_generation(
                self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation
            ) as policy:
                yield policy
        else:
            yield self.accelerator.unwrap_model(self.model)

    def _collate(self, packed):
        """Collate decisions on the device; with ``pack_rows`` several share a row, up to the longest decision."""
        row_tokens = max(len(p) for p in packed) if self.args.pack_rows else None
        return collate_segments(packed, self._pad_id, row_tokens=row_tokens).to(self.accelerator.device)

    @property
    def _fused(self) -> bool:
        """Whether actions are sampled from the loss forward (no separate rollout forward)."""
        return self.args.sample_in_loss_forward and self.num_iterations == 1

    @property
    def _pad_id(self) -> int:
        tok = self._tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    def _generate_and_score_completions(self, generation_batch):
        """Rollouts instead of text generation: one row per decision (``len(generation_batch)`` rows)."""
        n_rows = len(generation_batch)
        mode = "train" if self.model.training else "eval"
        if self._fused:
            # the decisions are observed, answered and sampled inside the loss forward (``_fused_loss``)
            return {"decision_slot": torch.arange(n_rows)}
        with self._unwrapped_for_rollout() as policy:
            was_training = policy.training
            policy.eval()

            def logits_fn(packed):
                return self._rollout_logits(policy, packed)

            rows = self.rollout.collect(n_rows, logits_fn)
            policy.train(was_training)
        self._log_rollout_stats(mode, n_rows)
        return rows_to_inputs(rows, self.args.num_generations)

    def _gathered_means(self, sums: dict[str, tuple[float, float]]) -> dict[str, float]:
        """Global means of (sum, count) pairs across processes, in one gather (keys in the same order on every
        rank)."""
        keys = sorted(sums)
        local = torch.tensor(
            [[sums[k][0], sums[k][1]] for k in keys], dtype=torch.float64, device=self.accelerator.device
        )
        total = self.accelerator.reduce(local, reduction="sum") if self.accelerator.num_processes > 1 else local
        return {k: value / count for k, (value, count) in zip(keys, total.tolist()) if count > 0}

    def _log_rollout_stats(self, mode: str, n_rows: int) -> None:
        stats = self.rollout.pop_stats()
        keys = ["skipped_decisions"] + [
            f"env/{e}/{m}" for e in self.rollout.pool.env_names for m in ("return", "regret", "entropy")
        ]
        sums = {k: (sum(stats.get(k, [])), len(stats.get(k, []))) for k in keys}
        sums["skipped_decisions"] = (sum(stats.get("skipped_decisions", [])), 1.0)
        sums["env_errors"] = (sum(stats.get("env_errors", [])), 1.0)
        now = time.perf_counter()
        elapsed = now - self._last_generation_time if self._last_generation_time is not None else None
        self._last_generation_time = now
        sums["decisions_per_s"] = (n_rows / elapsed if elapsed else 0.0, 1.0 if elapsed else 0.0)
        for key, value in self._gathered_means(sums).items():
            if key == "decisions_per_s":
                value *= self.accelerator.num_processes
            self._metrics[mode][key].append(value)

    # ------------------------------------------------------------------------------------------------------ loss
    def _compute_loss(self, model, inputs):
        if "decision_slot" in inputs:
            return self._fused_loss(model, len(inputs["decision_slot"]))
        output, _, batch = self._answer(model, inputs["packed"], with_reference=False)
        return self._loss_from_output(output, batch, inputs)

    def _answer(self, model, packed, with_reference: bool):
        """The loss forward over ``packed`` (in length-grouped forwards under ``max_batch_tokens``), and with
        ``with_reference`` the reference policy's choice logits without autograd: from the shared frozen trunk when
        it can, else from the frozen copy or, under LoRA, the adapter-disabled model. Returns ``(output,
        ref_choice_logits | None, batch)``."""
        unwrapped = self.accelerator.unwrap_model(model)
        layer = self._shared_trunk_layer

        def forward(batch):
            if with_reference and layer is not None:
                with captured_trunk(unwrapped, layer) as captured:
                    output = model(**batch.model_inputs())
                return output, reference_choice_logits(self.ref_model, captured, batch, layer)
            output = model(**batch.model_inputs())
            if not with_reference:
                return output, None
            with torch.no_grad():
                if self.ref_model is not None:
                    return output, self.ref_model(**batch.model_inputs()).choice_logits
                with unwrapped.disable_adapter():
                    return output, unwrapped(**batch.model_inputs()).choice_logits

        return chunked_forward(forward, self._collate, packed, self.args.max_batch_tokens)

    def _fused_loss(self, model, n_slots: int):
        """``num_iterations == 1``: one forward with autograd answers ``n_slots`` decisions (outcome decisions whose
        episode ended, replayed, then fresh ones); the fresh ones' actions are sampled from its detached act logits
        and their envs stepped, and the same forward's outputs give the loss (as the seed does)."""
        rollout = self.rollout
        for _ in range(1000):
            replay = rollout.pool.take(n_slots)
            wave = rollout.observe_wave(n_slots - len(replay))
            if replay or wave.episodes:
                break
        else:
            raise RuntimeError(
                "rollout: 1000 waves produced no decision; every decision is being skipped (see skipped_decisions)"
            )
        output, ref_choice, batch = self._answer(model, [row.packed for row in replay] + wave.packed, self.beta != 0.0)
        n_replay = len(replay)
        act = self._act_rows(output.choice_logits.detach(), batch)[n_replay:]
        ref = self._act_rows(ref_choice, batch)[n_replay:] if ref_choice is not None else None
        rows = rollout.advance(wave, act, ref)
        inputs = fused_inputs(replay, wave, rows, self.args.num_generations, rollout.env_index)
        self._log_rollout_stats("train", len(batch.questions))
        loss = self._loss_from_output(output, batch, inputs)
        rollout.prefetch(wave.episodes)  # their next decisions, observed while the backward pass runs
        return loss

    def _loss_from_output(self, output, batch, inputs):
        """Clipped policy loss + ``beta`` x exact KL + ``report_w`` x report loss of one forward's outputs."""
        args, device = self.args, self.accelerator.device
        act_logits, legal = act_logits_of(output, batch)  # (N, A)
        logp_all = torch.log_softmax(act_logits.float() / args.temperature, -1)  # (N, A)
        actions = inputs["actions"].to(device)  # (N, k)
        mask = inputs["sample_mask"].to(device)
        logp = logp_all.gather(1, actions)  # (N, k)
        pg_loss, clip_ratio = policy_loss(
            logp,
            inputs["old_logps"].to(device),
            inputs["advantages"].to(device),
            mask,
            self.epsilon_low,
            self.epsilon_high,
        )
        loss = pg_loss
        kl_weight = inputs["kl_weight"].to(device)  # (N,): which rows' KL and reports train here
        kl = torch.zeros(len(inputs["packed"]), device=device)
        if self.beta != 0.0:
            ref = torch.zeros_like(logp_all)
            for i, r in enumerate(inputs["ref_logps"]):
                if r is not None:
                    ref[i, : r.shape[0]] = r.to(device)
            kl = exact_kl(logp_all, ref, legal) * kl_weight  # (N,)
            loss = loss + self.beta * kl.sum() / kl_weight.sum().clamp(min=1.0)
        reports = report_losses(output, batch, inputs["targets"], self._taus)
        terms = [t for ts in reports.values() for t in ts]
        report_loss = torch.stack(terms).mean() if terms else torch.zeros((), device=device)
        loss = loss + args.report_w * report_loss
        # every head takes part in every step (DDP without find_unused_parameters): zero-weight touch
        touch = output.option_logits.sum() + output.noul_logits.sum() + output.quantiles.sum()
        touch = touch + output.score_logits.masked_fill(~torch.isfinite(output.score_logits), 0.0).sum()
        loss = loss + 0.0 * touch

        # KL metrics count the rows whose KL trained here (host tensors: no device sync)
        env_index = torch.where(inputs["kl_weight"] > 0, inputs["env_index"], -1)
        self._record_loss_metrics(pg_loss, kl, report_loss, bool(terms), clip_ratio, reports, env_index)
        return loss

    def _record_loss_metrics(self, pg_loss, kl, report_loss, has_reports, clip_ratio, reports, env_index) -> None:
        """Log the loss terms (one device sync for all of them) and stop on a non-finite term before backward.
        ``env_index`` (host) is -1 for rows whose KL did not train here."""
        names = ["loss/policy", "loss/kl", "loss/report", "clip_ratio"]
        n_kl = float((env_index >= 0).sum())
        values = [pg_loss.detach(), kl.detach().sum() / max(n_kl, 1.0), report_loss.detach(), clip_ratio]
        counts = [1.0, 1.0 if n_kl > 0 else 0.0, 1.0 if has_reports else 0.0, 1.0]
        for q in QTYPES:
            names.append(f"report/{q}")
            values.append(torch.stack(reports[q]).detach().sum() if reports[q] else kl.new_zeros(()))
            counts.append(float(len(reports[q])))
        on_device = env_index.to(kl.device)
        for i, name in enumerate(self.rollout.pool.env_names):
            names.append(f"env/{name}/kl")
            values.append((kl.detach() * (on_device == i)).sum())
            counts.append(float((env_index == i).sum()))
        host = torch.stack([v.float().reshape(()) for v in values]).tolist()
        for name, value in zip(names[:3], host[:3]):
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"step {self.state.global_step}: the {name} term of the loss is {value}; training stopped before "
                    "the backward pass, so no weight was changed"
                )
        mode = "train" if self.model.training else "eval"
        for key, value in self._gathered_means(dict(zip(names, zip(host, counts)))).items():
            self._metrics[mode][key].append(value)

    def training_step(self, model, inputs, num_items_in_batch=None):
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:  # background observations overlap this micro-batch's backward pass, never a callback or a save
            self.rollout.join_prefetch()

    def _clip_grad_norm(self, model):
        grad_norm = super()._clip_grad_norm(model)
        if grad_norm is not None and not math.isfinite(float(grad_norm)):
            raise FloatingPointError(
                f"step {self.state.global_step}: the gradient norm is {float(grad_norm)}; training stopped before the "
                "optimizer step, so no weight was changed"
            )
        return grad_norm

    # ------------------------------------------------------------------------------------------------ model card
    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's model card, tagged with ``alea`` and the env names, with the last evaluation table appended."""
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        super().create_model_card(
            model_name=model_name, dataset_name=dataset_name, tags=tags + ["alea", *self.env_factories]
        )
        table = getattr(self, "last_eval_table", None)
        path = os.path.join(self.args.output_dir, "README.md")
        if table and self.is_world_process_zero() and os.path.exists(path):
            with open(path, "a", encoding="utf-8") as f:
                f.write(
                    "\n## Evaluation\n\nGreedy policy, paired episodes; normalised score is (policy - random) / "
                    "(oracle - random), exp.score the same from exact expected rewards (dense envs), skill is 1 - loss / "
                    "no-skill loss.\n\n```\n" + format_table(table) + "\n```\n"
                )

    # ------------------------------------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Play ``eval_episodes`` greedy episodes per env (split across processes) and log per-env return, oracle
        and random returns, normalised score (and dense envs' expected score and regret) and per-qtype report
        losses and skills (see :func:`~alea_trl.evaluation.evaluate_policy`)."""
        unwrapped = self.accelerator.unwrap_model(self.model)
        sums = evaluation_sums(
            unwrapped,
            self._tokenizer,
            self.env_factories,
            episodes=self.args.eval_episodes,
            seed=self.args.seed + 1,
            max_len=self.args.max_len,
            batch_size=self.args.max_batch,
            shard=(self.accelerator.process_index, self.accelerator.num_processes),
        )
        table = {env: {} for env in self.env_factories} | table_from_means(self._gathered_means(sums))
        self.last_eval_table = table
        metrics = {  # undefined figures (NaN: an env whose oracle ties random, a zero baseline) are not logged
            f"{metric_key_prefix}_{env}/{k}": v for env, row in table.items() for k, v in row.items() if v == v
        }
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


__all__ = ["COMPLETE_MARKER", "POOL_STATE_NAME", "AleaEnvGRPOTrainer", "last_complete_checkpoint"]
