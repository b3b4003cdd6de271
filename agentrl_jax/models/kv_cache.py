"""The preallocated key/value cache that a multi-turn episode keeps between turns, and the
per-layer working copy a turn computes on."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.sharding import constrain


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


# Logical axes of a DecodeCache's per-layer arrays (see agentrl_jax.sharding).
_KEYS_AXES = ("batch", "act_kv_heads", "head_dim", "cache_slots")
_VALUES_AXES = ("batch", "act_kv_heads", "cache_slots", "head_dim")


@flax.struct.dataclass
class DecodeCache:
    """A working copy of a KVCache's first ``size`` slots, laid out for the attention matmuls.

    A ``KVCache`` stacks every layer in one [L, B, S, K, H] array: one buffer to donate, shard
    and checkpoint. Attention cannot read it in place: each layer's slice, and the key transpose
    that the scores' matmul needs, are copies of the whole cache on every forward pass, which made
    a decode step's cost grow ten times faster than its arithmetic. A turn therefore copies the
    slots it can touch (the filled part plus the turn's own tokens, rounded up to a power of two)
    into one array per layer, keys already transposed, runs prefill and every decode step on that
    copy (each step writes one slot per row per layer in place and reads only the copied slots),
    and writes it back once at the end (``store``).

    Attributes:
      k: L arrays [B, K, H, S'] of keys, slot-minor: scores are ``q @ k`` with no transpose.
      v: L arrays [B, K, S', H] of values.
      lengths: [B] int32 valid slots per sequence.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    lengths: jax.Array

    @classmethod
    def load(cls, cache: KVCache, size: int, rows: jax.Array | None = None) -> DecodeCache:
        """Copies slots ``[0, size)`` of ``cache`` (of the batch rows ``rows``, default all)."""
        if not 0 < size <= cache.size:
            raise ValueError(f"DecodeCache.load: size={size}, expected in [1, {cache.size}]")
        k, v, lengths = cache.k[:, :, :size], cache.v[:, :, :size], cache.lengths
        if rows is not None:
            k, v, lengths = k[:, rows], v[:, rows], lengths[rows]
        return cls(
            k=tuple(constrain(k[i].transpose(0, 2, 3, 1), _KEYS_AXES) for i in range(k.shape[0])),
            v=tuple(constrain(v[i].transpose(0, 2, 1, 3), _VALUES_AXES) for i in range(k.shape[0])),
            lengths=lengths,
        )

    def store(self, cache: KVCache) -> KVCache:
        """``cache`` with slots ``[0, size)`` replaced by this copy (in place when donated)."""
        k = jnp.stack([k.transpose(0, 3, 1, 2) for k in self.k]).astype(cache.k.dtype)
        v = jnp.stack([v.transpose(0, 2, 1, 3) for v in self.v]).astype(cache.v.dtype)
        return KVCache(
            k=jax.lax.dynamic_update_slice(cache.k, k, (0, 0, 0, 0, 0)),
            v=jax.lax.dynamic_update_slice(cache.v, v, (0, 0, 0, 0, 0)),
            lengths=self.lengths,
        )

    def gather(self, rows: jax.Array) -> DecodeCache:
        """The copy of batch rows ``rows`` (e.g. one prefilled prefix given to a whole group)."""
        return DecodeCache(
            k=tuple(k[rows] for k in self.k),
            v=tuple(v[rows] for v in self.v),
            lengths=self.lengths[rows],
        )

    @property
    def size(self) -> int:
        return self.v[0].shape[2]

    @property
    def batch(self) -> int:
        return self.v[0].shape[0]
