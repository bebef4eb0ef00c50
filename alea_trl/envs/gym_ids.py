"""The Gymnasium envs the registry names (optional extra ``gym``), as plain data: importing it needs no gymnasium.

:mod:`alea_trl.envs.registry` registers each name (the env is made, and gymnasium imported, only when one is made) and
:mod:`alea_trl.envs.gymnasium` makes them (:func:`~alea_trl.envs.gymnasium.make_gym_env`); both re-export
``GYM_ENVS``.
"""

GYM_ENVS = {
    "gym-frozenlake-4x4": ("FrozenLake-v1", {"map_name": "4x4"}),
    "gym-frozenlake-8x8": ("FrozenLake8x8-v1", {}),
    "gym-taxi": ("Taxi-v4", {}),
    "gym-cliffwalking": ("CliffWalking-v1", {"max_episode_steps": 100}),
    "gym-blackjack": ("Blackjack-v1", {}),
}
"""The registered Gymnasium envs (optional extra ``gym``): name -> (Gymnasium id, ``gymnasium.make`` defaults).
CliffWalking has no time limit of its own: 100 steps keep a random policy's episodes finite (the optimal path takes
13)."""


__all__ = ["GYM_ENVS"]
