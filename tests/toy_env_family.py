"""A user's env family, registered from its own module: a tiny deterministic text game.

The package knows nothing of it: ``--config.plugins="('toy_env_family',)"`` imports this module,
whose ``register_env`` call carries everything a run needs (the env, its task source, its split
names, the split tuning reads and the split the report reads), so it trains, evaluates and
reports through ``launch.train`` and ``launch.eval`` unchanged (tests/test_env_plugins.py).

The game: a corridor of rooms, each left by one door (north, east, south or west). ``go <door>``
through the right door advances a room, anything else stays put; the last room wins. Levels
``short`` (1 room to cross) and ``long`` (2); a task's doors come from its seed, and every split
holds its own seeds.
"""

from __future__ import annotations

from typing import Any

import agentrl_jax
from agentrl_jax.envs.base import Env, Observation, Task, stable_key

NAME = "toy-corridor"
DOORS = ("north", "east", "south", "west")
COMMANDS = tuple(f"go {d}" for d in DOORS) + ("look",)
LEVELS = {"short": 1, "long": 2}
SPLITS = ("train", "dev", "heldout")
TASKS_PER_SPLIT = 4
PREPARED: list[tuple[str, str, int]] = []  # the jobs ``prepare`` was given, in order


class CorridorEnv(Env):
    """The corridor game; ``max_steps`` ends an episode that has not won."""

    def __init__(self, max_steps: int = 4, admissible_commands: bool = True):
        self.max_steps = max_steps
        self.admissible_commands = admissible_commands

    def _obs(self, feedback: str = "") -> Observation:
        text = f"You are in room {self.room}. Doors lead {', '.join(DOORS)}."
        return Observation(
            objective=f"cross {len(self.doors)} room(s) to the exit",
            text=text,
            feedback=feedback or text,
            admissible_commands=COMMANDS if self.admissible_commands else None,
        )

    def _info(self) -> dict[str, Any]:
        won = self.room >= len(self.doors)
        return {
            "won": won,
            "score": self.room,
            "max_score": len(self.doors),
            "state_key": stable_key(NAME, self.task.id, self.room),
            "expert_action": "look" if won else f"go {self.doors[self.room]}",
        }

    def reset(self, task: Task) -> Observation:
        self.task, self.doors, self.room, self.steps = task, tuple(task.param("doors")), 0, 0
        return self._obs()

    def reset_info(self) -> dict[str, Any]:
        return self._info()

    def step(self, action: str):
        self.steps += 1
        action = action.strip().lower()
        moved = action == f"go {self.doors[self.room]}"
        self.room += moved
        info = {**self._info(), "invalid_action": action not in COMMANDS}
        done = info["won"] or self.steps >= self.max_steps
        feedback = "You walk through the door." if moved else "Nothing happens."
        return self._obs(feedback), float(moved), done, info


def make_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """``count`` corridors of ``level`` from ``split`` (at most ``TASKS_PER_SPLIT``), generated
    from seeds no other split uses."""
    del env_kwargs
    base = 1000 * SPLITS.index(split) + 100 * list(LEVELS).index(level)
    tasks = []
    for seed in range(base, base + min(count, TASKS_PER_SPLIT)):
        doors = tuple(DOORS[stable_key(seed, i) % len(DOORS)] for i in range(LEVELS[level]))
        tasks.append(Task(NAME, split, f"{level}/{seed}", (("doors", doors), ("seed", seed))))
    return tasks


def prepare(jobs, progress: bool = True) -> None:
    """A study's hook before its cells start (a family whose tasks are costly builds them here,
    once); the corridors are free, so it only records what it was asked for."""
    del progress
    PREPARED.extend(jobs)


agentrl_jax.register_env(
    NAME,
    CorridorEnv,
    make_tasks=make_tasks,
    splits=SPLITS,
    eval_split="dev",
    report_split="heldout",
    levels=tuple(LEVELS),
    prepare=prepare,
    overwrite=True,
)
