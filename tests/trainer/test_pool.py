"""Episode pool scheduling: fair across envs and across the episodes of each env."""

import numpy as np

from alea_trl.envs import make_env
from alea_trl.trainer.pool import EpisodePool


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
