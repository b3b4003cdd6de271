"""TensorBoard event files without TensorFlow, written through tensorboard's own event writer."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from agentrl_jax.run.metric_writer import MetricWriter


class SummaryWriter(MetricWriter):
    """Writes scalars (and optional images) to ``logdir`` as real TensorBoard event files (the
    run's first :class:`~agentrl_jax.run.metric_writer.MetricWriter`).

    Only process 0 of a multi-host run should construct one; others pass ``enabled=False``.
    Non-finite scalars are written as they are (TensorBoard shows them) so a divergence is visible.
    """

    def __init__(self, logdir: str, *, enabled: bool = True, flush_secs: int = 10):
        self.logdir = logdir
        self.enabled = enabled
        self._writer = None
        if enabled:
            os.makedirs(logdir, exist_ok=True)
            self._writer = EventFileWriter(logdir, flush_secs=flush_secs)

    def scalar(self, tag: str, value: float, step: int) -> None:
        if not self._writer:
            return
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))]
        )
        self._writer.add_event(event_pb2.Event(summary=summary, step=int(step), wall_time=_now()))

    def scalars(self, metrics: Mapping[str, float], step: int) -> None:
        for tag, value in metrics.items():
            if isinstance(value, (int, float, np.floating, np.integer)) or np.ndim(value) == 0:
                self.scalar(tag, float(value), step)

    def image_png(self, tag: str, png_bytes: bytes, step: int, height: int, width: int) -> None:
        if not self._writer:
            return
        image = summary_pb2.Summary.Image(
            height=height, width=width, colorspace=4, encoded_image_string=png_bytes
        )
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, image=image)])
        self._writer.add_event(event_pb2.Event(summary=summary, step=int(step), wall_time=_now()))

    def flush(self) -> None:
        if self._writer:
            self._writer.flush()

    def close(self) -> None:
        if self._writer:
            self._writer.close()
            self._writer = None


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """Reads every scalar from the event files in ``logdir`` (for tests, eval plots, reports)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    out: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(logdir)):
        if "tfevents" not in name:
            continue
        for event in EventFileLoader(os.path.join(logdir, name)).Load():
            for value in event.summary.value:
                # The loader upgrades simple_value scalars to scalar tensors of the scalars plugin.
                if value.HasField("simple_value"):
                    scalar = value.simple_value
                elif value.metadata.plugin_data.plugin_name == "scalars":
                    scalar = float(tensor_util.make_ndarray(value.tensor))
                else:
                    continue
                out.setdefault(value.tag, []).append((event.step, scalar))
    return out


def _now() -> float:
    import time

    return time.time()


def png_of_figure(fig) -> tuple[bytes, int, int]:
    """Renders a matplotlib figure to PNG bytes with its pixel height and width."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    width, height = fig.canvas.get_width_height()
    return buf.getvalue(), int(height), int(width)


__all__ = ["SummaryWriter", "png_of_figure", "read_scalars"]
