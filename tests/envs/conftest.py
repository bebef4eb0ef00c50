"""Helpers shared by the env tests."""


def play_episode(env, act_rng, policy: str = "random") -> float:
    """Play ``env`` (already reset) to the end with the oracle (``policy="oracle"``) or uniformly random actions drawn
    from ``act_rng``; returns the summed reward."""
    total = 0.0
    while not env.done:
        a = env.oracle_action() if policy == "oracle" else int(act_rng.integers(env.n_legal()))
        total += env.step(a)[0]
    return total
