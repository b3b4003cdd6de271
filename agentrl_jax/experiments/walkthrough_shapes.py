"""An episode against its walkthrough: the walkthrough's shape (its commands' first words,
``take ; eat``) and where an episode first left it (``Divergence``), for the failure breakdown's
tables by shape (``experiments/failures.py``, docs/evaluation.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agentrl_jax.envs.base import Walkthrough


def command_verb(command: str) -> str:
    """A command's first word, lower case ("" for an empty command)."""
    words = command.lower().split()
    return words[0] if words else ""


def walkthrough_shape(walkthrough: Walkthrough | None) -> str:
    """The walkthrough's commands' first words joined by " ; " (``take ; eat``); "" without a
    walkthrough or commands."""
    if walkthrough is None:
        return ""
    return " ; ".join(command_verb(c) for c in walkthrough.commands)


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where an episode first left its walkthrough.

    Attributes:
      step: the index of the first command that differs from the walkthrough's command at that
        step, which is also the number of walkthrough commands played before it (0: the first).
      expected: the first word of the walkthrough's command at that step.
      played: the first word of the command played instead.
    """

    step: int
    expected: str
    played: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def divergence(commands: Sequence[str], walkthrough: Walkthrough | None) -> Divergence | None:
    """The first step where ``commands`` differ from the walkthrough's commands (compared lower
    case, runs of spaces as one); None without a walkthrough, or where each command played is
    the walkthrough's at its step (as far as both go).

    The walkthrough is read as a plan from the start (TextWorld's: the expert's plan from the
    initial state); the steps after the first divergence are not compared.
    """
    if walkthrough is None:
        return None
    for step, (played, expected) in enumerate(zip(commands, walkthrough.commands)):
        if _normal(played) != _normal(expected):
            return Divergence(step, command_verb(expected), command_verb(played))
    return None


def _normal(command: str) -> str:
    return " ".join(command.lower().split())


def _verb(word: str) -> str:
    return word.replace("|", "/") or "(empty)"  # an empty command has no first word
