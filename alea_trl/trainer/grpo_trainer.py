"""AleaEnvGRPOTrainer: GRPO over environment decision points, as a TRL ``GRPOTrainer``.

One training step, top to bottom: ``_generate_and_score_completions`` (TRL's generation hook) either plays a rollout
(:mod:`~alea_trl.trainer.rollout`, actions sampled from a no-grad forward) or, when actions are sampled from the loss
forward itself, hands the loss the number of decisions to answer; ``_compute_loss`` answers the decisions
(:mod:`~alea_trl.trainer.forward`) and computes :func:`~alea_trl.trainer.loss.grpo_loss`; the outputs (checkpoints,
evaluation, metrics, the Hub) are :mod:`~alea_trl.trainer.outputs`.

The TRL and transformers internals it relies on (trl pinned to a minor version in pyproject.toml):
- ``GRPOTrainer.__init__``, called behind :func:`~alea_trl.trainer.trl_init.grpo_init_guards`, which rewrite
  ``args.beta``, ``args.sync_ref_model`` and ``args.model_init_kwargs`` for its duration (its reference loading and
  the checks that follow are inline in ``__init__``: no method to override); ``AleaEnvGRPOConfig.__post_init__``
  likewise gives ``GRPOConfig.__post_init__`` a ``num_generations`` that divides every batch size;
- the hooks ``_generate_and_score_completions``, ``_compute_loss`` and ``training_step``; ``_prepare_inputs``'
  buffering of a generation batch across gradient accumulation and ``num_iterations`` (every loss input is a tensor
  or a list of one row per decision), ``_buffered_inputs`` and ``_step`` (saved with checkpoints);
- the attributes ``_metrics`` (averaged by ``GRPOTrainer.log``), ``_logs`` (its completion table), the entropy
  controller's ``entropy_coef``, ``use_adaptive_entropy``, ``_entropy_bonus_enabled``, ``_last_world_entropy``,
  ``_entropy_window_stats``, and ``_tokenizer``, ``_dist.is_zero3``, ``beta``, ``epsilon_low`` / ``epsilon_high``,
  ``num_iterations``, ``log_completions``; ``GRPOTrainer.get_gamma_weights`` / ``get_off_policy_mask`` and
  ``SyncRefModelCallback``;
- ``Trainer._get_train_sampler``, ``_clip_grad_norm``, ``_track_num_input_tokens``, ``_save_checkpoint`` (run with
  ``args.save_total_limit`` unset, so that rotation waits for the commit marker: the rotation is inline in it),
  ``_load_rng_state`` and ``_get_output_dir``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from torch.utils.data import SequentialSampler
from transformers import set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.callbacks import SyncRefModelCallback

from ..collate import pad_token_id
from ..envs import env_factories as make_env_factories
from ..evaluation import table_metrics
from .config import AleaEnvGRPOConfig
from .forward import PolicyForward, even_forwards_for, reference_policy
from .loss import Collectives, ObjectiveSettings, grpo_loss
from .model_setup import (
    apply_train_mode,
    grouped_optimizer,
    lora_config,
    resolve_model,
    resolve_tokenizer,
    warn_if_no_float32_master,
)
from .outputs import (
    check_metric_for_best_model,
    commit_checkpoint,
    complete_checkpoint,
    completion_logs,
    decision_entries,
    gathered_means,
    load_rollout_state,
    loss_sums,
    play_greedy_episodes,
    push_at_init,
    rollout_sums,
    save_evaluation,
    save_lora_extras,
    saved_before_push,
    saved_dense_update,
    staleness_sums,
    stop_if_not_finite,
    token_sums,
    whole_final_model,
    write_model_card,
)
from .rollout import EpisodePool, Rollout, np_rng_for_rank, rows_to_inputs, sampled_forward_inputs
from .trl_init import check_router_aux_loss, grpo_init_guards, rewards_come_from_envs, undo_fused_lm_head


class AleaEnvGRPOTrainer(GRPOTrainer):
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
      base, and ``push_to_hub`` saves locally before any network call (:mod:`~alea_trl.trainer.outputs.hub`).
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

        check_metric_for_best_model(args, factories)
        # the placeholder dataset only paces Trainer's loop: one pass over it is the whole run; evaluation plays envs
        # and never reads its placeholder (Trainer.__init__ refuses an eval_strategy without an eval dataset)
        n_slots = args.generation_batch_size * args.gradient_accumulation_steps * args.num_iterations * args.max_steps
        placeholder = Dataset.from_dict({"decision_slot": list(range(n_slots))})
        guards = grpo_init_guards(model, args, loaded_from_path=isinstance(model_arg, (str, os.PathLike)))
        with guards, push_at_init(args):
            super().__init__(
                model=model,
                reward_funcs=rewards_come_from_envs,
                args=args,
                train_dataset=placeholder,
                eval_dataset=placeholder.select(range(min(1, n_slots))),
                processing_class=processing_class,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
            )
        undo_fused_lm_head(self.accelerator.unwrap_model(self.model))
        self.beta = args.beta  # GRPOTrainer.__init__ saw the guard's beta of 0
        self.objective = ObjectiveSettings.from_args(args, taus, self.epsilon_low, self.epsilon_high)
        self._collectives = Collectives.of(self.accelerator)
        self._logs = completion_logs(args)  # TRL's completion table, sized to one generation batch of actions
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
            result = self._answer(policy, packed, with_reference=self.beta != 0.0)
        return result.act_logits(), result.ref_act_logits()

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
        """Act logits `(N, A)` of the current policy (no gradient) for branch continuations, in the mode of the
        forward that sampled the branched actions (train mode in the loss forward, eval mode in a rollout wave), so a
        backbone with dropout plays its branches with the policy whose actions they value."""
        policy = self.accelerator.unwrap_model(self.model)
        with torch.no_grad(), self.compute_loss_context_manager():
            result = self.policy_forward(policy, policy, packed, with_reference=False)
        return result.act_logits()

    def _generate_and_score_completions(self, generation_batch):
        """Rollouts instead of text generation: one row per decision (``len(generation_batch)`` rows).

        When actions are sampled from the loss forward (``sample_in_loss_forward`` with ``num_iterations == 1``),
        nothing is played here: the batch is ``{"decision_slot": ...}``, one slot per decision that the loss
        forward observes, answers and samples (``_loss_with_sampling``)."""
        n_rows = len(generation_batch)
        mode = "train" if self.model.training else "eval"
        if self._samples_in_loss_forward:
            return {"decision_slot": torch.arange(n_rows)}
        with self._unwrapped_for_rollout() as policy:
            was_training = policy.training
            policy.eval()

            def logits_fn(packed):
                return self._rollout_logits(policy, packed)

            with self.even_forwards.region(self._forward_modules(policy)):
                rows = self.rollout.collect(
                    n_rows, logits_fn, step=self.state.global_step, continuation_logits=self._continuation_logits
                )
            policy.train(was_training)
        self._log_rollout_stats(mode, n_rows)
        inputs = rows_to_inputs(rows, self.rollout.widest)
        self._log_completions(inputs)
        return inputs

    def gathered_means(self, sums: dict[str, tuple[float, float]]) -> dict[str, float]:
        """Global means of per-process ``(sum, count)`` pairs (see
        :func:`~alea_trl.trainer.outputs.metrics.gathered_means`); every process must call it with the same keys."""
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

    def _log_completions(self, inputs: dict) -> None:
        """Add the actions that train in ``inputs`` (all processes') to TRL's completion table; a no-op unless
        ``log_completions`` (see :func:`~alea_trl.trainer.outputs.metrics.decision_entries`)."""
        if not self.log_completions:
            return
        entries = gather_object(decision_entries(inputs, self.rollout.pool.env_names, self._tokenizer))
        for prompt, completion, reward, advantage, env in entries:
            self._logs["prompt"].append(prompt)
            self._logs["completion"].append(completion)
            self._logs["rewards"]["reward"].append(reward)
            self._logs["advantages"].append(advantage)
            self._logs["extra"]["env"].append(env)

    # ------------------------------------------------------------------------------------------------------ loss
    def _compute_loss(self, model, inputs):
        if "decision_slot" in inputs:  # actions are sampled from this forward (see _generate_and_score_completions)
            return self._loss_with_sampling(model, len(inputs["decision_slot"]))
        result = self._answer(model, inputs["packed"], with_reference=False)
        return self._loss(result, inputs)

    def _answer(self, model, packed, with_reference: bool):
        """``packed`` answered by ``model`` (and the reference), see
        :class:`~alea_trl.trainer.forward.PolicyForward`."""
        return self.policy_forward(model, self.accelerator.unwrap_model(model), packed, with_reference)

    def _loss_with_sampling(self, model, n_slots: int):
        """``num_iterations == 1``: one forward with autograd answers ``n_slots`` decisions (outcome decisions whose
        episode ended, replayed, then fresh ones); the fresh ones' actions are sampled from its detached act logits
        and their envs stepped, and the same forward's outputs give the loss."""
        rollout = self.rollout
        replay, wave = rollout.replays_and_wave(n_slots)
        result = self._answer(model, [row.packed for row in replay] + wave.packed, self.beta != 0.0)
        act = result.act_logits()[len(replay) :]
        ref = result.ref_act_logits()
        ref = ref[len(replay) :] if ref is not None else None
        with self.even_forwards.region(self._forward_modules()):  # branch continuations
            rows = rollout.advance(
                wave, act, ref, step=self.state.global_step, continuation_logits=self._continuation_logits
            )
        inputs = sampled_forward_inputs(replay, wave, rows, rollout.widest, rollout.env_index)
        self._log_completions(inputs)
        self._log_rollout_stats("train", len(result.batch.questions))
        loss = self._loss(result, inputs)
        rollout.prefetch(wave.episodes)  # their next decisions, observed while the backward pass runs
        return loss

    def _forward_modules(self, policy=None) -> dict:
        """The modules whose forwards :class:`~alea_trl.trainer.forward.EvenForwards` keeps in step."""
        policy = policy if policy is not None else self.accelerator.unwrap_model(self.model)
        return {1: policy} | ({2: self.ref_model} if self.ref_model is not None else {})

    def _loss(self, result, inputs):
        """:func:`~alea_trl.trainer.loss.grpo_loss` of one forward's outputs (plus the zero-weight outputs of dummy
        forwards, see :mod:`~alea_trl.trainer.forward.even`); logs its terms and the forward's tokens, and stops on
        a non-finite term before the backward pass."""
        mode = "train" if self.model.training else "eval"
        loss, terms = grpo_loss(
            result.output,
            result.batch,
            inputs,
            self.objective,
            entropy_coef=self._entropy_coef_now(),
            collectives=self._collectives,
        )
        self._track_entropy(terms.entropy_bonus, mode)
        # KL metrics count the rows whose KL trained here (host tensors: no device sync)
        env_index = torch.where(inputs["kl_report_mask"] > 0, inputs["env_index"], -1)
        sums = loss_sums(terms, env_index, self.rollout.pool.env_names)
        stop_if_not_finite(sums, self.state.global_step)
        sums |= token_sums(inputs["packed"], result.padded_tokens, self.args.include_num_input_tokens_seen == "all")
        sums |= staleness_sums(inputs, self.state.global_step)
        # as TRL's GRPOTrainer does: the running total of all processes' tokens, logged as ``num_tokens``
        means = self._log_metrics(mode, sums)
        self._metrics[mode].pop("tokens/counted")
        self.state.num_input_tokens_seen += round(means["tokens/counted"] * self.accelerator.num_processes)
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]
        return loss if result.dummy_loss is None else loss + result.dummy_loss

    def _entropy_coef_now(self) -> float | None:
        """The coefficient of this micro-batch's entropy bonus; ``None`` when no bonus is configured (the state is
        ``GRPOTrainer``'s adaptive controller's, see :mod:`~alea_trl.trainer.loss.policy`)."""
        if not self._entropy_bonus_enabled:
            return None
        if self.use_adaptive_entropy:  # TRL: the bonus applies while the last measured entropy is at most the target
            return self.entropy_coef if self._last_world_entropy <= self.args.entropy_target else 0.0
        return self.entropy_coef

    def _track_entropy(self, bonus: tuple[torch.Tensor, torch.Tensor] | None, mode: str) -> None:
        """Accumulate a micro-batch's ``(entropy sum, decisions)`` of the bonus; at an optimizer step, update the
        adaptive coefficient from all processes' window and log ``entropy_coef`` (as ``GRPOTrainer``)."""
        if bonus is None or mode != "train":
            return
        if self.use_adaptive_entropy:
            stats = torch.stack([b.detach().float() for b in bonus])
            window = self._entropy_window_stats
            self._entropy_window_stats = stats if window is None else window + stats
            if self.accelerator.sync_gradients:
                total = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                world_entropy = (total[0] / total[1].clamp(min=1.0)).item()
                args = self.args
                if world_entropy <= args.entropy_target:
                    self.entropy_coef = min(self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
                else:
                    self.entropy_coef = max(self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
                self._last_world_entropy = world_entropy
                self._entropy_window_stats = None
        if self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)

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

    # ------------------------------------------------------------------------------------ checkpoints and resume
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Trainer's ``train``; ``resume_from_checkpoint=True`` picks the newest *complete* checkpoint (one whose
        commit marker was written), and a path to an incomplete one is refused
        (:mod:`~alea_trl.trainer.outputs.checkpointing`)."""
        return super().train(
            resume_from_checkpoint=complete_checkpoint(resume_from_checkpoint, self.args.output_dir),
            trial=trial,
            ignore_keys_for_eval=ignore_keys_for_eval,
            **kwargs,
        )

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint, plus the rollout state of every rank, then a commit marker written last (atomically,
        after all ranks are done); older checkpoints are rotated out only once the new one is complete, so a process
        killed at any moment leaves its newest *complete* checkpoint on disk."""
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # Trainer would rotate before the marker
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        run_dir = self._get_output_dir(trial=trial)
        output_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        commit_checkpoint(self, output_dir, run_dir, limit)

    def _load_rng_state(self, checkpoint):
        super()._load_rng_state(checkpoint)
        state = load_rollout_state(checkpoint, self.accelerator.process_index) if checkpoint is not None else None
        if state is not None:
            self._check_buffered_update(state, checkpoint)
            self.rollout.load_state_dict(state)
            self._buffered_inputs, self._step = state.get("buffered_inputs"), state.get("micro_step", 0)

    def _check_buffered_update(self, state: dict, checkpoint: str) -> None:
        """A checkpoint saved mid-buffer (``num_iterations > 1``) resumes by training its buffered rows again; their
        dense rows hold advantages or log-prob steps according to the ``dense_update`` they were made under, so a
        resume under another update is refused rather than fitting one as the other."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        if state.get("buffered_inputs") is None or state.get("micro_step", 0) % generate_every == 0:
            return  # the next step generates new rows: any dense_update may take over
        made_under = state.get("dense_update") or saved_dense_update(checkpoint)
        if made_under != self.args.dense_update:
            raise ValueError(
                f"AleaEnvGRPOTrainer: field 'dense_update': {checkpoint} was saved part way through a buffer of rows "
                f"made under dense_update={made_under!r}, and this run sets {self.args.dense_update!r}; resume with "
                f"dense_update={made_under!r} (or from a checkpoint at the end of a buffer)"
            )

    # -------------------------------------------------------------------------------------------------- evaluation
    def evaluate(
        self,
        eval_dataset=None,
        ignore_keys=None,
        metric_key_prefix: str = "eval",
        *,
        episodes: int | dict[str, int] | None = None,
        seed: int | None = None,
    ) -> dict[str, float]:
        """Play greedy episodes of every env (split across processes) and log per env the return, the oracle and random
        returns, the normalised score (and dense envs' expected score and regret) and per-qtype report losses and
        skills (see :func:`~alea_trl.evaluation.evaluation_sums`), and their mean normalised score
        (``<prefix>_normalized_score``); the table is kept as ``last_eval_table``, its episodes and seed as
        ``last_eval_settings``. Called by Trainer every ``eval_steps`` with ``eval_strategy="steps"``.

        Args:
            metric_key_prefix (`str`, defaults to `"eval"`): prefix of the logged keys (``eval_<env>/<figure>``).
            episodes (`int` or `dict[str, int]`, *optional*): episodes per env, one count for all or one per env
                (default ``args.eval_episodes``).
            seed (`int`, *optional*): seed of the evaluation episodes (default ``args.seed + 1``).
        """
        unwrapped = self.accelerator.unwrap_model(self.model)
        was_training = unwrapped.training
        unwrapped.eval()
        episodes = self.args.eval_episodes if episodes is None else episodes
        seed = self.args.seed + 1 if seed is None else seed
        self.last_eval_table, self.last_eval_settings = play_greedy_episodes(
            unwrapped, self._tokenizer, self.env_factories, self.args, self.accelerator, self.even_forwards,
            episodes, seed,
        )  # fmt: skip
        metrics = table_metrics(self.last_eval_table, metric_key_prefix)
        self.log(metrics)
        unwrapped.train(was_training)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # ---------------------------------------------------------------------------------------------------- outputs
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Trainer's ``save_model``; the final save of an FSDP run with sharded state dicts writes whole weights, and a
        LoRA output also gets the Alea ``config.json`` and names its base (:mod:`~alea_trl.trainer.outputs.hub`)."""
        output_dir = output_dir or self.args.output_dir
        with whole_final_model(self, _internal_call):
            super().save_model(output_dir, _internal_call)
            save_lora_extras(self, output_dir)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None) -> None:
        """Write the Alea model card to ``output_dir/README.md`` (see
        :func:`~alea_trl.trainer.outputs.hub.write_model_card`); ``dataset_name`` is refused: the data are the envs."""
        write_model_card(self, "grpo", model_name=model_name, dataset_name=dataset_name, tags=tags)

    def save_evaluation(self, **settings) -> None:
        """Write ``eval_results.json``: the last evaluation's figures and how they were played (episodes, seed, envs
        and the given ``settings``), so ``recipes/evaluate.py`` can play the same episodes again."""
        save_evaluation(self, **settings)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True, **kwargs):
        """Save the final model, tokenizer and card in ``output_dir``, then ``Trainer.push_to_hub``; a Hub that cannot
        be reached or refuses raises :class:`~alea_trl.trainer.outputs.hub.HubPushError` naming the endpoint and the
        saved folder."""
        with saved_before_push(self, model_name=kwargs.get("model_name"), tags=kwargs.get("tags")):
            return super().push_to_hub(commit_message=commit_message, blocking=blocking, **kwargs)


__all__ = ["AleaEnvGRPOTrainer"]
