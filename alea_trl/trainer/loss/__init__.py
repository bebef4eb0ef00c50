"""The objective of one forward, as pure tensor functions: the policy loss over sampled actions, the dense envs'
updates over every legal action, the exact KL and the proper-scoring report losses."""

from .dense import STEP_TARGET_UPDATES, all_actions_loss, step_target_loss
from .objective import LossTerms, ObjectiveSettings, exact_kl, grpo_loss, report_losses, supervised_loss
from .policy import Collectives, PolicyObjective, PolicyStats, act_entropy, high_entropy_samples, policy_loss


__all__ = [
    "STEP_TARGET_UPDATES",
    "Collectives",
    "LossTerms",
    "ObjectiveSettings",
    "PolicyObjective",
    "PolicyStats",
    "act_entropy",
    "all_actions_loss",
    "exact_kl",
    "grpo_loss",
    "high_entropy_samples",
    "policy_loss",
    "report_losses",
    "step_target_loss",
    "supervised_loss",
]
