"""Rollouts played ahead of their update (asynchronous RL, ``rl.max_staleness`` > 0).

Iteration ``i + S``'s rollout plays in a background thread while the learner trains on
iteration ``i``'s, played S iterations ago. A rollout played ahead is a ``PendingRollout`` (its
episodes, each step tagged with the version of the policy that played it, and the iteration's
numpy generator after its task draws), which every checkpoint holds until its update, so a
resumed run trains on the same episodes. ``PlayAhead`` is the background thread: it plays one
rollout at a time under a ``PhaseClock`` of its own, which the iteration's clock adds as its
background (``timing.add_background``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import numpy as np

from agentrl_jax import timing
from agentrl_jax.rollout.trajectory import Trajectory


def tag_version(trajs: list[Trajectory], version: int) -> None:
    """Marks every step as sampled by the policy of RL version ``version`` (the policy's
    weights never change during a rollout)."""
    for traj in trajs:
        for step in traj.steps:
            step.policy_version = version


def staleness_metrics(trajs: list[Trajectory], version: int) -> dict[str, float]:
    """``rollout/staleness``: how many versions the policy that played the steps of ``trajs``
    lags behind ``version`` (the learner's), the mean over their steps, each read from its
    ``Step.policy_version``; nothing when there is no step."""
    played = [s.policy_version for t in trajs for s in t.steps]
    return {"rollout/staleness": float(version - np.mean(played))} if played else {}


@dataclasses.dataclass
class PendingRollout:
    """An iteration's rollout played ahead of its update.

    Attributes:
      iteration: the RL iteration whose update trains on it.
      trajs: its episodes, each step tagged with the version of the policy that played it
        (``Step.policy_version``).
      rng_state: the iteration's numpy generator after its task draws (the update draws on).
      seconds: the rollout's wall seconds.
    """

    iteration: int
    trajs: list[Trajectory]
    rng_state: dict[str, Any]
    seconds: float

    @classmethod
    def of(cls, it, trajs, np_rng: np.random.Generator, seconds) -> PendingRollout:
        return cls(it, trajs, np_rng.bit_generator.state, seconds)

    def numpy_rng(self) -> np.random.Generator:
        """The iteration's numpy generator where its task draws left it."""
        np_rng = np.random.default_rng()
        np_rng.bit_generator.state = self.rng_state
        return np_rng

    def to_json(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "trajs": [t.to_json() for t in self.trajs],
            "rng_state": self.rng_state,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PendingRollout:
        trajs = [Trajectory.from_json(t) for t in data["trajs"]]
        return cls(data["iteration"], trajs, data["rng_state"], data["seconds"])


class PlayAhead:
    """The background thread that plays rollouts ahead, one at a time."""

    def __init__(self):
        self._executor: futures.ThreadPoolExecutor | None = None

    def start(
        self,
        it: int,
        version: int,
        play: Callable[[], list[Trajectory]],
        np_rng: np.random.Generator,
    ) -> futures.Future[tuple[PendingRollout, timing.PhaseClock]]:
        """Plays iteration ``it``'s rollout (``play()``, by the policy of RL version ``version``)
        in the background. Its future gives the ``PendingRollout`` and the thread's clock."""

        def run() -> tuple[PendingRollout, timing.PhaseClock]:
            t0 = time.perf_counter()
            clock = timing.PhaseClock()  # the iteration's clock adds it when it is done
            with clock.running():
                trajs = play()
            tag_version(trajs, version)
            return PendingRollout.of(it, trajs, np_rng, time.perf_counter() - t0), clock

        if self._executor is None:
            self._executor = futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-rollout")
        return self._executor.submit(run)

    def shutdown(self, wait: bool = True) -> None:
        """Waits for the rollout in flight (with ``wait``) and ends the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=wait)
            self._executor = None
