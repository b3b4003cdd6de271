"""Environment families by name: ``make_env("textworld", max_steps=50)``, ``family("alfworld")``.

A family is whole (an :class:`EnvFamily`): its env factory, its task source, its split names,
the split tuning and checkpoint selection read (``eval_split``), the split the reported numbers
come from (``report_split``), and optionally its known levels, a task-type hook for the reports,
a hook that builds tasks ahead of a study, and one that gives a task's expert walkthrough (the
failure breakdown's reference). A user's module registers one with
``register_env(name, factory, make_tasks=..., splits=..., ...)`` and it trains, evaluates and
reports with no edit to the package (``config.plugins`` imports the module; docs/environments.md).

Callables are stored as import paths ``"module:attribute"``, imported on first use, so that

- registering a family costs nothing until it is used (ALFWorld pulls in heavy packages), and
- the actor pool can send a name to a fresh worker process, which resolves the same path there
  (a spawned or forkserver child does not inherit the parent's in-memory registrations).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from agentrl_jax.envs.base import Env, LatencyEnv, split_latency

TRAIN_SPLIT = "train"  # the split every family trains on (demonstrations, RL)


@dataclasses.dataclass(frozen=True)
class EnvFamily:
    """Everything the system needs to train, evaluate and report on an env family.

    Attributes:
      name: the family's name in tasks (``Task.env``) and configs (``config.env.name``).
      factory: ``"module:attribute"`` of an ``Env`` subclass or a function returning an ``Env``.
      make_tasks: ``"module:attribute"`` of ``make_tasks(level, split, count, env_kwargs) ->
        list[Task]`` (``count`` tasks of ``level`` from ``split``, fewer if it holds fewer); ""
        for an env built only by hand (no config run can draw tasks from it).
      splits: every split name, ``"train"`` first; the rest are held out.
      eval_split: the held-out split tuning and checkpoint selection read (in-run evaluations).
      report_split: the held-out split the before/after numbers come from; no tuning path
        should read it (TextWorld: ``test``; a family without a third split reports on its
        ``eval_split``).
      levels: the level names its task source knows (a config naming another fails before
        compute); empty: open-ended (TextWorld's ``custom:R,O,Q``, SWE's repository names).
      task_type: ``"module:attribute"`` of ``task_type(task) -> str`` ("" for none), the
        category a report breaks success down by when the episode's info and the task's params
        name none (``run/evaluation.task_type``).
      prepare: ``"module:attribute"`` of ``prepare(jobs, progress) -> None`` ("" for none):
        builds the tasks of ``jobs``, ``(level, split, count)`` triples, ahead of a study whose
        cells run in parallel (TextWorld generates its games once, not once per cell).
      walkthrough: ``"module:attribute"`` of ``walkthrough(task) -> base.Walkthrough | None``
        ("" for none): the task's winning commands, the rooms they pass through and the game's
        entities, which the failure breakdown compares a lost episode with
        (``experiments/failures.py``: wrong rooms, wrong objects, games longer than the step cap).
    """

    name: str
    factory: str
    make_tasks: str = ""
    splits: tuple[str, ...] = (TRAIN_SPLIT, "valid", "test")
    eval_split: str = "valid"
    report_split: str = ""
    levels: tuple[str, ...] = ()
    task_type: str = ""
    prepare: str = ""
    walkthrough: str = ""

    def __post_init__(self):
        def problem(what: str) -> ValueError:
            return ValueError(f"env family {self.name!r}: {what}")

        if not self.name or ":" in self.name:
            raise problem("a name must be non-empty and hold no ':'")
        for field in ("factory", "make_tasks", "task_type", "prepare", "walkthrough"):
            path = getattr(self, field)
            if not isinstance(path, str) or (path and ":" not in path):
                raise problem(f"{field}={path!r} must look like 'module:attr'")
        splits = tuple(self.splits)
        if not splits or splits[0] != TRAIN_SPLIT or len(set(splits)) != len(splits):
            raise problem(f"splits={splits!r}: expected distinct names, {TRAIN_SPLIT!r} first")
        object.__setattr__(self, "splits", splits)
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "report_split", self.report_split or self.eval_split)
        for field in ("eval_split", "report_split"):
            if getattr(self, field) not in self.held_out_splits:
                raise problem(
                    f"{field}={getattr(self, field)!r} is not one of its held-out splits "
                    f"{self.held_out_splits}"
                )

    @property
    def held_out_splits(self) -> tuple[str, ...]:
        """The splits evaluations may read (``launch.eval --split``): all but ``train``."""
        return self.splits[1:]

    def hook(self, field: str) -> Callable[..., Any] | None:
        """The callable registered as ``field`` (``make_tasks``, ``task_type``, ``prepare``,
        ``walkthrough``), imported; None when the family registered none."""
        path = getattr(self, field)
        return _load(path, self.name) if path else None

    def tasks(self, level: str, split: str, count: int, env_kwargs: dict[str, Any] | None = None):
        """``count`` tasks of ``level`` from ``split`` (ValueError on a split it does not have)."""
        if not self.make_tasks:
            raise ValueError(
                f"env {self.name!r} is registered without a task source; register it with "
                "register_env(name, factory, make_tasks='module:function', splits=...)"
            )
        if split not in self.splits:
            raise ValueError(
                f"env {self.name!r} has no split {split!r}; its splits: {', '.join(self.splits)}"
            )
        return self.hook("make_tasks")(level, split, count, dict(env_kwargs or {}))


_REGISTRY: dict[str, EnvFamily] = {}


def register(
    name: str,
    factory: str | Callable[..., Env],
    *,
    overwrite: bool = False,
    make_tasks: str | Callable[..., Any] | None = "",
    splits: tuple[str, ...] = (TRAIN_SPLIT, "valid", "test"),
    eval_split: str = "valid",
    report_split: str = "",
    levels: tuple[str, ...] = (),
    task_type: str | Callable[..., str] | None = "",
    prepare: str | Callable[..., Any] | None = "",
    walkthrough: str | Callable[..., Any] | None = "",
) -> EnvFamily:
    """Registers the env family ``name`` (see :class:`EnvFamily` for the fields).

    Args:
      name: the env family name used in tasks and configs.
      factory: ``"module:attribute"`` or an importable class/function (stored as its import path,
        so worker processes can resolve it; it must live at module level).
      overwrite: replace an existing registration instead of raising.
      make_tasks, splits, eval_split, report_split, levels, task_type, prepare, walkthrough:
        the family's task source and evaluation protocol (:class:`EnvFamily`); callables are
        stored as import paths like ``factory``. Without ``make_tasks`` the env can be built
        (``make_env``, an ``ActorPool``) but a config run cannot draw tasks from it.

    Returns:
      The registered :class:`EnvFamily`.

    Raises:
      ValueError: ``name`` is taken (by a different family) and ``overwrite`` is False, a
        callable is not importable by path (a lambda or a nested function), or the splits are
        inconsistent (``eval_split``/``report_split`` not among the held-out ``splits``).
    """
    family = EnvFamily(
        name=name,
        factory=_path(factory),
        make_tasks=_path(make_tasks),
        splits=tuple(splits),
        eval_split=eval_split,
        report_split=report_split,
        levels=tuple(levels),
        task_type=_path(task_type),
        prepare=_path(prepare),
        walkthrough=_path(walkthrough),
    )
    if name in _REGISTRY and _REGISTRY[name] != family and not overwrite:
        raise ValueError(
            f"env name {name!r} is already registered to {_REGISTRY[name].factory!r}; "
            "pass overwrite=True to replace it"
        )
    _REGISTRY[name] = family
    return family


def unregister(name: str) -> None:
    """Removes the family ``name`` (a no-op when it is not registered)."""
    _REGISTRY.pop(name, None)


def family(name: str) -> EnvFamily:
    """The :class:`EnvFamily` registered as ``name`` (ValueError listing the registered ones)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    raise ValueError(
        f"unknown env {name!r}; valid names: {', '.join(names())} (the registered env families)"
    )


