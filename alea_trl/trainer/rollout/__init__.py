"""The host side of a step, without autograd: episodes, their observation, sampling and env steps, advantages, and the
decision rows handed to the loss."""

from .advantages import all_action_advantages, env_batch_std, group_advantages, outcome_advantage, step_targets
from .branching import FAILURE_CAUSES, BranchFallbacks, branch_values
from .observation import Observer, Wave
from .pool import Episode, EpisodePool, np_rng_for_rank
from .rollout import Rollout
from .rows import DecisionRow, rows_to_inputs, sampled_forward_inputs


__all__ = [
    "FAILURE_CAUSES",
    "BranchFallbacks",
    "DecisionRow",
    "Episode",
    "EpisodePool",
    "Observer",
    "Rollout",
    "Wave",
    "all_action_advantages",
    "branch_values",
    "env_batch_std",
    "group_advantages",
    "np_rng_for_rank",
    "outcome_advantage",
    "rows_to_inputs",
    "sampled_forward_inputs",
    "step_targets",
]
