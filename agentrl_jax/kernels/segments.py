"""Masked group statistics and discounted sums shared by the estimators (pure jnp, jit-friendly).

Grouping uses segment reductions over dense ids (see ``batch.py``): O(N + num_segments) memory.

Float32 care: statistics are computed on deviations from the group's maximum (an exact shift).
A group of equal values then has deviations of exactly 0, so its normalised advantages are exactly
0 instead of rounding noise divided by eps (the usual failure of (x - mean) / (std + eps) in
float32 when every rollout of a task gets the same reward).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def group_deviation(
    x: jax.Array, ids: jax.Array, mask: jax.Array, num_segments: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x minus the mean of its group, over masked elements.

    Args:
      x: values, any shape.
      ids: int32 group id of each element (same shape as x), or of each row ([B] for x of
        shape [B, S]: every element of row b is in group ids[b]); in [0, num_segments).
      mask: 0/1 (or bool), x's shape; elements with 0 belong to no group.
      num_segments: static bound on the number of groups.

    Returns:
      (dev, dev_from_pivot, count): ``x - group_mean`` (0 where masked out), ``x - group_max``
      (the exact shift used; 0 where masked out), and the number of elements of each
      element's group, all of x's shape.
    """
    dev, shifted, count, _ = _group_stats(x, ids, mask, num_segments, squares=False)
    return dev, shifted, count


def _group_stats(x, ids, mask, num_segments, *, squares):
    """(dev, shifted, count, sum of dev^2 or None) per element, in three segment passes.

    Scatters are the expensive op on CPU, so sums that share ids travel in one scatter
    ([N, 2] updates), and the squares ride with the correction pass: with d1 the first-pass
    deviation and c = mean(d1), sum (d1 - c)^2 = sum d1^2 - n c^2.
    """
    valid = mask.astype(bool)
    seg_max, seg_sum = _segment_ops(ids, num_segments, x.shape)
    pivot = seg_max(jnp.where(valid, x, -jnp.inf))
    shifted = jnp.where(valid, x - pivot, 0.0)
    total, count = seg_sum(shifted, valid.astype(x.dtype))
    inv_count = 1.0 / jnp.maximum(count, 1.0)
    dev = jnp.where(valid, shifted - total * inv_count, 0.0)
    # Corrected two-pass mean: the residual of the first pass removes its rounding error.
    if squares:
        resid, sq = seg_sum(dev, dev * dev)
        sq = jnp.maximum(sq - resid * resid * inv_count, 0.0)
    else:
        (resid,), sq = seg_sum(dev), None
    dev = jnp.where(valid, dev - resid * inv_count, 0.0)
    return dev, shifted, count, sq


