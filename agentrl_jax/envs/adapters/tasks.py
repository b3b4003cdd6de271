"""The task source the adapters share: a task is a seed of a level, and splits own disjoint seeds.

An adapted environment has no task files of its own: its episodes differ by the seed its reset
takes (gymnasium's ``reset(seed=...)``, an OpenEnv server's ``reset(seed=...)``, TextArena's
``reset(num_players=1, seed=...)``). Task ``i`` of split ``s`` uses seed ``SPLIT_SEED_OFFSET[s] +
i``, as TextWorld's games do, so train and held-out episodes never share a seed. A level names
what is played: the env id for gymnasium, the game id for TextArena, ``default`` for an OpenEnv
server (one server serves one environment).
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.envs.base import Task

SPLITS = ("train", "valid", "test")
SPLIT_SEED_OFFSET = {"train": 0, "valid": 1_000_000, "test": 2_000_000}
MAX_TASKS_PER_SPLIT = 1_000_000  # a split's seeds stop where the next split's begin


def seeded_tasks(env: str, level: str, split: str, count: int) -> list[Task]:
    """``count`` tasks of ``level`` from ``split`` of the adapter family ``env``: seeds
    ``SPLIT_SEED_OFFSET[split] + i``.

    Raises:
      ValueError: an unknown split, a level holding ``/`` (level names become file names of the
        evaluation reports), or more tasks than a split holds.
    """
    if split not in SPLIT_SEED_OFFSET:
        raise ValueError(f"env {env!r} has no split {split!r}; its splits: {', '.join(SPLITS)}")
    if not level or "/" in level:
        raise ValueError(
            f"env {env!r}: level {level!r} must be a non-empty name without '/' (it names "
            "the evaluation's files)"
        )
    if count > MAX_TASKS_PER_SPLIT:
        raise ValueError(f"env {env!r}: {count} tasks asked, a split holds {MAX_TASKS_PER_SPLIT}")
    base = SPLIT_SEED_OFFSET[split]
    return [
        Task(env, split, f"{level}/{seed}", (("level", level), ("seed", seed)))
        for seed in range(base, base + count)
    ]


def gymnasium_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """The gymnasium family's tasks: ``level`` is a registered env id (checked here, so a config
    naming an unknown or non-text env fails when its tasks are drawn, before any episode)."""
    from agentrl_jax.envs.adapters import gymnasium_env  # noqa: PLC0415 - gymnasium on demand

    gymnasium_env.check_text_env(level, env_kwargs.get("module", ""))
    return seeded_tasks("gymnasium", level, split, count)


def textarena_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """The textarena family's tasks: ``level`` is a registered TextArena game id (one whose
    valid moves are known, where ``env_kwargs`` asks for ``admissible_commands``)."""
    from agentrl_jax.envs.adapters import textarena_env  # noqa: PLC0415 - textarena on demand

    textarena_env.check_game(level, bool(env_kwargs.get("admissible_commands", False)))
    return seeded_tasks("textarena", level, split, count)


def openenv_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """The openenv family's tasks: seeds of the one environment its server serves."""
    del env_kwargs
    return seeded_tasks("openenv", level, split, count)
