"""Episode pool scheduling: fair across envs and across the episodes of each env."""

import numpy as np

from alea_trl.envs import make_env
from alea_trl.trainer.rollout.pool import EpisodePool


def test_every_episode_advances_and_envs_share_each_wave():
    pool = EpisodePool(
        {"kelly": lambda: make_env("kelly"), "hmm": lambda: make_env("hmm")},
        eps_per_env=8,
        rng=np.random.default_rng(0),
    )
    seen = set()
    for _ in range(4):  # 4 waves of 4 decisions cover all 16 episodes once
        wave = pool.schedule(4)
        assert sorted(ep.env_name for ep in wave) == ["hmm", "hmm", "kelly", "kelly"]
        seen |= {id(ep) for ep in wave}
    assert len(seen) == 16


def test_done_episodes_are_skipped():
    pool = EpisodePool({"nim": lambda: make_env("nim")}, eps_per_env=3, rng=np.random.default_rng(1))
    ep = pool.episodes["nim"][0]
    while not ep.env.done:
        ep.env.step(0)
    assert all(e is not ep for e in pool.schedule(10)) and len(pool.schedule(10)) == 2


def test_a_rollout_state_saved_with_the_queue_on_the_pool_still_loads(tokenizer, make_args):
    """Checkpoints written when the ready queue lived on the pool keep their queued rows."""
    import collections
    import pickle

    from alea_trl.trainer.rollout import Rollout

    def rollout():
        pool = EpisodePool({"kelly": lambda: make_env("kelly")}, eps_per_env=2, rng=np.random.default_rng(0))
        return Rollout(pool, tokenizer, make_args(), seed=0)

    saved = rollout()
    saved.queue.extend(["row a", "row b"])
    state = saved.state_dict()
    state["pool"].queue = state.pop("queue")  # the former layout
    loaded = rollout()
    loaded.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert loaded.queue == collections.deque(["row a", "row b"])
    assert not hasattr(loaded.pool, "queue")
