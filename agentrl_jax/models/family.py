"""What a model family supplies (``Family``), and the pieces the families share.

A family maps one Hugging Face ``model_type`` onto the decoder (``models/decoder.py``): its
config.json <-> ``ModelConfig``, its tensor names both ways (``TensorMap``s), the policy,
critic and layer-unrolling constructors, and its LoRA slots with their PEFT module names. The
registry (``models/registry.py``) holds one ``Family`` per ``model_type``; code outside
``models/`` asks it and never names a family.

Every family here stores its decoder as Llama does (``model.layers.{i}.self_attn.q_proj``, ...),
so ``decoder_tensor_maps`` maps them all, reading the config's options (biases, q/k norms,
sandwich norms, an untied head); ``need_int``, ``common_fields`` and ``rope_from_hf`` read the
config.json fields they share.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from agentrl_jax.models import decoder
from agentrl_jax.models.config import ModelConfig, RopeScaling


class CheckpointError(ValueError):
    """A checkpoint directory, its config.json or one of its tensors is not usable."""


# Our LoRA target -> (the Hugging Face module holding it, its name), as Llama-style decoders
# name them (PEFT's ``target_modules``).
LLAMA_LORA_MODULES = {
    "q": ("self_attn", "q_proj"),
    "k": ("self_attn", "k_proj"),
    "v": ("self_attn", "v_proj"),
    "o": ("self_attn", "o_proj"),
    "gate": ("mlp", "gate_proj"),
    "up": ("mlp", "up_proj"),
    "down": ("mlp", "down_proj"),
}


# ---------------------------------------------------------------------------------------------
# config.json fields


def need_int(hf: dict[str, Any], field: str, source, default: int | None = None) -> int:
    """``hf[field]`` (or ``default``) as a positive int; CheckpointError naming it otherwise."""
    value = hf.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(
            f"{source}: field {field!r} must be a positive integer, got {value!r}"
        )
    return value


def refuse(hf: dict[str, Any], source, field: str, allowed: tuple, why: str) -> None:
    """CheckpointError when ``hf[field]`` is present and not one of ``allowed``."""
    if field in hf and hf[field] not in allowed:
        raise CheckpointError(f"{source}: {field}={hf[field]!r} is not supported ({why})")


def common_fields(hf: dict[str, Any], source, *, default_max_positions: int = 32768):
    """The ModelConfig fields every Llama-style config.json states the same way."""
    hidden, heads = need_int(hf, "hidden_size", source), need_int(hf, "num_attention_heads", source)
    kv_heads = need_int(hf, "num_key_value_heads", source, heads)
    if hf.get("head_dim") is None and hidden % heads:
        raise CheckpointError(
            f"{source}: hidden_size={hidden} is not divisible by num_attention_heads={heads} "
            "and no head_dim is given"
        )
    head_dim = need_int(hf, "head_dim", source, hidden // heads)
    if heads % kv_heads:
        raise CheckpointError(
            f"{source}: num_attention_heads={heads} is not a multiple of "
            f"num_key_value_heads={kv_heads}"
        )
    return dict(
        vocab_size=need_int(hf, "vocab_size", source),
        hidden_size=hidden,
        intermediate_size=need_int(hf, "intermediate_size", source),
        num_layers=need_int(hf, "num_hidden_layers", source),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=need_int(
            hf, "max_position_embeddings", source, default_max_positions
        ),
    )


def common_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json fields of ``common_fields`` (and what every family writes alike)."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
    }


def _rope_kind(block: Mapping[str, Any]) -> str:
    return block.get("rope_type", block.get("type", "default"))


def rope_from_hf(
    params: Mapping[str, Any] | None,
    legacy_scaling: Mapping[str, Any] | None,
    theta: float,
    source,
    *,
    kinds: tuple[str, ...] = ("default",),
    field: str = "rope_parameters",
) -> tuple[float, RopeScaling | None]:
    """The RoPE base and scaling of one attention kind, from the transformers-5 layout
    (``params``: ``rope_parameters`` or one layer type's block of it) or the legacy one
    (``theta``, the ``rope_theta`` field, and ``legacy_scaling``, ``rope_scaling``).

    Args:
      kinds: the ``rope_type``s the family supports ("default", "linear", "llama3").

    Raises:
      CheckpointError: another rope_type, or a scaling field missing.
    """
    params, legacy_scaling = params or {}, legacy_scaling or {}
    for name, block in ((field, params), ("rope_scaling", legacy_scaling)):
        kind = _rope_kind(block)
        if kind not in kinds:
            raise CheckpointError(
                f"{source}: {name}.rope_type={kind!r} is not supported (supported: "
                f"{', '.join(kinds)})"
            )
    block = params if _rope_kind(params) != "default" else legacy_scaling
    theta = float(params.get("rope_theta", theta))
    kind = _rope_kind(block)
    if kind == "default":
        return theta, None
    try:
        extra = {}
        if kind == "llama3":
            extra = dict(
                low_freq_factor=float(block["low_freq_factor"]),
                high_freq_factor=float(block["high_freq_factor"]),
                original_max_position_embeddings=int(block["original_max_position_embeddings"]),
            )
        return theta, RopeScaling(kind, float(block["factor"]), **extra)
    except KeyError as e:
        raise CheckpointError(f"{source}: rope_type={kind!r} needs the field {e.args[0]!r}") from e
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def rope_to_hf(theta: float, scaling: RopeScaling | None) -> dict[str, Any]:
    """One attention kind's ``rope_parameters`` block (transformers 5's layout)."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    out = {"rope_type": scaling.kind, "rope_theta": theta, "factor": scaling.factor}
    if scaling.kind == "llama3":
        out.update(
            low_freq_factor=scaling.low_freq_factor,
            high_freq_factor=scaling.high_freq_factor,
            original_max_position_embeddings=scaling.original_max_position_embeddings,
        )
    return out


