"""LoRA on the decoder: adapters on a model, what trains, and the merged copy.

The adapters are part of the model (``ModelConfig.lora``, a ``LoraConfig``): each targeted
projection W (q, k, v, o, gate, up, down) of every layer gets A [in, rank] and B [rank, out],
``nnx.LoRAParam`` variables beside W in the same module (the family's ``lora_slots`` name
them: ``registry.family(cfg).lora_slots``), and
the layer computes ``x @ W + dropout(x) @ A @ B * (alpha / rank)``, as PEFT does. So everything
that handles a model handles a LoRA model unchanged: ``nnx.split`` / ``nnx.state``, jit, the
scanned layout (the pairs are stacked [L, ...] like every layer parameter and ride the same
``lax.scan``), remat, the cached pass (``unroll_layers`` slices them too), and sharding: A and B
carry their base matrix's logical axes on its in and out axes and ``lora_rank`` (replicated) on
the rank axis, so the rules place them like W.

    lora_cfg = LoraConfig(rank=16, alpha=32.0, targets="all")
    policy = apply_lora(load_hf_model(ckpt, mesh=mesh, param_dtype=jnp.bfloat16), lora_cfg)
    graphdef, adapters, frozen = split(policy)      # adapters: f32 LoRAParams only
    optimizer = nnx.Optimizer(policy, optax.adam(1e-4), wrt=TRAINABLE)  # state for adapters
    sampler_policy = merge(policy, jnp.bfloat16)    # a plain model, W + A B alpha/rank

Why not qwix (the LoRA library Tunix uses): docs/models.md, "LoRA".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from agentrl_jax import sharding as sharding_lib
from agentrl_jax.models import registry
from agentrl_jax.models.config import LORA_TARGETS, LoraConfig, ModelConfig
from agentrl_jax.models.params import stacked_layer_index

M = TypeVar("M", bound=nnx.Module)

# What trains in a LoRA model (an nnx filter): the adapters alone. ``nnx.LoRAParam`` is a
# subclass of ``nnx.Param``, so ``nnx.Param`` alone would select the base weights too.
TRAINABLE = nnx.LoRAParam
# The frozen base: every parameter that is not an adapter.
FROZEN = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))

__all__ = [
    "FROZEN",
    "LORA_TARGETS",
    "TRAINABLE",
    "LoraConfig",
    "adapters",
    "apply_lora",
    "attach_adapters",
    "base_model",
    "merge",
    "split",
    "trainable_filter",
    "with_adapters",
]


def trainable_filter(model_or_cfg: nnx.Module | ModelConfig):
    """The nnx filter of what an optimizer should train: ``TRAINABLE`` (the adapters) for a LoRA
    model, every ``nnx.Param`` otherwise (a full fine-tune)."""
    cfg = model_or_cfg if isinstance(model_or_cfg, ModelConfig) else model_or_cfg.cfg
    return TRAINABLE if cfg.lora is not None else nnx.Param


def has_adapters(state: Any) -> bool:
    """Whether a model's state holds LoRA adapters (``nnx.LoRAParam``): the one test of a
    policy's state (the sampler merges them; the learner's LoRA state must have them)."""
    return any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(state))


def split(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """``(graphdef, trainable, rest)``: the adapters (or, without LoRA, every parameter) and the
    rest of the state; ``nnx.merge(graphdef, trainable, rest)`` is the model again."""
    return nnx.split(model, trainable_filter(model), ...)


def adapters(model: nnx.Module) -> nnx.State:
    """The model's LoRA adapters (``nnx.LoRAParam`` variables; empty without LoRA)."""
    return nnx.state(model, TRAINABLE)


def with_adapters(model: nnx.Module, state: nnx.State) -> None:
    """Writes adapter values (as ``adapters`` returns them) into ``model``, in place."""
    nnx.update(model, state)


def _mesh_of(model: nnx.Module) -> Mesh | None:
    placement = getattr(model.trunk.embed_vd[...], "sharding", None)
    return placement.mesh if isinstance(placement, NamedSharding) else None


@functools.lru_cache(maxsize=32)
def _abstract(cls: type, cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """The graphdef and abstract state of ``cls(cfg)`` (traced once per class and config)."""
    return nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))))


