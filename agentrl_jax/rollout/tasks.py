"""Task lists per complexity level, for every environment family the trainer drives.

A level names a slice of tasks: a TextWorld game spec (``simple``, ``medium``, ``hard``,
``custom:R,O,Q`` or a challenge), an ALFWorld task type (or ``all``). Train and evaluation tasks
come from disjoint splits (TextWorld: disjoint seed ranges; ALFWorld: train vs valid_seen /
valid_unseen; SWE: a fixed fifth of a JSONL file's instances, chosen by a hash of the instance
id, is the ``eval`` split and the rest ``train``). An evaluation level may name its split:
``all@valid_seen``. SWE levels are ``all`` or a repository name.

Evaluation protocol, per family (``registry.EnvFamily``): ``eval_split`` is the split tuning and
checkpoint selection read (the in-run evaluations); ``report_split`` is the one the reported
before/after numbers come from, which no tuning path reads (TextWorld: ``test``; ALFWorld and SWE
have no third split, so their report reads the same split as their evaluations); the held-out
splits are those ``launch.eval --split`` accepts.

Every family, built-in or a user's, registers its task source with the env registry
(``register_env(name, factory, make_tasks=..., splits=..., eval_split=..., report_split=...)``);
:func:`make_tasks` asks the registry. The built-in families' sources are the functions below.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.envs import registry
from agentrl_jax.envs.base import Task


def make_tasks(
    env: str, level: str, split: str, count: int, env_kwargs: dict[str, Any] | None = None
) -> list[Task]:
    """``count`` tasks of ``level`` from ``split`` (fewer if the split holds fewer), from the task
    source the family ``env`` registered (ValueError naming the registered families)."""
    try:
        family = registry.family(env)
    except ValueError as e:
        raise ValueError(f"config.env.name={env!r} has no task source: {e}") from e
    return family.tasks(level, split, count, env_kwargs)


def eval_split(env: str) -> str:
    """The split the in-run evaluations of the family ``env`` read (its tuning split)."""
    return registry.family(env).eval_split


def textworld_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """TextWorld: ``count`` games of the spec ``level`` (made on first use, then cached)."""
    del env_kwargs
    from agentrl_jax.envs import games

    return games.make_tasks(level, split, count)


def textworld_prepare(jobs, progress: bool = True) -> None:
    """Generates the games of ``jobs`` (``(level, split, count)``) once, in parallel."""
    from agentrl_jax.envs import games

    games.generate(
        [(level, split, i) for level, split, n in jobs for i in range(n)], progress=progress
    )


def textworld_task_type(task: Task) -> str:
    """A TextWorld game's preset name (``custom-r2-o3-q2`` -> ``simple``), else its spec's name
    ("" for a task without a spec)."""
    spec = str(task.param("spec") or "")
    if not spec:
        return ""
    from agentrl_jax.envs import games  # light; textworld itself stays unloaded.

    for level in games.PRESETS:
        if games.parse_spec(level).name == spec:
            return level
    return spec


def alfworld_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """ALFWorld: the first ``count`` games of task type ``level`` (``all``: every type)."""
    from agentrl_jax.envs import alfworld_data

    root = alfworld_data.resolve_data_dir(env_kwargs.get("data_dir"))
    types = None if level == "all" else (level,)
    ids = alfworld_data.list_task_ids(root, split, types)
    return [Task(env="alfworld", split=split, id=i) for i in ids[:count]]


def alfworld_task_type(task: Task) -> str:
    """The ALFWorld task type encoded in the task id."""
    from agentrl_jax.envs.alfworld_data import task_type_of  # optional env's data helpers.

    return task_type_of(task.id)


def swe_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """SWE: a fixed fifth of the JSONL's instances (by a hash of the instance id) is ``eval``,
    the rest ``train``; ``level`` is ``all`` or a repository name."""
    from agentrl_jax.envs.base import stable_key
    from agentrl_jax.swe.tasks import load_jsonl

    path = env_kwargs.get("path")
    if not path:
        raise ValueError(
            "config.env.kwargs.path is missing: the SWE env needs the tasks.jsonl written "
            "by `python -m launch.make_swe_tasks` (or a SWE-Gym JSONL)"
        )
    records = [t for t in load_jsonl(path) if level in ("all", t.repo)]
    chosen = [t for t in records if (stable_key(t.instance_id) % 5 == 0) == (split == "eval")]
    return [Task(env="swe", split=split, id=t.instance_id) for t in chosen[:count]]


def report_levels(
    env_name: str, levels: tuple[str, ...], eval_levels: tuple[str, ...], count: int
) -> list[str]:
    """The before/after report's sets as ``level@split``: ``levels`` (or, empty, the names of
    ``eval_levels``) on the family's ``report_split`` unless a level names its own; none when
    ``count`` (games per level) is 0."""
    if not count:
        return []
    split = registry.family(env_name).report_split
    chosen = levels or tuple(level.partition("@")[0] for level in eval_levels)
    return ["@".join(parse_level(level, split)) for level in chosen]


def parse_level(level: str, default_split: str) -> tuple[str, str]:
    """``'all@valid_seen'`` -> ('all', 'valid_seen'); a bare level gets ``default_split``."""
    name, _, split = level.partition("@")
    return name, split or default_split
