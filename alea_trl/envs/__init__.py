"""Decision environments with exact oracles, and the registry that names them.

Built in: ``hmm``, ``kelly``, ``newsvendor`` (dense: exact expected reward of every action) and ``bandit``, ``nim``
(outcome: only the episode return is revealed). ``python -m alea_trl.envs`` prints the random and oracle policies'
mean returns.
"""

from .bandit import BanditEnv
from .base import AleaEnv
from .hmm import HMMEnv
from .kelly import KellyEnv
from .newsvendor import NewsvendorEnv
from .nim import NimEnv
from .registry import env_factories, list_envs, make_env, register_env


BUILTIN_ENVS = ("hmm", "kelly", "newsvendor", "bandit", "nim")

for _cls in (HMMEnv, KellyEnv, NewsvendorEnv, BanditEnv, NimEnv):
    register_env(_cls.name, _cls)

__all__ = [
    "BUILTIN_ENVS",
    "AleaEnv",
    "BanditEnv",
    "HMMEnv",
    "KellyEnv",
    "NewsvendorEnv",
    "NimEnv",
    "env_factories",
    "list_envs",
    "make_env",
    "register_env",
]
