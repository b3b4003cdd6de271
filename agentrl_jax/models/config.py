"""Model configuration and presets for Qwen2-family decoders."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

# What a decoder layer saves for the backward pass (``ModelConfig.remat``); see qwen2.py.
REMAT_POLICIES = ("none", "full", "save_dots")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Qwen2-family decoder.

    Attributes mirror Hugging Face's ``Qwen2Config`` (see ``hf_checkpoint.config_from_hf``);
    ``dtype`` is the compute dtype (bf16 on accelerators, f32 on CPU; see ``backend_dtypes``),
    ``param_dtype`` the storage dtype.

    ``scan_layers``: the decoder layers are one module whose parameters carry a leading layer axis
    ([L, ...], logical axis ``layers``), run by ``jax.lax.scan``, so tracing and compiling a pass
    costs one layer whatever the depth; False keeps a list of L layers (a Python loop).
    ``remat``: what each layer keeps for the backward pass (``REMAT_POLICIES``): ``"none"`` all
    of its activations, ``"full"`` only its input (everything is recomputed), ``"save_dots"``
    the outputs of its weight matmuls (attention and elementwise work are recomputed). ``True``
    and ``False`` mean ``"full"`` and ``"none"``.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: str | bool = "none"
    scan_layers: bool = False

    def __post_init__(self):
        if isinstance(self.remat, bool):
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"ModelConfig.remat={self.remat!r}; expected one of {list(REMAT_POLICIES)} "
                "(or a bool: True is 'full')"
            )
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"ModelConfig.scan_layers must be a bool, got {self.scan_layers!r}")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (rotary embeddings)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads="
                f"{self.num_kv_heads} (grouped-query attention)"
            )

    def replace(self, **kwargs) -> ModelConfig:
        return dataclasses.replace(self, **kwargs)

    @property
    def num_params(self) -> int:
        d, f, h, kv, hd = (
            self.hidden_size,
            self.intermediate_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
        )
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d + (h + 2 * kv) * hd
        layer = attn + 3 * d * f + 2 * d
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + d


PRESETS: dict[str, ModelConfig] = {
    # A few million parameters: the CPU default, sized for the built-in tokenizer's vocabulary.
    # Unrolled: 4 layers compile quickly anyway. The Qwen presets scan their layers.
    "tiny": ModelConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=688,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        rope_theta=10_000.0,
        max_position_embeddings=4096,
    ),
    "qwen2.5-0.5b": ModelConfig(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
        scan_layers=True,
    ),
    "qwen2.5-1.5b": ModelConfig(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        tie_word_embeddings=True,
        scan_layers=True,
    ),
    "qwen2.5-7b": ModelConfig(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        tie_word_embeddings=False,
        scan_layers=True,
    ),
}


def backend_dtypes(backend: str | None = None) -> dict[str, Any]:
    """Default ``dtype`` / ``param_dtype`` overrides for a JAX backend (default: the current one).

    bf16 compute with f32 parameters on accelerators (GPU, TPU); f32 throughout on CPU, where
    bf16 matmuls are slow and parity tests need f32. Use as ``preset(name, **backend_dtypes())``.
    """
    backend = backend or jax.default_backend()
    if backend == "cpu":
        return {"dtype": jnp.float32, "param_dtype": jnp.float32}
    return {"dtype": jnp.bfloat16, "param_dtype": jnp.float32}


def preset(name: str, **overrides) -> ModelConfig:
    """Returns the named preset, with ``overrides`` applied (e.g. ``dtype=jnp.bfloat16``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
