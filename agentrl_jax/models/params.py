"""Parameters: their creation with logical axis names (read by ``agentrl_jax.sharding``), and
the two layouts of a model's layers, unrolled (``(..., "layers", i, name...)``, one parameter a
layer) and scanned (``(..., "layers", name...)``, the L layers' stacked on a leading axis)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

dense_init = jax.nn.initializers.normal(0.02)
zeros = jax.nn.initializers.zeros
ones = jax.nn.initializers.ones


def param(rngs: nnx.Rngs, init, shape, axes, dtype) -> nnx.Param:
    """A parameter carrying its logical axis names (read by ``agentrl_jax.sharding``)."""
    return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=axes)


def stacked_layer_index(path: tuple) -> int | None:
    """Where ``"layers"`` is in the state path of a scanned model's stacked layer parameter;
    None for any other path (one layer of an unrolled model is ``(..., "layers", i, ...)``)."""
    k = path.index("layers") if "layers" in path else None
    return k if k is not None and isinstance(path[k + 1], str) else None


def _relabel(var: nnx.Variable, value, axes_fn) -> nnx.Variable:
    """``var`` holding ``value``, its logical axes (if it has any) mapped by ``axes_fn``."""
    out = var.replace(value)
    axes = var.get_metadata().get("logical_axes")
    if axes is not None:
        out.set_metadata(logical_axes=axes_fn(tuple(axes)))
    return out


def unstack_layers(state: nnx.State) -> nnx.State:
    """A scanned model's state (or gradients) laid out as the unrolled model's: each stacked
    ``(..., "layers", name...)`` [L, ...] parameter becomes L parameters ``(..., "layers", i,
    name...)``. ``nnx.merge(unrolled_graphdef, unstack_layers(state))`` is the same model."""
    flat = []
    for path, var in nnx.to_flat_state(state):
        k = stacked_layer_index(path)
        if k is None:
            flat.append((path, var))
            continue
        value = var.get_value()
        for i in range(value.shape[0]):
            layer_var = _relabel(var, value[i], lambda axes: axes[1:])
            flat.append(((*path[: k + 1], i, *path[k + 1 :]), layer_var))
    return nnx.from_flat_state(flat)


def stack_layers(state: nnx.State) -> nnx.State:
    """The inverse of ``unstack_layers``: an unrolled model's state in the scanned layout."""
    flat, layers = [], {}
    for path, var in nnx.to_flat_state(state):
        k = path.index("layers") if "layers" in path else None
        if k is None or not isinstance(path[k + 1], int):
            flat.append((path, var))
        else:
            layers.setdefault((*path[: k + 1], *path[k + 2 :]), {})[path[k + 1]] = var
    for path, by_layer in layers.items():
        value = jnp.stack([by_layer[i].get_value() for i in range(len(by_layer))])
        flat.append((path, _relabel(by_layer[0], value, lambda axes: ("layers", *axes))))
    return nnx.from_flat_state(flat)
