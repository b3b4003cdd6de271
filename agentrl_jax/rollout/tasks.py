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
:func:`make_tasks` asks the registry. The built-in families' sources live beside their envs
(TextWorld's in ``envs/textworld/games.py``, ALFWorld's in ``envs/alfworld/data.py``, SWE's in
``envs/swe/tasks.py``).
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
