"""AleaEnvGRPOTrainer: GRPO over environment decision points, as a TRL ``GRPOTrainer``.

The TRL and transformers internals it relies on (trl pinned to a minor version in pyproject.toml):
``GRPOTrainer.__init__`` (behind ``trl_init``'s guards); the hooks ``_generate_and_score_completions`` and
``_compute_loss`` (overridden); ``_prepare_inputs``' buffering of a generation batch across gradient accumulation
and ``num_iterations`` (every loss input is a tensor or list of one row per decision); the attributes ``_metrics``
(averaged by ``GRPOTrainer.log``), ``_logs`` (its completion table), the entropy controller's ``entropy_coef``,
``use_adaptive_entropy``, ``_entropy_bonus_enabled``, ``_last_world_entropy``, ``_entropy_window_stats``, and
``_tokenizer``, ``_dist.is_zero3``, ``beta``, ``epsilon_low`` / ``epsilon_high``, ``num_iterations``;
``GRPOTrainer.get_gamma_weights`` / ``get_off_policy_mask`` and ``SyncRefModelCallback``;
``Trainer._get_train_sampler``, ``_clip_grad_norm``, ``_track_num_input_tokens``, and (in ``checkpointing``)
``_save_checkpoint``, ``_load_rng_state``, ``_get_output_dir``, ``_step``, ``_buffered_inputs``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import torch
from datasets import Dataset
from torch.utils.data import SequentialSampler
from transformers import set_seed
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.callbacks import SyncRefModelCallback

from ..collate import pad_token_id
from ..envs import env_factories as make_env_factories
from .checkpointing import COMPLETE_MARKER, POOL_STATE_NAME, CrashSafeCheckpoints, last_complete_checkpoint
from .completions_log import CompletionsLog
from .config import AleaEnvGRPOConfig
from .entropy import EntropyControl
from .even_forwards import even_forwards_for
from .forward import PolicyForward, act_rows
from .greedy_evaluation import GreedyEvaluation, periodic_evaluation
from .hub import HubOutputs, push_at_init
from .loss import grpo_loss
from .loss_inputs import rows_to_inputs, sampled_forward_inputs
from .metrics import gathered_means, loss_sums, rollout_sums, staleness_sums, stop_if_not_finite, token_sums
from .model_setup import (
    apply_train_mode,
    grouped_optimizer,
    lora_config,
    resolve_model,
    resolve_tokenizer,
)
from .policy_loss import Collectives, PolicyObjective
from .pool import EpisodePool, np_rng_for_rank
from .precision import warn_if_no_float32_master
from .reference import reference_policy
from .rollout import Rollout
from .trl_init import check_router_aux_loss, grpo_init_guards, rewards_come_from_envs, undo_fused_lm_head
from .whole_final_model import WholeFinalModel


class AleaEnvGRPOTrainer(
    WholeFinalModel, HubOutputs, CrashSafeCheckpoints, EntropyControl, CompletionsLog, GreedyEvaluation, GRPOTrainer
):
    """GRPO over decision points of environments, without text generation.

    What differs from [`~trl.GRPOTrainer`]:
    - there is no dataset and no reward function: an episode pool per process (``eps_per_env`` episodes of each env in
      ``args.envs``) emits decisions; one row of a generation batch is one decision;
    - no ``generate``: actions are sampled from the act head (k per dense decision, one per outcome decision), from
      the detached logits of the loss forward itself when ``num_iterations == 1`` (``sample_in_loss_forward``), else
      from one packed no-grad forward per wave of decisions;
    - advantages: dense decisions use the exact expected rewards of their k actions (group-normalised); outcome
      decisions are replayed when their episode ends, with the per-env normalised return;
    - the loss is the policy loss over sampled actions (TRL's ``loss_type``, off-policy and high-entropy masks and
      entropy bonus, read over actions) + ``beta`` x exact KL over the legal actions + ``report_w`` x proper-scoring
      report losses against the env oracles;
    - checkpoints also carry the episode pool, so ``resume_from_checkpoint`` continues the same episodes;
    - ``evaluate()`` plays ``eval_episodes`` greedy episodes per env and logs return, normalised score and report
      losses.
    - the model card is Alea's (quick start, envs' questions, evaluation as ``model-index``), LoRA outputs name their
      base, and ``push_to_hub`` saves locally before any network call (``hub.py``).
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
        set_seed(args.seed)
        model_arg, model = model, resolve_model(model, args)
        check_router_aux_loss(model, args)
        taus = list(model.config.taus)
        processing_class = resolve_tokenizer(model, processing_class, args, model_arg)
        if args.train_mode == "lora":
            peft_config = lora_config(model, args, base=peft_config)
        elif peft_config is not None:
            raise ValueError("AleaEnvGRPOTrainer: field 'peft_config': only used with train_mode='lora'")
        else:
            apply_train_mode(model, args.train_mode, args.tail_k)

        # the placeholder dataset only paces Trainer's loop: one pass over it is the whole run
        n_slots = args.generation_batch_size * args.gradient_accumulation_steps * args.num_iterations * args.max_steps
        placeholder = Dataset.from_dict({"decision_slot": list(range(n_slots))})
        guards = grpo_init_guards(model, args, loaded_from_path=isinstance(model_arg, (str, os.PathLike)))
        with guards, periodic_evaluation(args, factories), push_at_init(args):
            super().__init__(
                model=model,
                reward_funcs=rewards_come_from_envs,
                args=args,
                train_dataset=placeholder,
                processing_class=processing_class,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
            )
        undo_fused_lm_head(self.accelerator.unwrap_model(self.model))
        self.beta = args.beta  # GRPOTrainer.__init__ saw the guard's beta of 0
        self._taus = taus
        self._objective, self._collectives = PolicyObjective.from_args(args), Collectives.of(self.accelerator)
        self._reset_completion_logs()
        unwrapped, sharded = (
            self.accelerator.unwrap_model(self.model),
            (self.is_deepspeed_enabled, self.is_fsdp_enabled),
        )
        self.ref_model, shared = reference_policy(unwrapped, self.accelerator, args, *sharded)
        if args.sync_ref_model:  # TR-DPO, as GRPOTrainer adds it (its __init__ saw sync_ref_model off: trl_init)
            self.add_callback(SyncRefModelCallback(ref_model=self.ref_model, accelerator=self.accelerator))
        rank = self.accelerator.process_index
        pool = EpisodePool(factories, args.eps_per_env, np_rng_for_rank(args.seed, rank), args.outcome_baseline_window)
        self.rollout = Rollout(pool, self._tokenizer, args, seed=args.seed * 1_000_003 + rank)
        pad_id, sharded_model = pad_token_id(self._tokenizer), self._dist.is_zero3 or self.is_fsdp_enabled
        self.even_forwards = even_forwards_for(
            sharded_model, self.accelerator.device, self.rollout.observer, pad_id, factories
        )
        forward_args = (args.pack_rows, args.max_batch_tokens, self.ref_model, shared, self.even_forwards)
        self.policy_forward = PolicyForward(self.accelerator.device, pad_id, *forward_args)
        self.rollout.continuation_logits = self._continuation_logits
        self.env_factories = factories
        self._last_generation_time = None

    # ------------------------------------------------------------------------------------------------------ set-up
    def create_optimizer(self, model=None):
        """Three parameter groups: heads (``lr_head``), backbone (``learning_rate``), extras (``lr_aux``)."""
        if self.optimizer is None:
            self.optimizer = grouped_optimizer(self)
            warn_if_no_float32_master(self.model, self.optimizer, self.is_deepspeed_enabled)
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
        ref = act_rows(ref_choice, batch) if ref_choice is not None else None
        return act_rows(output.choice_logits, batch), ref

    @contextlib.contextmanager
    def _unwrapped_for_rollout(self):
        """The policy module for no-grad rollout forwards (parameters gathered under DeepSpeed ZeRO-3)."""
        if not self._dist.is_zero3:
            yield self.accelerator.unwrap_model(self.model)
            return
        gather = self.args.ds3_gather_for_generation
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator, gather_deepspeed3_params=gather) as p:
            yield p

    @property
    def _samples_in_loss_forward(self) -> bool:
        """Whether actions are sampled from the loss forward (no separate rollout forward)."""
        return self.args.sample_in_loss_forward and self.num_iterations == 1

    def _continuation_logits(self, packed) -> torch.Tensor:
        """Act logits `(N, A)` of the current policy (eval mode, no gradient) for branch continuations."""
        policy = self.accelerator.unwrap_model(self.model)
        was_training = policy.training
        policy.eval()
        with torch.no_grad(), self.compute_loss_context_manager():
            output, _, batch = self.policy_forward(policy, policy, packed, with_reference=False)
        policy.train(was_training)
        return act_rows(output.choice_logits, batch)

    def _generate_and_score_completions(self, generation_batch):
        """Rollouts instead of text generation: one row per decision (``len(generation_batch)`` rows)."""
        n_rows = len(generation_batch)
        mode = "train" if self.model.training else "eval"
        if self._samples_in_loss_forward:
            # the decisions are observed, answered and sampled inside the loss forward (``_loss_with_sampling``)
            return {"decision_slot": torch.arange(n_rows)}
        with self._unwrapped_for_rollout() as policy:
            was_training = policy.training
            policy.eval()

            def logits_fn(packed):
                return self._rollout_logits(policy, packed)

            self.rollout.step = self.state.global_step
            with self.even_forwards.region(self._forward_modules(policy)):
                rows = self.rollout.collect(n_rows, logits_fn)
            policy.train(was_training)
        self._log_rollout_stats(mode, n_rows)
        inputs = rows_to_inputs(rows, self.rollout.widest)
        self._log_completions(inputs)
        return inputs

    def gathered_means(self, sums: dict[str, tuple[float, float]]) -> dict[str, float]:
        """Global means of per-process ``(sum, count)`` pairs (see :func:`~alea_trl.trainer.metrics.gathered_means`);
        every process must call it with the same keys."""
        return gathered_means(self.accelerator, sums)

    def _log_metrics(self, mode: str, sums: dict[str, tuple[float, float]]) -> dict[str, float]:
        means = self.gathered_means(sums)
        for key, value in means.items():
            self._metrics[mode][key].append(value)
        return means

    def _log_rollout_stats(self, mode: str, n_rows: int) -> None:
        sums = rollout_sums(self.rollout.pop_stats(), self.rollout.pool.env_names)
        now = time.perf_counter()
        elapsed = now - self._last_generation_time if self._last_generation_time is not None else None
        self._last_generation_time = now
        # decisions per second of all processes together: each process's rate, averaged, times their number
        rate = n_rows / elapsed * self.accelerator.num_processes if elapsed else 0.0
        sums["decisions_per_s"] = (rate, 1.0 if elapsed else 0.0)
        self._log_metrics(mode, sums)

    # ------------------------------------------------------------------------------------------------------ loss
    def _compute_loss(self, model, inputs):
        if "decision_slot" in inputs:
            return self._loss_with_sampling(model, len(inputs["decision_slot"]))
        output, _, batch = self._answer(model, inputs["packed"], with_reference=False)
        return self._loss(output, batch, inputs, self.policy_forward.padded_tokens, self.policy_forward.dummy_loss)

    def _answer(self, model, packed, with_reference: bool):
        """``packed`` answered by ``model`` (and the reference): see :class:`~alea_trl.trainer.forward.PolicyForward`."""
        return self.policy_forward(model, self.accelerator.unwrap_model(model), packed, with_reference)

    def _loss_with_sampling(self, model, n_slots: int):
        """``num_iterations == 1``: one forward with autograd answers ``n_slots`` decisions (outcome decisions whose
        episode ended, replayed, then fresh ones); the fresh ones' actions are sampled from its detached act logits
        and their envs stepped, and the same forward's outputs give the loss (as the seed does)."""
        rollout = self.rollout
        replay, wave = rollout.replays_and_wave(n_slots)
        output, ref_choice, batch = self._answer(model, [row.packed for row in replay] + wave.packed, self.beta != 0.0)
        forward = self.policy_forward  # its padded_tokens / dummy_loss now: branch continuations run it again
        padded_tokens, dummy_loss = forward.padded_tokens, forward.dummy_loss
        act = act_rows(output.choice_logits.detach(), batch)[len(replay) :]
        ref = act_rows(ref_choice, batch)[len(replay) :] if ref_choice is not None else None
        rollout.step = self.state.global_step
        with self.even_forwards.region(self._forward_modules()):  # branch continuations
            rows = rollout.advance(wave, act, ref)
        inputs = sampled_forward_inputs(replay, wave, rows, rollout.widest, rollout.env_index)
        self._log_completions(inputs)
        self._log_rollout_stats("train", len(batch.questions))
        loss = self._loss(output, batch, inputs, padded_tokens, dummy_loss)
        rollout.prefetch(wave.episodes)  # their next decisions, observed while the backward pass runs
        return loss

    def _forward_modules(self, policy=None) -> dict:
        """The modules whose forwards :class:`~alea_trl.trainer.even_forwards.EvenForwards` keeps in step."""
        policy = policy if policy is not None else self.accelerator.unwrap_model(self.model)
        return {1: policy} | ({2: self.ref_model} if self.ref_model is not None else {})

    def _loss(self, output, batch, inputs, padded_tokens: int, dummy_loss=None):
        """:func:`~alea_trl.trainer.loss.grpo_loss` of one forward's outputs (plus the zero-weight outputs of dummy
        forwards, see :mod:`~alea_trl.trainer.even_forwards`); logs its terms and the forward's tokens, and stops on
        a non-finite term before the backward pass."""
        mode = "train" if self.model.training else "eval"
        loss, terms = grpo_loss(
            output,
            batch,
            inputs,
            temperature=self.args.temperature,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            report_w=self.args.report_w,
            taus=self._taus,
            delta=self.args.delta,
            outcome_weight=self.args.outcome_loss_weight,
            objective=self._objective,
            entropy_coef=self._entropy_coef_now(),
            collectives=self._collectives,
            dense_update=self.args.dense_update,
        )
        self._track_entropy(terms.entropy_bonus, mode)
        # KL metrics count the rows whose KL trained here (host tensors: no device sync)
        env_index = torch.where(inputs["kl_report_mask"] > 0, inputs["env_index"], -1)
        sums = loss_sums(terms, env_index, self.rollout.pool.env_names)
        stop_if_not_finite(sums, self.state.global_step)
        sums |= token_sums(inputs["packed"], padded_tokens, self.args.include_num_input_tokens_seen == "all")
        sums |= staleness_sums(inputs, self.state.global_step)
        # as TRL's GRPOTrainer does: the running total of all processes' tokens, logged as ``num_tokens``
        means = self._log_metrics(mode, sums)
        self._metrics[mode].pop("tokens/counted")
        self.state.num_input_tokens_seen += round(means["tokens/counted"] * self.accelerator.num_processes)
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]
        return loss if dummy_loss is None else loss + dummy_loss

    def _track_num_input_tokens(self, inputs):
        """Trainer counts ``input_ids`` of the dataloader's batch; ours holds decision slots. The loss forward counts
        the decisions' tokens instead (``_loss``)."""

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


__all__ = ["COMPLETE_MARKER", "POOL_STATE_NAME", "AleaEnvGRPOTrainer", "last_complete_checkpoint"]
