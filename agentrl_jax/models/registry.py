"""The model families, keyed by Hugging Face ``model_type``: one line each.

Code outside ``models/`` asks here for what a checkpoint or a config needs (its ``Family``:
config mapping, tensor names, policy / critic / unrolling constructors, LoRA slots) and never
names a family. Adding a family is one model file with its ``FAMILY``, one line below and its
tests.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.models import gemma3, llama, qwen2, qwen3, qwen3_moe
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.family import CheckpointError, Family

FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        qwen2.FAMILY,
        qwen3.FAMILY,
        llama.FAMILY,
        gemma3.FAMILY,
        qwen3_moe.FAMILY,
    )
}
MODEL_TYPES = tuple(FAMILIES)


def family(of: ModelConfig | str) -> Family:
    """The family of a config (``ModelConfig.family``) or of a ``model_type``."""
    name = of.family if isinstance(of, ModelConfig) else of
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; registered: {list(MODEL_TYPES)}")
    return FAMILIES[name]


def for_hf(hf: dict[str, Any], source: Any = "config.json") -> Family:
    """The family that loads a Hugging Face config.json (its ``model_type`` and
    ``architectures``); CheckpointError naming the file and field otherwise."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{source}: model_type={model_type!r} is not supported; "
            f"expected one of {list(MODEL_TYPES)}"
        )
    fam = FAMILIES[model_type]
    archs = hf.get("architectures") or list(fam.architectures)
    unsupported = [a for a in archs if a not in fam.architectures]
    if unsupported:
        raise CheckpointError(
            f"{source}: architectures={archs!r} is not supported for model_type="
            f"{model_type!r}; expected {list(fam.architectures)}"
        )
    return fam