def _segment_ops(ids: jax.Array, num_segments: int, shape: tuple[int, ...]):
    """(max, sum) over each element's segment, given back per element of ``shape``.

    ``sum`` takes several arrays and returns their segment sums as a tuple (one scatter).
    A single segment uses plain ``jnp.sum`` reductions and broadcasts: they sum in blocks
    (float32 error ~1e-7 relative over 2M tokens), where a variadic ``lax.reduce`` on CPU
    accumulated sequentially and lost ~1e-2 (measured on 512 x 4096 token returns).
    Row ids ([B] for [B, S] values) reduce each row densely first, so the scatter has B
    updates instead of B * S.
    """
    if num_segments == 1:
        # Rows first, then the row totals: on CPU ~15% faster than one flat reduction of a
        # [512, 4096] array, and as exact (blocked sums either way).
        def seg_max(x):
            return jnp.broadcast_to(jnp.max(jnp.max(x, axis=-1)), shape)

        def seg_sum(*xs):
            return tuple(jnp.broadcast_to(jnp.sum(jnp.sum(x, axis=-1)), shape) for x in xs)

        return seg_max, seg_sum
    rows = ids.ndim == 1 and len(shape) == 2
    flat_ids = ids if rows else ids.reshape(-1)

    def spread(y):  # [num_segments, ...] -> per element of shape
        y = y[flat_ids]
        return jnp.broadcast_to(y[:, None], shape) if rows else y.reshape(shape)

    def seg_max(x):
        x = jnp.max(x, axis=1) if rows else x.reshape(-1)
        return spread(jax.ops.segment_max(x, flat_ids, num_segments=num_segments))

    def seg_sum(*xs):
        parts = [jnp.sum(x, axis=1) if rows else x.reshape(-1) for x in xs]
        if len(parts) == 1:
            return (spread(jax.ops.segment_sum(parts[0], flat_ids, num_segments=num_segments)),)
        sums = jax.ops.segment_sum(jnp.stack(parts, axis=-1), flat_ids, num_segments=num_segments)
        return tuple(spread(sums[:, i]) for i in range(len(parts)))

    return seg_max, seg_sum


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
      x: values, any shape; ids, mask: see :func:`group_deviation` (element or row ids).
      num_segments: static bound on the number of groups.
      norm_by_std: divide by the group's std (GRPO) or only subtract the mean (Dr. GRPO).
      eps: added to the std.

    Returns:
      The normalised values, x's shape.
    """
    dev, _, count, sq = _group_stats(x, ids, mask, num_segments, squares=norm_by_std)
    if not norm_by_std:
        return dev
    var = sq / jnp.maximum(count - 1.0, 1.0)
    return dev / (jnp.sqrt(var) + eps)


def _chunk_length(discount: float) -> int:
    """Chunk length L of :func:`masked_suffix_sums`, 0 for the sequential scan.

    The weights discount^(K_t - K_t') come out of exp(K * log(discount)) with K <= L; the
    float32 rounding of that argument (about ulp(L |log discount|)) becomes relative error, so
    L |log discount| is kept <= 4 (error < 3e-7); discounts below ~0.6 use the scan.
    """
    if discount >= 1.0:
        return 32
    for size in (32, 16, 8):
        if discount > 0 and size * -math.log(discount) <= 4.0:
            return size
    return 0


def chunked_discount(discount: float) -> bool:
    """Whether :func:`masked_suffix_sums` runs chunked matmuls (True) or a sequential scan."""
    return _chunk_length(discount) > 0


def _sequential_suffix_sums(x, valid, discount):
    """Reference-order reverse scan (small discounts, e.g. lambda = 0, and step-level sums)."""

    def step(carry, inputs):  # carry [B]: incl at the next masked-in position.
        x_t, m_t = inputs
        incl = x_t + discount * carry
        return jnp.where(m_t, incl, carry), (incl, carry)

    zeros = jnp.zeros(x.shape[:1], x.dtype)
    _, (incl, strict) = jax.lax.scan(step, zeros, (x.T, valid.T), reverse=True)
    return incl.T, strict.T


def masked_suffix_sums(
    x: jax.Array,
    mask: jax.Array,
    discount: float,
    *,
    strict: bool = False,
    sequential: bool = False,
) -> jax.Array:
    """Discounted suffix sums over the masked-in positions of each row, skipping the others.

    For a row's masked-in positions t_0 < t_1 < ... (environment tokens in between are skipped,
    not steps), at every masked-in t = t_i::

        incl_t   = sum_{j >= 0} discount^j     x_{t_{i+j}}   ( = x_t + discount * incl_{t_{i+1}} )
        strict_t = sum_{j >= 1} discount^(j-1) x_{t_{i+j}}   ( = incl_{t_{i+1}}, 0 at the last )

    A sequential scan costs microseconds of loop overhead per position on CPU, so by default the
    sums are computed in chunks of L positions with matmuls: with K_t the number of masked-in
    positions at or after t inside its chunk, the weight of x_t' in incl_t is
    discount^(K_t - K_t'), so ``incl = discount^K * (triu @ (x * discount^-K))`` inside a chunk
    (L from 8 to 32, see :func:`_chunk_length`); a short scan over the T / L chunks then
    carries the sums into the preceding chunks. Discounts below ~0.6 fall back to the
    sequential scan.

    Args:
      x: [B, T] values, or [N, B, T] to sum N arrays with one mask (ignored where mask is 0).
      mask: [B, T] 0/1.
      discount: static discount in [0, 1].
      strict: bool, or one bool per array in x: return strict_t instead of incl_t.
      sequential: use a plain reverse ``lax.scan`` in the order of the reference loops: equal
        inputs then give bitwise-equal sums wherever they sit in the row (the step-level
        estimators rely on it, so that tied returns stay exactly tied).

    Returns:
      The sums, x's shape, 0 where mask is 0.
    """
    stacked = x.ndim == 3
    xs = x if stacked else x[None]
    flags = tuple(strict) if isinstance(strict, (tuple, list)) else (strict,) * xs.shape[0]
    valid = mask > 0
    xs = jnp.where(valid[None], xs, 0.0)
    size = 0 if sequential else _chunk_length(discount)
    if size == 0:
        outs = []
        for x_i, flag in zip(xs, flags):
            incl, nxt = _sequential_suffix_sums(x_i, valid, discount)
            outs.append(jnp.where(valid, nxt if flag else incl, 0.0))
        out = jnp.stack(outs)
        return out if stacked else out[0]
    n, batch, length = xs.shape
    chunks = -(-length // size)
    pad = (0, chunks * size - length)
    x3 = jnp.pad(xs, ((0, 0), (0, 0), pad)).reshape(n, batch * chunks, size)
    # A float 0/1 mask feeds the matmul as it is (a converted copy would be one more [B, T]
    # array written and read: on CPU these kernels are bound by such passes, not by flops).
    m = mask.astype(x.dtype) if jnp.issubdtype(mask.dtype, jnp.floating) else valid.astype(x.dtype)
    m3 = jnp.pad(m, ((0, 0), pad)).reshape(batch * chunks, size)
    k = np.arange(size)
    upper = (k[:, None] >= k[None, :]).astype(np.float32)  # [t', t]: t' at or after t
    strict_upper = (k[:, None] > k[None, :]).astype(np.float32)
    # Counts are small integers: exact at any matmul precision. The weighted sums need full
    # float32 (no TF32 / bf16 passes on accelerators; on CPU HIGHEST only costs time).
    counts = jnp.dot(m3, upper)  # K_t
    hi = None if jax.default_backend() == "cpu" else jax.lax.Precision.HIGHEST
    log_d = math.log(discount) if discount < 1.0 else 0.0
    # discount^K is recomputed from the counts where it is needed (cheap, fused) instead of
    # being kept as another [B, T] array; only the chunk-start factors are small arrays.
    factors = jnp.exp(counts[:, 0] * log_d).reshape(batch, chunks)

    def across(carry, inputs):  # carry [B]: incl at the first position of the next chunk.
        start, factor = inputs
        return start + factor * carry, carry

    outs = []
    for x_i, flag in zip(x3, flags):
        weighted = x_i * jnp.exp(-counts * log_d)  # x * discount^-K
        summed = jnp.dot(weighted, upper, precision=hi)
        starts = factors * summed[:, 0].reshape(batch, chunks)  # incl at each chunk start
        zeros = jnp.zeros((batch,), x.dtype)
        _, carry_in = jax.lax.scan(across, zeros, (starts.T, factors.T), reverse=True)
        carry_in = carry_in.T.reshape(-1, 1)  # [B * C, 1], broadcast over the chunk
        if flag:
            strict_sum = jnp.dot(weighted, strict_upper, precision=hi)
            out = jnp.exp((counts - 1.0) * log_d) * (strict_sum + carry_in)
        else:
            out = jnp.exp(counts * log_d) * (summed + carry_in)
        outs.append(jnp.where(valid, out.reshape(batch, -1)[:, :length], 0.0))
    return jnp.stack(outs) if stacked else outs[0]


def reverse_discounted_sum(
    x: jax.Array, mask: jax.Array, discount: float, *, sequential: bool = False
) -> jax.Array:
    """y_t = x_t + discount * y_{t'} at masked-in t, t' the next masked-in position (0 elsewhere).

    The ``incl`` sum of :func:`masked_suffix_sums`: returns over steps, token returns over
    agent tokens (environment tokens skipped), GAE over steps.
    """
    return masked_suffix_sums(x, mask, discount, sequential=sequential)


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
