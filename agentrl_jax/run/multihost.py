"""Multi-host runs: one process per host under ``jax.distributed``, the same program everywhere.

What each process of an N-process run does (docs/architecture.md, "Multi-host"):

- **Rollouts.** The tasks of an RL iteration (and the SFT demonstrations, and the held-out
  evaluation) are dealt out over the processes, as evenly as possible, in whole tasks (a task's
  group of episodes stays together) and in order; each process cuts its share into *waves*, the
  batches of episodes its actor pool plays at once (``plan_waves``, ``RolloutWorker.wave_size``),
  so every process plays in every call that has a task for each. It plays them with its own
  actor pool and a process-local copy of the policy (``local_copy``: in the compute dtype, split
  over the process's devices). Every episode is keyed by its task's position in the whole list
  and its place in the group (``rollout.episode_keys``; the sampler draws each row with its own
  key) and grouped by that position, so it plays as it would in a single process's waves,
  whichever wave holds it.
- **Assembly.** The episodes are all-gathered on the host (``allgather_objects``: token ids and
  rewards, small next to the rollout's cost), so every process holds the iteration's full episode
  list in the single-process order and runs the single-process host code on it: rows, length
  buckets, group-normalised advantages, the minibatch permutation, the SFT pipeline.
- **Placement.** Each process puts on its devices only the rows of the global batch that the mesh
  assigns to them (``Learner.place_batch``; ``process_rows`` says which): the global array the
  jitted update reads is, row for row, the one a single process with all the devices builds.
- **Writes.** Checkpoints go through orbax (every process calls save; orbax writes each array
  shard once and the JSON meta from process 0). TensorBoard, eval reports, the run's config and
  report files, progress bars and info logs come from process 0 only (``is_primary``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import pathlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from agentrl_jax import sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rollout.rollout import RolloutWorker, cut_waves
from agentrl_jax.rollout.trajectory import Trajectory


def is_primary() -> bool:
    """Whether this is process 0, the one that logs and writes files of its own."""
    return jax.process_index() == 0


def process_slice(num_items: int, unit: int, process_index: int, process_count: int) -> slice:
    """The items process ``process_index`` owns: a contiguous block of whole ``unit``-sized chunks.

    The ``ceil(num_items / unit)`` chunks (the last one may be short) are dealt out in order, as
    evenly as possible, the first processes taking one more when they do not divide evenly; a
    process with no chunk gets an empty slice. Every item belongs to exactly one process, and the
    processes' slices in process order are the items in order.

    Raises:
      ValueError: for a negative ``num_items``, ``unit < 1`` or a process index out of range.
    """
    if num_items < 0:
        raise ValueError(f"num_items={num_items}: expected >= 0")
    if unit < 1:
        raise ValueError(f"unit={unit}: expected >= 1 items per chunk")
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} is not in [0, process_count={process_count})"
        )
    chunks = -(-num_items // unit)
    base, extra = divmod(chunks, process_count)
    first = process_index * base + min(process_index, extra)
    count = base + (process_index < extra)
    return slice(min(first * unit, num_items), min((first + count) * unit, num_items))


def process_rows(
    mesh: Mesh,
    logical_axes: Sequence[str | None],
    shape: Sequence[int],
    process_of: Callable[[Any], int] = lambda d: d.process_index,
) -> dict[int, np.ndarray]:
    """Rows (indices along axis 0) of a global batch array each process supplies.

    The rows a process's devices hold under the logical-axis rules (``agentrl_jax.sharding``):
    for a batch split over (data, fsdp), process p's block of the mesh. A batch whose rows do not
    divide over the mesh is replicated, and then every process holds every row.

    Args:
      mesh: the global mesh.
      logical_axes: the array's logical axes, e.g. ``("batch", None)``.
      shape: the global shape.
      process_of: the process of a device (default: its ``process_index``; a test can map the
        fake devices of one process to pretended processes).
    """
    named = sharding.named_sharding(mesh, logical_axes, shape)
    rows: dict[int, set[int]] = {}
    for device, index in named.devices_indices_map(tuple(shape)).items():
        owned = range(shape[0])[index[0]] if index else range(shape[0])
        rows.setdefault(process_of(device), set()).update(owned)
    return {p: np.array(sorted(r), np.int64) for p, r in sorted(rows.items())}


def payload_bucket(num_bytes: int) -> int:
    """The padded length of an exchanged payload: the smallest power of two >= ``num_bytes``."""
    return 1 << max(num_bytes - 1, 0).bit_length()


def allgather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj`` (any picklable value), in process order, on every process.

    A collective: every process must call it at the same point. One process: ``[obj]``.
    """
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils  # noqa: PLC0415 (multi-host only)

    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32)))
    sizes = sizes.reshape(-1)
    # The gather is compiled per shape: padding to a power of two keeps the programs of a run's
    # exchanges (episodes of a new byte length every iteration) to a handful.
    padded = np.zeros(payload_bucket(int(sizes.max())), np.uint8)
    padded[: data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [pickle.loads(gathered[p, : int(n)].tobytes()) for p, n in enumerate(sizes)]


def broadcast_object(make: Callable[[], Any]) -> Any:
    """Process 0's ``make()``, on every process (only process 0 calls ``make``)."""
    value = make() if is_primary() else None
    return allgather_objects(value)[0]


def sampler_mesh_shape(cfg: ModelConfig, num_devices: int) -> tuple[int, ...]:
    """The shape of a sampler on ``num_devices`` of one host: ``(data, fsdp, tp)`` = ``(d, 1,
    tp)``, or ``(data, fsdp, tp, expert)`` = ``(d, 1, tp, e)`` for a model with routed experts.

    ``tp`` is the most devices that divide ``num_devices`` and both head counts (query and kv),
    so attention, the MLP width, the vocabulary and the KV cache's heads are all split, not
    replicated. No ``fsdp``: a decode step would all-gather every weight it reads.

    The ``num_devices / tp`` devices left over take rows (``data``) in a dense model. Parameters
    are replicated along ``data``, so in a model with routed experts (``cfg.num_experts``) each
    ``data`` row would hold every expert, most of the model's bytes (Qwen3-30B-A3B, 4 kv heads,
    on 8 devices: tp=4, and each expert held twice). There the leftover devices go first to
    ``expert`` (``e``: the largest divisor of them that divides ``num_experts``), so each device
    holds ``num_experts / e`` experts and the host one copy of each, and what remains to
    ``data``. The price: the batch, attention and the KV cache are replicated along ``expert``
    as they would be split along ``data`` (``batch`` is split over (data, fsdp) only); the
    experts' work is split either way (every expert runs on every token, ``models/moe.py``).
    A model with experts always gets the four-axis shape (``e`` = 1 when nothing is left over);
    a dense model keeps the three-axis one.
    """
    tp = max(
        t
        for t in range(1, num_devices + 1)
        if num_devices % t == 0 and cfg.num_heads % t == 0 and cfg.num_kv_heads % t == 0
    )
    rest = num_devices // tp
    if not cfg.num_experts:
        return (rest, 1, tp)
    expert = max(e for e in range(1, rest + 1) if rest % e == 0 and cfg.num_experts % e == 0)
    return (rest // expert, 1, tp, expert)


def process_devices(process_index: int) -> list[Any]:
    """A process's devices, in the global device order (every process sees the same list)."""
    return [d for d in jax.devices() if d.process_index == process_index]


def local_mesh(cfg: ModelConfig, process_index: int | None = None) -> Mesh:
    """Where a process's sampler runs: its own devices, shaped by ``sampler_mesh_shape``."""
    index = jax.process_index() if process_index is None else process_index
    devices = process_devices(index)
    return sharding.make_mesh(sampler_mesh_shape(cfg, len(devices)), devices)


def _stacked_mesh(local: Mesh) -> Mesh:
    """Every process's local mesh (the same shape and axes as ``local``: three, or four with
    ``expert``), stacked along ``data``.

    The same on every process: process p's devices are rows ``[p * d, (p + 1) * d)``, laid out
    as its own local mesh, so a parameter laid out by the rules on this mesh (parameters are
    never split over ``data``; the other axes, ``expert`` included, have their local sizes) has
    on each process's devices exactly its layout on that process's local mesh.
    """
    shape = tuple(int(local.shape[a]) for a in local.axis_names)
    if local.axis_names[0] != "data":
        raise ValueError(f"local mesh axes {local.axis_names}: expected 'data' first")
    blocks = []
    for p in range(jax.process_count()):
        devices = process_devices(p)
        if len(devices) != local.size:
            raise ValueError(
                f"process {p} has {len(devices)} devices; the local mesh {dict(local.shape)} "
                f"needs {local.size} on every process"
            )
        blocks.append(sharding.make_mesh(shape, devices).devices)
    return Mesh(np.concatenate(blocks, axis=0), local.axis_names, axis_types=local.axis_types)


def local_copy(tree: Any, local: Mesh, dtype: Any = None) -> Any:
    """This process's copy of a global parameter state (e.g. the policy's), on ``local``.

    The arrays are cast to ``dtype`` (the sampler's compute dtype: bf16 on accelerators; None
    keeps them) and laid out on ``local`` by the logical-axis rules: split over its ``tp`` axis
    (and routed experts over its ``expert`` axis, when it has one), not replicated, so a process
    holds one copy spread over its devices. One collective moves them there (every process
    calls this): each array is cast in its own layout, resharded to every process's local
    layout at once (``_stacked_mesh``), and this process's shards become one array on
    ``local``. The sampler runs on that copy without any cross-host communication, so each
    process plays its own waves at its own pace. The copy shares no buffer with ``tree``: it
    can be deleted while the train state lives on.

    Args:
      tree: an ``nnx.State`` of parameters (Variables carrying ``logical_axes``) on any mesh.
      local: this process's mesh (``local_mesh``).
      dtype: the copy's floating dtype, or None.
    """
    fresh = sharding.cast_copy(tree, dtype)
    placed = jax.device_put(fresh, sharding.leaf_shardings(fresh, _stacked_mesh(local)))
    del fresh  # its buffers go as soon as the reshard has read them
    by_device = {d: i for i, d in enumerate(local.devices.flat)}

    def to_local(x: jax.Array, target: NamedSharding) -> jax.Array:
        shards = sorted(
            (s for s in x.addressable_shards if s.device in by_device),
            key=lambda s: by_device[s.device],
        )
        return jax.make_array_from_single_device_arrays(x.shape, target, [s.data for s in shards])

    return jax.tree.map(to_local, placed, sharding.leaf_shardings(placed, local))


# ---------------------------------------------------------------- agreement


class DisagreementError(RuntimeError):
    """The processes of a run do not agree on what they run; the message names what differs."""


def digest(value: Any) -> str:
    """A short, stable hash of a value's ``repr`` (lists, tuples, dicts of plain values)."""
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def code_fingerprint(package: str = "agentrl_jax") -> dict[str, str]:
    """``{path: hash}`` of every Python file of ``package`` (paths from the package's parent).

    The code revision two hosts run: a checkout at another commit, or an edit on one host, shows
    as the files that differ (a git revision would miss uncommitted edits).
    """
    root = pathlib.Path(importlib.import_module(package).__file__).parent
    return {
        str(f.relative_to(root.parent)): hashlib.sha256(f.read_bytes()).hexdigest()[:16]
        for f in sorted(root.rglob("*.py"))
    }


def task_fingerprint(task_lists: dict[str, Sequence[Any]]) -> dict[str, str]:
    """``{name: hash of the task ids in order}`` for named task lists (e.g. per level)."""
    return {name: digest([t.name for t in tasks]) for name, tasks in task_lists.items()}


def disagreements(fingerprints: Sequence[dict[str, dict[str, str]]], show: int = 3) -> list[str]:
    """Where each process's fingerprint differs from process 0's, one line per process and part.

    A fingerprint is ``{part: {key: value}}`` (e.g. ``{"config": {"rl.actor_lr": "0.0001"}}``);
    a line names the part, then up to ``show`` keys with both processes' values.
    """
    out = []
    first = fingerprints[0]
    for p, other in enumerate(fingerprints[1:], start=1):
        for part in sorted(set(first) | set(other)):
            mine, theirs = first.get(part, {}), other.get(part, {})
            keys = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
            if not keys:
                continue
            shown = ", ".join(
                f"{k} ({mine.get(k, 'missing')} vs {theirs.get(k, 'missing')})" for k in keys[:show]
            )
            more = f" and {len(keys) - show} more" if len(keys) > show else ""
            out.append(f"process {p} differs from process 0 in {part}: {shown}{more}")
    return out


def check_agreement(fingerprint: dict[str, dict[str, str]]) -> None:
    """Checks that every process holds the same ``fingerprint`` (a collective; one process:
    nothing to compare).

    Raises:
      DisagreementError: on every process, naming each part and key that differs.
    """
    problems = disagreements(allgather_objects(fingerprint))
    if problems:
        raise DisagreementError(
            "the processes of this run disagree: "
            + "; ".join(problems)
            + " (every host must run the same code, config, task lists and tokenizer)"
        )


@dataclasses.dataclass
class ProcessInfo:
    index: int
    count: int

    @classmethod
    def current(cls) -> ProcessInfo:
        return cls(jax.process_index(), jax.process_count())


def plan_waves(num_tasks: int, per_wave: int, process_count: int) -> list[list[slice]]:
    """The waves each process plays of ``num_tasks`` tasks, ``per_wave`` tasks at most per wave.

    The tasks are first dealt out over the processes as evenly as possible, in whole tasks (a
    task's group of episodes is never split) and in order (``process_slice``); each process then
    cuts its share into waves its own actor pool holds. Every process thus plays in every call
    that has at least one task per process, and as few waves as the largest share needs.

    Returns:
      Per process, in process order, its waves as slices of the task list: the waves of all
      processes in order are the tasks in order, each task once.
    """
    if per_wave < 1:
        raise ValueError(f"per_wave={per_wave}: expected >= 1 tasks per wave")
    shares = [process_slice(num_tasks, 1, p, process_count) for p in range(process_count)]
    return [cut_waves(share.start, share.stop, per_wave) for share in shares]


class ShardedRolloutWorker(RolloutWorker):
    """A RolloutWorker whose ``run`` plays only this process's share, then gathers everyone's.

    The result is the single-process ``run``'s: the same episodes in the same (task-major)
    order, the same group ids, each episode keyed by its task's global position
    (``rollout.episode_keys``), so it plays the same whichever process and wave hold it.
    ``capacity`` is this process's pool, as in a RolloutWorker: the slots its waves and its
    continuous batching's cohorts use (``rollout.batching='continuous'`` streams the share
    through them).
    """

    def __init__(self, *args, process: ProcessInfo | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.process = process or ProcessInfo.current()

    def waves(self, num_tasks: int, per_wave: int) -> list[slice]:
        """This process's waves of the list (``plan_waves``): its share, cut to fit its pool."""
        return plan_waves(num_tasks, per_wave, self.process.count)[self.process.index]

    def gather(self, played: list[Trajectory]) -> list[Trajectory]:
        """Every process's episodes, in process order: the list's episodes in order (a
        collective: every process calls it, one with no share too)."""
        return [t for block in allgather_objects(played) for t in block]


__all__ = [
    "DisagreementError",
    "ProcessInfo",
    "ShardedRolloutWorker",
    "allgather_objects",
    "broadcast_object",
    "check_agreement",
    "code_fingerprint",
    "digest",
    "disagreements",
    "is_primary",
    "local_copy",
    "local_mesh",
    "payload_bucket",
    "plan_waves",
    "process_devices",
    "process_rows",
    "process_slice",
    "sampler_mesh_shape",
    "task_fingerprint",
]
