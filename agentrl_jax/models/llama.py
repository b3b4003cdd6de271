"""Llama 3.x: the family's config.json <-> ``ModelConfig`` (registry entry ``llama``).

No biases, SiLU, and RoPE rescaled as Llama 3.1 and later ship it (``rope_type`` "llama3":
low frequencies divided by ``factor``, high ones kept, a smooth blend between); "linear" and
default RoPE load too. Tied embeddings as the config says (Llama 3.2 1B and 3B tie them).
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.family import (
    Family,
    common_fields,
    common_to_hf,
    refuse,
    rope_from_hf,
    rope_to_hf,
)


def config_from_hf(hf: dict[str, Any], source) -> dict[str, Any]:
    """ModelConfig fields from a Llama config.json."""
    refuse(hf, source, "hidden_act", ("silu",), "expected 'silu'")
    # Llama's attention_bias also puts a bias on o_proj, which the decoder has not got.
    refuse(hf, source, "attention_bias", (False,), "no Llama 3 checkpoint has attention biases")
    refuse(hf, source, "mlp_bias", (False,), "no Llama 3 checkpoint has MLP biases")
    theta, scaling = rope_from_hf(
        hf.get("rope_parameters"),
        hf.get("rope_scaling"),
        hf.get("rope_theta", 10_000.0),
        source,
        kinds=("default", "linear", "llama3"),
    )
    return dict(
        common_fields(hf, source, default_max_positions=2048),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=False,
    )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    rope = rope_to_hf(cfg.rope_theta, cfg.rope_scaling)
    legacy = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {
        **common_to_hf(cfg),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
        # What Llama 3.1 checkpoints carry, for readers of the older layout.
        "rope_scaling": legacy if cfg.rope_scaling is not None else None,
    }


FAMILY = Family(
    model_type="llama",
    architectures=("LlamaForCausalLM",),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    tool_format="llama3_json",
)
