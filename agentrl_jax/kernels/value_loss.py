"""Clipped value loss of the critic and its explained variance."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentrl_jax.kernels.config import DEFAULT_LOSS_CONFIG, LossConfig
from agentrl_jax.kernels.weighted import Weighted, aggregate


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    loss_mask: jax.Array,
    *,
    config: LossConfig = DEFAULT_LOSS_CONFIG,
) -> tuple[Weighted, dict[str, Weighted]]:
    """PPO's clipped value loss, to minimise.

        v_clip = V_old + clip(V - V_old, -value_clip, value_clip)
        l_t    = 0.5 * max((V - R)^2, (v_clip - R)^2)      (0.5 * (V - R)^2 if value_clip None)

    Args:
      values: [B, T] current critic values V(h_t).
      old_values: [B, T] values when the batch was collected (no gradient).
      returns: [B, T] targets R = A + V_old (``Advantages.returns``; no gradient).
      loss_mask: [B, T] 1 on agent tokens.
      config: value_clip and aggregation.

    Returns:
      (loss, {"losses/value_clipfrac": ...}) as numerator / denominator.
    """
    old = jax.lax.stop_gradient(old_values)
    target = jax.lax.stop_gradient(returns)
    unclipped = jnp.square(values - target)
    if config.value_clip is None:
        loss, clipped_more = unclipped, jnp.zeros_like(unclipped)
    else:
        v_clip = old + jnp.clip(values - old, -config.value_clip, config.value_clip)
        clipped = jnp.square(v_clip - target)
        loss = jnp.maximum(unclipped, clipped)
        clipped_more = (clipped > unclipped).astype(loss.dtype)
    metrics = {"losses/value_clipfrac": aggregate(clipped_more, loss_mask, "token_mean")}
    return aggregate(0.5 * loss, loss_mask, config.aggregation), metrics


def explained_variance(values: jax.Array, returns: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """1 - Var[R - V] / Var[R] over agent tokens (cleanrl's ``losses/explained_variance``).

    Args:
      values, returns, loss_mask: [B, T].

    Returns:
      A scalar; NaN when the returns have zero variance.
    """
    w = (loss_mask > 0).astype(values.dtype)
    n = jnp.maximum(jnp.sum(w), 1.0)

    def var(x):
        mean = jnp.sum(w * x) / n
        return jnp.sum(w * jnp.square(x - mean)) / n

    return 1.0 - var(returns - values) / var(returns)
