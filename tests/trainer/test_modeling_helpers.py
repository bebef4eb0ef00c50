"""Helpers shared by trainer tests."""

import numpy as np

from alea_trl.envs import make_env


def fresh_decisions(envs, n, seed=99):
    return [make_env(e).reset(np.random.default_rng([seed, i])).observe() for e in envs for i in range(n)]
