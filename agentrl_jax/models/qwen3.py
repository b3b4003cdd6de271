"""Qwen3 (dense): the family's config.json <-> ``ModelConfig`` (registry entry ``qwen3``).

Qwen2's decoder with an RMSNorm over each head's queries and keys before RoPE, no q/k/v biases
(unless ``attention_bias``), and a head dim of its own (``head_dim`` need not be
hidden / heads). Sliding-window layers (``use_sliding_window``) are refused: Qwen3 checkpoints
ship them off.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.family import (
    CheckpointError,
    Family,
    common_fields,
    common_to_hf,
    refuse,
    rope_from_hf,
    rope_to_hf,
)


def config_from_hf(hf: dict[str, Any], source) -> dict[str, Any]:
    """ModelConfig fields from a Qwen3 config.json."""
    refuse(hf, source, "hidden_act", ("silu",), "expected 'silu'")
    if hf.get("use_sliding_window", False):
        raise CheckpointError(
            f"{source}: use_sliding_window=true is not supported (full attention only)"
        )
    if any(t != "full_attention" for t in hf.get("layer_types") or ()):
        raise CheckpointError(f"{source}: layer_types other than full_attention are not supported")
    theta, _ = rope_from_hf(
        hf.get("rope_parameters"), hf.get("rope_scaling"), hf.get("rope_theta", 10_000.0), source
    )
    return dict(
        common_fields(hf, source),
        rope_theta=theta,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        qk_norm=True,
    )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **common_to_hf(cfg),
        "hidden_act": "silu",
        "attention_bias": cfg.attention_bias,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope_to_hf(cfg.rope_theta, None),
        "use_sliding_window": False,
        "max_window_layers": cfg.num_layers,
        "layer_types": ["full_attention"] * cfg.num_layers,
    }


FAMILY = Family(
    model_type="qwen3",
    architectures=("Qwen3ForCausalLM",),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    tool_format="qwen",
)
