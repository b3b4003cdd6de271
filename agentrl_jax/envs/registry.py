"""Environments by name: ``make_env("textworld", max_steps=50)``.

Each name maps to an import path ``"module:attribute"`` of a factory (an ``Env`` subclass or a
function returning an ``Env``). Paths are strings, imported on first use, so that

- registering a family costs nothing until it is used (ALFWorld pulls in heavy packages), and
- the actor pool can send a name to a fresh worker process, which resolves the same path there
  (a spawned or forkserver child does not inherit the parent's in-memory registrations).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from agentrl_jax.envs.base import Env

# name -> "module:attribute". ALFWorld's module registers the same way (its own file); the
# lazy path here is the hook so that ``make_env("alfworld")`` works without importing it first.
_REGISTRY: dict[str, str] = {
    "textworld": "agentrl_jax.envs.textworld_env:TextWorldEnv",
    "alfworld": "agentrl_jax.envs.alfworld_env:ALFWorldEnv",
    "swe": "agentrl_jax.swe.env:SweEnv.from_jsonl",
}


def register(name: str, factory: str | Callable[..., Env], *, overwrite: bool = False) -> None:
    """Registers ``factory`` under ``name``.

    Args:
      name: the env family name used in tasks and configs.
      factory: ``"module:attribute"`` or an importable class/function (stored as its import path,
        so worker processes can resolve it; it must live at module level).
      overwrite: replace an existing registration instead of raising.

    Raises:
      ValueError: ``name`` is taken and ``overwrite`` is False, or ``factory`` is not importable
        by path (a lambda or a nested function).
    """
    path = factory if isinstance(factory, str) else _import_path(factory)
    if ":" not in path:
        raise ValueError(f"factory path {path!r} for env {name!r} must look like 'module:attr'")
    if name in _REGISTRY and _REGISTRY[name] != path and not overwrite:
        raise ValueError(
            f"env name {name!r} is already registered to {_REGISTRY[name]!r}; "
            "pass overwrite=True to replace it"
        )
    _REGISTRY[name] = path


def names() -> list[str]:
    """The registered env names, sorted."""
    return sorted(_REGISTRY)


def resolve(name: str) -> str:
    """The ``"module:attribute"`` path registered for ``name`` (ValueError listing valid names)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:  # Already a path: lets a worker process build envs registered elsewhere.
        return name
    raise ValueError(f"unknown env {name!r}; valid names: {', '.join(names())}")


def load_factory(name_or_path: str) -> Callable[..., Env]:
    """Imports the factory for a registered name or a ``"module:attribute"`` path."""
    path = resolve(name_or_path)
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(
            f"env {name_or_path!r} is registered to {path!r} but module {module_name!r} "
            f"cannot be imported: {e}"
        ) from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ImportError(f"env {name_or_path!r}: {module_name!r} has no {attr!r}") from e
    return obj


def make_env(name: str, **kwargs: Any) -> Env:
    """Builds the env registered as ``name`` with ``kwargs`` (ValueError on an unknown name)."""
    return load_factory(name)(**kwargs)


def lists_admissible_commands(name: str, kwargs: dict[str, Any]) -> bool | None:
    """Whether the env registered as ``name``, built with ``kwargs``, lists admissible commands
    (``Env.lists_admissible_commands``; None when its factory is not an ``Env`` class or one of
    its classmethods, or the env cannot tell)."""
    factory = load_factory(name)
    owner = factory if isinstance(factory, type) else getattr(factory, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, Env):
        return owner.lists_admissible_commands(**kwargs)
    return None


def _import_path(factory: Callable[..., Env]) -> str:
    qualname = getattr(factory, "__qualname__", "")
    module = getattr(factory, "__module__", None)
    if not module or not qualname or "<" in qualname:
        raise ValueError(
            f"cannot register {factory!r} by reference: it must be a module-level class or "
            "function (not a lambda or a nested function) so worker processes can import it"
        )
    return f"{module}:{qualname}"