# ---------------------------------------------------------------------------------------------
# Tensor names and layouts


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """How one of our parameters is stored in a Hugging Face checkpoint.

    The HF tensor is viewed with each of its dims split into ``groups`` (e.g. q_proj.weight
    [N*H, D] -> view [N, H, D] with groups ((N, H), (D,))); our parameter is
    ``view.transpose(perm)``.
    """

    hf_name: str
    groups: tuple[tuple[int, ...], ...]
    perm: tuple[int, ...]

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(g) for g in self.groups)

    @property
    def view_shape(self) -> tuple[int, ...]:
        return tuple(n for g in self.groups for n in g)

    @property
    def our_shape(self) -> tuple[int, ...]:
        view = self.view_shape
        return tuple(view[p] for p in self.perm)

    def to_hf(self, ours: np.ndarray) -> np.ndarray:
        """Our full array -> the HF tensor."""
        return np.ascontiguousarray(ours.transpose(np.argsort(self.perm))).reshape(self.hf_shape)

    def _plan(self, index: tuple[slice, ...]):
        """The HF index a part of our parameter reads, the read's view and the in-memory slice.

        A leading view dim of each group maps to a contiguous HF range; inner dims of a group
        are sliced after the read.
        """
        ours_shape = self.our_shape
        index = tuple(index) + (slice(None),) * (len(ours_shape) - len(index))
        view_ranges: list[tuple[int, int]] = [(0, 0)] * len(ours_shape)
        for i, p in enumerate(self.perm):
            start, stop, step = index[i].indices(ours_shape[i])
            assert step == 1, "shards are contiguous"
            view_ranges[p] = (start, stop)
        hf_index, inner, local_view = [], [], []
        v = 0
        for group in self.groups:
            rest = math.prod(group[1:])
            start, stop = view_ranges[v]
            hf_index.append(slice(start * rest, stop * rest))
            local_view.extend((stop - start, *group[1:]))
            inner.append(slice(None))
            inner.extend(slice(*view_ranges[v + k]) for k in range(1, len(group)))
            v += len(group)
        return tuple(hf_index), tuple(local_view), tuple(inner)

    def hf_index(self, index: tuple[slice, ...]) -> tuple[slice, ...]:
        """The part of the HF tensor that ``read(..., index)`` reads from the file."""
        return self._plan(index)[0]

    def read(self, hf_slice: Any, index: tuple[slice, ...]) -> np.ndarray:
        """Reads the part of our parameter at ``index`` from a safetensors slice handle.

        Only the HF rows (and columns) the part needs are read (``hf_index``).
        """
        hf_index, local_view, inner = self._plan(index)
        data = np.asarray(hf_slice[hf_index])
        return data.reshape(local_view)[inner].transpose(self.perm)


