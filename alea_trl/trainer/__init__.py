"""GRPO over environment decision points, inside TRL: the trainers and their configs (the TRL shell), then the stages
of one step: ``rollout`` (host side), ``forward`` (device), ``loss`` (pure tensors), ``act`` (the act distribution all
three read) and ``outputs`` (checkpoints, evaluation, metrics, the Hub)."""

from .config import DENSE_UPDATES, AleaEnvGRPOConfig
from .distributed import describe_engine, end_distributed
from .grpo_trainer import AleaEnvGRPOTrainer
from .model_setup import apply_train_mode, extra_switches, param_groups
from .outputs import HubPushError
from .sft_trainer import AleaSFTConfig, AleaSFTTrainer


__all__ = [
    "DENSE_UPDATES",
    "AleaEnvGRPOConfig",
    "AleaEnvGRPOTrainer",
    "AleaSFTConfig",
    "AleaSFTTrainer",
    "HubPushError",
    "apply_train_mode",
    "describe_engine",
    "end_distributed",
    "extra_switches",
    "param_groups",
]
