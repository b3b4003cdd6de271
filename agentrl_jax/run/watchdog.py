"""Ends a process whose phase (an RL iteration, an SFT epoch, an evaluation) runs past a limit.

In a multi-host run, a host that hangs or dies holds every other process in its next collective
(an all-gather of episodes, a step of the sharded update), where nothing times out: the run sits
on the pod forever. The trainer guards each phase with a :class:`Watchdog`
(``config.watchdog_s``): past the limit, the process prints one line naming the phase and the
limit, dumps every thread's stack to stderr (where it was stuck), and exits with status
:data:`EXIT_STATUS`. The other processes then fail too (their own watchdogs, or JAX's heartbeat
noticing the dead peer), and the launcher sees the run end.

The process is ended with ``os._exit``: a thread blocked inside a collective cannot be
interrupted, so no exception could reach it. Checkpoints already written stay restorable.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
from collections.abc import Iterator

from absl import logging

EXIT_STATUS = 124  # as timeout(1) reports a command that ran past its limit


class Watchdog:
    """Ends the process when a guarded phase runs longer than ``limit_s`` (0: never).

    Args:
      limit_s: seconds a phase may run; 0 turns the watchdog off.
      field: the setting's name, for the message (``config.watchdog_s``).
    """

    def __init__(self, limit_s: float, *, field: str = "config.watchdog_s"):
        if limit_s < 0:
            raise ValueError(f"{field}={limit_s}: expected >= 0 seconds (0: off)")
        self.limit_s = float(limit_s)
        self.field = field
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self, what: str) -> None:
        """Starts (or restarts) the clock for phase ``what`` (e.g. ``"RL iteration 3"``)."""
        if not self.limit_s:
            return
        timer = threading.Timer(self.limit_s, self._expire, args=(what,))
        timer.daemon = True
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = timer
        timer.start()

    def disarm(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[Watchdog]:
        """Arms for ``what`` for the ``with`` block (``arm`` inside it moves to the next phase,
        e.g. the next SFT epoch); disarms on the way out, even on an exception. Guards do not
        nest."""
        self.arm(what)
        try:
            yield self
        finally:
            self.disarm()

    def _expire(self, what: str) -> None:
        import jax  # noqa: PLC0415 (the process's index, for the message)

        message = (
            f"watchdog: {what} has run for more than {self.field}={self.limit_s:g}s on process "
            f"{jax.process_index()} of {jax.process_count()}; ending the process (exit status "
            f"{EXIT_STATUS}). A host that is stuck or gone holds every process in its next "
            f"collective; raise {self.field} if this phase is just slow. Thread stacks follow."
        )
        logging.error("%s", message)
        print(message, file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_STATUS)


__all__ = ["EXIT_STATUS", "Watchdog"]
