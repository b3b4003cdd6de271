"""Device meshes and the one table that maps logical axes to mesh axes.

Every parameter carries the logical names of its axes (``nnx.Param(..., logical_axes=(...))``,
e.g. ``("embed", "mlp")``); activations and caches are described with the same vocabulary.
``LOGICAL_AXIS_RULES`` is the single place that decides which mesh axis each logical axis is split
over, on a mesh with axes ``(data, fsdp, tp)``:

- ``data``: pure data parallelism; parameters are replicated along it.
- ``fsdp``: the batch is split along it too, and so is each parameter's ``embed`` axis (ZeRO-3
  style: XLA all-gathers a weight just before it is used).
- ``tp``: tensor parallelism over attention heads, the MLP width and the vocabulary.
- ``expert`` (optional, a fourth size to ``make_mesh``): expert parallelism: routed experts'
  weights (logical axis ``expert``) and their activations are split along it; everything else
  is replicated along it.

A logical axis whose size does not divide evenly by its mesh axes is replicated instead (e.g.
Qwen2.5-0.5B's 2 kv heads on tp=4), so any preset runs on any mesh.

Typical use::

    mesh = make_mesh((2, 2, 2))
    model = create_sharded_model(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)), mesh)
    tokens = jax.device_put(tokens_bt, named_sharding(mesh, ("batch", "seq"), tokens_bt.shape))
    with jax.set_mesh(mesh):  # activates the model's activation constraints (``constrain``)
        logits, _ = jax.jit(lambda m, t: m(t))(model, tokens)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tp")
# The optional fourth mesh axis (``make_mesh`` with four sizes): routed experts.
EXPERT_AXIS = "expert"

MeshAxes = str | tuple[str, ...] | None

# The one table: logical axis -> mesh axis (or axes, or None for replicated).
LOGICAL_AXIS_RULES: dict[str, MeshAxes] = {
    # Parameters.
    "vocab": "tp",
    "embed": "fsdp",
    "q_heads": "tp",
    "kv_heads": "tp",
    "head_dim": None,
    "mlp": "tp",
    "norm": None,
    "lora_rank": None,  # A LoRA adapter's rank axis (small): replicated.
    "expert": EXPERT_AXIS,  # Routed experts' leading axis (absent from a 3-axis mesh).
    # Activations, inputs and the KV cache.
    "batch": ("data", "fsdp"),
    "seq": None,
    "act_embed": None,
    "act_heads": "tp",
    "act_kv_heads": "tp",
    "act_vocab": "tp",
    "act_mlp": "tp",
    "act_expert": EXPERT_AXIS,
    "layers": None,
    "cache_slots": None,
}

# Logical axes of the KVCache's per-layer arrays and lengths (see agentrl_jax.models.kv_cache).
KV_KEYS_AXES = ("batch", "act_kv_heads", "head_dim", "cache_slots")  # slot-minor (CPU)
KV_VALUES_AXES = ("batch", "act_kv_heads", "cache_slots", "head_dim")
KV_LENGTHS_AXES = ("batch",)

_log = logging.getLogger(__name__)
M = TypeVar("M", bound=nnx.Module)


def make_mesh(shape: Sequence[int] = (-1, 1, 1), devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh with axes ``(data, fsdp, tp)``, or ``(data, fsdp, tp, expert)`` given four sizes,
    over ``devices`` (default: all devices).

    Args:
      shape: sizes of (data, fsdp, tp[, expert]); one entry may be -1 to take the remaining
        devices.
      devices: the devices to use (default ``jax.devices()``, all hosts' devices).

    Raises:
      ValueError: if the shape has the wrong length or does not multiply to the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = [int(s) for s in shape]
    axes = MESH_AXES + (EXPERT_AXIS,) if len(shape) == len(MESH_AXES) + 1 else MESH_AXES
    if len(shape) != len(axes):
        raise ValueError(
            f"mesh shape {tuple(shape)} must have one size per axis {MESH_AXES} (or also "
            f"{EXPERT_AXIS!r})"
        )
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh shape {tuple(shape)}: sizes must be positive, at most one -1")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if len(devices) % known:
            raise ValueError(
                f"mesh shape {tuple(shape)} cannot fill {len(devices)} devices "
                f"({len(devices)} is not divisible by {known})"
            )
        shape[shape.index(-1)] = len(devices) // known
    if math.prod(shape) != len(devices):
        raise ValueError(
            f"mesh shape {dict(zip(axes, shape))} needs {math.prod(shape)} devices, "
            f"but {len(devices)} are available"
        )
    # Auto axes: parameters and inputs carry explicit shardings and XLA's partitioner propagates
    # them through the model, so the model code needs no mesh-aware annotations.
    return jax.make_mesh(
        tuple(shape), axes, axis_types=(AxisType.Auto,) * len(axes), devices=devices
    )


def _as_tuple(mesh_axes: MeshAxes) -> tuple[str, ...]:
    if mesh_axes is None:
        return ()
    return (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)


def logical_to_spec(
    logical_axes: Sequence[str | None],
    shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
    rules: dict[str, MeshAxes] | None = None,
) -> PartitionSpec:
    """The PartitionSpec for an array whose axes have the given logical names.

    Args:
      logical_axes: one logical name (or None, replicated) per array axis.
      shape: the array's shape; with ``mesh``, an axis whose size is not divisible by its mesh
        axes' total size is replicated instead of split.
      mesh: the mesh (needed for the divisibility check and to drop axes the mesh lacks).
      rules: the table to use (default ``LOGICAL_AXIS_RULES``).

    Raises:
      KeyError: for a logical name that the table does not know.
    """
    rules = LOGICAL_AXIS_RULES if rules is None else rules
    if shape is not None and len(shape) != len(logical_axes):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    entries: list[MeshAxes] = []
    for i, name in enumerate(logical_axes):
        if name is None:
            entries.append(None)
            continue
        if name not in rules:
            raise KeyError(
                f"logical axis {name!r} has no entry in the sharding rules; known: {sorted(rules)}"
            )
        axes = tuple(a for a in _as_tuple(rules[name]) if a not in used)
        if mesh is not None:
            axes = tuple(a for a in axes if a in mesh.shape)
            if shape is not None and shape[i] % math.prod(mesh.shape[a] for a in axes):
                axes = ()  # Not evenly divisible: replicate this axis.
        used.update(axes)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries)


def named_sharding(
    mesh: Mesh, logical_axes: Sequence[str | None], shape: Sequence[int] | None = None
) -> NamedSharding:
    """A NamedSharding for an array (input, activation or parameter) from its logical axes."""
    return NamedSharding(mesh, logical_to_spec(logical_axes, shape, mesh))


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """Pins an activation's layout by its logical axes, when tracing under ``jax.set_mesh``.

    Outside a mesh context this is the identity, so model code can call it unconditionally;
    inside one it guides XLA's partitioner (batch over (data, fsdp), heads and MLP width over
    tp) instead of leaving it to infer activation layouts from the weights'. The sampler and the
    Learner trace their programs under their mesh (``MeshJit``).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes, x.shape, mesh))


