"""Task lists per complexity level, for every environment family the trainer drives.

A level names a slice of tasks: a TextWorld game spec (``simple``, ``medium``, ``hard``,
``custom:R,O,Q`` or a challenge), an ALFWorld task type (or ``all``). Train and evaluation tasks
come from disjoint splits (TextWorld: disjoint seed ranges; ALFWorld: train vs valid_seen /
valid_unseen; SWE: a fixed fifth of a JSONL file's instances, chosen by a hash of the instance
id, is the ``eval`` split and the rest ``train``). An evaluation level may name its split:
``all@valid_seen``. SWE levels are ``all`` or a repository name.

Evaluation protocol: ``EVAL_SPLIT`` is the split tuning and checkpoint selection read (the
in-run evaluations); ``REPORT_SPLIT`` is the one the reported before/after numbers come from,
which no tuning path reads (TextWorld: ``test``; ALFWorld and SWE have no third split, so their
report reads the same split as their evaluations). ``HELD_OUT_SPLITS`` are the splits
``launch.eval --split`` accepts.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.envs.base import Task

EVAL_SPLIT = {"textworld": "valid", "alfworld": "valid_unseen", "swe": "eval"}
REPORT_SPLIT = {"textworld": "test", "alfworld": "valid_unseen", "swe": "eval"}
HELD_OUT_SPLITS = {
    "textworld": ("valid", "test"),
    "alfworld": ("valid_seen", "valid_unseen"),
    "swe": ("eval",),
}


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
    if env == "swe":
        from agentrl_jax.envs.base import stable_key
        from agentrl_jax.swe.tasks import load_jsonl

        path = (env_kwargs or {}).get("path")
        if not path:
            raise ValueError(
                "config.env.kwargs.path is missing: the SWE env needs the tasks.jsonl written "
                "by `python -m launch.make_swe_tasks` (or a SWE-Gym JSONL)"
            )
        if split not in ("train", "eval"):
            raise ValueError(f"SWE split {split!r}: expected 'train' or 'eval'")
        records = [t for t in load_jsonl(path) if level in ("all", t.repo)]
        chosen = [t for t in records if (stable_key(t.instance_id) % 5 == 0) == (split == "eval")]
        return [Task(env="swe", split=split, id=t.instance_id) for t in chosen[:count]]
    raise ValueError(f"config.env.name={env!r} has no task source; valid: textworld, alfworld, swe")


def report_levels(
    env_name: str, levels: tuple[str, ...], eval_levels: tuple[str, ...], count: int
) -> list[str]:
    """The before/after report's sets as ``level@split``: ``levels`` (or, empty, the names of
    ``eval_levels``) on the env's ``REPORT_SPLIT`` unless a level names its own; none when
    ``count`` (games per level) is 0."""
    if not count:
        return []
    split = REPORT_SPLIT.get(env_name, "test")
    chosen = levels or tuple(level.partition("@")[0] for level in eval_levels)
    return ["@".join(parse_level(level, split)) for level in chosen]


def parse_level(level: str, default_split: str) -> tuple[str, str]:
    """``'all@valid_seen'`` -> ('all', 'valid_seen'); a bare level gets ``default_split``."""
    name, _, split = level.partition("@")
    return name, split or default_split
