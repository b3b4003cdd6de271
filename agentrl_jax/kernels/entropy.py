"""Entropy of the policy's token distribution, and the entropy bonus term."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentrl_jax.kernels.weighted import Weighted, aggregate


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """H(softmax(logits)) per position, in nats.

    Args:
      logits: [B, T, V].

    Returns:
      [B, T] entropies in float32: log Z - E_p[z] on logits shifted by their max, which keeps
      both terms small (less cancellation than with raw logits).
    """
    z = logits.astype(jnp.float32)
    z = z - jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    e = jnp.exp(z)
    total = jnp.sum(e, axis=-1)
    return jnp.log(total) - jnp.sum(e * z, axis=-1) / total


def entropy_bonus(entropy: jax.Array, loss_mask: jax.Array, aggregation: str) -> Weighted:
    """Mean entropy over agent tokens as numerator / denominator.

    The trainer subtracts ``entropy_coef * bonus.value`` from the loss (maximising entropy).

    Args:
      entropy: [B, T] from :func:`entropy_from_logits`.
      loss_mask: [B, T].
      aggregation: as in :func:`weighted.aggregate`.
    """
    return aggregate(entropy, loss_mask, aggregation)
