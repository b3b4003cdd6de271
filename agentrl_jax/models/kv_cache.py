"""The key/value cache that a multi-turn episode keeps between turns."""

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

    The arrays are laid out for the attention matmuls and kept so between turns: one array per
    layer, values [B, K, S', H] and keys in the layout the platform reads and writes in place
    (``keys_slot_minor``): on CPU slot-minor, [B, K, H, S'] (scores are ``q @ k`` with no
    transpose: XLA's CPU dot was 27-40% slower per episode with [B, K, S', H] keys); elsewhere
    [B, K, S', H] like the values (the TPU compiler stores a slot-minor array tiled along the
    slots, so writing one slot per row made it copy every layer's keys each step: 3.5 GiB of a
    Qwen2.5-1.5B turn's temporaries on a v5e slice). A decode step writes one slot per row per
    layer in place and reads its layer's arrays as they are: no slice, transpose or working copy
    of the cache is made in a turn. (A stacked [L, B, S, K, H] buffer cannot be read so: each
    layer's slice, and the key transpose, were copies of the whole cache on every step or every
    turn.)

    ``size`` is the slots reserved per row (what a conversation may grow to); ``slots`` (S') is
    the slots allocated so far. The sampler allocates slots as a conversation grows, a power of
    two at a time (``with_slots``), so attention reads about the filled part of the cache, not
    every slot that a long episode reserved.

    Attributes:
      keys: L arrays [B, K, H, S'] (slot-minor) or [B, K, S', H] (K kv heads, H head dim).
      values: L arrays [B, K, S', H].
      lengths: [B] int32, valid slots per sequence.
      capacity: slots reserved per row (static), >= S'.
      keys_slot_minor: the keys' layout (static).
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    lengths: jax.Array
    capacity: int = flax.struct.field(pytree_node=False)
    keys_slot_minor: bool = flax.struct.field(pytree_node=False, default=True)

    @classmethod
    def create(
        cls,
        config: ModelConfig,
        batch: int,
        size: int,
        dtype=None,
        *,
        slots: int | None = None,
        platform: str | None = None,
    ) -> KVCache:
        """An empty cache reserving ``size`` slots per row, ``slots`` (default all) allocated,
        its keys laid out for ``platform`` (default: JAX's default backend)."""
        slots = size if slots is None else slots
        if not 0 < slots <= size:
            raise ValueError(f"KVCache.create: slots={slots}, expected in [1, size={size}]")
        dtype = dtype or config.dtype
        k, h = config.num_kv_heads, config.head_dim
        slot_minor = (platform or jax.default_backend()) == "cpu"
        key_shape = (batch, k, h, slots) if slot_minor else (batch, k, slots, h)
        layers = range(config.num_layers)
        return cls(
            keys=tuple(jnp.zeros(key_shape, dtype) for _ in layers),
            values=tuple(jnp.zeros((batch, k, slots, h), dtype) for _ in layers),
            lengths=jnp.zeros((batch,), jnp.int32),
            capacity=size,
            keys_slot_minor=slot_minor,
        )

    @property
    def size(self) -> int:
        """Slots reserved per row: the longest conversation the cache holds."""
        return self.capacity

    @property
    def slots(self) -> int:
        """Slots allocated so far (every row's ``lengths`` is at most this)."""
        return self.values[0].shape[2]

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    @property
    def k(self) -> jax.Array:
        """Every layer's keys as one [L, B, size, K, H] array (a copy, for inspection)."""
        order = (0, 3, 1, 2) if self.keys_slot_minor else (0, 2, 1, 3)
        return jnp.stack([self._reserved(k.transpose(order)) for k in self.keys])

    @property
    def v(self) -> jax.Array:
        """Every layer's values as one [L, B, size, K, H] array (a copy, for inspection)."""
        return jnp.stack([self._reserved(v.transpose(0, 2, 1, 3)) for v in self.values])

    def _reserved(self, x_bskh: jax.Array) -> jax.Array:
        pad = self.capacity - x_bskh.shape[1]
        return jnp.pad(x_bskh, ((0, 0), (0, pad), (0, 0), (0, 0)))

    def with_slots(self, slots: int) -> KVCache:
        """This cache with ``slots`` allocated (the new ones empty), a copy (meant for jit)."""
        if not self.slots <= slots <= self.capacity:
            raise ValueError(
                f"with_slots: slots={slots}, expected in [{self.slots}, capacity={self.capacity}]"
            )
        more = slots - self.slots
        value_pad = ((0, 0), (0, 0), (0, more), (0, 0))
        key_pad = ((0, 0), (0, 0), (0, 0), (0, more)) if self.keys_slot_minor else value_pad
        return self.replace(
            keys=tuple(jnp.pad(k, key_pad) for k in self.keys),
            values=tuple(jnp.pad(v, value_pad) for v in self.values),
        )

    def gather(self, rows: jax.Array) -> KVCache:
        """The cache of batch rows ``rows`` (e.g. one prefilled prefix given to a whole group)."""
        return self.replace(
            keys=tuple(k[rows] for k in self.keys),
            values=tuple(v[rows] for v in self.values),
            lengths=self.lengths[rows],
        )
