"""Gemma 3, text only: the family's config.json <-> ``ModelConfig`` (registry entry
``gemma3_text``, transformers' ``Gemma3ForCausalLM``: the 1B checkpoint, or a larger one's
language model saved alone).

Local sliding-window layers interleaved with global ones (``layer_types``; older configs give
``sliding_window_pattern``), each kind with its own RoPE base (global: ``rope_theta`` and an
optional linear scaling; local: ``rope_local_base_freq``); q/k norms; embeddings scaled by
sqrt(hidden); norms before and after attention and MLP, all Gemma's (1 + w); a GELU (tanh)
MLP; scores divided by sqrt(``query_pre_attn_scalar``); soft-capped logits when the config caps
them (``final_logit_softcapping``). ``attn_logit_softcapping`` is refused: transformers' Gemma 3
does not apply it (Gemma 3 replaced Gemma 2's score capping by the q/k norms), so a checkpoint
that sets it has no reference to match. The multimodal ``gemma3`` checkpoints (vision tower) are
not this family.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.family import (
    CheckpointError,
    Family,
    common_fields,
    common_to_hf,
    need_int,
    refuse,
    rope_from_hf,
    rope_to_hf,
)

_LAYER_KINDS = ("full_attention", "sliding_attention")


def _int_if_whole(x: float | int) -> float | int:
    return int(x) if float(x).is_integer() else x


def _positive_or_none(hf: dict[str, Any], field: str, source) -> float | None:
    value = hf.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise CheckpointError(f"{source}: field {field!r} must be a positive number or null")
    return float(value)


def config_from_hf(hf: dict[str, Any], source) -> dict[str, Any]:
    """ModelConfig fields from a Gemma 3 text config.json."""
    act = hf.get("hidden_activation", hf.get("hidden_act", "gelu_pytorch_tanh"))
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise CheckpointError(
            f"{source}: hidden_activation={act!r} is not supported; expected 'gelu_pytorch_tanh'"
        )
    refuse(hf, source, "attention_bias", (False,), "no Gemma 3 checkpoint has attention biases")
    refuse(hf, source, "use_bidirectional_attention", (False, None), "a causal decoder only")
    refuse(
        hf,
        source,
        "attn_logit_softcapping",
        (None,),
        "transformers' Gemma 3 ignores it, so what such a checkpoint computes is not defined",
    )
    layers = need_int(hf, "num_hidden_layers", source)
    layer_types = hf.get("layer_types")
    if layer_types is None:
        pattern = need_int(hf, "sliding_window_pattern", source, 6)
        layer_types = [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
    if len(layer_types) != layers or any(t not in _LAYER_KINDS for t in layer_types):
        raise CheckpointError(
            f"{source}: layer_types={layer_types!r} must name full_attention or "
            f"sliding_attention for each of the {layers} layers"
        )
    params = hf.get("rope_parameters") or {}
    nested = any(kind in params for kind in _LAYER_KINDS)
    full, local = (params.get(k) for k in _LAYER_KINDS) if nested else (params, None)
    theta, scaling = rope_from_hf(
        full,
        hf.get("rope_scaling"),
        hf.get("rope_theta", 1_000_000.0),
        source,
        kinds=("default", "linear"),
        field="rope_parameters.full_attention",
    )
    local_theta, _ = rope_from_hf(
        local,
        None,
        hf.get("rope_local_base_freq", 10_000.0),
        source,
        field="rope_parameters.sliding_attention",
    )
    scalar = hf.get("query_pre_attn_scalar", 256)
    if isinstance(scalar, bool) or not isinstance(scalar, int | float) or scalar <= 0:
        raise CheckpointError(f"{source}: query_pre_attn_scalar={scalar!r} must be positive")
    return dict(
        # Gemma3TextConfig's head_dim defaults to 256, not hidden / heads.
        common_fields(
            {**hf, "head_dim": hf.get("head_dim") or 256}, source, default_max_positions=131_072
        ),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=local_theta,
        layer_types=tuple(layer_types),
        sliding_window=need_int(hf, "sliding_window", source, 4096),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        attention_bias=False,
        qk_norm=True,
        norm_plus_one=True,
        sandwich_norms=True,
        embed_scale=True,
        hidden_act="gelu_tanh",
        query_pre_attn_scalar=_int_if_whole(scalar),
        final_logit_softcap=_positive_or_none(hf, "final_logit_softcapping", source),
    )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    local_theta = cfg.rope_local_theta or cfg.rope_theta
    layer_types = cfg.layer_types or ("full_attention",) * cfg.num_layers
    return {
        **common_to_hf(cfg),
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "use_bidirectional_attention": False,
        "query_pre_attn_scalar": _int_if_whole(cfg.query_pre_attn_scalar or cfg.head_dim),
        "sliding_window": cfg.sliding_window or cfg.max_position_embeddings,
        "layer_types": list(layer_types),
        "rope_parameters": {
            "full_attention": rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
            "sliding_attention": rope_to_hf(local_theta, None),
        },
        "attn_logit_softcapping": None,
        "final_logit_softcapping": cfg.final_logit_softcap,
    }


FAMILY = Family(
    model_type="gemma3_text",
    architectures=("Gemma3ForCausalLM",),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
)
