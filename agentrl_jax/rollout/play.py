"""The episode drivers: a wave of episodes, or a stream of groups continuously batched.

One driver plays a wave of episodes (what the actor pool holds at once) for any actor:
``play_wave(pool, episodes, max_turns, actor)`` resets, steps in batches and marks the episodes
the pool loses; each episode's state is one ``Episode``. ``play_stream`` plays groups of episodes
through the pool's slots (``rollout.batching="continuous"``): cohorts of rows, each with its own
actor, one cohort decoding while another's envs step, a row freed as its episode ends and taken
by the next group. The actors are ``rollout/rollout.py``'s (``RolloutWorker``: the policy or the
expert) and the tokenizer corpus's (``run/build.py``); a command an actor answers itself (a
malformed tool call, a ``StepResult``) never reaches the env.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Protocol

import jax

from agentrl_jax import timing
from agentrl_jax.envs.actors import StepResult
from agentrl_jax.envs.base import Observation, Task
from agentrl_jax.rollout.tool_calls import ToolCall
from agentrl_jax.rollout.trajectory import Trajectory


@dataclasses.dataclass
class Episode:
    """One episode of a wave, as ``play_wave`` plays it for an actor.

    Attributes:
      task: what the pool resets.
      live: still playing (the driver clears it when the episode ends or is lost; an actor that
        ends an episode itself, a full context, clears it too).
      failed: lost to the actor pool (a worker crash or hang, an env exception).
      obs: the newest observation.
      info: the newest info (the reset's ``reset_info``, then each step's).
      traj: the policy's record (RolloutWorker), or None.
      pending_ids: the newest observation's ids, as the model reads them.
      choices: ``constrain_actions``: the admissible commands' ids.
      header: step mode: the system prompt and the goal, the start of every context.
      history: step mode: each turn's ids (observation, then action), as first encoded.
      used: episode mode: the tokens of the episode's cache.
      turn: the actions taken so far.
      key: ``play_stream``: the episode's PRNG key (its turns fold in their index).
    """

    task: Task
    live: bool = True
    failed: bool = False
    obs: Observation | None = None
    info: dict = dataclasses.field(default_factory=dict)
    traj: Trajectory | None = None
    pending_ids: list[int] = dataclasses.field(default_factory=list)
    choices: list[list[int]] | None = None
    header: list[int] = dataclasses.field(default_factory=list)
    history: list[list[int]] = dataclasses.field(default_factory=list)
    used: int = 0
    turn: int = 0
    key: jax.Array | None = None


class Actor(Protocol):
    """Who acts in ``play_wave``: the policy, the expert, or anything that picks commands."""

    def start(self, ep: Episode) -> None:
        """After the episode's reset (``ep.obs`` and ``ep.info`` are set)."""

    def act(self, turn: int, episodes: list[Episode]) -> list[str | ToolCall | StepResult | None]:
        """One command per episode of the wave (None: the episode is not stepped; a
        ``StepResult``: the actor answered it itself, and the env is not stepped)."""

    def observe(self, ep: Episode, result: StepResult) -> None:
        """After a step the pool answered (not called for an episode the pool lost)."""


def play_wave(pool, episodes: list[Episode], max_turns: int, actor: Actor) -> list[Episode]:
    """Plays one wave (episodes that fit the actor pool at once) for ``actor``: every reset,
    then up to ``max_turns`` batched steps, until no episode is live or the actor has no
    command for any. Lost episodes are marked ``failed`` and never reach the actor again."""
    with timing.phase("env"):
        resets = pool.reset([ep.task for ep in episodes])
    for ep, res in zip(episodes, resets, strict=True):
        if res.infra_failure:
            ep.failed, ep.live = True, False
            continue
        ep.obs, ep.info = res.observation, res.info
        actor.start(ep)
    for turn in range(max_turns):
        if not any(ep.live for ep in episodes):
            break
        actions = actor.act(turn, episodes)
        if all(a is None for a in actions):
            break
        answered = {i: a for i, a in enumerate(actions) if isinstance(a, StepResult)}
        if answered:  # a malformed tool call, answered by the actor: the env is not stepped
            actions = [None if i in answered else a for i, a in enumerate(actions)]
        with timing.phase("env"):
            results = pool.step(actions) if any(a is not None for a in actions) else actions
        if answered:
            results = [answered.get(i, res) for i, res in enumerate(results)]
        for ep, res in zip(episodes, results, strict=True):
            if res is None:
                continue
            if res.infra_failure:
                ep.failed, ep.live = True, False
                continue
            if res.observation is not None:
                ep.obs = res.observation
            ep.info = res.info
            ep.live = not res.done
            actor.observe(ep, res)
    return episodes


_IDLE = Episode(task=None, live=False)  # a row with nothing to decode this turn


