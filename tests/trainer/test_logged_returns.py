"""``env/<name>/return`` is a return: for an env whose ``action_rewards`` are returns-to-go (the Gymnasium adapter's
``Q*``) the episode's realised return, never a sum of returns-to-go; for an env whose ``action_rewards`` are one
step's rewards, under best of k, the policy's expected return at the states met."""

import numpy as np
import pytest
import torch

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.envs import make_env
from alea_trl.trainer.rollout import Rollout
from alea_trl.trainer.rollout.pool import EpisodePool

from .toy_envs import NamedBestEnv


LAKE = "gym-frozenlake-4x4"


def _returns(tokenizer, make_args, name, factory, n_episodes, **overrides):
    """Play uniformly (all-zero act logits) until ``n_episodes`` episodes end; the rollout's statistics."""
    args = make_args(
        envs=[name], eps_per_env=2, num_generations=4, **({"beta": 0.0} | overrides)
    )  # driven by hand: no reference policy, no KL
    rollout = Rollout(EpisodePool({name: factory}, 2, np.random.default_rng(0)), tokenizer, args, seed=0)
    stats = {"return": [], "return_best_of_k": []}
    for _ in range(500):
        wave = rollout.observe_wave(2)
        rollout.advance(wave, [torch.zeros(ep.env.observe().n_legal) for ep in wave.episodes])
        for key, values in rollout.pop_stats().items():
            if key.startswith(f"env/{name}/return"):
                stats[key.rsplit("/", 1)[-1]] += values
        if len(stats["return"]) >= n_episodes:
            return stats
    raise AssertionError(f"fewer than {n_episodes} episodes ended")


@pytest.mark.parametrize("dense_advance", ["best_of_k", "sample"])
def test_an_env_whose_action_rewards_are_returns_to_go_logs_its_realised_return(tokenizer, make_args, dense_advance):
    """Non-slippery FrozenLake pays 1 at the goal and 0 otherwise: every episode's return is 0 or 1 (a sum of the
    Q* values along the way reads tens)."""

    def lake():
        return make_env(LAKE, is_slippery=False)

    assert lake().action_rewards_to_go
    stats = _returns(tokenizer, make_args, LAKE, lake, 6, dense_advance=dense_advance)
    assert set(stats["return"]) <= {0.0, 1.0}
    if dense_advance == "best_of_k":  # the realised return of the episode as advanced, under both names
        assert stats["return"] == stats["return_best_of_k"] and 1.0 in stats["return"]


def test_an_env_whose_action_rewards_are_step_rewards_logs_the_policys_expected_return(tokenizer, make_args):
    """NamedBestEnv (one decision, 1 for the named one of 4 options): under best of k the uniform policy's expected
    return 1/4 is logged, and the best of the 4 samples' realised return beside it."""
    assert not NamedBestEnv.action_rewards_to_go
    stats = _returns(tokenizer, make_args, "named_best", NamedBestEnv, 20)
    np.testing.assert_allclose(stats["return"], 0.25, rtol=1e-6)
    assert np.mean(stats["return_best_of_k"]) > 0.5  # 1 - (3/4)^4 = 0.68 in expectation


def test_training_logs_the_goal_share_of_goal_reaching_envs(tiny_model, tokenizer, make_args):
    # on-policy advance: the untrained policy falls into a hole or reaches G within a few steps
    args = make_args(envs=["gym-frozenlake-4x4", "kelly"], max_steps=16, eps_per_env=2, dense_advance="sample")
    trainer = AleaEnvGRPOTrainer(tiny_model(), args=args, processing_class=tokenizer)
    trainer.train()
    shares = [
        h["env/gym-frozenlake-4x4/goal_share"]
        for h in trainer.state.log_history
        if "env/gym-frozenlake-4x4/goal_share" in h
    ]
    assert shares and all(0.0 <= s <= 1.0 for s in shares)
    assert not any("env/kelly/goal_share" in h for h in trainer.state.log_history)
