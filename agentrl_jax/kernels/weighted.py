"""A loss or metric kept as numerator and denominator, so means stay exact across microbatches.

Summing ``numerator`` and ``denominator`` over microbatches (or devices) and dividing once gives
the same mean as one big batch; averaging per-microbatch means does not when masks differ.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from agentrl_jax.kernels.config import AGGREGATIONS


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weighted:
    """numerator / denominator, both scalars (float32)."""

    numerator: jax.Array
    denominator: jax.Array

    @property
    def value(self) -> jax.Array:
        """The mean; 0 when the denominator is 0 (nothing to average)."""
        return self.numerator / jnp.maximum(self.denominator, 1e-12)

    def __add__(self, other: Weighted) -> Weighted:
        """Accumulates microbatches: sums numerators and denominators."""
        return Weighted(self.numerator + other.numerator, self.denominator + other.denominator)


def aggregate(loss_bt: jax.Array, mask_bt: jax.Array, mode: str) -> Weighted:
    """Reduces a per-token loss with a mask, as numerator and denominator.

    Modes (B rows, T tokens, n_b = sum_t mask[b, t], rows with n_b = 0 are left out):

    - ``token_mean``: sum_{b,t} mask * loss / sum_{b,t} mask (every token weighs the same).
    - ``seq_mean_token_sum``: sum_b (sum_t mask * loss) / #rows (longer answers weigh more).
    - ``seq_mean_token_mean``: sum_b (sum_t mask * loss / n_b) / #rows (every row weighs
      the same).
    - ``episode_mean``: sum_b w_b m_b / sum_b w_b, with m_b row b's (mask-weighted) token mean
      and w_b its weight, the largest value of its mask: every episode weighs the same when
      each of its rows carries 1 / its number of rows (the trainer's step-wise rows; a
      whole-episode row carries 1). With a 0/1 mask it is ``seq_mean_token_mean``.

    Args:
      loss_bt: [B, T] per-token loss.
      mask_bt: [B, T] 0/1 (or weights; ``episode_mean`` reads a row's weight from it).
      mode: one of the four above.

    Returns:
      The weighted scalar.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation is {mode!r}; expected one of {AGGREGATIONS}")
    mask = mask_bt.astype(loss_bt.dtype)
    per_row = jnp.sum(jnp.where(mask > 0, loss_bt * mask, 0.0), axis=1)  # where: no 0 * inf.
    if mode == "token_mean":
        return Weighted(jnp.sum(per_row), jnp.sum(mask))
    count = jnp.sum(mask, axis=1)
    rows = jnp.sum((count > 0).astype(loss_bt.dtype))
    if mode == "episode_mean":
        weight = jnp.max(mask, axis=1)  # 0 for empty rows
        return Weighted(jnp.sum(weight * per_row / jnp.maximum(count, 1e-12)), jnp.sum(weight))
    if mode == "seq_mean_token_mean":
        per_row = per_row / jnp.maximum(count, 1e-12)
    return Weighted(jnp.sum(per_row), rows)
