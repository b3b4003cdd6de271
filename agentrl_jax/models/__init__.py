"""Qwen2-family models: configuration, the nnx modules and the KV cache."""

from agentrl_jax.models.config import PRESETS, ModelConfig, preset
from agentrl_jax.models.kv_cache import KVCache
from agentrl_jax.models.qwen2 import Qwen2ForCausalLM, Qwen2Trunk, Qwen2ValueModel

__all__ = [
    "PRESETS",
    "KVCache",
    "ModelConfig",
    "Qwen2ForCausalLM",
    "Qwen2Trunk",
    "Qwen2ValueModel",
    "preset",
]
