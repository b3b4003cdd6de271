"""The metric writers' seam: :class:`MetricWriter`, one backend a run's metrics go to, and
:class:`MultiWriter`, the same calls to several.

Its own module so that each backend (``run/tensorboard.py``'s ``SummaryWriter``, W&B's in
``run/writers.py``) subclasses it, and ``run/writers.py``'s ``build_writer`` picks the backends,
without the two importing each other.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence


class MetricWriter(abc.ABC):
    """One metrics backend. Only process 0 of a multi-host run writes (``enabled``)."""

    @abc.abstractmethod
    def scalars(self, metrics: Mapping[str, float], step: int) -> None:
        """Writes each scalar of ``metrics`` (non-scalars are skipped) at ``step``."""

    @abc.abstractmethod
    def image_png(self, tag: str, png_bytes: bytes, step: int, height: int, width: int) -> None:
        """Writes a PNG image (a learning curve) at ``step``."""

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Makes what was written so far durable."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flushes and releases the backend. Safe to call twice."""


class MultiWriter(MetricWriter):
    """Every call to each of ``writers``, in order."""

    def __init__(self, writers: Sequence[MetricWriter]):
        self.writers = list(writers)

    def scalars(self, metrics: Mapping[str, float], step: int) -> None:
        for w in self.writers:
            w.scalars(metrics, step)

    def image_png(self, tag: str, png_bytes: bytes, step: int, height: int, width: int) -> None:
        for w in self.writers:
            w.image_png(tag, png_bytes, step, height, width)

    def flush(self) -> None:
        for w in self.writers:
            w.flush()

    def close(self) -> None:
        for w in self.writers:
            w.close()
