"""TextWorld's PDDL engine wrapped with alfworld's own wrappers, as alfworld's generator does it.

    PddlEnv -> AlfredDemangler(shuffle=False) -> AlfredInfos -> AlfredExpert (optional)

``PddlEnv`` (textworld 1.7) grounds the problem with fast-downward and renders text through the
grammar; ``AlfredDemangler`` names objects "mug 1" instead of "Mug_bar__minus_02_dot_05..."; the
expert proposes the next command (``state["extra.expert_plan"]``).

Three things this module adds around the engine, all for robustness in long-running workers:
- ``SafeExpert``: alfworld's handcoded expert raises when it gives up (after 200 of its own steps,
  or when it runs out of subgoals, e.g. after the agent wandered off); here that ends the expert's
  advice for the episode (no expert action) instead of crashing the step. Its tie-breaking
  ``random.choice`` calls draw from a per-episode seeded generator, so expert demonstrations are
  reproducible, and the process-global ``random`` state is left as it was.
- ``guarded``: fast-downward's translator overwrites ``sys.argv`` and may ``sys.exit`` on a bad
  problem; ``guarded`` restores ``sys.argv`` and turns any failure into ``EngineError``.
- ``ENGINE_LOCK``: the engine is not thread-safe across envs of one process. Its grammar and PDDL
  parsers are module-level tatsu parsers that keep their parse state on the parser object (two
  threads parsing at once corrupt each other: ``IndexError: pop from empty list``); the expert's
  seeded draws swap the process-global ``random`` state (so do ``alfworld_games``' goal draws);
  the translator sets ``sys.argv``, ``sys.stdout`` and its module-level options. ``guarded`` runs
  every engine call under this per-process lock, and ``ALFWorldEnv.reset`` holds it for all of a
  reset, so envs stepped on threads of their own (the actor pool's ``concurrent_envs``) take
  turns inside the engine. The engine is Python holding the GIL, so the threads could hardly
  overlap inside it anyway; the price is that a step may wait for another env's reset (a new
  game's first load: seconds).
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import textworld
from alfworld.agents.environment.alfred_tw_env import (
    AlfredDemangler,
    AlfredExpert,
    AlfredExpertType,
    AlfredInfos,
)
from textworld.envs import PddlEnv

T = TypeVar("T")
EXPERT_TYPES = (AlfredExpertType.HANDCODED, AlfredExpertType.PLANNER)
# Held by every engine call (``guarded``) and by all of ``ALFWorldEnv.reset``: see the docstring.
ENGINE_LOCK = threading.RLock()


class EngineError(RuntimeError):
    """The PDDL engine could not load or run a game."""


class SafeExpert(AlfredExpert):
    """alfworld's ``AlfredExpert`` that never raises and draws its random choices from a seed.

    ``state["extra.expert_plan"]`` is ``[]`` once the expert has given up; ``expert_error`` then
    says why.
    """

    def __init__(self, env=None, expert_type: str = AlfredExpertType.HANDCODED):
        super().__init__(env=env, expert_type=expert_type)
        self.seed = 0
        self.expert_error: str | None = None
        self._rng_state = random.Random(0).getstate()

    def reset(self):
        self.expert_error = None
        self._rng_state = random.Random(self.seed).getstate()
        return super().reset()

    def _gather_infos(self):
        if self.expert_error is not None:
            self.state["extra.expert_plan"] = []
            return
        saved = random.getstate()
        random.setstate(self._rng_state)
        try:
            super()._gather_infos()
        except Exception as e:  # HandCodedAgentTimeout/Failed, or a heuristic hitting odd text.
            self.expert_error = f"{type(e).__name__}: {e}"
            self.state["extra.expert_plan"] = []
        finally:
            self._rng_state = random.getstate()
            random.setstate(saved)


def make_engine(expert: str | None = AlfredExpertType.HANDCODED) -> textworld.core.Environment:
    """Builds the wrapped engine (no game loaded yet).

    Args:
      expert: "handcoded" (alfworld's heuristic expert, cheap), "planner" (fast-downward replans
        every step: optimal but slower), or None (no expert, cheapest).
    """
    if expert is not None and expert not in EXPERT_TYPES:
        raise ValueError(
            f"unknown ALFWorld expert {expert!r}; expected one of {EXPERT_TYPES} or None"
        )
    infos = textworld.EnvInfos(
        admissible_commands=True, won=True, facts=expert is not None, extras=["gamefile"]
    )
    env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
    if expert is not None:
        env = SafeExpert(env, expert_type=expert)
    return env


def guarded(what: str, fn: Callable[[], T]) -> T:
    """Runs ``fn()`` under ``ENGINE_LOCK`` with ``sys.argv`` restored afterwards; any failure
    becomes ``EngineError``."""
    with ENGINE_LOCK:
        argv = list(sys.argv)
        try:
            return fn()
        except (Exception, SystemExit) as e:  # The translator calls sys.exit() on some bad input.
            raise EngineError(f"{what}: {type(e).__name__}: {e}") from e
        finally:
            sys.argv[:] = argv


def fact_strings(state: Any) -> list[str]:
    """The true PDDL state's atoms as sorted strings over raw (unique) object ids.

    A PDDL state is its set of true atoms (closed world). TextWorld's engine also keeps the
    negations of deleted atoms ("not_atlocation(agent1,loc_3)" once the agent left loc_3) and
    derived axioms ("new-axiom@..."): history and functions of the atoms, not state, so they
    are left out; otherwise walking away and back would look like a new state.
    """
    return sorted(
        f"{f.name}({','.join(v.name for v in f.arguments)})"
        for f in state["_facts"]
        if not f.is_negation and not f.name.startswith("new-axiom@")
    )


def held_objects(state: Any) -> list[str]:
    """Display names ("mug 1") of what the agent holds, from the ``holds`` facts."""
    infos = state["_entity_infos"]
    names = []
    for f in state["_facts"]:
        if f.name == "holds" and len(f.arguments) == 2:
            var = f.arguments[1]
            info = infos.get(var.name)
            names.append((info.name if info is not None and info.name else var.name).strip())
    return sorted(names)
