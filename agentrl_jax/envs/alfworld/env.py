"""ALFWorld, the text version of ALFRED household tasks, behind the project's ``Env`` contract.

    env = ALFWorldEnv(data_dir="../shared/data/alfworld", max_steps=50)
    task = env.tasks("valid_unseen")[0]  # Task("alfworld", "valid_unseen", "<folder>/<trial>")
    obs = env.reset(task)                # obs.objective: "put some mug on desk."
    obs, reward, done, info = env.step(env.reset_info()["expert_action"])

Each task's game is rebuilt from its problem (``alfworld_games``), played by TextWorld's PDDL engine
with alfworld's wrappers (``alfworld_engine``). Reward is sparse: 1 on the step that wins, else 0.
An episode ends on a win or after ``max_steps`` steps (ALFWorld papers use 50).

``info`` per step:
  won, invalid_action: the command matched no admissible command (the engine answers
    "Nothing happens." and the state is unchanged), state_key (below), expert_action (alfworld's
    expert's next command, None once it has given up), score/max_score (1 on win / 1),
  task_type (one of the six), task (the task name), steps, truncated (hit max_steps unwon),
  action_note (what was done to a malformed action, '' when nothing).

state_key is ``stable_key`` of the task and the sorted true atoms of the PDDL state (grounded over
raw object ids such as ``Mug_bar__minus_02_dot_05...``, which are unique; the engine's records of
deleted atoms are left out, see ``alfworld_engine.fact_strings``). Text alone is not
enough: two different states can print the same text. "Nothing happens." is the feedback of any
invalid command from any state; "You arrive at drawer 1. The drawer 1 is closed." hides whether
something was put in that drawer earlier; display names are per-class counters, so which of two
identical-looking mugs the agent holds is not in the text. The facts include bookkeeping predicates
of the domain (``checked``: a receptacle was looked at), so the key is exact: it never merges two
distinct states, and it may tell apart two situations that look the same to a human.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

from agentrl_jax.envs.alfworld import data as alfworld_data
from agentrl_jax.envs.alfworld import games as alfworld_games
from agentrl_jax.envs.base import Env, Observation, Task, stable_key

ENV_NAME = "alfworld"
MAX_ACTION_CHARS = 512  # Admissible commands are under ~60 characters.
_BANNER = re.compile(r"^\s*-= Welcome to TextWorld, ALFRED! =-\s*")
_TASK_MARK = "Your task is to: "


class ALFWorldEnv(Env):
    """The ALFWorld text benchmark (json_2.1.1 tasks), one episode at a time.

    Args:
      data_dir: the data root, its json_2.1.1 folder, the alfworld_problems.tar.xz pack, or a
        folder holding it; None reads $ALFWORLD_DATA. Missing data raises MissingDataError
        saying how to get it.
      split: the default split of ``tasks()`` and of string task ids given to ``reset``.
      max_steps: the step limit of an episode.
      expert: "handcoded" (alfworld's heuristic expert), "planner" (optimal, slower) or None.
      cache_dir: where packs are unpacked and games cached (default ~/.cache/agentrl_jax/alfworld).
      goal_desc_human_anns_prob: probability of a human-written goal instead of the template.
      admissible_commands: list the valid commands in each observation.
      fast_engine: memoize pure functions inside the engine (``alfworld_speedups``: grammar
        parsing and PDDL translation): identical games, ~3x faster steps, resets of a game
        already seen nearly free. False does not install it (the patch is process-wide: it stays
        if another env of the process installed it; ``alfworld_speedups.uninstall()`` removes it).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        split: str = "train",
        max_steps: int = 50,
        expert: str | None = "handcoded",
        cache_dir: str | os.PathLike | None = None,
        goal_desc_human_anns_prob: float = 0.0,
        admissible_commands: bool = True,
        fast_engine: bool = True,
    ):
        if split not in alfworld_data.SPLITS:
            raise ValueError(
                f"unknown ALFWorld split {split!r}; expected one of {alfworld_data.SPLITS}"
            )
        if expert not in (None, "handcoded", "planner"):
            raise ValueError(
                f"unknown ALFWorld expert {expert!r}; expected 'handcoded', 'planner' or None"
            )
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if not 0.0 <= goal_desc_human_anns_prob <= 1.0:
            raise ValueError(
                f"goal_desc_human_anns_prob must be in [0, 1], got {goal_desc_human_anns_prob}"
            )
        # Resolve before importing alfworld: its import sets ALFWORLD_DATA when unset.
        self.root = alfworld_data.resolve_data_dir(data_dir, cache_dir)
        self.split = split
        self.max_steps = int(max_steps)
        self.expert = expert
        self.cache_dir = cache_dir
        self.goal_desc_human_anns_prob = float(goal_desc_human_anns_prob)
        self.list_admissible = admissible_commands
        self.fast_engine = fast_engine
        self._engine = None
        self._loaded: pathlib.Path | None = None
        self._task: Task | None = None
        self._objective = ""
        self._steps = 0
        self._done = True
        self._last: tuple[Observation, dict[str, Any]] | None = None

    @property
    def last_info(self) -> dict[str, Any]:
        """The info of the last reset or step (after a reset: won, state_key, expert_action...).

        ``reset`` returns only an Observation (the Env contract); the initial state key and the
        expert's first action are here.
        """
        if self._last is None:
            raise RuntimeError("ALFWorldEnv.last_info before reset(): call reset(task) first")
        return dict(self._last[1])

    def reset_info(self) -> dict[str, Any]:
        """The Env contract's name for ``last_info`` right after a reset."""
        return self.last_info

    def tasks(self, split: str | None = None, task_types=None) -> list[Task]:
        """The tasks of a split (default: this env's), sorted by id, optionally of some types."""
        split = split or self.split
        ids = alfworld_data.list_task_ids(self.root, split, task_types)
        return [Task(env=ENV_NAME, split=split, id=i) for i in ids]

    def reset(self, task: Task | str) -> Observation:
        """Starts ``task`` (a Task, or an id in this env's default split)."""
        from agentrl_jax.envs.alfworld import engine as alfworld_engine

        task = self._as_task(task)
        self._done = True  # Until this reset succeeds, stepping is refused.
        # All of it under the engine's per-process lock: the goal draw in build_game, install()
        # and the engine itself touch process-wide state (alfworld_engine's docstring).
        with alfworld_engine.ENGINE_LOCK:
            state = self._reset_engine(task)
        intro = _BANNER.sub("", state.feedback).strip()
        text, _, objective = intro.partition(_TASK_MARK)
        self._task, self._objective = task, objective.strip()
        self._steps, self._done = 0, False
        obs = self._observation(state, text=text.strip(), feedback="")
        self._last = (obs, self._info(state, invalid=False, note=""))
        return obs

    def _reset_engine(self, task: Task) -> Any:
        """Builds (or finds) the task's game, loads it unless loaded, and resets the engine."""
        from agentrl_jax.envs.alfworld import engine as alfworld_engine

        game_file = alfworld_games.build_game(
            self.root,
            task.split,
            task.id,
            cache_dir=self.cache_dir,
            goal_desc_human_anns_prob=self.goal_desc_human_anns_prob,
        )
        if self._engine is None:
            self._engine = alfworld_engine.make_engine(self.expert)
        if self.fast_engine:
            from agentrl_jax.envs.alfworld import speedups as alfworld_speedups

            alfworld_speedups.install(translations=alfworld_games.translations_dir(self.cache_dir))
        if self._loaded != game_file:
            self._loaded = None
            alfworld_engine.guarded(
                f"loading ALFWorld game {str(game_file)!r} (task {task.name})",
                lambda: self._engine.load(str(game_file)),
            )
            self._loaded = game_file
        if self.expert is not None:
            self._engine.seed = stable_key("alfworld-expert", task.split, task.id) & 0xFFFF_FFFF
        return alfworld_engine.guarded(f"resetting ALFWorld task {task.name}", self._engine.reset)

    def step(self, action: Any) -> tuple[Observation, float, bool, dict[str, Any]]:
        """Applies one command; any text (empty, huge, garbled) gets an answer, never an error.

        Returns:
          (observation, reward, done, info); after the episode ended it returns the last
          observation again with done=True, reward 0 and info["action_note"] saying so.
        """
        from agentrl_jax.envs.alfworld import engine as alfworld_engine

        if self._last is None:
            raise RuntimeError("ALFWorldEnv.step() before reset(): call reset(task) first")
        if self._done:
            obs, info = self._last
            return obs, 0.0, True, {**info, "action_note": "episode is over; call reset(task)"}
        command, note = clean_action(action)
        state, _, _ = alfworld_engine.guarded(
            f"stepping ALFWorld task {self._task.name}", lambda: self._engine.step(command)
        )
        self._steps += 1
        won = bool(state["won"])
        feedback = state.feedback.strip()
        # The engine marks a command matching no admissible action with _last_action=None (and
        # answers "Nothing happens."); an admissible command always has an action.
        invalid = state["_last_action"] is None
        info = self._info(state, invalid=invalid, note=note)
        self._done = won or info["truncated"]
        obs = self._observation(state, text=feedback, feedback=feedback)
        self._last = (obs, info)
        return obs, (1.0 if won else 0.0), self._done, info

    def close(self) -> None:
        """Frees the engine (safe to call twice)."""
        if self._engine is not None:
            from agentrl_jax.envs.alfworld import engine as alfworld_engine

            with alfworld_engine.ENGINE_LOCK:
                self._engine.close()
        self._engine, self._loaded, self._last, self._done = None, None, None, True

    def _as_task(self, task: Task | str) -> Task:
        if isinstance(task, str):
            task = Task(env=ENV_NAME, split=self.split, id=task)
        if not isinstance(task, Task):
            raise TypeError(f"reset() takes a Task or a task id string, got {type(task).__name__}")
        if task.env != ENV_NAME:
            raise ValueError(f"task {task.name!r} is for env {task.env!r}, not {ENV_NAME!r}")
        alfworld_data.task_type_of(task.id)  # Raises on a malformed id.
        return task

    def _observation(self, state: Any, *, text: str, feedback: str) -> Observation:
        from agentrl_jax.envs.alfworld import engine as alfworld_engine

        held = alfworld_engine.held_objects(state)
        inventory = (
            "You are carrying: " + ", ".join(f"a {h}" for h in held) + "."
            if held
            else "You are not carrying anything."
        )
        commands = tuple(state["admissible_commands"]) if self.list_admissible else None
        return Observation(
            objective=self._objective,
            text=text,
            inventory=inventory,
            feedback=feedback,
            admissible_commands=commands,
        )

    def _info(self, state: Any, *, invalid: bool, note: str) -> dict[str, Any]:
        from agentrl_jax.envs.alfworld import engine as alfworld_engine

        won = bool(state["won"])
        plan = state.get("extra.expert_plan") if self.expert is not None else None
        return {
            "won": won,
            "invalid_action": invalid,
            "state_key": stable_key(
                ENV_NAME,
                self._task.split,
                self._task.id,
                tuple(alfworld_engine.fact_strings(state)),
            ),
            "expert_action": plan[0] if plan else None,
            "score": 1.0 if won else 0.0,
            "max_score": 1.0,
            "task_type": alfworld_data.task_type_of(self._task.id),
            "task": self._task.name,
            "steps": self._steps,
            "truncated": not won and self._steps >= self.max_steps,
            "action_note": note,
        }


