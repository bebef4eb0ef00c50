"""What a run leaves behind and reports: crash-safe checkpoints, the greedy evaluation, metrics and the completion
table, the model card and the Hub."""

from .checkpointing import (
    COMPLETE_MARKER,
    POOL_STATE_NAME,
    commit_checkpoint,
    complete_checkpoint,
    last_complete_checkpoint,
    load_rollout_state,
    saved_dense_update,
)
from .evaluation import check_metric_for_best_model, play_greedy_episodes
from .hub import (
    HubPushError,
    push_at_init,
    save_evaluation,
    save_lora_extras,
    saved_before_push,
    whole_final_model,
    write_model_card,
)
from .metrics import (
    completion_logs,
    decision_entries,
    gathered_means,
    loss_sums,
    rollout_sums,
    staleness_sums,
    stop_if_not_finite,
    token_sums,
)
from .model_card import build_model_card


__all__ = [
    "COMPLETE_MARKER",
    "POOL_STATE_NAME",
    "HubPushError",
    "build_model_card",
    "check_metric_for_best_model",
    "commit_checkpoint",
    "complete_checkpoint",
    "completion_logs",
    "decision_entries",
    "gathered_means",
    "last_complete_checkpoint",
    "load_rollout_state",
    "loss_sums",
    "play_greedy_episodes",
    "push_at_init",
    "rollout_sums",
    "save_evaluation",
    "save_lora_extras",
    "saved_dense_update",
    "saved_before_push",
    "staleness_sums",
    "stop_if_not_finite",
    "token_sums",
    "whole_final_model",
    "write_model_card",
]
