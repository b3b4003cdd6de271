"""Where a run's metrics go: TensorBoard always, Weights & Biases when ``config.logging.wandb``
is on, any other backend as one more :class:`MetricWriter`.

The trainer writes through one writer (``build_writer``): a :class:`MultiWriter` over the
backends, each given the same ``(tag, value, step)`` scalars and the same PNG images. A backend
is a :class:`MetricWriter` (``run/metric_writer.py``, the seam), a class with four methods
(``scalars``, ``image_png``, ``flush``, ``close``); a CLU or MLflow writer is one more subclass
and one more line in ``build_writer``.

W&B: the run is created in ``<workdir>/wandb`` (``wandb.init(dir=...)``), ``mode`` from the
config (``offline`` by default: no network, ``wandb sync`` uploads it later; ``WANDB_MODE`` in
the environment overrides it, as wandb documents). Steps: the trainer's steps restart per phase
(SFT steps, then RL iterations from 0) and a resumed run writes some again, which W&B's own
``_step`` (increasing only) cannot hold, so every row carries the trainer's step as a ``step``
field and the scalars are plotted against it (``define_metric("*", step_metric="step")``).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentrl_jax.run.metric_writer import MetricWriter, MultiWriter


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, np.floating, np.integer)) or np.ndim(value) == 0


class WandbWriter(MetricWriter):
    """Weights & Biases (``wandb`` package, the ``adapters`` extra): scalars as history rows
    with the trainer's ``step``, images as ``wandb.Image`` media.

    Args:
      settings: ``config.logging.wandb`` (``WandbSection``).
      workdir: the run's folder; the W&B run lives in ``<workdir>/wandb``.
      run_config: the run's config, recorded as the W&B run's config.
      enabled: False on processes other than 0 (nothing is created).
    """

    def __init__(self, settings, workdir: str, run_config: dict[str, Any], *, enabled: bool = True):
        self.run = None
        if not enabled:
            return
        try:
            import wandb  # noqa: PLC0415 - only a run with W&B on needs it
        except ImportError as e:
            raise ImportError(
                "config.logging.wandb.enabled=True needs the wandb package "
                "(pip install -e '.[adapters]')"
            ) from e
        self._wandb = wandb
        from agentrl_jax.run import paths  # noqa: PLC0415

        # A workdir on a bucket (gs://...): the W&B run's files stay local, under the current
        # folder (W&B writes its files with plain file I/O).
        local = os.getcwd() if paths.is_url(workdir) else workdir
        root = os.path.join(local, "wandb")
        os.makedirs(root, exist_ok=True)
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity or None,
            name=settings.name or os.path.basename(os.path.normpath(workdir)),
            group=settings.group or None,
            tags=list(settings.tags) or None,
            dir=local,
            mode=os.environ.get("WANDB_MODE") or settings.mode,
            config=run_config,
            resume="allow",
            id=settings.run_id or _run_id(root),
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def scalars(self, metrics: Mapping[str, float], step: int) -> None:
        if self.run is None:
            return
        row = {k: float(v) for k, v in metrics.items() if _is_scalar(v)}
        if row:
            self.run.log({"step": int(step), **row})

    def image_png(self, tag: str, png_bytes: bytes, step: int, height: int, width: int) -> None:
        if self.run is None:
            return
        import io  # noqa: PLC0415

        from PIL import Image  # noqa: PLC0415 - matplotlib's own dependency

        image = self._wandb.Image(Image.open(io.BytesIO(png_bytes)), caption=tag)
        self.run.log({"step": int(step), tag: image})

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
            # Offline, wandb-core may still be writing the run's file when finish returns;
            # teardown waits for it (a later wandb.init starts the service again).
            self._wandb.teardown()


def _run_id(root: str) -> str:
    """The W&B run id of the workdir: made once and kept in ``<workdir>/wandb/run_id``, so a
    resumed training run continues the same W&B run."""
    path = os.path.join(root, "run_id")
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    import secrets  # noqa: PLC0415

    run_id = secrets.token_hex(4)
    with open(path, "w") as f:
        f.write(run_id)
    return run_id


def build_writer(config, workdir: str, *, enabled: bool) -> MetricWriter:
    """The run's writer: TensorBoard in ``<workdir>/tensorboard``, plus W&B when
    ``config.logging.wandb.enabled``."""
    from agentrl_jax.run.tensorboard import SummaryWriter  # noqa: PLC0415

    tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"), enabled=enabled)
    if not config.logging.wandb.enabled:
        return tensorboard
    as_dict = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    return MultiWriter(
        [tensorboard, WandbWriter(config.logging.wandb, workdir, as_dict, enabled=enabled)]
    )


# ---------------------------------------------------------------------------- reading W&B runs

_BLOCK = 32 * 1024  # the .wandb file is a LevelDB-style log: 32 KiB blocks of framed records
_HEADER = 7  # b":W&B", 2 bytes of magic, 1 byte of version
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: str):
    """The ``wandb_internal_pb2.Record`` messages of a ``run-<id>.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2  # noqa: PLC0415

    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file (header {data[:4]!r})")
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FIRST:
            pending = chunk
            continue
        if kind == _MIDDLE:
            pending += chunk
            continue
        payload = pending + chunk if kind == _LAST else chunk
        pending = b""
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def read_wandb_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar a :class:`WandbWriter` logged into the W&B run folder ``run_dir``
    (``<workdir>/wandb/offline-run-*``), by tag: ``[(step, value), ...]`` in order, as
    ``tensorboard.read_scalars`` reads TensorBoard's files; media rows are left out."""
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    out: dict[str, list[tuple[int, float]]] = {}
    for record in wandb_records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in record.history.item
        }
        if "step" not in row:
            continue
        media = tuple(k[: -len("_type")] for k in row if k.endswith("/_type"))
        for key, value in row.items():
            if (
                key == "step"
                or key.startswith(("_", *media))
                or not isinstance(value, (int, float))
            ):
                continue
            out.setdefault(key, []).append((int(row["step"]), float(value)))
    return out


def read_wandb_media(run_dir: str) -> dict[str, list[str]]:
    """The images a :class:`WandbWriter` logged into ``run_dir``: ``{tag: [file, ...]}``."""
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    out: dict[str, list[str]] = {}
    for record in wandb_records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        items = {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in record.history.item
        }
        for key, value in items.items():
            if key.endswith("/_type") and value == "image-file":
                tag = key[: -len("/_type")]
                out.setdefault(tag, []).append(os.path.join(run_dir, "files", items[f"{tag}/path"]))
    return out


__all__ = [
    "MetricWriter",
    "MultiWriter",
    "WandbWriter",
    "build_writer",
    "read_wandb_media",
    "read_wandb_scalars",
    "wandb_records",
]