def _assemble(cls: type, cfg: ModelConfig, values: dict[tuple, jax.Array]) -> nnx.Module:
    """``cls(cfg)`` holding ``values`` (state path -> array) as its state."""
    graphdef, abstract = _abstract(cls, cfg)
    flat = [(path, var.replace(values[path])) for path, var in nnx.to_flat_state(abstract)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def base_model(model: M) -> M:
    """``model`` without its adapters, unmerged (its base arrays, shared: no copy); a model
    without LoRA as it is."""
    if model.cfg.lora is None:
        return model
    values = {
        path: var.get_value()
        for path, var in nnx.to_flat_state(nnx.state(model))
        if not isinstance(var, nnx.LoRAParam)
    }
    return _assemble(type(model), model.cfg.replace(lora=None), values)


def apply_lora(model: M, lora: LoraConfig | None, *, seed: int = 0, base_dtype: Any = None) -> M:
    """``model`` (a policy or value model) with fresh LoRA adapters on ``lora.targets``.

    A is kaiming-uniform (U(+-1/sqrt(fan_in)), PEFT's default) and B zero, so the new model
    computes exactly what ``model`` did until B moves. The adapters are ``lora.param_dtype``
    (f32) whatever the base's dtype, and are created by one jitted program (cached by shapes
    and layout) directly in their layout on the base's mesh (the logical-axis rules: A and B
    split like their base matrix).
    The base arrays are shared with ``model``, not copied: use the returned model from then on
    (donating one model's state frees the other's base). With ``base_dtype`` other than the
    base's, the base is instead cast to it, each array in its layout (a bf16 base under f32
    adapters: the frozen weights at half the memory); the new model's ``cfg.param_dtype`` says
    so.

    Args:
      model: a policy or value model without LoRA, scanned or not.
      lora: the adapters; None or rank 0 returns ``model`` itself.
      seed: draws A.
      base_dtype: the frozen base's storage dtype; None keeps the model's.

    Raises:
      ValueError: ``model`` already has adapters (``base_model`` or ``merge`` it first).
    """
    if lora is None or lora.rank == 0:
        return model
    if model.cfg.lora is not None:
        raise ValueError(
            f"the model already has LoRA adapters ({model.cfg.lora}); take base_model(model) "
            "or merge(model) first"
        )
    cls, cfg = type(model), model.cfg.replace(lora=lora)
    if base_dtype is not None:
        cfg = cfg.replace(param_dtype=np.dtype(base_dtype))
    mesh = _mesh_of(model)
    _, abstract = _abstract(cls, cfg)
    fan_in = {}
    for slot in registry.family(cfg).lora_slots(cfg).values():
        fan_in[(slot.module, slot.a)] = slot.fan_in
        fan_in[(slot.module, slot.b)] = None  # B starts at zero
    paths, specs, shardings = [], [], []
    for path, var in nnx.to_flat_state(abstract):
        if isinstance(var, nnx.LoRAParam):
            shape = var.get_value().shape
            fan = fan_in[tuple(path[-2:])]
            paths.append(path)
            specs.append((shape, 0.0 if fan is None else 1.0 / math.sqrt(fan)))
            if mesh is not None:
                axes = var.get_metadata()["logical_axes"]
                shardings.append(
                    NamedSharding(mesh, sharding_lib.logical_to_spec(axes, shape, mesh))
                )
    init = _adapter_init(tuple(specs), np.dtype(lora.param_dtype), tuple(shardings) or None)
    values = {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model))}
    if base_dtype is not None and sharding_lib.casts(list(values.values()), base_dtype):
        cast = sharding_lib.cast_copy(list(values.values()), base_dtype)
        values = dict(zip(values, cast, strict=True))
    values.update(zip(paths, init(jax.random.key(seed)), strict=True))
    return _assemble(cls, cfg, values)


@functools.lru_cache(maxsize=16)
def _adapter_init(specs: tuple, dtype: np.dtype, shardings: tuple | None):
    """One jitted program that draws every adapter: ``specs`` holds (shape, bound) per adapter,
    U(+-bound) for A and zeros for B (bound 0), laid out as ``shardings`` says. Cached, so a
    second model of the same shapes compiles nothing."""

    def init(key):
        # One draw for every A, cut into pieces: a single threefry program compiles in a
        # fraction of the time one per adapter takes (seconds each on CPU).
        sizes = [math.prod(shape) for shape, bound in specs if bound != 0.0]
        u = jax.random.uniform(key, (sum(sizes),), jnp.float32, -1.0, 1.0)
        out, start = [], 0
        for shape, bound in specs:
            if bound == 0.0:
                out.append(jnp.zeros(shape, dtype))
                continue
            size = math.prod(shape)
            out.append((u[start : start + size].reshape(shape) * bound).astype(dtype))
            start += size
        return tuple(out)

    return jax.jit(init, out_shardings=shardings)


