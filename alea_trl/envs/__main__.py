"""``python -m alea_trl.envs``: mean episode return of the random and the oracle policy on every registered env.

Both policies play the same episodes (same seeds), so the difference is paired. Options: ``--episodes N``
(default 1000), ``--seed S``, ``--envs a,b``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from . import list_envs, make_env
from .play import baseline_return


def policy_table(envs: list[str], episodes: int, seed: int = 0) -> dict:
    """``{env: {policy: (mean, standard error)}}`` over ``episodes`` seeded episodes."""
    table = {}
    for name in envs:
        env, row = make_env(name), {}
        for policy in ("random", "oracle"):
            returns = np.array(
                [
                    baseline_return(env, np.random.default_rng([seed, i]), policy, np.random.default_rng([seed, i, 1]))
                    for i in range(episodes)
                ]
            )
            row[policy] = (float(returns.mean()), float(returns.std(ddof=1) / np.sqrt(episodes)))
        table[name] = row
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--envs", default=",".join(list_envs()))
    args = parser.parse_args()
    table = policy_table([e for e in args.envs.split(",") if e], args.episodes, args.seed)
    print(f"{'env':<12} {'random':>18} {'oracle':>18} {'gap / s.e.':>11}")
    for name, row in table.items():
        (rm, rs), (om, os_) = row["random"], row["oracle"]
        print(f"{name:<12} {rm:>10.3f} ± {rs:<5.3f} {om:>10.3f} ± {os_:<5.3f} {(om - rm) / np.hypot(rs, os_):>11.1f}")
    print(json.dumps({"episodes": args.episodes, "table": table}))


if __name__ == "__main__":
    main()
