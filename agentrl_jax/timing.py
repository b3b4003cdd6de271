"""Where an iteration's wall time goes: named phases, and JAX's compilations inside them.

A ``PhaseClock`` adds up the seconds spent in named phases. Phases nest: a phase's seconds are
its own, without its children's, so the phases of one clock never count a second twice and their
sum is the time spent inside any phase. A phase opened inside a scope phase (``evaluate``) is
recorded under it (``evaluate/sample``). The code being timed marks its phases with the
module-level ``phase(name)``, which records into the clock made current by
``PhaseClock.running()`` and is a no-op when none is.

JAX's compilations are recorded too, by ``jax.monitoring`` listeners (installed on the first
``running()``): each XLA compilation of a program, or its load from the persistent compilation
cache (``agentrl_jax/compile_cache.py``), is taken out of the phase it happened in and added to
``compile``, so a device phase measures the programs' runs alone. The listeners run in the
thread that compiles, inside the phase that called the program. (Tracing and lowering stay in
the phase that called the program.)

``DEVICE_PHASES`` wait on device programs and are timed to the programs' completion (their
callers block on the outputs, which they read next anyway). Their share of the wall time is the
device's busy fraction (``IterationProfile.device_busy_fraction``); on an accelerator the rest is
host time during which the device is idle.

A thread that works beside the timed one (asynchronous RL's rollout played ahead) runs a clock of
its own, handed to the iteration's with ``add_background``: its phases are reported under
``background/`` and left out of the coverage (they overlap the main thread's), and its device
phases count as busy where they ran outside the main thread's (``background_busy_s``).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import threading
import time
from collections.abc import Iterator

# Phases whose seconds are device programs running (the host waits on their outputs); ``sync``
# is the sampler's copy of the weights (a cast on the device, or nothing when it borrows them).
DEVICE_PHASES = ("sample", "score", "update", "sync")

# jax.monitoring's event for one XLA compilation, or its load from the persistent cache
# (jax/_src/dispatch.py: BACKEND_COMPILE_EVENT wraps ``compile_or_get_cached``).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

_current: contextvars.ContextVar[PhaseClock | None] = contextvars.ContextVar(
    "agentrl_phase_clock", default=None
)
_listeners_installed = False
_install_lock = threading.Lock()


class PhaseClock:
    """Seconds per phase, compilations and their seconds, over the time it was running.

    Attributes:
      seconds: phase path -> seconds of its own (children excluded).
      compilations: XLA programs compiled or loaded from the persistent cache.
      cache_hits: of those, the ones loaded from the persistent compilation cache.
    """

    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.compilations = 0
        self.cache_hits = 0
        self.started = time.perf_counter()
        self._open: list[list] = []  # [path, children's seconds, scope] of each open phase
        # (start, end) of each device phase, and its own seconds over that span's length.
        self.device_spans: list[tuple[float, float, float]] = []
        self.background: PhaseClock | None = None  # add_background's clocks, merged

    @contextlib.contextmanager
    def running(self) -> Iterator[PhaseClock]:
        """Makes this the clock ``phase`` records into, for the ``with`` block."""
        install_listeners()
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    @contextlib.contextmanager
    def phase(self, name: str, *, scope: bool = False) -> Iterator[None]:
        """Times the block as ``name`` (``outer/name`` inside a scope phase ``outer``)."""
        outer = next((path for path, _, is_scope in reversed(self._open) if is_scope), None)
        path = f"{outer}/{name}" if outer else name
        self._open.append([path, 0.0, scope])
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            own = self._close(t1 - t0)
            if name in DEVICE_PHASES and t1 > t0:
                self.device_spans.append((t0, t1, own / (t1 - t0)))

    def _close(self, elapsed: float) -> float:
        path, children, _ = self._open.pop()
        self.seconds[path] += elapsed - children
        if self._open:
            self._open[-1][1] += elapsed
        return elapsed - children

    def add_background(self, other: PhaseClock) -> None:
        """Adds the phases of ``other``, a clock run by a thread beside this one's (its seconds
        overlap this clock's), as this clock's background."""
        if self.background is None:
            self.background = PhaseClock()
        for path, seconds in other.seconds.items():
            self.background.seconds[path] += seconds
        self.background.device_spans += other.device_spans
        self.compilations += other.compilations
        self.cache_hits += other.cache_hits

    def background_busy_s(self) -> float:
        """The background's device seconds that ran while no device phase of this clock did
        (each span weighted by its own share: a compilation inside it is not device time)."""
        if self.background is None:
            return 0.0
        cover = _union([(a, b) for a, b, _ in self.device_spans])
        return sum(share * _outside(a, b, cover) for a, b, share in self.background.device_spans)

    def _compiled(self, seconds: float) -> None:
        """An XLA compilation of ``seconds`` inside the open phase: moved to ``compile``."""
        self.compilations += 1
        self.seconds["compile"] += seconds
        if self._open:
            self._open[-1][1] += seconds

    @property
    def total(self) -> float:
        """Seconds inside any phase."""
        return sum(self.seconds.values())

    def elapsed(self) -> float:
        """Wall seconds since the clock was made."""
        return time.perf_counter() - self.started

    def as_dict(self) -> dict[str, float]:
        return dict(sorted(self.seconds.items()))


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The disjoint spans that cover ``spans``, in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _outside(a: float, b: float, cover: list[tuple[float, float]]) -> float:
    """The length of [a, b] outside the disjoint spans ``cover``."""
    inside = sum(max(0.0, min(b, d) - max(a, c)) for c, d in cover)
    return (b - a) - inside


def add_background(clock: PhaseClock) -> None:
    """Adds ``clock`` (a background thread's) to the running clock (no-op without one)."""
    current = _current.get()
    if current is not None:
        current.add_background(clock)


def phase(name: str, *, scope: bool = False) -> contextlib.AbstractContextManager:
    """Times the ``with`` block as phase ``name`` of the running clock (no-op without one).

    ``scope``: the phases opened inside are recorded as ``name/<phase>`` (an evaluation's
    ``evaluate/sample``), not with the iteration's own.
    """
    clock = _current.get()
    return contextlib.nullcontext() if clock is None else clock.phase(name, scope=scope)


@dataclasses.dataclass
class CompileTotals:
    """The process's XLA compilations since ``install_listeners`` (every thread, any clock)."""

    compilations: int = 0
    seconds: float = 0.0  # compiling, or loading from the persistent cache
    cache_hits: int = 0


TOTALS = CompileTotals()


def _on_duration(event: str, seconds: float, **kwargs) -> None:
    if event != BACKEND_COMPILE_EVENT:
        return
    TOTALS.compilations += 1
    TOTALS.seconds += seconds
    clock = _current.get()
    if clock is not None:
        clock._compiled(seconds)


def _on_event(event: str, **kwargs) -> None:
    if event != CACHE_HIT_EVENT:
        return
    TOTALS.cache_hits += 1
    clock = _current.get()
    if clock is not None:
        clock.cache_hits += 1


def install_listeners() -> None:
    """Starts counting compilations (``TOTALS``, and the running clock's); idempotent."""
    global _listeners_installed
    with _install_lock:
        if _listeners_installed:
            return
        from jax import monitoring  # noqa: PLC0415 - only a running clock needs it

        monitoring.register_event_duration_secs_listener(_on_duration)
        monitoring.register_event_listener(_on_event)
        _listeners_installed = True


@dataclasses.dataclass(frozen=True)
class IterationProfile:
    """Where one iteration's wall time went.

    Attributes:
      iteration: its number (1-based, as logged).
      wall_s: its wall-clock seconds.
      phases: phase path -> seconds of its own (``PhaseClock.seconds``).
      phases: phase path -> seconds of its own (``PhaseClock.seconds``); a background
        thread's under ``background/`` (``PhaseClock.add_background``).
      compilations: XLA programs compiled or loaded from the persistent cache during it.
      cache_hits: of those, loaded from the cache.
      background_busy_s: a background thread's device seconds outside the main thread's
        device phases (``PhaseClock.background_busy_s``).
    """

    iteration: int
    wall_s: float
    phases: dict[str, float]
    compilations: int
    cache_hits: int
    background_busy_s: float = 0.0

    @classmethod
    def of(cls, iteration: int, wall_s: float, clock: PhaseClock) -> IterationProfile:
        phases = clock.as_dict()
        if clock.background is not None:
            phases.update({f"background/{p}": s for p, s in clock.background.as_dict().items()})
        return cls(
            iteration,
            wall_s,
            phases,
            clock.compilations,
            clock.cache_hits,
            clock.background_busy_s(),
        )

    @property
    def coverage(self) -> float:
        """The main thread's phases' seconds over the wall time (1: every second is in a
        phase)."""
        own = sum(s for p, s in self.phases.items() if not p.startswith("background/"))
        return own / self.wall_s if self.wall_s else 0.0

    @property
    def device_busy_fraction(self) -> float:
        """Seconds of device programs running over the wall time: the main thread's device
        phases, and a background thread's where they ran outside those."""
        busy = sum(
            s
            for p, s in self.phases.items()
            if p.rsplit("/", 1)[-1] in DEVICE_PHASES and not p.startswith("background/")
        )
        busy += self.background_busy_s
        return busy / self.wall_s if self.wall_s else 0.0


def phase_metrics(clock: PhaseClock) -> dict[str, float]:
    """TensorBoard scalars of a clock so far: ``time/phase/<path>_s``, the compilations and the
    device's busy fraction (``perf/device_busy_fraction``) over its elapsed time."""
    profile = IterationProfile.of(0, clock.elapsed(), clock)
    out = {f"time/phase/{path}_s": s for path, s in profile.phases.items()}
    out["perf/compilations"] = float(profile.compilations)
    out["perf/device_busy_fraction"] = profile.device_busy_fraction
    return out