def names() -> list[str]:
    """The registered env names, sorted."""
    return sorted(_REGISTRY)


def resolve(name: str) -> str:
    """The ``"module:attribute"`` path registered for ``name`` (ValueError listing valid names)."""
    if name in _REGISTRY:
        return _REGISTRY[name].factory
    if ":" in name:  # Already a path: lets a worker process build envs registered elsewhere.
        return name
    raise ValueError(
        f"unknown env {name!r}; valid names: {', '.join(names())} (the registered env families)"
    )


def load_factory(name_or_path: str) -> Callable[..., Env]:
    """Imports the factory for a registered name or a ``"module:attribute"`` path."""
    return _load(resolve(name_or_path), name_or_path)


def make_env(name: str, **kwargs: Any) -> Env:
    """Builds the env registered as ``name`` with ``kwargs`` (ValueError on an unknown name);
    ``step_latency_s`` among them wraps it in a ``LatencyEnv``."""
    latency, own = split_latency(kwargs)
    env = load_factory(name)(**own)
    return env if latency is None else LatencyEnv(env, latency)


def lists_admissible_commands(name: str, kwargs: dict[str, Any]) -> bool | None:
    """Whether the env registered as ``name``, built with ``kwargs``, lists admissible commands
    (``Env.lists_admissible_commands``; None when its factory is not an ``Env`` class or one of
    its classmethods, or the env cannot tell)."""
    factory = load_factory(name)
    owner = factory if isinstance(factory, type) else getattr(factory, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, Env):
        return owner.lists_admissible_commands(**split_latency(kwargs)[1])
    return None


