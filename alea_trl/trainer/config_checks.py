"""Checks of the GRPOConfig fields an `AleaEnvGRPOConfig` inherits: every field either acts on decision training or
is refused with a `ValueError` naming it (see docs/config_fields.md for the status of every field).

Design decisions:
1. A refused field is one with no meaning for decisions answered in one forward pass (text generation, vLLM, tools,
   multi-reward aggregation). Its default (or its "off" value) is accepted; anything else raises, before
   ``GRPOConfig.__post_init__`` runs, so the message names the field the user set rather than one TRL derives from it.
2. Fields whose meaning depends on another field (``delta`` only clips in the ratio-clipping losses, the
   ``sapo_*`` / ``vespo_*`` / adaptive-entropy / reference-sync / completion-logging knobs only act when their switch
   is on) are refused when set without it: TRL would accept and ignore them.
3. Messages have the project's form ``AleaEnvGRPOConfig: field '<name>': <why>; <fix>``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any


LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_LOSSES = ("grpo", "dapo", "dr_grpo", "bnpo", "luspo")  # the losses whose ratio term `delta` clamps
IS_LEVELS = ("token", "sequence")
SCALE_REWARDS = ("group", "batch", "none")

_VLLM = "vLLM generates text; Alea decisions are answered by heads in one forward pass and no text is generated"
_NO_TEXT = "no text is generated: each decision is answered by one forward pass of the heads"
_NO_TOKENS = "an action is one option drawn once per decision, not a sequence of generated tokens"
_VLLM_FIELDS = (
    "vllm_mode",
    "vllm_model_impl",
    "vllm_enable_sleep_mode",
    "vllm_structured_outputs_regex",
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout",
    "vllm_group_port",
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "vllm_tensor_parallel_size",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_cap",
)

# field -> why it has no meaning for decisions; only its default is accepted
DEFAULT_ONLY: dict[str, str] = {
    "use_vllm": _VLLM,
    **{name: f"it configures vLLM, and {_VLLM}" for name in _VLLM_FIELDS},
    "use_transformers_continuous_batching": f"continuous batching schedules text generation; {_NO_TEXT}",
    "use_transformers_paged": f"(deprecated alias of use_transformers_continuous_batching) {_NO_TEXT}",
    "transformers_continuous_batching_config": f"continuous batching schedules text generation; {_NO_TEXT}",
    "cast_lm_head_to_fp32": "Alea models have no LM head (actions come from the choice head)",
    "max_completion_length": f"{_NO_TOKENS}; the longest decision is `max_len`",
    "repetition_penalty": f"{_NO_TOKENS}, so there are no earlier tokens to penalise",
    "cache_implementation": f"{_NO_TEXT}, so there is no generation cache",
    "max_tool_calling_iterations": f"{_NO_TEXT}; there are no tool calls (environments are stepped by the trainer)",
    "mask_truncated_completions": "nothing is truncated: a decision longer than `max_len` resets its episode and is "
    "counted in `skipped_decisions`",
    "num_generations_eval": "`evaluate()` plays greedy episodes (`eval_episodes`), it samples no groups",
    "multi_objective_aggregation": "each decision has one reward source (its environment), nothing to aggregate",
    "use_bias_correction_kl": "the KL is exact over the legal actions (no sampled estimator), so its gradient is "
    "already the unbiased reverse-KL gradient that the correction exists to give",
    "remove_unused_columns": "the placeholder dataset's only column ('decision_slot') paces the loop; removing it "
    "would leave no rows",
}

# field -> (accepted values, why other values have no meaning, how to fix)
ALLOWED: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "generation_kwargs": (lambda v: not v, f"{_NO_TEXT}, so there is no GenerationConfig", "leave it unset"),
    "chat_template_kwargs": (
        lambda v: not v,
        "decisions are packed by alea_trl.packing; no chat template is applied",
        "leave it unset",
    ),
    "pad_to_multiple_of": (
        lambda v: v is None or (isinstance(v, str) and v.lower() in ("auto", "none", "null")),
        "decisions are packed into rows up to the longest decision of a forward; padding to a multiple is not "
        "implemented",
        "leave it at 'auto' (or None); `max_batch_tokens` bounds a forward's padded size",
    ),
    "router_aux_loss_coef": (
        lambda v: v is None or v == 0.0,
        "the Alea forward does not return a Mixture-of-Experts router loss, so no load-balancing term can be added",
        "leave it unset or 0.0",
    ),
    "reward_weights": (
        lambda v: v is None or (isinstance(v, (list, tuple)) and len(v) == 1 and _finite(v[0])),
        "there is one reward source (the environment's reward), so at most one finite weight",
        "give one weight, e.g. [1.0], or leave it unset",
    ),
}

# field -> (switch field, switch value, what the switch is); the field only acts when the switch is on
NEEDS_SWITCH: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "ref_model_mixup_alpha": ("sync_ref_model", bool, "sync_ref_model=True"),
    "ref_model_sync_steps": ("sync_ref_model", bool, "sync_ref_model=True"),
    "entropy_coef_min": ("use_adaptive_entropy", bool, "use_adaptive_entropy=True"),
    "entropy_coef_max": ("use_adaptive_entropy", bool, "use_adaptive_entropy=True"),
    "entropy_coef_delta": ("use_adaptive_entropy", bool, "use_adaptive_entropy=True"),
    "entropy_target": ("use_adaptive_entropy", bool, "use_adaptive_entropy=True"),
    "num_completions_to_print": ("log_completions", bool, "log_completions=True"),
    "log_unique_prompts": ("log_completions", bool, "log_completions=True"),
    "log_completions_hub_repo": ("log_completions", bool, "log_completions=True"),
    "sapo_temperature_neg": ("loss_type", lambda v: v == "sapo", "loss_type='sapo'"),
    "sapo_temperature_pos": ("loss_type", lambda v: v == "sapo", "loss_type='sapo'"),
    "vespo_k_pos": ("loss_type", lambda v: v == "vespo", "loss_type='vespo'"),
    "vespo_lambda_pos": ("loss_type", lambda v: v == "vespo", "loss_type='vespo'"),
    "vespo_k_neg": ("loss_type", lambda v: v == "vespo", "loss_type='vespo'"),
    "vespo_lambda_neg": ("loss_type", lambda v: v == "vespo", "loss_type='vespo'"),
    "delta": ("loss_type", lambda v: v in CLIPPED_LOSSES, f"a ratio-clipping loss_type {CLIPPED_LOSSES}"),
}


def _fail(name: str, why: str, fix: str):
    raise ValueError(f"AleaEnvGRPOConfig: field '{name}': {why}; {fix}")


def _defaults(config) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(type(config)):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def check_inherited_fields(config) -> None:
    """Refuse the GRPOConfig fields that are set to a value with no meaning for decisions. Runs before
    ``GRPOConfig.__post_init__`` (raw values)."""
    defaults = _defaults(config)
    for name, why in DEFAULT_ONLY.items():
        value = getattr(config, name)
        if value != defaults[name]:
            _fail(name, f"{why}; got {value!r}", f"leave it at its default ({defaults[name]!r})")
    for name, (ok, why, fix) in ALLOWED.items():
        value = getattr(config, name)
        if not ok(value):
            _fail(name, f"{why}; got {value!r}", fix)
    for name, (switch, on, what) in NEEDS_SWITCH.items():
        value = getattr(config, name)
        if value != defaults[name] and not _off(config, name, value) and not on(getattr(config, switch)):
            _fail(
                name,
                f"only acts with {what} (here {switch}={getattr(config, switch)!r}); got {value!r}",
                f"set {what} or leave {name} at its default ({defaults[name]!r})",
            )
    _check_epsilons(config, defaults)


def check_process_group_backend(config) -> None:
    """A DeepSpeed launch of several processes on a machine without an accelerator needs ``ddp_backend="gloo"``.

    accelerate picks a process-group backend from the device: on CPU with ``use_cpu=False`` (as DeepSpeed runs) it
    picks none, counts one process, and DeepSpeed's batch check then fails deep inside ``deepspeed.initialize``
    (``train_batch_size 4 != 4 * 1 * 2``). Refused here, at once, naming the flag. On GPUs the flag stays unset:
    accelerate takes NCCL, and gloo would replace it.
    """
    import torch

    deepspeed = bool(config.deepspeed) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    if deepspeed and several and not accelerator and not config.use_cpu and config.ddp_backend is None:
        _fail(
            "ddp_backend",
            "DeepSpeed over several processes on a machine without an accelerator needs a CPU process-group backend "
            "(accelerate picks none here, counts one process, and DeepSpeed's batch check fails)",
            "add --ddp_backend gloo (ddp_backend='gloo'); on GPUs leave it unset so that NCCL is used",
        )


def _check_epsilons(config, defaults: dict[str, Any]) -> None:
    """`epsilon` / `epsilon_high` set for a loss that does not read them (as TRL: cispo reads `epsilon` only as the
    fallback of `epsilon_high`, its weight cap; sapo and vespo read neither)."""
    loss = config.loss_type
    if config.epsilon != defaults["epsilon"] and (
        loss in ("sapo", "vespo") or (loss == "cispo" and config.epsilon_high is not None)
    ):
        _fail(
            "epsilon",
            f"loss_type={loss!r} does not clip with it (got {config.epsilon!r})",
            "leave it at its default or pick a ratio-clipping loss_type",
        )
    if config.epsilon_high is not None and loss in ("sapo", "vespo"):
        _fail(
            "epsilon_high",
            f"loss_type={loss!r} does not clip with it (got {config.epsilon_high!r})",
            "leave it unset or pick a ratio-clipping loss_type or 'cispo'",
        )


def check_resolved_fields(config) -> None:
    """Value checks of the fields the trainer acts on, after ``GRPOConfig.__post_init__`` (resolved values)."""
    checks = [
        ("loss_type", config.loss_type in LOSS_TYPES, f"one of {LOSS_TYPES}"),
        ("importance_sampling_level", config.importance_sampling_level in IS_LEVELS, f"one of {IS_LEVELS}"),
        ("scale_rewards", config.scale_rewards in SCALE_REWARDS, f"one of {SCALE_REWARDS} (or True / False)"),
        ("temperature", _finite(config.temperature) and config.temperature > 0, "a number > 0"),
        ("top_k", _is_int(config.top_k) and config.top_k >= 0, "an integer >= 0 (0: off)"),
        ("top_p", _finite(config.top_p) and 0 < config.top_p <= 1, "a number in (0, 1] (1.0: off)"),
        ("min_p", config.min_p is None or (_finite(config.min_p) and 0 <= config.min_p <= 1), "None or in [0, 1]"),
        ("epsilon", _finite(config.epsilon) and config.epsilon >= 0, "a number >= 0"),
        ("epsilon_high", config.epsilon_high is None or config.epsilon_high >= 0, "None or a number >= 0"),
        ("delta", config.delta is None or config.delta > 0, "None or a positive bound on the importance ratio"),
        ("top_entropy_quantile", 0 <= config.top_entropy_quantile <= 1, "a quantile in [0, 1] (1.0: off)"),
        ("entropy_coef", _finite(config.entropy_coef), "a finite number"),
        ("entropy_coef_delta", config.entropy_coef_delta >= 0, "a number >= 0"),
        ("entropy_coef_max", config.entropy_coef_max >= config.entropy_coef_min, "at least entropy_coef_min"),
        (
            "off_policy_mask_threshold",
            config.off_policy_mask_threshold is None or config.off_policy_mask_threshold >= 0,
            "None or a KL threshold >= 0",
        ),
        ("ref_model_mixup_alpha", 0 < config.ref_model_mixup_alpha <= 1, "a number in (0, 1]"),
        ("ref_model_sync_steps", config.ref_model_sync_steps >= 1, "an integer >= 1"),
    ]
    for name, ok, what in checks:
        if not ok:
            _fail(name, f"must be {what}, got {getattr(config, name)!r}", "set a valid value")
    if config.dense_update != "sampled":
        for name, off in (
            ("loss_type", config.loss_type in ("grpo", "bnpo")),
            ("top_entropy_quantile", config.top_entropy_quantile == 1.0),
            ("off_policy_mask_threshold", config.off_policy_mask_threshold is None),
        ):
            if not off:
                _fail(
                    name,
                    f"{getattr(config, name)!r} acts on sampled actions, and dense_update={config.dense_update!r} "
                    "trains every "
                    "legal action of a dense decision (one term per decision)",
                    "set dense_update='sampled' to use it, or leave this field at its default",
                )
    if config.sync_ref_model and config.beta == 0.0:
        _fail(
            "sync_ref_model",
            "with beta=0.0 there is no reference policy to synchronise",
            "set beta > 0 or sync_ref_model=False",
        )
    if config.sync_ref_model and config.train_mode == "lora":
        _fail(
            "sync_ref_model",
            "under train_mode='lora' the reference is the policy with its adapter disabled, "
            "there is no separate copy to mix into",
            "set sync_ref_model=False or another train_mode",
        )


def check_generation_pacing(config, set_by_user: str | None) -> None:
    """With actions sampled in the loss forward (``sample_in_loss_forward`` and ``num_iterations == 1``) every
    micro-batch samples fresh decisions, so a generation batch spanning several optimizer steps (TRL's reuse of rows
    across steps) cannot happen: refuse it rather than train on-policy while the config says otherwise."""
    in_loss = config.sample_in_loss_forward and config.num_iterations == 1
    if in_loss and config.steps_per_generation > config.gradient_accumulation_steps:
        name = set_by_user or "steps_per_generation"
        _fail(
            name,
            f"steps_per_generation={config.steps_per_generation} > gradient_accumulation_steps="
            f"{config.gradient_accumulation_steps} reuses rows across optimizer steps, but with "
            "sample_in_loss_forward=True each micro-batch samples its own decisions in its loss forward",
            "set sample_in_loss_forward=False (one rollout forward per generation batch, as in TRL) or leave it "
            "so that one generation batch spans at most one optimizer step",
        )


def fold_trust_remote_code(config) -> None:
    """``trust_remote_code=True`` reaches the model loaders through ``model_init_kwargs`` (as TRL passes it)."""
    if config.trust_remote_code:
        config.model_init_kwargs = {"trust_remote_code": True, **(config.model_init_kwargs or {})}


def _off(config, name: str, value) -> bool:
    """Whether ``value`` switches field ``name`` off: ``None`` for a field whose type allows it (e.g. ``delta``)."""
    if value is not None:
        return False
    # the class's own annotation: HfArgumentParser (TrlParser) rewrites a dataclass field's ``type`` in place, dropping
    # the None of an Optional
    annotation = next(
        c.__annotations__[name] for c in type(config).__mro__ if name in getattr(c, "__annotations__", {})
    )
    return "None" in str(annotation)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


__all__ = [
    "check_process_group_backend",
    "ALLOWED",
    "CLIPPED_LOSSES",
    "DEFAULT_ONLY",
    "LOSS_TYPES",
    "NEEDS_SWITCH",
    "check_generation_pacing",
    "check_inherited_fields",
    "check_resolved_fields",
    "fold_trust_remote_code",
]
