"""Fault injection for resume tests: SIGKILL the trainer at a named point of a run.

    AGENTRL_CHAOS_KILL=update:2 python -m launch.train --config=... --workdir=runs/x

kills the run with a real ``SIGKILL`` (no handler, no cleanup, no flush: what an OOM killer or a
preempted VM does) the 2nd time it reaches the point ``update``; rerunning the same command
without the variable resumes it. ``tests/test_train.py`` kills at every point and checks that the
resumed run ends with the uninterrupted run's parameters and metrics.

Points (each counts from 1 in the process that reaches it; a resumed run counts afresh):

- ``sft_step``: after each SFT optimizer step (its metrics logged), before the next one.
- ``sft_epoch``: after each SFT epoch that is checkpointed (all but the last), once its
  checkpoint is complete on disk, before the next epoch's first step.
- ``rollout``: after the first turn of each sampled wave of episodes (RL rollouts; greedy
  evaluations and expert demonstrations do not count), while the episodes are mid-way.
- ``update``: in each RL update, once the update program is dispatched and before its new state
  and metrics come back.
- ``checkpoint``: after each numbered checkpoint's write has started, once its temporary
  directory exists (``N.orbax-checkpoint-tmp``) and before orbax renames it: the write is under
  way and never finalised.

Every point but ``checkpoint`` kills once the checkpoint writes under way are complete
(``settle_with``), so where a run resumes does not depend on the background writer's speed.
With the variable unset, ``maybe_kill`` is a no-op: one comparison against None.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import time
from collections.abc import Callable

ENV_VAR = "AGENTRL_CHAOS_KILL"
POINTS = ("sft_step", "sft_epoch", "rollout", "update", "checkpoint")


def parse(spec: str | None) -> tuple[str, int] | None:
    """``"point:n"`` -> (point, n); None or empty -> None.

    Raises:
      ValueError: naming the variable and the value when the point is unknown or n is not an
        int >= 1.
    """
    if not spec:
        return None
    point, _, count = spec.partition(":")
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"{ENV_VAR}={spec!r}: expected POINT:N with POINT one of {', '.join(POINTS)} "
            "and N an int >= 1"
        )
    return point, int(count)


_TARGET = parse(os.environ.get(ENV_VAR))
_reached: collections.Counter[str] = collections.Counter()
_settled: Callable[[], bool] | None = None


def settle_with(settled: Callable[[], bool] | None) -> None:
    """What a kill waits for when its point names nothing else (the trainer: no checkpoint write
    under way), so that a point's kill finds the same checkpoints on disk however fast the
    background writer was: a write still going would otherwise make the rerun resume from one
    checkpoint or the one before, by chance. Writes cut short are the ``checkpoint`` point's."""
    global _settled
    _settled = settled


def maybe_kill(
    point: str, ready: Callable[[], bool] | None = None, *, timeout_s: float = 120.0
) -> None:
    """SIGKILLs this process if ``point`` is the armed one and this is its n-th time.

    Args:
      point: one of ``POINTS``.
      ready: on the n-th time only, polled until true before the kill: what the point promises
        holds (a write's temporary directory exists). Default: ``settle_with``'s.
      timeout_s: how long ``ready`` may take.

    Raises:
      RuntimeError: ``ready`` stayed false for ``timeout_s`` (the kill could not land where the
        point says, so the run fails instead of dying somewhere else).
    """
    if _TARGET is None:
        return
    _kill_at(point, ready, timeout_s)


def _kill_at(point: str, ready: Callable[[], bool] | None, timeout_s: float) -> None:
    if point not in POINTS:
        raise ValueError(f"chaos point {point!r}: expected one of {', '.join(POINTS)}")
    _reached[point] += 1
    name, count = _TARGET
    if point != name or _reached[point] != count:
        return
    ready = ready or _settled
    deadline = time.monotonic() + timeout_s
    while ready is not None and not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"chaos: {point} #{count} was never ready within {timeout_s}s")
        time.sleep(0.001)
    # The last line of the killed run's log says where it died (stderr is unbuffered).
    print(f"chaos: SIGKILL at {point} #{count}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["ENV_VAR", "POINTS", "maybe_kill", "parse", "settle_with"]