def mesh_context(mesh: Mesh | None) -> contextlib.AbstractContextManager:
    """``jax.set_mesh(mesh)``, or a context that does nothing for ``mesh=None``."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


class MeshJit:
    """``jax.jit(fn, **jit_kwargs)``, traced, lowered and called under ``jax.set_mesh(mesh)``.

    The model's activation constraints (``constrain``) act only when a program is traced under a
    mesh; tracing a jitted step without one leaves them out, and XLA then picks the activations'
    layouts from the weights' alone (e.g. an FSDP-split hidden width instead of the batch split).
    Calls and ``lower`` enter the mesh; everything else (``_cache_size``, ``trace``...) is the
    jitted function's. ``mesh=None``: a plain ``jax.jit``.
    """

    def __init__(self, fn: Callable[..., Any], mesh: Mesh | None, **jit_kwargs: Any):
        self.mesh = mesh
        self.jitted = jax.jit(fn, **jit_kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with mesh_context(self.mesh):
            return self.jitted(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        with mesh_context(self.mesh):
            return self.jitted.lower(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.jitted, name)


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _variable_spec(var: nnx.Variable, mesh: Mesh | None) -> PartitionSpec:
    axes = var.get_metadata().get("logical_axes")
    if axes is None:
        return PartitionSpec()  # Unannotated state (e.g. RNG counters): replicated.
    return logical_to_spec(axes, np.shape(var.value), mesh)


def state_specs(state: Any, mesh: Mesh | None = None) -> Any:
    """PartitionSpecs for an ``nnx.State`` (or a module's state), one per Variable.

    Works on abstract states from ``nnx.eval_shape`` too. With ``mesh``, indivisible axes are
    replicated (see ``logical_to_spec``).
    """
    if isinstance(state, nnx.Module):
        state = nnx.state(state)
    return jax.tree.map(lambda v: _variable_spec(v, mesh), state, is_leaf=_is_variable)


def state_shardings(state: Any, mesh: Mesh) -> Any:
    """NamedShardings for an ``nnx.State`` (or a module's state), one per Variable."""
    specs = state_specs(state, mesh)
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )


def leaf_shardings(state: Any, mesh: Mesh) -> Any:
    """``state_shardings`` in the state's own tree: one NamedSharding per array leaf.

    The shape ``jit(out_shardings=...)``, ``device_put`` and ``jax.tree.map`` alongside the state
    (or any copy of its parameters, e.g. inside an optimizer state) expect.
    """
    return jax.tree.unflatten(
        jax.tree.structure(state), jax.tree.leaves(state_shardings(state, mesh))
    )


def _cast_or_copy(x: jax.Array, dtype: Any) -> jax.Array:
    if dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
        return x.astype(dtype)
    # A copy, not ``x`` itself: jit forwards an output that is an input, and the caller may
    # delete this one while the input lives on.
    return jnp.copy(x)


@functools.partial(jax.jit, static_argnums=1)
def _cast_copy(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda x: _cast_or_copy(x, dtype), tree)


def casts(tree: Any, dtype: Any) -> bool:
    """Whether some floating array of ``tree`` (arrays or ``jax.ShapeDtypeStruct``) is not in
    ``dtype``: a copy in ``dtype`` would be one of its own, not the same buffers."""
    floating = (x.dtype for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating))
    return any(d != np.dtype(dtype) for d in floating)


