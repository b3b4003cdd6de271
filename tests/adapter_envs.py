"""Environments in other people's protocols, for the adapter tests (tests/test_adapters.py).

- ``TextCorridor-v0``: a gymnasium env with ``gymnasium.spaces.Text`` observations and actions,
  registered on import (``env.kwargs.module="adapter_envs"``).
- ``app``: an OpenEnv server (openenv-core's ``create_fastapi_app``) of the same corridor game,
  run by ``uvicorn adapter_envs:app``.

The game: a corridor of ``ROOMS`` rooms, each left by one door (north, east, south or west) drawn
from the episode's seed; ``go <door>`` through the right door advances a room, anything else
stays put; the last room wins with reward 1. Every state lists the valid commands.
"""

from __future__ import annotations

import random
import string
from typing import Any

import gymnasium
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
from pydantic import Field

DOORS = ("north", "east", "south", "west")
COMMANDS = [f"go {d}" for d in DOORS] + ["look"]
ROOMS = 2
GYM_ID = "TextCorridor-v0"
CHARSET = string.ascii_letters + string.digits + " .,!?'-"


class Corridor:
    """The game itself, shared by both protocols."""

    def __init__(self, seed: int | None):
        rng = random.Random(seed)
        self.doors = [rng.choice(DOORS) for _ in range(ROOMS)]
        self.room = 0

    def text(self) -> str:
        return f"You are in room {self.room} of {ROOMS}. Doors lead north, east, south and west."

    def step(self, action: str) -> tuple[str, float, bool]:
        moved = action.strip().lower() == f"go {self.doors[self.room]}"
        self.room += moved
        won = self.room >= ROOMS
        feedback = "You walk through the door. " if moved else "Nothing happens. "
        return feedback + ("You reached the exit!" if won else self.text()), float(won), won


class TextCorridorEnv(gymnasium.Env):
    """The corridor as a gymnasium env with Text spaces."""

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's own attribute

    def __init__(self):
        self.observation_space = gymnasium.spaces.Text(max_length=200, charset=CHARSET)
        self.action_space = gymnasium.spaces.Text(max_length=40, charset=CHARSET)

    def _info(self) -> dict[str, Any]:
        return {"objective": f"cross {ROOMS} rooms to the exit", "admissible_commands": COMMANDS}

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        self.game = Corridor(seed)
        return self.game.text(), self._info()

    def step(self, action: str):
        text, reward, won = self.game.step(action)
        return text, reward, won, False, self._info()


gymnasium.register(GYM_ID, entry_point=TextCorridorEnv, max_episode_steps=20)


class CorridorAction(Action):
    command: str = Field(..., min_length=1, description="a text command, e.g. 'go north'")


class CorridorObservation(Observation):
    text: str = ""
    legal_actions: list[str] = Field(default_factory=list)


class CorridorEnvironment(Environment):
    """The corridor as an OpenEnv environment (one per WebSocket session)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs):
        self.game = Corridor(seed)
        self._state = State(episode_id=episode_id, step_count=0, room=0)
        return CorridorObservation(text=self.game.text(), legal_actions=COMMANDS)

    def step(self, action: CorridorAction, timeout_s=None, **kwargs):
        text, reward, won = self.game.step(action.command)
        self._state = State(
            episode_id=self._state.episode_id,
            step_count=self._state.step_count + 1,
            room=self.game.room,
        )
        return CorridorObservation(text=text, legal_actions=COMMANDS, reward=reward, done=won)

    @property
    def state(self) -> State:
        return self._state


app = create_fastapi_app(
    CorridorEnvironment, CorridorAction, CorridorObservation, max_concurrent_envs=16
)
