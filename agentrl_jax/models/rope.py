"""Rotary position embeddings in the rotate-half layout (Hugging Face's), with the checkpoint's
base (``rope_theta``) and its ``RopeScaling`` (linear or llama3), as every family's decoder
rotates its queries and keys (``models/decoder.py``)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def _scaled_inv_freq(head_dim: int, theta: float, scaling) -> np.ndarray:
    """The inverse frequencies [H / 2] under a ``RopeScaling``, in f32 as transformers'
    ``ROPE_INIT_FUNCTIONS`` compute them (a constant of the config)."""
    inv_freq = (1.0 / (theta ** (np.arange(0, head_dim, 2) / head_dim))).astype(np.float32)
    factor = np.float32(scaling.factor)
    if scaling.kind == "linear":
        return inv_freq / factor
    # llama3: long wavelengths divided by the factor, short ones kept, a smooth blend between.
    old = scaling.original_max_position_embeddings
    low_wavelen = old / scaling.low_freq_factor
    high_wavelen = old / scaling.high_freq_factor
    wavelen = (2 * math.pi / inv_freq).astype(np.float32)
    llama = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq).astype(np.float32)
    smooth = (old / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, llama).astype(np.float32)


def rope_tables(positions_bt: jax.Array, head_dim: int, theta: float, scaling=None):
    """cos and sin tables [B, T, H] for the rotate-half rotary layout (``scaling``: a
    ``RopeScaling`` or None)."""
    if scaling is None:
        inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    else:
        inv_freq = jnp.asarray(_scaled_inv_freq(head_dim, theta, scaling))
    freqs_bth = positions_bt.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs_bth, freqs_bth], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_btnh: jax.Array, cos_bth: jax.Array, sin_bth: jax.Array) -> jax.Array:
    """Rotates queries or keys [B, T, N, H] by their positions' angles (computed in f32)."""
    dtype = x_btnh.dtype
    x = x_btnh.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out = x * cos_bth[:, :, None, :] + rotated * sin_bth[:, :, None, :]
    return out.astype(dtype)
