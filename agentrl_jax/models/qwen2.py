"""Qwen2 / Qwen2.5: the family's config.json <-> ``ModelConfig`` (registry entry ``qwen2``).

The decoder's defaults are Qwen2's: q/k/v biases, no q/k norms, SiLU, default RoPE.
Sliding-window attention (``use_sliding_window``) is refused: Qwen2.5 checkpoints ship it off.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.family import (
    CheckpointError,
    Family,
    common_fields,
    common_to_hf,
    rope_from_hf,
    rope_to_hf,
)


def config_from_hf(hf: dict[str, Any], source) -> dict[str, Any]:
    """ModelConfig fields from a Qwen2 config.json."""
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(
            f"{source}: hidden_act={hf['hidden_act']!r} is not supported; expected 'silu'"
        )
    if hf.get("use_sliding_window", False):
        raise CheckpointError(
            f"{source}: use_sliding_window=true is not supported (full attention only)"
        )
    theta, _ = rope_from_hf(
        hf.get("rope_parameters"), hf.get("rope_scaling"), hf.get("rope_theta", 10_000.0), source
    )
    return dict(
        common_fields(hf, source),
        rope_theta=theta,
        # Qwen2Config's own default is untied; checkpoints state it explicitly.
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **common_to_hf(cfg),
        "hidden_act": "silu",
        # Both layouts: transformers >= 5 reads rope_parameters, older readers rope_theta.
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope_to_hf(cfg.rope_theta, None),
        "use_sliding_window": False,
        "max_window_layers": cfg.num_layers,
    }


FAMILY = Family(
    model_type="qwen2",
    architectures=("Qwen2ForCausalLM",),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    tool_format="qwen",
)