def cast_copy(tree: Any, dtype: Any = None) -> Any:
    """A copy of a pytree of arrays in new buffers, its floating arrays in ``dtype``.

    Each array keeps its layout (an elementwise program: the output's sharding is the input's);
    integer arrays and ``dtype=None`` are copied as they are. The copy shares no buffer with
    ``tree``, so it can be deleted (``jax.Array.delete``) while ``tree`` is in use. Compiled once
    per tree structure, layout and dtype.
    """
    return _cast_copy(tree, None if dtype is None else np.dtype(dtype))


def moved_copy(tree: Any, mesh: Mesh, dtype: Any = None) -> Any:
    """A copy of a parameter state on another ``mesh`` (other devices: a disaggregated
    rollout's), laid out there by the logical-axis rules, its floating arrays in ``dtype``.

    The arrays move device to device (``jax.device_put``), then are cast on ``mesh``; the copy
    shares no buffer with ``tree``.
    """
    # may_alias=False: a copy even where ``mesh`` lays an array out as it already is.
    placed = jax.device_put(tree, leaf_shardings(tree, mesh), may_alias=False)
    if dtype is None or not casts(placed, dtype):
        return placed
    out = cast_copy(placed, dtype)
    for x in jax.tree.leaves(placed):
        x.delete()
    return out