AlfworldEnv = ALFWorldEnv  # Alias: the registry's first draft spelled it this way.


def clean_action(action: Any) -> tuple[str, str]:
    """Turns any action into engine-safe text, and says what was changed ('' when nothing).

    bytes are decoded as UTF-8 with invalid sequences replaced; text that is not valid Unicode
    (lone surrogates) gets them replaced; None becomes ''; other objects their str(); text over
    MAX_ACTION_CHARS is cut. The engine then matches it against the admissible commands as is
    (after stripping outer whitespace), as ALFWorld does.
    """
    notes = []
    if action is None:
        action, notes = "", ["action was None"]
    elif isinstance(action, (bytes, bytearray)):
        raw = bytes(action)
        action = raw.decode("utf-8", errors="replace")
        if action.encode("utf-8") != raw:
            notes.append("non-UTF-8 bytes replaced")
    elif not isinstance(action, str):
        notes.append(f"action of type {type(action).__name__} converted to text")
        action = str(action)
    cleaned = action.encode("utf-8", errors="replace").decode("utf-8")
    if cleaned != action:
        notes.append("invalid Unicode replaced")
    if len(cleaned) > MAX_ACTION_CHARS:
        notes.append(f"action cut from {len(cleaned)} to {MAX_ACTION_CHARS} characters")
        cleaned = cleaned[:MAX_ACTION_CHARS]
    if not cleaned.strip():
        notes.append("empty action")
    return cleaned, "; ".join(notes)


def success_by_task_type(results: list[tuple[str, bool]]) -> dict[str, float]:
    """Success rate per task type and overall ("all") from ``(task_id_or_type, won)`` pairs."""
    wins: dict[str, list[bool]] = {}
    for key, won in results:
        task_type = key if key in alfworld_data.TASK_TYPES else alfworld_data.task_type_of(key)
        wins.setdefault(task_type, []).append(bool(won))
    rates = {t: sum(w) / len(w) for t, w in sorted(wins.items())}
    if wins:
        every = [w for ws in wins.values() for w in ws]
        rates["all"] = sum(every) / len(every)
    return rates
