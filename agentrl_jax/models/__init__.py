"""Models: configuration, the decoder every family shares (``registry.py`` maps each family's
checkpoints onto it), and the KV cache.

Checkpoints (``agentrl_jax.models.hf_checkpoint``) and tokenizers
(``agentrl_jax.models.tokenizer``) are imported from their modules, so that importing the model
does not pull in safetensors or transformers.
"""

from agentrl_jax.models.config import PRESETS, ModelConfig, backend_dtypes, preset
from agentrl_jax.models.decoder import CausalLM, Trunk, ValueModel
from agentrl_jax.models.kv_cache import KVCache

__all__ = [
    "PRESETS",
    "KVCache",
    "ModelConfig",
    "CausalLM",
    "Trunk",
    "ValueModel",
    "backend_dtypes",
    "preset",
]