def host_array(x: jax.Array) -> np.ndarray:
    """The whole of a (possibly multi-host) array on this host, as numpy.

    An array whose shards all live on this process is read directly (the single-process path);
    otherwise the other processes' shards are all-gathered (a collective: all processes call it).
    """
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils  # noqa: PLC0415 (multi-host only)

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def create_sharded_model(ctor: Callable[[], M], mesh: Mesh | None = None) -> M:
    """Builds ``ctor()`` with every parameter created directly in its sharded layout.

    The model is first traced abstractly (``nnx.eval_shape``: no memory) to learn its parameter
    shapes and logical axes; then the initialiser runs under ``jax.jit`` with ``out_shardings``,
    so each device only ever materialises its own shard. (One compiled initialiser is also much
    faster than running each parameter's initialiser op by op, so this is worth using without a
    mesh too.)

    Args:
      ctor: a zero-argument function returning the module, e.g.
        ``lambda: CausalLM(cfg, rngs=nnx.Rngs(0))``.
      mesh: the device mesh; None puts the whole model on the default device.
    """
    abstract = nnx.eval_shape(ctor)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = None if mesh is None else state_shardings(abstract_state, mesh)

    def init():
        return nnx.state(ctor())

    state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def shard_model(model: nnx.Module, mesh: Mesh) -> None:
    """Moves an existing model's state, in place, into the layout the rules give on ``mesh``."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, state_shardings(state, mesh)))


def kv_cache_shardings(cache: Any, mesh: Mesh) -> Any:
    """A KVCache-shaped pytree of NamedShardings for ``cache`` (for device_put / jit)."""
    key_axes = KV_KEYS_AXES if cache.keys_slot_minor else KV_VALUES_AXES
    return cache.replace(
        keys=tuple(named_sharding(mesh, key_axes, k.shape) for k in cache.keys),
        values=tuple(named_sharding(mesh, KV_VALUES_AXES, v.shape) for v in cache.values),
        lengths=named_sharding(mesh, KV_LENGTHS_AXES, cache.lengths.shape),
    )


def maybe_initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto: bool | None = None,
    initialization_timeout_s: int | None = None,
    heartbeat_timeout_s: int | None = None,
) -> bool:
    """Starts JAX's multi-controller runtime when a multi-host run is configured.

    Configured means: ``coordinator_address`` is given (then ``num_processes`` and ``process_id``
    are passed along), or the environment sets ``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (per-node variables of a job scheduler; flags
    win over them), or ``auto`` is true, or the environment variable ``AGENTRL_DISTRIBUTED=1`` is
    set (``auto`` then lets JAX detect the cluster: TPU pods, SLURM, Open MPI...). Otherwise, and
    when already initialised, it does nothing. It must run before any other JAX call that
    touches devices.

    ``initialization_timeout_s`` (how long to wait for every process to connect) and
    ``heartbeat_timeout_s`` (how long a process may go silent before the others are told it is
    gone and fail instead of waiting) go to ``jax.distributed.initialize`` when the installed
    JAX accepts them (None: JAX's defaults, 300 s and 100 s in JAX 0.10).

    Returns:
      True if the runtime is initialised when this returns (by this call or an earlier one).

    Raises:
      ValueError: a coordinator without a process count and id, or a non-integer
        ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``.
    """
    if jax.distributed.is_initialized():
        return True
    if coordinator_address is None and os.environ.get("JAX_COORDINATOR_ADDRESS"):
        coordinator_address = os.environ["JAX_COORDINATOR_ADDRESS"]
        if num_processes is None:
            num_processes = _env_int("JAX_NUM_PROCESSES")
        if process_id is None:
            process_id = _env_int("JAX_PROCESS_ID")
    if auto is None:
        auto = os.environ.get("AGENTRL_DISTRIBUTED", "0").lower() in ("1", "true", "auto")
    if coordinator_address is None and not auto:
        return False
    if coordinator_address is not None and (num_processes is None or process_id is None):
        raise ValueError(
            f"coordinator_address={coordinator_address!r} also needs num_processes and process_id "
            f"(got num_processes={num_processes}, process_id={process_id})"
        )
    timeouts = {
        "initialization_timeout": initialization_timeout_s,
        "heartbeat_timeout_seconds": heartbeat_timeout_s,
    }
    accepted = inspect.signature(jax.distributed.initialize).parameters
    for name, value in timeouts.items():
        if value is not None and name not in accepted:
            _log.warning("this JAX's jax.distributed.initialize has no %s; not passed", name)
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        **{k: v for k, v in timeouts.items() if v is not None and k in accepted},
    )
    _log.info(
        "jax.distributed: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
