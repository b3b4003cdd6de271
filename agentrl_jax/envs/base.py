"""The environment contract every domain implements (TextWorld, ALFWorld, SWE).

    env.reset(task) -> Observation
    env.step(action_text) -> (Observation, reward, done, info)
    env.step(ToolCall(name, arguments)) -> (Observation, reward, done, info)   (tool envs)

``info`` always carries ``won`` (bool), ``invalid_action`` (bool) and ``state_key`` (an int that is
equal exactly when the true environment states are equal; GiGPO and GAGPO group steps by it), plus
``score``/``max_score`` where the env keeps a score and ``expert_action`` where it has an expert.
``env.reset_info()`` gives the same keys for the state right after a reset. Optional keys the
failure breakdown reads (``experiments/failures.py``): ``lost`` (the env ended the episode in
defeat), ``expert_steps`` (the expert's plan length from the state) and ``room`` (where the
player is, named as the family's :class:`Walkthrough` names rooms).

An env that offers function tools (``Env.tool_schemas``) is stepped with a ``ToolCall``: the
rollout parses the policy's call in its model family's format and checks it against the schemas
first (``rollout/tool_calls.py``), so the env sees only a well-formed call to one of its tools.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import inspect
import random
import time
from typing import Any


@dataclasses.dataclass(frozen=True)
class Task:
    """A named, reproducible task: the env family, the split, and an id or seed within it."""

    env: str
    split: str
    id: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.env}/{self.split}/{self.id}"

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the agent is shown after a reset or a step.

    Attributes:
      objective: the task's goal, in words.
      text: what the agent sees now (room description, command output).
      inventory: what the agent carries, where the env has an inventory.
      feedback: the env's answer to the last command ('' after a reset).
      admissible_commands: the valid commands, where the env can list them.
    """

    objective: str
    text: str
    inventory: str = ""
    feedback: str = ""
    admissible_commands: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Walkthrough:
    """A task's expert solution, as an env family's ``walkthrough`` hook gives it: what the
    failure breakdown (``experiments/failures.py``) compares a lost episode's commands with.

    Attributes:
      commands: the winning commands from the start, in order.
      rooms: the rooms the player passes through playing them, the start first, each once, in
        the order first entered (named as the env's ``room`` info names them); empty when the
        env has no rooms.
      entities: every thing of the game a command can name (objects, containers, supporters,
        doors; not rooms), lower case.
    """

    commands: tuple[str, ...]
    rooms: tuple[str, ...] = ()
    entities: tuple[str, ...] = ()

    @property
    def objects(self) -> frozenset[str]:
        """The entities the walkthrough's commands name."""
        return frozenset(name for command in self.commands for name in self.named(command))

    def named(self, command: str) -> tuple[str, ...]:
        """The entities ``command`` names, in order: whole words, case-insensitive, the longest
        name first where names overlap (``red key`` in "unlock chest with red key", not ``key``).
        """
        words = command.lower().split()
        names = sorted({tuple(e.lower().split()) for e in self.entities if e.split()}, key=len)
        found, i = [], 0
        while i < len(words):
            for name in reversed(names):  # longest first
                if tuple(words[i : i + len(name)]) == name:
                    found.append(" ".join(name))
                    i += len(name)
                    break
            else:
                i += 1
        return tuple(found)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A call of one of an env's function tools, as the rollout parsed it from the policy's text.

    Attributes:
      name: the tool's name (one of ``Env.tool_schemas``).
      arguments: the call's arguments, checked against the tool's JSON schema (required ones
        present, each of its declared type).
    """

    name: str
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)


class Env(abc.ABC):
    """A text environment: one episode at a time, driven by text actions."""

    @abc.abstractmethod
    def reset(self, task: Task) -> Observation:
        """Starts ``task`` and returns the first observation."""

    @abc.abstractmethod
    def step(self, action: str | ToolCall) -> tuple[Observation, float, bool, dict[str, Any]]:
        """Applies one action (any text, even malformed; a ``ToolCall`` where the env offers
        tools) and returns (obs, reward, done, info)."""

    @classmethod
    def tool_schemas(cls, **kwargs: Any) -> tuple[dict[str, Any], ...]:
        """The function tools an env built with ``kwargs`` offers, as JSON schemas in the form
        ``apply_chat_template(tools=...)`` takes (``{"type": "function", "function": {"name",
        "description", "parameters"}}``). Empty (the default): its actions are text commands.
        """
        return ()

    @classmethod
    def lists_admissible_commands(cls, **kwargs: Any) -> bool | None:
        """Whether an env built with ``kwargs`` lists admissible commands in its observations
        (``rollout.constrain_actions`` writes one of them; the config is checked against this).

        True, False, or None when it cannot tell before playing. By default: the value of the
        constructor's ``admissible_commands`` argument (given or its default) where it has one,
        else None. An env that never lists any returns False.
        """
        param = inspect.signature(cls).parameters.get("admissible_commands")
        if param is None:
            return None
        return bool(kwargs.get("admissible_commands", param.default))

    def reset_info(self) -> dict[str, Any]:
        """The info of the state the last ``reset`` produced: at least ``state_key`` and, where
        the env has an expert, ``expert_action``. The actor pool returns it with each reset (the
        rollout needs the initial state key and the expert's first action)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Frees engine resources. Safe to call twice."""


def stable_key(*parts: Any) -> int:
    """A process-independent 63-bit integer key of ``parts`` (Python's hash() is salted per run)."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


# ------------------------------------------------------------------------------ step latency

# The env.kwargs key of an injected step latency (every family accepts it: it is taken out
# before the env's own factory sees its kwargs).
STEP_LATENCY = "step_latency_s"


class LatencyEnv(Env):
    """``env`` whose every step waits ``latency`` seconds before answering: a stand-in for a slow
    or remote environment (a test suite that runs for seconds, an env behind a network) in
    benchmarks and tests. The answers are ``env``'s own, unchanged.

    ``latency`` is a number of seconds (>= 0), or ``(low, high)``: a delay drawn uniformly per
    step, from a generator seeded with ``seed`` (timing only: nothing the episode sees depends
    on it).
    """

    def __init__(self, env: Env, latency: float | tuple[float, float], seed: int = 0):
        self.env = env
        self.low, self.high = parse_latency(latency)
        self._rng = random.Random(seed)

    def reset(self, task: Task) -> Observation:
        return self.env.reset(task)

    def reset_info(self) -> dict[str, Any]:
        return self.env.reset_info()

    def step(self, action: str | ToolCall) -> tuple[Observation, float, bool, dict[str, Any]]:
        out = self.env.step(action)
        delay = self.low if self.high == self.low else self._rng.uniform(self.low, self.high)
        time.sleep(delay)
        return out

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name: str) -> Any:  # the wrapped env's other attributes
        return getattr(self.env, name)


def parse_latency(latency: Any) -> tuple[float, float]:
    """``(low, high)`` seconds of a ``step_latency_s`` value: a number, or a pair low <= high.

    Raises:
      ValueError: naming ``env.kwargs.step_latency_s`` and what was expected.
    """
    pair = latency if isinstance(latency, (list, tuple)) else (latency, latency)
    ok = len(pair) == 2 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in pair
    )
    if not ok or pair[0] > pair[1]:
        raise ValueError(
            f"env.kwargs.{STEP_LATENCY} is {latency!r}; expected seconds >= 0, or a pair "
            "[low, high] with 0 <= low <= high (a delay drawn uniformly per step)"
        )
    return float(pair[0]), float(pair[1])


def split_latency(kwargs: dict[str, Any]) -> tuple[tuple[float, float] | None, dict[str, Any]]:
    """``(latency or None, the env's own kwargs)`` of an ``env.kwargs`` dict."""
    rest = dict(kwargs)
    if STEP_LATENCY not in rest:
        return None, rest
    return parse_latency(rest.pop(STEP_LATENCY)), rest