def decoder_tensor_maps(cfg: ModelConfig, *, prefix: tuple = ()) -> dict[tuple, TensorMap]:
    """Our parameter paths (as in ``nnx.to_flat_state``) -> their tensors in a Llama-style
    Hugging Face checkpoint (Qwen2, Qwen3, Llama, Gemma 3 text), for the parameters ``cfg``'s
    options give the decoder.

    Layer parameters are keyed as an unrolled model's, ``(..., "layers", i, ...)``; a scanned
    model's stacked parameter ``(..., "layers", ...)`` is their L tensors stacked.

    Args:
      cfg: the model config.
      prefix: the trunk's path prefix is ``prefix + ("trunk",)``; the LM head is at ``prefix``.
    """
    tm = TensorMap
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    t = (*prefix, "trunk")
    maps = {
        (*t, "embed_vd"): tm("model.embed_tokens.weight", ((v,), (d,)), (0, 1)),
        (*t, "final_norm", "weight"): tm("model.norm.weight", ((d,),), (0,)),
    }
    # Our norms -> Hugging Face's: the MLP's input norm is post_attention_layernorm in Qwen and
    # Llama, pre_feedforward_layernorm beside Gemma's output norms.
    norms = {"input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm"}
    if cfg.sandwich_norms:
        norms = {
            "input_norm": "input_layernorm",
            "attn_out_norm": "post_attention_layernorm",
            "post_attn_norm": "pre_feedforward_layernorm",
            "mlp_out_norm": "post_feedforward_layernorm",
        }
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}.", (*t, "layers", i)
        attn, att = f"{hf}self_attn.", (*ours, "attn")
        for name, hf_name in norms.items():
            maps[(*ours, name, "weight")] = tm(f"{hf}{hf_name}.weight", ((d,),), (0,))
        # nn.Linear stores [out, in]; ours is [in, heads, head_dim].
        maps[(*att, "q_weight_dnh")] = tm(f"{attn}q_proj.weight", ((n, h), (d,)), (2, 0, 1))
        maps[(*att, "k_weight_dkh")] = tm(f"{attn}k_proj.weight", ((k, h), (d,)), (2, 0, 1))
        maps[(*att, "v_weight_dkh")] = tm(f"{attn}v_proj.weight", ((k, h), (d,)), (2, 0, 1))
        if cfg.attention_bias:
            maps[(*att, "q_bias_nh")] = tm(f"{attn}q_proj.bias", ((n, h),), (0, 1))
            maps[(*att, "k_bias_kh")] = tm(f"{attn}k_proj.bias", ((k, h),), (0, 1))
            maps[(*att, "v_bias_kh")] = tm(f"{attn}v_proj.bias", ((k, h),), (0, 1))
        if cfg.qk_norm:
            maps[(*att, "q_norm", "weight")] = tm(f"{attn}q_norm.weight", ((h,),), (0,))
            maps[(*att, "k_norm", "weight")] = tm(f"{attn}k_norm.weight", ((h,),), (0,))
        maps[(*att, "o_weight_nhd")] = tm(f"{attn}o_proj.weight", ((d,), (n, h)), (1, 2, 0))
        mlp = (*ours, "mlp")
        maps[(*mlp, "gate_weight_df")] = tm(f"{hf}mlp.gate_proj.weight", ((f,), (d,)), (1, 0))
        maps[(*mlp, "up_weight_df")] = tm(f"{hf}mlp.up_proj.weight", ((f,), (d,)), (1, 0))
        maps[(*mlp, "down_weight_fd")] = tm(f"{hf}mlp.down_proj.weight", ((d,), (f,)), (1, 0))
    if not cfg.tie_word_embeddings:
        maps[(*prefix, "lm_head_dv")] = tm("lm_head.weight", ((v,), (d,)), (1, 0))
    return maps


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: everything the system needs to load, build, adapt and save it.

    Attributes:
      model_type: the Hugging Face ``model_type`` (config.json) it reads; also
        ``ModelConfig.family``.
      architectures: the ``architectures`` its checkpoints may name (the first is written).
      config_from_hf: ``(config.json dict, source) -> ModelConfig fields`` (a dict; raises
        ``CheckpointError`` naming the field for what it cannot load).
      config_to_hf: ``ModelConfig -> config.json fields`` (the architecture, model_type, dtype
        and stop token are added by ``hf_checkpoint.config_to_hf``).
      tensor_maps: ``(cfg, prefix=()) -> {our state path: TensorMap}`` for every parameter
        stored in a causal-LM checkpoint.
      policy, critic: the nnx classes built as ``cls(cfg, rngs=...)`` (``critic`` also
        ``from_policy``).
      unroll_layers: a scanned model -> the unrolled one with the same weights.
      lora_slots: ``cfg -> {target: decoder.LoraSlot}`` of one layer.
      lora_modules: target -> (HF module, projection) for PEFT's tensor names.
      tool_format: how its instruction-tuned checkpoints write a tool call (a format of
        ``rollout/tool_calls.py``; "" where the family has none).
    """

    model_type: str
    architectures: tuple[str, ...]
    config_from_hf: Callable[[dict[str, Any], str], dict[str, Any]]
    config_to_hf: Callable[[ModelConfig], dict[str, Any]]
    tensor_maps: Callable[..., dict[tuple, TensorMap]] = decoder_tensor_maps
    policy: type = decoder.CausalLM
    critic: type = decoder.ValueModel
    unroll_layers: Callable[[Any], Any] = decoder.unroll_layers
    lora_slots: Callable[[ModelConfig], dict[str, decoder.LoraSlot]] = decoder.lora_slots
    lora_modules: Mapping[str, tuple[str, str]] = dataclasses.field(
        default_factory=lambda: dict(LLAMA_LORA_MODULES)
    )
    tool_format: str = ""
