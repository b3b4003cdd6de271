"""Model configuration and presets of the decoder families (``models/registry.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

# What a decoder layer saves for the backward pass (``ModelConfig.remat``); see decoder.py.
REMAT_POLICIES = ("none", "full", "save_dots")
# The projections a LoRA adapter can target (``LoraConfig.targets``), in the decoder's order; in
# Hugging Face and PEFT names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# The MLP gate's activations (``ModelConfig.hidden_act``): SiLU (Qwen, Llama) and GELU with the
# tanh approximation (Gemma's ``gelu_pytorch_tanh``).
HIDDEN_ACTS = ("silu", "gelu_tanh")
# A layer's attention (``ModelConfig.layer_types``), in Hugging Face's names.
LAYER_TYPES = ("full_attention", "sliding_attention")
# How a sparse layer computes its routed experts (``ModelConfig.moe_impl``; see ``models/moe.py``):
# every expert on every token, combined by the routing weights, or a grouped matmul over the
# tokens sorted by expert (``jax.lax.ragged_dot``).
MOE_IMPLS = ("dense", "grouped")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Rotary frequencies rescaled for long contexts, as Hugging Face's ``rope_type`` says.

    ``kind``: ``"linear"`` divides every frequency by ``factor`` (Gemma 3's global layers);
    ``"llama3"`` divides the low frequencies (wavelength above ``original_max_position_embeddings
    / low_freq_factor``) by ``factor``, keeps the high ones (below ``.. / high_freq_factor``) and
    interpolates between (Llama 3.1 and later).
    """

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.kind not in ("linear", "llama3"):
            raise ValueError(f"RopeScaling.kind={self.kind!r}; expected 'linear' or 'llama3'")
        if not self.factor > 0:
            raise ValueError(f"RopeScaling.factor must be positive, got {self.factor!r}")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(
                f"RopeScaling: llama3 needs high_freq_factor > low_freq_factor > 0, got "
                f"{self.high_freq_factor} and {self.low_freq_factor}"
            )


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on the decoder's projections (PEFT's LoRA; see ``models/lora.py``).

    Each targeted weight W [in, out] gets a pair A [in, rank], B [rank, out] (``nnx.LoRAParam``,
    stored in ``param_dtype``, f32 by default whatever the base's dtype) and the layer computes
    ``x @ W + dropout(x) @ A @ B * (alpha / rank)``. A starts kaiming-uniform and B at zero, as in
    PEFT, so a fresh adapter changes nothing.

    Attributes:
      rank: the adapters' inner width; 0 turns LoRA off (``ModelConfig`` then holds None).
      alpha: the scale's numerator (PEFT's ``lora_alpha``).
      dropout: probability of dropping an adapter's input (PEFT's ``lora_dropout``); applied
        only when the forward pass is given a key (``lora_dropout_key``), so sampling and
        scoring are deterministic.
      targets: the projections to adapt, some of ``LORA_TARGETS``; a list, a tuple, a
        comma-separated string or ``"all"``. Kept in ``LORA_TARGETS`` order.
      param_dtype: the adapters' storage dtype.
    """

    rank: int = 0
    alpha: float = 8.0
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_TARGETS
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"LoraConfig.rank must be an int >= 0 (0: off), got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float):
            raise ValueError(f"LoraConfig.alpha must be a positive number, got {self.alpha!r}")
        if not (0 < self.alpha < float("inf")):
            raise ValueError(f"LoraConfig.alpha must be a positive number, got {self.alpha!r}")
        object.__setattr__(self, "alpha", float(self.alpha))
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float):
            raise ValueError(f"LoraConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not (0 <= self.dropout < 1):
            raise ValueError(f"LoraConfig.dropout must be in [0, 1), got {self.dropout!r}")
        object.__setattr__(self, "dropout", float(self.dropout))
        targets = self.targets
        if isinstance(targets, str):
            targets = LORA_TARGETS if targets.strip() == "all" else targets.split(",")
        if not isinstance(targets, list | tuple):
            raise ValueError(
                f"LoraConfig.targets must be some of {list(LORA_TARGETS)} (a list, a "
                f"comma-separated string or 'all'), got {self.targets!r}"
            )
        names = [t.strip() if isinstance(t, str) else t for t in targets]
        unknown = [t for t in names if t not in LORA_TARGETS]
        if unknown:
            raise ValueError(
                f"LoraConfig.targets: {unknown} not among the projections {list(LORA_TARGETS)}"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"LoraConfig.targets names a projection twice: {names}")
        if self.rank > 0 and not names:
            raise ValueError("LoraConfig.targets is empty but rank > 0: name some projections")
        object.__setattr__(self, "targets", tuple(t for t in LORA_TARGETS if t in names))
        if not jnp.issubdtype(jnp.dtype(self.param_dtype), jnp.floating):
            raise ValueError(
                f"LoraConfig.param_dtype must be a floating dtype, got {self.param_dtype!r}"
            )

    @property
    def scale(self) -> float:
        """``alpha / rank``: what the adapters' product is multiplied by."""
        return self.alpha / self.rank

    def replace(self, **kwargs) -> LoraConfig:
        return dataclasses.replace(self, **kwargs)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape, numerics and architecture of a decoder of one of the families.

    Attributes mirror Hugging Face's configs (each family's ``config_from_hf``, e.g.
    ``models/qwen2.py``);
    ``dtype`` is the compute dtype (bf16 on accelerators, f32 on CPU; see ``backend_dtypes``),
    ``param_dtype`` the storage dtype.

    ``scan_layers``: the decoder layers are one module whose parameters carry a leading layer axis
    ([L, ...], logical axis ``layers``), run by ``jax.lax.scan``, so tracing and compiling a pass
    costs one layer whatever the depth; False keeps a list of L layers (a Python loop).
    ``remat``: what each layer keeps for the backward pass (``REMAT_POLICIES``): ``"none"`` all
    of its activations, ``"full"`` only its input (everything is recomputed), ``"save_dots"``
    the outputs of its weight matmuls (attention and elementwise work are recomputed). ``True``
    and ``False`` mean ``"full"`` and ``"none"``.
    ``lora``: low-rank adapters on the projections (``LoraConfig``), or None (off; a
    ``LoraConfig`` of rank 0 becomes None). The base weights stay in ``param_dtype``.

    The family's architecture (the defaults are Qwen2's; ``models/decoder.py`` reads them):
    ``family``: the Hugging Face ``model_type`` whose registry entry maps checkpoints
    (``models/registry.py``). ``attention_bias``: q/k/v biases. ``qk_norm``: an RMSNorm over
    each head's queries and keys before RoPE (Qwen3, Gemma 3). ``norm_plus_one``: Gemma's RMSNorm,
    ``x * (1 + w)`` computed in f32 (weights start at 0), rather than ``w * x`` rounded first.
    ``sandwich_norms``: norms on the attention's and the MLP's outputs too, before the residual
    adds (Gemma 3). ``embed_scale``: embeddings times sqrt(hidden_size) (Gemma).
    ``hidden_act``: the MLP gate's activation (``HIDDEN_ACTS``). ``query_pre_attn_scalar``:
    scores are divided by its square root (None: ``head_dim``'s). ``final_logit_softcap``:
    ``cap * tanh(x / cap)`` on the logits (None: off). ``rope_scaling``: a ``RopeScaling`` of
    the full-attention layers' frequencies.
    ``layer_types``: one of ``LAYER_TYPES`` per layer (empty: all full); a sliding layer's
    queries attend to the ``sliding_window`` latest positions (their own included), with
    ``rope_local_theta`` as RoPE base (None: ``rope_theta``) and no scaling.

    Routed experts (Qwen3-MoE; ``num_experts`` 0: none): a sparse layer's MLP is
    ``num_experts`` gated MLPs of width ``moe_intermediate_size`` and a router; each token goes
    to its ``num_experts_per_tok`` most probable experts (softmax over all experts, then top-k;
    with ``norm_topk_prob`` the k weights are renormalised to sum to 1). Layer i is sparse unless
    it is in ``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step``; a dense layer's MLP has
    ``intermediate_size``. ``router_aux_loss``: add the load-balancing loss (Switch
    Transformer's, as transformers' ``load_balancing_loss_func``) times
    ``router_aux_loss_coef`` to the training loss (transformers' ``output_router_logits``);
    off by default. ``moe_impl``: how the experts are computed (``MOE_IMPLS``, ``moe.MoE``):
    ``"dense"`` (the default) runs every expert on every token; ``"grouped"`` runs each token
    through its k experts only, as a grouped matmul (``jax.lax.ragged_dot``), which saves FLOPs
    only where the backend lowers it to a grouped kernel: TPU's forward and input gradient
    (its weight gradient is dense over every expert, more FLOPs than the dense way's training
    step); CPU and XLA's default GPU lowering expand it into a dense dot over every expert, k
    times the dense way's FLOPs.
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
    lora: LoraConfig | None = None
    family: str = "qwen2"
    attention_bias: bool = True
    qk_norm: bool = False
    norm_plus_one: bool = False
    sandwich_norms: bool = False
    embed_scale: bool = False
    hidden_act: str = "silu"
    query_pre_attn_scalar: float | None = None
    final_logit_softcap: float | None = None
    rope_scaling: RopeScaling | None = None
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    rope_local_theta: float | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss: bool = False
    router_aux_loss_coef: float = 0.001
    moe_impl: str = "dense"

    def __post_init__(self):
        if self.lora is not None and not isinstance(self.lora, LoraConfig):
            raise ValueError(
                f"ModelConfig.lora must be a LoraConfig or None, got {type(self.lora).__name__}"
            )
        if self.lora is not None and self.lora.rank == 0:
            object.__setattr__(self, "lora", None)
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
        if self.hidden_act not in HIDDEN_ACTS:
            raise ValueError(
                f"ModelConfig.hidden_act={self.hidden_act!r}; expected one of {list(HIDDEN_ACTS)}"
            )
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(
                "ModelConfig.rope_scaling must be a RopeScaling or None, got "
                f"{type(self.rope_scaling).__name__}"
            )
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_types:
            unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if unknown or len(self.layer_types) != self.num_layers:
                raise ValueError(
                    f"ModelConfig.layer_types must name one of {list(LAYER_TYPES)} for each of "
                    f"the {self.num_layers} layers, got {list(self.layer_types)}"
                )
        if any(self.sliding_layers) and not (
            isinstance(self.sliding_window, int) and self.sliding_window > 0
        ):
            raise ValueError(
                "ModelConfig.sliding_window must be a positive int when a layer is "
                f"sliding_attention, got {self.sliding_window!r}"
            )
        self._check_experts()
        for name in ("query_pre_attn_scalar", "final_logit_softcap"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"ModelConfig.{name} must be positive or None, got {value!r}")

    def _check_experts(self):
        """The routed-expert fields (``num_experts`` > 0) are consistent."""
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        if self.moe_impl not in MOE_IMPLS:
            raise ValueError(
                f"ModelConfig.moe_impl={self.moe_impl!r}; expected one of {list(MOE_IMPLS)}"
            )
        coef = self.router_aux_loss_coef
        if isinstance(coef, bool) or not isinstance(coef, int | float) or coef < 0:
            raise ValueError(
                f"ModelConfig.router_aux_loss_coef must be a number >= 0, got {coef!r}"
            )
        bad = [
            i
            for i in self.mlp_only_layers
            if not isinstance(i, int) or not 0 <= i < self.num_layers
        ]
        if bad:
            raise ValueError(
                f"ModelConfig.mlp_only_layers: {bad} are not layer indices in "
                f"[0, {self.num_layers})"
            )
        if not self.num_experts:
            if self.router_aux_loss:
                raise ValueError(
                    "ModelConfig.router_aux_loss=True needs routed experts, but num_experts=0"
                )
            return
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"ModelConfig.{name} must be a positive int with num_experts > 0, got {value!r}"
                )
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"ModelConfig.num_experts_per_tok={self.num_experts_per_tok} exceeds "
                f"num_experts={self.num_experts}"
            )
        if not (isinstance(self.decoder_sparse_step, int) and self.decoder_sparse_step > 0):
            raise ValueError(
                f"ModelConfig.decoder_sparse_step must be a positive int, got "
                f"{self.decoder_sparse_step!r}"
            )
        if self.router_aux_loss and not any(self.sparse_layers):
            raise ValueError(
                "ModelConfig.router_aux_loss=True needs routed experts, but the model has no "
                f"sparse layer (num_experts={self.num_experts}, mlp_only_layers="
                f"{list(self.mlp_only_layers)}, decoder_sparse_step={self.decoder_sparse_step})"
            )
        if self.scan_layers and len(set(self.sparse_layers)) > 1:
            raise ValueError(
                "ModelConfig.scan_layers=True needs every layer alike, but mlp_only_layers="
                f"{list(self.mlp_only_layers)} / decoder_sparse_step={self.decoder_sparse_step} "
                "mix sparse and dense layers: use scan_layers=False"
            )
        mlp = [t for t in ("gate", "up", "down") if self.lora and t in self.lora.targets]
        if mlp:
            raise ValueError(
                f"LoraConfig.targets: {mlp} are not supported on a mixture-of-experts model "
                "(num_experts > 0): its LoRA adapts the attention projections q, k, v, o only"
            )

    @property
    def sparse_layers(self) -> tuple[bool, ...]:
        """Per layer: whether its MLP is the routed experts (all False without experts), as
        transformers' ``Qwen3MoeDecoderLayer`` decides."""
        return tuple(
            self.num_experts > 0
            and i not in self.mlp_only_layers
            and (i + 1) % self.decoder_sparse_step == 0
            for i in range(self.num_layers)
        )

    def replace(self, **kwargs) -> ModelConfig:
        return dataclasses.replace(self, **kwargs)

    def with_layers(self, num_layers: int) -> ModelConfig:
        """The same family and widths with the first ``num_layers`` layers (their
        ``layer_types`` with them): the benches' ``--quick`` model of any preset."""
        return self.replace(num_layers=num_layers, layer_types=self.layer_types[:num_layers])

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer: whether it attends within the sliding window (all False without any)."""
        return tuple(t == "sliding_attention" for t in self.layer_types) or (
            (False,) * self.num_layers
        )

    @property
    def num_params(self) -> int:
        d, f, h, kv, hd = (
            self.hidden_size,
            self.intermediate_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
        )
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        attn += (h + 2 * kv) * hd if self.attention_bias else 0
        attn += 2 * hd if self.qk_norm else 0
        norms = (4 if self.sandwich_norms else 2) * d
        moe = self.num_experts * (3 * d * self.moe_intermediate_size + d)  # experts + router
        mlps = sum(moe if sparse else 3 * d * f for sparse in self.sparse_layers)
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + norms) + mlps + emb + d

    @property
    def num_lora_params(self) -> int:
        """The adapters' parameter count (0 without LoRA); ``num_params`` counts the base only."""
        if self.lora is None:
            return 0
        d, f = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        fan = {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d)}
        fan.update(gate=(d, f), up=(d, f), down=(f, d))
        per_layer = sum(sum(fan[t]) for t in self.lora.targets) * self.lora.rank
        return self.num_layers * per_layer


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
# The other families' presets: their checkpoints' config.json as each family's
# ``config_from_hf`` reads it (tests/test_models.py counts their parameters against
# transformers' own classes).
_QWEN3 = dict(
    family="qwen3",
    attention_bias=False,
    qk_norm=True,
    vocab_size=151936,
    num_kv_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    scan_layers=True,
)
_LLAMA3 = dict(
    family="llama",
    attention_bias=False,
    vocab_size=128256,
    num_kv_heads=8,
    rope_theta=500_000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    scan_layers=True,
)
PRESETS.update(
    {
        "qwen3-0.6b": ModelConfig(
            **_QWEN3,
            hidden_size=1024,
            intermediate_size=3072,
            num_layers=28,
            num_heads=16,
            tie_word_embeddings=True,
        ),
        "qwen3-1.7b": ModelConfig(
            **_QWEN3,
            hidden_size=2048,
            intermediate_size=6144,
            num_layers=28,
            num_heads=16,
            tie_word_embeddings=True,
        ),
        "qwen3-8b": ModelConfig(
            **_QWEN3,
            hidden_size=4096,
            intermediate_size=12288,
            num_layers=36,
            num_heads=32,
            tie_word_embeddings=False,
        ),
        "llama3.2-1b": ModelConfig(
            **_LLAMA3,
            hidden_size=2048,
            intermediate_size=8192,
            num_layers=16,
            num_heads=32,
            head_dim=64,
            tie_word_embeddings=True,
            rope_scaling=RopeScaling("llama3", 32.0),
        ),
        "llama3.1-8b": ModelConfig(
            **_LLAMA3,
            hidden_size=4096,
            intermediate_size=14336,
            num_layers=32,
            num_heads=32,
            head_dim=128,
            tie_word_embeddings=False,
            rope_scaling=RopeScaling("llama3", 8.0),
        ),
        # Sliding layers (window 512) with a global one every sixth.
        "gemma3-1b": ModelConfig(
            family="gemma3_text",
            vocab_size=262144,
            hidden_size=1152,
            intermediate_size=6912,
            num_layers=26,
            num_heads=4,
            num_kv_heads=1,
            head_dim=256,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            attention_bias=False,
            qk_norm=True,
            norm_plus_one=True,
            sandwich_norms=True,
            embed_scale=True,
            hidden_act="gelu_tanh",
            query_pre_attn_scalar=256,
            layer_types=tuple(
                "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)
            ),
            sliding_window=512,
            rope_local_theta=10_000.0,
            scan_layers=True,
        ),
        # Qwen3-30B-A3B: 48 layers, each a router and 128 experts of width 768, 8 a token.
        "qwen3-30b-a3b": ModelConfig(
            **{**_QWEN3, "family": "qwen3_moe", "num_kv_heads": 4},
            hidden_size=2048,
            intermediate_size=6144,
            num_layers=48,
            num_heads=32,
            tie_word_embeddings=False,
            num_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=768,
            norm_topk_prob=True,
        ),
    }
)


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
