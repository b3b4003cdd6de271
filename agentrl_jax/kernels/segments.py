"""Masked group statistics and discounted sums shared by the estimators (pure jnp, jit-friendly).

Grouping uses segment reductions over dense ids (see ``batch.py``): O(N + num_segments) memory.

Float32 care: statistics are computed on deviations from the group's maximum (an exact shift).
A group of equal values then has deviations of exactly 0, so its normalised advantages are exactly
0 instead of rounding noise divided by eps (the usual failure of (x - mean) / (std + eps) in
float32 when every rollout of a task gets the same reward).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def group_deviation(
    x: jax.Array, ids: jax.Array, mask: jax.Array, num_segments: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x minus the mean of its group, over masked elements.

    Args:
      x: values, any shape.
      ids: int32 group id of each element, same shape, in [0, num_segments).
      mask: 0/1 (or bool), same shape; elements with 0 belong to no group.
      num_segments: static bound on the number of groups.

    Returns:
      (dev, dev_from_pivot, count): ``x - group_mean`` (0 where masked out), ``x - group_max``
      (the exact shift used; 0 where masked out), and the number of elements of each
      element's group, all of x's shape.
    """
    valid = mask.astype(bool).reshape(-1)
    flat_x = x.reshape(-1)
    flat_ids = ids.reshape(-1)
    seg_max, seg_sum = _segment_ops(num_segments)
    pivot = seg_max(jnp.where(valid, flat_x, -jnp.inf), flat_ids)
    shifted = jnp.where(valid, flat_x - pivot[flat_ids], 0.0)
    weights = valid.astype(x.dtype)
    sums = seg_sum(jnp.stack([shifted, weights], axis=-1), flat_ids)
    count = sums[:, 1][flat_ids]
    inv_count = 1.0 / jnp.maximum(count, 1.0)
    dev = jnp.where(valid, shifted - sums[:, 0][flat_ids] * inv_count, 0.0)
    # Corrected two-pass mean: the residual of the first pass removes its rounding error.
    dev = jnp.where(valid, dev - seg_sum(dev, flat_ids)[flat_ids] * inv_count, 0.0)
    return dev.reshape(x.shape), shifted.reshape(x.shape), count.reshape(x.shape)


def _segment_ops(num_segments: int):
    """(max, sum) per segment; a single segment uses plain reductions (pairwise, more exact)."""
    if num_segments == 1:
        return (
            lambda x, ids: jnp.max(x, axis=0, keepdims=True),
            lambda x, ids: jnp.sum(x, axis=0, keepdims=True),
        )
    return (
        lambda x, ids: jax.ops.segment_max(x, ids, num_segments=num_segments),
        lambda x, ids: jax.ops.segment_sum(x, ids, num_segments=num_segments),
    )


def group_normalize(
    x: jax.Array,
    ids: jax.Array,
    mask: jax.Array,
    num_segments: int,
    *,
    norm_by_std: bool,
    eps: float,
) -> jax.Array:
    """(x - mean_g) / (std_g + eps) within each group g (or x - mean_g without the std).

    std is the unbiased (ddof = 1) standard deviation, as GRPO implementations use
    (``torch.std``); a group of one element has std 0, and its advantage is 0. Masked-out
    elements get 0.

    Args:
      x: values, any shape; ids, mask: same shape (see :func:`group_deviation`).
      num_segments: static bound on the number of groups.
      norm_by_std: divide by the group's std (GRPO) or only subtract the mean (Dr. GRPO).
      eps: added to the std.

    Returns:
      The normalised values, x's shape.
    """
    dev, _, count = group_deviation(x, ids, mask, num_segments)
    if not norm_by_std:
        return dev
    flat_ids = ids.reshape(-1)
    sq = _segment_ops(num_segments)[1]((dev * dev).reshape(-1), flat_ids)[flat_ids]
    var = sq.reshape(x.shape) / jnp.maximum(count - 1.0, 1.0)
    return dev / (jnp.sqrt(var) + eps)


def reverse_discounted_sum(x: jax.Array, mask: jax.Array, discount: jax.Array | float) -> jax.Array:
    """y_t = x_t + discount_t * y_{t'} along the last axis, t' the next masked-in position.

    Masked-out positions are skipped: they neither add to the sum nor cut it, and get y = 0.
    This is the masked reverse ``lax.scan`` behind returns, GAE and GAGPO.

    Args:
      x: [B, L] values.
      mask: [B, L] 0/1.
      discount: a scalar or [B, L] per-position discount.

    Returns:
      [B, L] discounted suffix sums (0 where masked out).
    """
    disc = jnp.broadcast_to(jnp.asarray(discount, x.dtype), x.shape)
    valid = mask.astype(bool)

    def step(carry, inputs):  # carry [B]: y at the next masked-in position.
        x_t, d_t, m_t = inputs
        y_t = x_t + d_t * carry
        return jnp.where(m_t, y_t, carry), jnp.where(m_t, y_t, 0.0)

    zeros = jnp.zeros(x.shape[:1], x.dtype)
    _, ys = jax.lax.scan(step, zeros, (x.T, disc.T, valid.T), reverse=True, unroll=1)
    return ys.T


def steps_to_tokens(step_values: jax.Array, step_ids: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Broadcasts a per-step value to every token of that step's action.

    Args:
      step_values: [B, S].
      step_ids: [B, T] int32, -1 off agent tokens.
      loss_mask: [B, T].

    Returns:
      [B, T]: ``step_values[b, step_ids[b, t]]`` on agent tokens, 0 elsewhere.
    """
    gathered = jnp.take_along_axis(step_values, jnp.maximum(step_ids, 0), axis=1)
    return jnp.where(loss_mask > 0, gathered, 0.0)


def last_token_of_step(step_ids: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """[B, T] bool: True on the last token of each action (actions are contiguous runs)."""
    nxt = jnp.concatenate([step_ids[:, 1:], jnp.full_like(step_ids[:, :1], -2)], axis=1)
    return (loss_mask > 0) & (step_ids != nxt)
