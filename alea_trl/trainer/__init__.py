"""GRPO over environment decision points, inside TRL."""

from .config import AleaEnvGRPOConfig
from .grpo_trainer import AleaEnvGRPOTrainer


__all__ = ["AleaEnvGRPOConfig", "AleaEnvGRPOTrainer"]
