"""The preallocated key/value cache that a multi-turn episode keeps between turns."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from agentrl_jax.models.config import ModelConfig


@flax.struct.dataclass
class KVCache:
    """Keys and values of every layer for a batch of independent sequences.

    Sequence ``b`` occupies slots ``[0, lengths[b])`` of its row; a forward pass over a chunk of
    new tokens writes them at ``lengths[b] + t`` and advances ``lengths[b]`` by the number of valid
    new tokens, so the next turn appends after the last one without re-encoding the history.

    Attributes:
      k: [L, B, S, K, H] keys (L layers, S cache slots, K kv heads, H head dim).
      v: [L, B, S, K, H] values.
      lengths: [B] int32, valid slots per sequence.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @classmethod
    def create(cls, config: ModelConfig, batch: int, size: int, dtype=None) -> KVCache:
        shape = (config.num_layers, batch, size, config.num_kv_heads, config.head_dim)
        dtype = dtype or config.dtype
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            lengths=jnp.zeros((batch,), jnp.int32),
        )

    @property
    def size(self) -> int:
        return self.k.shape[2]

    @property
    def batch(self) -> int:
        return self.k.shape[1]
