"""Qwen3-MoE: the family's config.json <-> ``ModelConfig``, tensor names and LoRA slots
(registry entry ``qwen3_moe``, transformers' ``Qwen3MoeForCausalLM``; Qwen3-30B-A3B,
Qwen3-235B-A22B).

Qwen3's attention (q/k norms, no biases, a head dim of its own) with routed experts in place of
the MLP (``moe.MoE``): a router and ``num_experts`` gated MLPs of width
``moe_intermediate_size``, ``num_experts_per_tok`` of them a token (softmax over the experts,
top k, renormalised with ``norm_topk_prob``); no shared expert. Layers in ``mlp_only_layers``,
or off every ``decoder_sparse_step``-th, keep a dense MLP of ``intermediate_size``.
``output_router_logits`` / ``router_aux_loss_coef`` become ``router_aux_loss`` /
``router_aux_loss_coef``.

Checkpoints store each expert's projections apart (``mlp.experts.{j}.gate_proj.weight``
[F, D], ...; transformers 5 reads them into its fused [E, ...] tensors and writes them back
so); ours are stacked [E, D, F], so each expert is one ``TensorMap`` keyed ``(*path, j)``.
LoRA adapts the attention projections only (q, k, v, o): the experts' and the dense layers'
MLPs get none (``ModelConfig`` refuses gate / up / down targets).
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.models import decoder
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.family import (
    LLAMA_LORA_MODULES,
    CheckpointError,
    Family,
    TensorMap,
    decoder_tensor_maps,
    need_int,
)
from agentrl_jax.models.qwen3 import config_from_hf as qwen3_config_from_hf
from agentrl_jax.models.qwen3 import config_to_hf as qwen3_config_to_hf

ATTENTION_TARGETS = ("q", "k", "v", "o")


def config_from_hf(hf: dict[str, Any], source) -> dict[str, Any]:
    """ModelConfig fields from a Qwen3-MoE config.json (``num_experts``, or transformers 5's
    ``num_local_experts``)."""
    if "num_experts" not in hf and "num_local_experts" in hf:
        hf = {**hf, "num_experts": hf["num_local_experts"]}
    experts = need_int(hf, "num_experts", source)
    top_k = need_int(hf, "num_experts_per_tok", source)
    if top_k > experts:
        raise CheckpointError(
            f"{source}: num_experts_per_tok={top_k} exceeds num_experts={experts}"
        )
    only = hf.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in only
    ):
        raise CheckpointError(f"{source}: mlp_only_layers={only!r} must be a list of layer indices")
    coef = hf.get("router_aux_loss_coef", 0.001)
    if isinstance(coef, bool) or not isinstance(coef, int | float) or coef < 0:
        raise CheckpointError(f"{source}: router_aux_loss_coef={coef!r} must be a number >= 0")
    return dict(
        qwen3_config_from_hf(hf, source),
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=need_int(hf, "moe_intermediate_size", source),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        decoder_sparse_step=need_int(hf, "decoder_sparse_step", source, 1),
        mlp_only_layers=tuple(only),
        router_aux_loss=bool(hf.get("output_router_logits", False)),
        router_aux_loss_coef=float(coef),
    )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **qwen3_config_to_hf(cfg),
        "num_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "norm_topk_prob": cfg.norm_topk_prob,
        "decoder_sparse_step": cfg.decoder_sparse_step,
        "mlp_only_layers": list(cfg.mlp_only_layers),
        "output_router_logits": cfg.router_aux_loss,
        "router_aux_loss_coef": cfg.router_aux_loss_coef,
    }


def tensor_maps(cfg: ModelConfig, *, prefix: tuple = ()) -> dict[tuple, TensorMap]:
    """Qwen3's tensor maps with each sparse layer's MLP replaced by its router
    (``mlp.gate.weight`` [E, D]) and its experts, one map per expert and projection keyed
    ``(*our stacked path, j)`` (``mlp.experts.{j}.gate_proj.weight`` [F, D] -> our [E, D, F]'s
    slice j, ...)."""
    maps = decoder_tensor_maps(cfg, prefix=prefix)
    d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    for i, sparse in enumerate(cfg.sparse_layers):
        if not sparse:
            continue
        hf, mlp = f"model.layers.{i}.mlp.", (*prefix, "trunk", "layers", i, "mlp")
        for name in ("gate_weight_df", "up_weight_df", "down_weight_fd"):
            del maps[(*mlp, name)]
        maps[(*mlp, "router_weight_de")] = TensorMap(f"{hf}gate.weight", ((e,), (d,)), (1, 0))
        for j in range(e):
            expert = f"{hf}experts.{j}."
            for ours, proj in (("gate_weight_edf", "gate_proj"), ("up_weight_edf", "up_proj")):
                maps[(*mlp, ours, j)] = TensorMap(f"{expert}{proj}.weight", ((f,), (d,)), (1, 0))
            maps[(*mlp, "down_weight_efd", j)] = TensorMap(
                f"{expert}down_proj.weight", ((d,), (f,)), (1, 0)
            )
    return maps


def lora_slots(cfg: ModelConfig) -> dict[str, decoder.LoraSlot]:
    """The attention projections' slots: the experts have no adapters."""
    slots = decoder.lora_slots(cfg)
    return {t: slots[t] for t in ATTENTION_TARGETS}


FAMILY = Family(
    model_type="qwen3_moe",
    architectures=("Qwen3MoeForCausalLM",),
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    tensor_maps=tensor_maps,
    lora_slots=lora_slots,
    lora_modules={t: LLAMA_LORA_MODULES[t] for t in ATTENTION_TARGETS},
    tool_format="qwen",
)
