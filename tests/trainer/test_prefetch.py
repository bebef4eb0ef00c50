"""Observations prefetched in a background thread (``prefetch_observations``) change nothing but where the work runs:
the same training, stale entries never used, and errors still raised by the main thread."""

import threading

import numpy as np
import pytest
import torch

from alea_trl import AleaEnvGRPOTrainer
from alea_trl.envs import make_env
from alea_trl.packing import pack_request
from alea_trl.trainer.rollout import Rollout
from alea_trl.trainer.rollout.pool import EpisodePool

from .conftest import TOY_FACTORIES


def _train(tiny_model, tokenizer, make_args, prefetch):
    model = tiny_model()
    args = make_args(
        envs=["named_best", "three_in_a_row"],
        max_steps=6,
        beta=0.05,
        prefetch_observations=prefetch,
        outcome_advantage="rtg",  # env copies of branching are observed in the main thread: the count below is of episodes
    )
    trainer = AleaEnvGRPOTrainer(model, args=args, processing_class=tokenizer, env_factories=TOY_FACTORIES)
    threads = []
    prepare = trainer.rollout.observer.prepare

    def spy(env, name):
        threads.append(threading.current_thread() is threading.main_thread())
        return prepare(env, name)

    trainer.rollout.observer.prepare = spy
    trainer.train()
    return trainer, {n: p.detach().clone() for n, p in model.named_parameters()}, threads


def test_prefetch_trains_exactly_as_without(tiny_model, tokenizer, make_args):
    on, params_on, threads_on = _train(tiny_model, tokenizer, make_args, True)
    off, params_off, threads_off = _train(tiny_model, tokenizer, make_args, False)
    assert all(threads_off)  # without prefetch every decision is observed in the main thread
    assert threads_on.count(False) > threads_on.count(True)  # with it, most are observed in the background
    timeless = [{k: v for k, v in log.items() if "time" not in k and "per_s" not in k} for log in on.state.log_history]
    assert timeless == [
        {k: v for k, v in log.items() if "time" not in k and "per_s" not in k} for log in off.state.log_history
    ]
    for name in params_on:
        assert torch.equal(params_on[name], params_off[name]), name


def _rollout(tokenizer, make_args, **overrides):
    args = make_args(**overrides)
    pool = EpisodePool({"kelly": lambda: make_env("kelly")}, eps_per_env=2, rng=np.random.default_rng(0))
    return Rollout(pool, tokenizer, args, seed=0)


def test_a_prefetched_decision_is_dropped_once_its_env_moves(tokenizer, make_args):
    rollout = _rollout(tokenizer, make_args)
    episodes = rollout.pool.episodes["kelly"]
    rollout.prefetch(episodes)
    rollout.join_prefetch()
    assert len(rollout.observer._prefetched) == 2
    episodes[0].env.step(0)  # moved behind the rollout's back: its prefetched decision is stale
    wave = rollout.observe_wave(2)
    for ep, packed in zip(wave.episodes, wave.packed):
        decision = ep.env.observe()
        assert packed.input_ids == pack_request(tokenizer, decision.state, decision.questions).input_ids
    assert not rollout.observer._prefetched


def test_errors_found_in_the_background_are_raised_by_the_main_thread(tokenizer, make_args):
    rollout = _rollout(tokenizer, make_args)
    env = rollout.pool.episodes["kelly"][0].env
    env.oracle_targets = lambda: {"p_heads": 1.5}  # malformed: a probability above 1
    rollout.prefetch(rollout.pool.episodes["kelly"])
    rollout.join_prefetch()  # the thread skipped it silently
    with pytest.raises(ValueError, match="env 'kelly'.*p_heads"):
        rollout.observe_wave(2)
