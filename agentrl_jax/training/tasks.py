"""Task lists per complexity level, for every environment family the trainer drives.

A level names a slice of tasks: a TextWorld game spec (``simple``, ``medium``, ``hard``,
``custom:R,O,Q`` or a challenge), an ALFWorld task type (or ``all``). Train and evaluation tasks
come from disjoint splits (TextWorld: disjoint seed ranges; ALFWorld: train vs valid_seen /
valid_unseen). An evaluation level may name its split: ``all@valid_seen``.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.envs.base import Task

EVAL_SPLIT = {"textworld": "valid", "alfworld": "valid_unseen"}


def make_tasks(
    env: str, level: str, split: str, count: int, env_kwargs: dict[str, Any] | None = None
) -> list[Task]:
    """``count`` tasks of ``level`` from ``split`` (fewer if the split holds fewer)."""
    if env == "textworld":
        from agentrl_jax.envs import games

        return games.make_tasks(level, split, count)
    if env == "alfworld":
        from agentrl_jax.envs import alfworld_data

        root = alfworld_data.resolve_data_dir((env_kwargs or {}).get("data_dir"))
        types = None if level == "all" else (level,)
        ids = alfworld_data.list_task_ids(root, split, types)
        return [Task(env="alfworld", split=split, id=i) for i in ids[:count]]
    raise ValueError(f"config.env.name={env!r} has no task source; valid: textworld, alfworld")


def parse_level(level: str, default_split: str) -> tuple[str, str]:
    """``'all@valid_seen'`` -> ('all', 'valid_seen'); a bare level gets ``default_split``."""
    name, _, split = level.partition("@")
    return name, split or default_split


def task_type(task: Task) -> str:
    """The category success is reported by: the game spec, or the ALFWorld task type."""
    if task.env == "alfworld":
        from agentrl_jax.envs.alfworld_data import task_type_of

        return task_type_of(task.id)
    return str(task.param("spec") or task.id.split("/", 1)[0])