def play_stream(
    pool,
    groups: list[list[Episode]],
    max_turns: int,
    actors: list,
    progress: Callable[[int], object] | None = None,
) -> None:
    """Plays ``groups`` of episodes through the pool's slots, continuously batched.

    The slots are cut into ``len(actors)`` cohorts of ``size`` rows (each actor owns its
    cohort's cache); cohort ``c``'s row ``r`` is the pool's slot ``c * size + r``. The groups
    queue in order; whenever a cohort has free rows for the next group, the group takes them
    and its resets are sent. A cohort decodes (``actor.act``) its rows whose observations are
    in as soon as none of its env steps is in flight, then sends their commands and goes on:
    while one cohort's envs step, another decodes. An episode that ends (done, lost, cut by
    its context, or ``max_turns`` actions played) frees its row at once (and is counted to
    ``progress``, when given).
    """
    size = actors[0].size
    queue = collections.deque(groups)
    rows: list[list[Episode | None]] = [[None] * size for _ in actors]
    ready: list[set[int]] = [set() for _ in actors]
    stepping = [0] * len(actors)  # env steps in flight per cohort
    kinds: dict[int, str] = {}  # slot -> the op in flight
    # A group's episodes start their first turn together, in one decode, so that its members
    # share their first prefill: their reset answers wait here until the whole group is in.
    started: dict[int, list[tuple[int, int]]] = {}  # id(group) -> its (cohort, row)s reset
    group_of: dict[int, list[Episode]] = {}  # id(episode) -> its group
    answered: dict[int, StepResult] = {}  # slot -> the actor's own answer (a malformed call)

    def admit(c: int) -> None:
        while queue:
            free = [r for r in range(size) if rows[c][r] is None]
            if len(free) < len(queue[0]):
                return
            group = queue.popleft()
            taken = free[: len(group)]
            for r, ep in zip(taken, group):
                rows[c][r] = ep
                group_of[id(ep)] = group
            started[id(group)] = []
            actors[c].admit(taken, group)
            items = {c * size + r: ep.task for r, ep in zip(taken, group)}
            kinds.update(dict.fromkeys(items, "reset"))
            with timing.phase("env"):
                pool.submit("reset", items)

    def free(c: int, r: int) -> None:
        """Cohort ``c``'s row ``r`` ends its episode."""
        rows[c][r] = None
        if progress is not None:
            progress(1)

    def reset_answered(ep: Episode, place: tuple[int, int] | None) -> None:
        """``ep``'s reset is in (``place``: its cohort and row; None: lost); once its whole
        group's are, the group's rows are ready for their first turn."""
        group = group_of.pop(id(ep))
        if place is not None:
            started[id(group)].append(place)
        if len(started[id(group)]) + sum(e.failed for e in group) == len(group):
            for c, r in started.pop(id(group)):
                ready[c].add(r)

    while True:
        for c in range(len(actors)):
            admit(c)
        if not any(ep is not None for cohort in rows for ep in cohort):
            return
        decoded = False
        for c, actor in enumerate(actors):
            if not ready[c] or stepping[c]:
                continue
            feed = [rows[c][r] if r in ready[c] else _IDLE for r in range(size)]
            actions = actor.act(None, feed)
            items = {}
            for r in sorted(ready[c]):
                if actions[r] is None:  # the actor ended it (its context is full)
                    free(c, r)
                elif isinstance(actions[r], StepResult):
                    answered[c * size + r] = actions[r]
                    kinds[c * size + r] = "answered"
                else:
                    items[c * size + r] = actions[r]
            ready[c].clear()
            if items:
                kinds.update(dict.fromkeys(items, "step"))
                stepping[c] += len(items)
                with timing.phase("env"):
                    pool.submit("step", items)
            decoded = True
        if not decoded and not pool.in_flight:
            raise RuntimeError("play_stream: episodes wait, but no op is in flight")
        with timing.phase("env"):
            answers = pool.poll(timeout=0.0 if decoded else None)
        answers.update(answered)
        answered.clear()
        for slot, res in sorted(answers.items()):
            c, r = divmod(slot, size)
            ep, kind = rows[c][r], kinds.pop(slot)
            if kind == "step":
                stepping[c] -= 1
            if res.infra_failure:
                ep.failed, ep.live = True, False
                free(c, r)
                if kind == "reset":
                    reset_answered(ep, None)
                continue
            if res.observation is not None:
                ep.obs = res.observation
            ep.info = res.info
            if kind == "reset":
                actors[c].start(ep)
                reset_answered(ep, (c, r))
            else:
                ep.live = not res.done
                actors[c].observe(ep, res)
                if ep.live and ep.turn < max_turns:
                    ready[c].add(r)
                else:
                    free(c, r)
