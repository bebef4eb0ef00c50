"""Gymnasium envs as Alea envs (optional extra ``gym``): the adapter, its exact oracles, and the built-in envs.

``GymnasiumEnv`` wraps any Gymnasium env with a ``Discrete`` action space. Envs with a model (Gymnasium's transition
table ``P``, or Blackjack's rules) are dense with exact oracles; others run in outcome mode. ``GYM_ENVS`` (in
``alea_trl.envs.gym_ids``) names the registered ones (``gym-frozenlake-4x4``, ...), made by :func:`make_gym_env`.
"""

from ..gym_ids import GYM_ENVS
from .adapter import GymnasiumEnv
from .blackjack import blackjack_model
from .tabular import Solution, TabularModel, greedy, solve


_ADAPTER_ARGS = ("render", "action_names", "model", "state", "goal", "goal_question", "discount", "horizon")


def make_gym_env(name: str, **kwargs) -> GymnasiumEnv:
    """A registered Gymnasium env: adapter arguments (``discount``, ``horizon``, ...) go to :class:`GymnasiumEnv`,
    any other keyword to ``gymnasium.make`` (e.g. ``is_slippery=False``)."""
    gym_id, defaults = GYM_ENVS[name]
    adapter = {k: kwargs.pop(k) for k in _ADAPTER_ARGS if k in kwargs}
    if adapter.get("horizon") is not None:  # the given horizon replaces a default time limit
        defaults = {k: v for k, v in defaults.items() if k != "max_episode_steps"}
    return GymnasiumEnv(gym_id, name=name, gym_kwargs=defaults | kwargs, **adapter)


__all__ = [
    "GYM_ENVS",
    "GymnasiumEnv",
    "Solution",
    "TabularModel",
    "blackjack_model",
    "greedy",
    "make_gym_env",
    "solve",
]
