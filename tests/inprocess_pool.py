"""An in-process env pool with ``ActorPool``'s interfaces, for rollout tests without actors.

Waves call ``reset`` / ``step``; continuous batching calls ``submit`` / ``poll`` by slot. Every
op is answered by the slot's env at once; with a ``seed``, each answer comes back only after a
number of polls drawn from ``random.Random(seed)``, so the replies arrive in an order the seed
sets.
"""

from __future__ import annotations

import random

from agentrl_jax.envs.actors import StepResult


class InProcessPool:
    """``envs``: one env per slot. ``calls`` holds every action stepped, ``log`` the slots of
    each poll's answers."""

    def __init__(self, envs, seed=None):
        self.envs = list(envs)
        self.capacity = len(self.envs)
        self.rng = None if seed is None else random.Random(seed)
        self.pending = {}  # slot -> [polls left, answer]
        self.calls, self.log = [], []

    @property
    def in_flight(self):
        return len(self.pending)

    def submit(self, kind, items):
        for slot, item in items.items():
            env = self.envs[slot]
            if kind == "reset":
                answer = StepResult(env.reset(item), info={"state_key": 0})
            else:
                self.calls.append(item)
                obs, reward, done, info = env.step(item)
                answer = StepResult(obs, reward=reward, done=done, info=info)
            self.pending[slot] = [0 if self.rng is None else self.rng.randrange(4), answer]

    def poll(self, timeout=None):
        for entry in self.pending.values():
            entry[0] -= 1
        due = {slot for slot, (left, _) in self.pending.items() if left < 0}
        if not due and timeout is None and self.pending:  # waits for the next answers
            soonest = min(left for left, _ in self.pending.values())
            due = {slot for slot, (left, _) in self.pending.items() if left == soonest}
        self.log.append(sorted(due))
        return {slot: self.pending.pop(slot)[1] for slot in sorted(due)}

    def reset(self, tasks):
        self.submit("reset", dict(enumerate(tasks)))
        return [self.pending.pop(i)[1] for i in range(len(tasks))]

    def step(self, actions):
        self.submit("step", {i: a for i, a in enumerate(actions) if a is not None})
        return [self.pending.pop(i)[1] if i in self.pending else None for i in range(len(actions))]
