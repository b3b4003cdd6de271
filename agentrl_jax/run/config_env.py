"""``config.env``: the env family, its levels and tasks, and the actor pool, each field checked
beside it (``run/config_checks.py``); the levels against the family's registry entry."""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl_jax.run import config_checks as checks
from agentrl_jax.run.config_checks import ConfigError


def check_levels(family, field: str, levels, held_out: bool = True) -> None:
    """Each of ``levels`` (``level`` or ``level@split``) names a level and split the env family
    has (``registry.EnvFamily``): a held-out split where ``held_out``, none otherwise (train
    levels read ``train``); a level among ``family.levels`` where it declares them.

    Raises:
      ConfigError: naming ``field``, the family and its splits or levels.
    """
    from agentrl_jax.envs import registry

    for entry in levels:
        if not isinstance(entry, str) or not entry.partition("@")[0]:
            raise ConfigError(f"{field} holds {entry!r}; expected 'level' or 'level@split'")
        level, at, split = entry.partition("@")
        splits = family.held_out_splits if held_out else ()
        if at and split not in splits:
            where = (
                f"one of {', '.join(splits)}"
                if splits
                else f"none (they read {registry.TRAIN_SPLIT!r})"
            )
            raise ConfigError(
                f"{field} holds {entry!r}: env family {family.name!r} has no held-out split "
                f"{split!r}; expected {where} (registered env families: "
                f"{', '.join(registry.names())})"
            )
        if family.levels and level not in family.levels:
            raise ConfigError(
                f"{field} holds {entry!r}: env family {family.name!r} has no level {level!r}; "
                f"expected one of {', '.join(family.levels)}"
            )


@dataclasses.dataclass(frozen=True)
class EnvSection:
    name: str = "textworld"
    kwargs: tuple[tuple[str, Any], ...] = checks.mapping()  # the env's constructor arguments
    train_levels: tuple[str, ...] = ("simple",)
    eval_levels: tuple[str, ...] = ("simple", "medium")
    num_train_tasks: int = 200
    num_eval_tasks: int = 50
    report_levels: tuple[str, ...] = ()  # empty: eval_levels, on the report split
    # Games per level of the before/after report (0: the report reads the valid evaluations).
    num_report_tasks: int = 200
    # Episodes per evaluated level written out as text (eval/<name>_<level>_transcripts.md).
    num_transcripts: int = 3
    num_workers: int = 2  # actor processes (0: one per CPU)
    envs_per_worker: int = 16
    # A worker steps its envs side by side, each on a thread (envs whose steps wait: remote,
    # subprocesses, step_latency_s); False: one after another.
    concurrent_steps: bool = False

    def __post_init__(self):
        from agentrl_jax.envs import registry

        try:
            registry.resolve(self.name)
        except ValueError as e:
            raise ConfigError(f"config.env.name: {e}") from e
        for name in ("train_levels", "eval_levels"):
            if not getattr(self, name):
                raise ConfigError(f"config.env.{name} is empty; expected at least one level")
        try:
            family = registry.family(self.name)
        except ValueError:  # a "module:attr" path: an env without a registered task source
            return
        for name in ("train_levels", "eval_levels", "report_levels"):
            check_levels(family, f"config.env.{name}", getattr(self, name), name != "train_levels")
        checks.integer("config.env.num_train_tasks", self.num_train_tasks, 1)
        checks.integer("config.env.num_eval_tasks", self.num_eval_tasks, 1)
        checks.integer("config.env.num_report_tasks", self.num_report_tasks, 0)
        checks.integer("config.env.num_transcripts", self.num_transcripts, 0)
        checks.integer("config.env.num_workers", self.num_workers, 0)
        checks.integer("config.env.envs_per_worker", self.envs_per_worker, 1)
        if not isinstance(self.concurrent_steps, bool):
            raise ConfigError(
                f"config.env.concurrent_steps is {self.concurrent_steps!r}; expected True or False"
            )