def tool_schemas(name: str, kwargs: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The function tools the env registered as ``name``, built with ``kwargs``, offers
    (``Env.tool_schemas``; empty when its factory is not an ``Env`` class or one of its
    classmethods, or its actions are text)."""
    factory = load_factory(name)
    owner = factory if isinstance(factory, type) else getattr(factory, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, Env):
        return tuple(owner.tool_schemas(**split_latency(kwargs)[1]))
    return ()


def _load(path: str, name: str) -> Any:
    """Imports ``"module:attribute"`` (``name``, the env it belongs to, names it in errors)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(
            f"env {name!r} is registered to {path!r} but module {module_name!r} "
            f"cannot be imported: {e}"
        ) from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ImportError(f"env {name!r}: {module_name!r} has no {attr!r}") from e
    return obj


def _path(obj: str | Callable[..., Any] | None) -> str:
    if obj is None:
        return ""
    return obj if isinstance(obj, str) else _import_path(obj)


def _import_path(factory: Callable[..., Any]) -> str:
    qualname = getattr(factory, "__qualname__", "")
    module = getattr(factory, "__module__", None)
    if not module or not qualname or "<" in qualname:
        raise ValueError(
            f"cannot register {factory!r} by reference: it must be a module-level class or "
            "function (not a lambda or a nested function) so worker processes can import it"
        )
    return f"{module}:{qualname}"


# The built-in families, registered like a user's, by import path: this module imports no family
# (each lives in its own subpackage, envs/textworld/, envs/alfworld/, envs/swe/, and nothing of it
# is imported until a task or an env of it is asked for).
register(
    "textworld",
    "agentrl_jax.envs.textworld.env:TextWorldEnv",
    make_tasks="agentrl_jax.envs.textworld.games:textworld_tasks",
    splits=(TRAIN_SPLIT, "valid", "test"),
    eval_split="valid",
    report_split="test",
    task_type="agentrl_jax.envs.textworld.games:textworld_task_type",
    prepare="agentrl_jax.envs.textworld.games:textworld_prepare",
    walkthrough="agentrl_jax.envs.textworld.games:textworld_walkthrough",
)
register(
    "alfworld",
    "agentrl_jax.envs.alfworld.env:ALFWorldEnv",
    make_tasks="agentrl_jax.envs.alfworld.data:alfworld_tasks",
    splits=(TRAIN_SPLIT, "valid_seen", "valid_unseen"),
    eval_split="valid_unseen",
    report_split="valid_unseen",  # no third split: the report reads the evaluations' split
    task_type="agentrl_jax.envs.alfworld.data:alfworld_task_type",
)
register(
    "swe",
    "agentrl_jax.envs.swe.env:SweEnv.from_jsonl",
    make_tasks="agentrl_jax.envs.swe.tasks:swe_tasks",
    splits=(TRAIN_SPLIT, "eval"),
    eval_split="eval",
    report_split="eval",
)
# Other people's environments (envs/adapters/): a level is the env or game id (gymnasium,
# textarena), "default" (openenv: one server, one environment) or "all" (a verifiers taskset);
# a task is a seed of it (a task of the taskset, for verifiers).
for _name, _factory, _tasks in (
    ("gymnasium", "gymnasium_env:GymnasiumEnv", "tasks:gymnasium_tasks"),
    ("openenv", "openenv_env:OpenEnvEnv", "tasks:openenv_tasks"),
    ("textarena", "textarena_env:TextArenaEnv", "tasks:textarena_tasks"),
    ("verifiers", "verifiers_env:VerifiersEnv", "verifiers_env:verifiers_tasks"),
):
    register(
        _name,
        f"agentrl_jax.envs.adapters.{_factory}",
        make_tasks=f"agentrl_jax.envs.adapters.{_tasks}",
        splits=(TRAIN_SPLIT, "valid", "test"),
        eval_split="valid",
        report_split="test",
    )
