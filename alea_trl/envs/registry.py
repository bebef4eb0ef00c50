"""A plain registry of environment factories: ``register_env(name, factory)``, ``make_env(name, **kwargs)``."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from .gym_ids import GYM_ENVS


_REGISTRY: dict[str, Callable] = {}


def register_env(name: str, factory: Callable, overwrite: bool = False) -> None:
    """Register ``factory`` (a class or any callable returning an env) under ``name``.

    Args:
        name (`str`): the name ``make_env`` and the trainer's ``envs`` list use.
        factory (`Callable`): called as ``factory(**kwargs)``; must return an object with the env contract.
        overwrite (`bool`, defaults to `False`): replace an existing registration instead of raising.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_env: field 'name': must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise ValueError(f"register_env: env {name!r}: field 'factory': must be callable, got {factory!r}")
    if name in _REGISTRY and not overwrite and _REGISTRY[name] is not factory:
        raise ValueError(f"register_env: env {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = factory


def make_env(name: str, **kwargs):
    """Build a registered environment; the episode starts with ``env.reset(rng)``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown env {name!r}; registered envs: {sorted(_REGISTRY)} (see register_env)")
    return _REGISTRY[name](**kwargs)


class RegisteredEnvFactory:
    """A picklable zero-argument factory for a registered env and its keyword arguments."""

    def __init__(self, name: str, kwargs: dict | None = None):
        self.name, self.kwargs = name, dict(kwargs or {})

    def __call__(self):
        return make_env(self.name, **self.kwargs)


def env_factories(envs, env_kwargs: dict | None = None, extra: dict | None = None) -> dict[str, Callable]:
    """``{name: zero-argument factory}`` for a list of env names (registered, or found in ``extra``), or a dict of
    factories passed through. Unknown names raise ``ValueError`` here, before anything runs."""
    if isinstance(envs, dict):
        return dict(envs)
    extra, env_kwargs = extra or {}, env_kwargs or {}
    factories = {}
    for name in envs:
        if name in extra:
            factories[name] = extra[name]
        elif name not in _REGISTRY:
            raise ValueError(f"unknown env {name!r}; registered envs: {sorted(_REGISTRY)} (see register_env)")
        else:
            factories[name] = RegisteredEnvFactory(name, env_kwargs.get(name))
    return factories


def list_envs() -> list[str]:
    """Names of the registered environments, sorted."""
    return sorted(_REGISTRY)


def _gym_env(name: str, **kwargs):
    """A registered Gymnasium env, importing the adapter (and gymnasium) only when one is made."""
    try:
        from .gymnasium import make_gym_env
    except ModuleNotFoundError as err:
        if err.name != "gymnasium":
            raise
        raise ImportError(f"env {name!r} needs gymnasium: pip install 'alea-trl[gym]'") from err
    return make_gym_env(name, **kwargs)


for _name in GYM_ENVS:
    register_env(_name, partial(_gym_env, _name))


__all__ = ["GYM_ENVS", "RegisteredEnvFactory", "env_factories", "list_envs", "make_env", "register_env"]