def attach_adapters(
    model: M, lora: LoraConfig, value: Callable[[tuple, nnx.Variable], np.ndarray]
) -> M:
    """``model``'s base (its arrays, shared) with adapters whose values are given on the host:
    ``value(path, abstract_variable)`` returns the whole array of the adapter at that state path
    (stacked [L, ...] in a scanned model). Each device takes its own slice, laid out by the rules
    on the base's mesh (every process must give the same arrays). For readers of trained
    adapters (``peft.load_peft_adapter``); ``apply_lora`` makes fresh ones."""
    base = base_model(model)
    cls, cfg = type(base), base.cfg.replace(lora=lora)
    mesh = _mesh_of(base)
    values = {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(base))}
    _, abstract = _abstract(cls, cfg)
    for path, var in nnx.to_flat_state(abstract):
        if not isinstance(var, nnx.LoRAParam):
            continue
        host = np.asarray(value(path, var), dtype=var.get_value().dtype)
        if host.shape != var.get_value().shape:
            raise ValueError(
                f"adapter {'.'.join(map(str, path))}: shape {host.shape}, expected "
                f"{var.get_value().shape}"
            )
        if mesh is None:
            placement = SingleDeviceSharding(jax.devices()[0])
        else:
            axes = var.get_metadata()["logical_axes"]
            placement = NamedSharding(mesh, sharding_lib.logical_to_spec(axes, host.shape, mesh))
        values[path] = jax.make_array_from_callback(
            host.shape, placement, lambda index, host=host: host[index]
        )
    return _assemble(cls, cfg, values)


def _merged_state(state: nnx.State, cfg: ModelConfig, dtype, mesh: Mesh | None) -> nnx.State:
    """The state of ``merge``'s model: each adapted W as W + A B * scale (in f32, then cast to
    ``dtype``), the adapters dropped, every floating array in ``dtype``."""
    slots = registry.family(cfg).lora_slots(cfg)
    flat = nnx.to_flat_state(state)
    by_path = dict(flat)
    by_weight = {(s.module, s.weight): s for t, s in slots.items() if t in cfg.lora.targets}
    out = []
    for path, var in flat:
        if isinstance(var, nnx.LoRAParam):
            continue
        value = var.get_value()
        slot = by_weight.get(tuple(path[-2:]))
        if slot is not None:
            a = by_path[(*path[:-1], slot.a)].get_value().astype(jnp.float32)
            b = by_path[(*path[:-1], slot.b)].get_value().astype(jnp.float32)
            spec = slot.merge_spec
            if stacked_layer_index(path) is not None:  # [L, ...]: one product per layer
                ins, res = spec.split("->")
                spec = ",".join("l" + x for x in ins.split(",")) + "->l" + res
            delta = jnp.einsum(spec, a, b, precision=jax.lax.Precision.HIGHEST)
            value = value.astype(jnp.float32) + delta * jnp.float32(cfg.lora.scale)
        if jnp.issubdtype(value.dtype, jnp.floating):
            value = value.astype(dtype)
        if mesh is not None:
            axes = var.get_metadata().get("logical_axes")
            spec = sharding_lib.logical_to_spec(axes or (None,) * value.ndim, value.shape, mesh)
            value = jax.lax.with_sharding_constraint(value, NamedSharding(mesh, spec))
        out.append((path, var.replace(value)))
    return nnx.from_flat_state(out)


_merge_jit = jax.jit(_merged_state, static_argnums=(1, 2, 3))


def merge(model: M, dtype=None) -> M:
    """A plain copy of ``model`` (no adapters) whose weights are the adapted ones: each targeted
    W becomes W + A @ B * alpha / rank, summed in f32 and stored in ``dtype`` (default: the base's
    ``param_dtype``), e.g. a bf16 copy for the sampler, or for ``save_hf_checkpoint`` (which
    merges a LoRA model itself).

    One jitted program (compiled once per config, dtype and layout), laid out on the model's
    mesh by the rules. New buffers: ``model`` stays usable, and the copy can be deleted
    while ``model`` trains on. A model without LoRA gives a copy in ``dtype``.
    """
    cfg = model.cfg
    dtype = np.dtype(cfg.param_dtype if dtype is None else dtype)
    out_cfg = cfg.replace(lora=None, param_dtype=dtype)
    if cfg.lora is None:
        state = sharding_lib.cast_copy(nnx.state(model), dtype)
    else:
        state = _merge_jit(nnx.state(model), cfg, dtype, _mesh_of(model))
    values = {path: var.get_value() for path, var in nnx.to_flat_state(state)}
    return _assemble(type(model), out_cfg, values)
