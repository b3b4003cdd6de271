"""The decoder of every model family in flax.nnx, compatible with Hugging Face checkpoints.

Grouped-query attention, rotary embeddings (``models/rope.py``: rotate-half layout, the theta and
scaling), RMSNorm, a gated MLP, tied or untied embeddings; the family's options in
``ModelConfig`` add what its architecture has: q/k/v biases (Qwen2), q/k norms (Qwen3, Gemma 3),
Gemma's (1 + w) norms around attention and MLP, scaled embeddings, GELU, capped logits and
sliding-window layers with their own RoPE base (Gemma 3). ``models/registry.py`` maps each
family's checkpoints onto it. Names use shape suffixes:
B batch, T new tokens, S key slots, D model width, N query heads, K kv heads, G = N // K, H head
dim, F MLP width, V vocabulary.

Two ways to call the trunk, both pure and usable inside jit (flax 0.12 modules are pytrees, so a
module can be an argument of a jitted function; ``nnx.split`` / ``nnx.merge`` work too):

- Teacher forcing: ``model(tokens_bt, mask_bt=...)`` attends within the chunk; positions follow the
  mask (left or right padding both work).
- With a cache: ``model(tokens_bt, cache=cache, num_new_b=...)`` appends a right-padded chunk of
  ``num_new_b[b]`` valid tokens after each sequence's cached history and attends over the cache.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.kv_cache import KVCache
from agentrl_jax.models.moe import MoE
from agentrl_jax.models.params import dense_init, ones, param, unstack_layers, zeros
from agentrl_jax.models.rope import apply_rope, rope_tables
from agentrl_jax.sharding import constrain, shard_model

_NEG_INF = -1e30
# Logical axes of activations (see agentrl_jax.sharding.LOGICAL_AXIS_RULES).
_RESIDUAL_AXES = ("batch", "seq", "act_embed")
_Q_AXES = ("batch", "seq", "act_heads", "head_dim")
_KV_AXES = ("batch", "seq", "act_kv_heads", "head_dim")


@dataclasses.dataclass(frozen=True)
class LoraSlot:
    """Where one target projection's LoRA pair lives and how it is applied (``lora_slots``).

    ``a`` [.., rank] and ``b`` [rank, ..] are attributes of the ``module`` ("attn" or "mlp")
    beside the base ``weight``, with the base's logical axes on the base's in and out axes and
    ``lora_rank`` (replicated) on the rank axis. ``a_spec`` / ``b_spec`` are the two matmuls of
    the forward pass, ``merge_spec`` the product A B in the base weight's layout.
    """

    module: str
    weight: str
    a: str
    b: str
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    a_axes: tuple[str, ...]
    b_axes: tuple[str, ...]
    a_spec: str
    b_spec: str
    merge_spec: str

    @property
    def fan_in(self) -> int:
        return math.prod(self.a_shape[:-1])


def lora_slots(cfg: ModelConfig) -> dict[str, LoraSlot]:
    """Every LoRA target (``LORA_TARGETS``) of one decoder layer -> its ``LoraSlot``, for
    ``cfg.lora.rank`` (rank 0 without LoRA)."""
    d, f, n, k, h = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
    )
    r = 0 if cfg.lora is None else cfg.lora.rank
    slots = {}
    for name, heads, axis in (("q", n, "q_heads"), ("k", k, "kv_heads"), ("v", k, "kv_heads")):
        x = "n" if name == "q" else "k"
        slots[name] = LoraSlot(
            "attn", f"{name}_weight_d{x}h", f"{name}_lora_a_dr", f"{name}_lora_b_r{x}h",
            (d, r), (r, heads, h), ("embed", "lora_rank"), ("lora_rank", axis, "head_dim"),
            "btd,dr->btr", f"btr,r{x}h->bt{x}h", f"dr,r{x}h->d{x}h",
        )  # fmt: skip
    slots["o"] = LoraSlot(
        "attn", "o_weight_nhd", "o_lora_a_nhr", "o_lora_b_rd",
        (n, h, r), (r, d), ("q_heads", "head_dim", "lora_rank"), ("lora_rank", "embed"),
        "btnh,nhr->btr", "btr,rd->btd", "nhr,rd->nhd",
    )  # fmt: skip
    for name in ("gate", "up"):
        slots[name] = LoraSlot(
            "mlp", f"{name}_weight_df", f"{name}_lora_a_dr", f"{name}_lora_b_rf",
            (d, r), (r, f), ("embed", "lora_rank"), ("lora_rank", "mlp"),
            "btd,dr->btr", "btr,rf->btf", "dr,rf->df",
        )  # fmt: skip
    slots["down"] = LoraSlot(
        "mlp", "down_weight_fd", "down_lora_a_fr", "down_lora_b_rd",
        (f, r), (r, d), ("mlp", "lora_rank"), ("lora_rank", "embed"),
        "btf,fr->btr", "btr,rd->btd", "fr,rd->fd",
    )  # fmt: skip
    return slots


def _add_lora(module: nnx.Module, cfg: ModelConfig, names: tuple[str, ...], rngs: nnx.Rngs):
    """Gives ``module`` the LoRA pairs of those of ``names`` that ``cfg.lora`` targets: A
    kaiming-uniform (PEFT's ``kaiming_uniform_(a=sqrt(5))``: U(+-1 / sqrt(fan_in))), B zero."""
    lora = cfg.lora
    if lora is None:
        return
    slots = lora_slots(cfg)
    for name in names:
        if name not in lora.targets:
            continue
        slot = slots[name]
        bound = 1.0 / math.sqrt(slot.fan_in)
        a = jax.random.uniform(rngs.params(), slot.a_shape, lora.param_dtype, -bound, bound)
        b = jnp.zeros(slot.b_shape, lora.param_dtype)
        setattr(module, slot.a, nnx.LoRAParam(a, logical_axes=slot.a_axes))
        setattr(module, slot.b, nnx.LoRAParam(b, logical_axes=slot.b_axes))


def _lora_delta(module: nnx.Module, cfg: ModelConfig, name: str, x, key, index: int):
    """The LoRA term ``dropout(x) @ A @ B * alpha / rank`` of projection ``name`` on ``x`` (in
    the compute dtype), or None when the projection has no adapter. Dropout only with a key
    (``fold_in(key, index)``: each projection draws its own mask, as PEFT's)."""
    lora = cfg.lora
    if lora is None or name not in lora.targets:
        return None
    slot = lora_slots(cfg)[name]
    dt = cfg.dtype
    if key is not None and lora.dropout > 0:
        keep = jax.random.bernoulli(jax.random.fold_in(key, index), 1.0 - lora.dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - lora.dropout), 0).astype(x.dtype)
    # x A summed in f32 and scaled there, rounded to ``dt`` once: the f32 scale the merged copy
    # (``lora.merge``) and PEFT apply, not alpha / rank rounded to bf16 (16/48 -> 0.333984375).
    h = jnp.einsum(
        slot.a_spec, x, getattr(module, slot.a)[...].astype(dt), preferred_element_type=jnp.float32
    )
    h = constrain((h * jnp.float32(lora.scale)).astype(dt), ("batch", "seq", "lora_rank"))
    return jnp.einsum(slot.b_spec, h, getattr(module, slot.b)[...].astype(dt))


def _plus(x, delta):
    return x if delta is None else x + delta


class RMSNorm(nnx.Module):
    """RMSNorm computed in float32: as Hugging Face's Qwen2RMSNorm (``w * x``, x rounded to the
    input's dtype first), or with ``plus_one`` as Gemma3RMSNorm (``x * (1 + w)`` in f32, rounded
    last; the weight starts at 0)."""

    def __init__(self, dim: int, eps: float, param_dtype, *, rngs: nnx.Rngs, plus_one=False):
        self.eps = eps
        self.plus_one = plus_one
        self.weight = param(rngs, zeros if plus_one else ones, (dim,), ("norm",), param_dtype)

    def __call__(self, x):
        dtype = x.dtype
        x = x.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        if self.plus_one:
            return (x * (1.0 + self.weight[...].astype(jnp.float32))).astype(dtype)
        # Cast back before scaling, in the same order as Hugging Face, so bf16 rounds alike.
        return self.weight[...].astype(dtype) * x.astype(dtype)


def _norm(cfg: ModelConfig, dim: int, rngs: nnx.Rngs) -> RMSNorm:
    return RMSNorm(dim, cfg.rms_norm_eps, cfg.param_dtype, rngs=rngs, plus_one=cfg.norm_plus_one)


def at_positions(x_bt: jax.Array, position_b: jax.Array) -> jax.Array:
    """``x_bt[b, position_b[b]]`` for every row, keeping a length-1 position axis: [B, 1, ...]."""
    return x_bt[jnp.arange(x_bt.shape[0]), position_b][:, None]


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, n, k, h, pd = (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.param_dtype,
        )
        self.cfg = cfg
        self.q_weight_dnh = param(rngs, dense_init, (d, n, h), ("embed", "q_heads", "head_dim"), pd)
        if cfg.attention_bias:
            self.q_bias_nh = param(rngs, zeros, (n, h), ("q_heads", "head_dim"), pd)
        self.k_weight_dkh = param(
            rngs, dense_init, (d, k, h), ("embed", "kv_heads", "head_dim"), pd
        )
        if cfg.attention_bias:
            self.k_bias_kh = param(rngs, zeros, (k, h), ("kv_heads", "head_dim"), pd)
        self.v_weight_dkh = param(
            rngs, dense_init, (d, k, h), ("embed", "kv_heads", "head_dim"), pd
        )
        if cfg.attention_bias:
            self.v_bias_kh = param(rngs, zeros, (k, h), ("kv_heads", "head_dim"), pd)
        self.o_weight_nhd = param(rngs, dense_init, (n, h, d), ("q_heads", "head_dim", "embed"), pd)
        if cfg.qk_norm:
            self.q_norm = _norm(cfg, h, rngs)
            self.k_norm = _norm(cfg, h, rngs)
        _add_lora(self, cfg, ("q", "k", "v", "o"), rngs)

    def __call__(
        self, x_btd, cos_bth, sin_bth, mask_bts, cache_kv=None, query_b=None, lora_key=None
    ):
        """Attention of the chunk's queries over the chunk's own keys or over a cache row.

        Args:
          cache_kv: None (teacher forcing: keys are the chunk's), or
            ``(keys, v_bksh, write_bt, slot_minor)``: this layer's keys ([B, K, H, S'] when
            ``slot_minor``, else [B, K, S', H]) and values in a ``KVCache``, into which the
            chunk's keys and values are written at slots ``write_bt`` (out-of-bounds slots are
            dropped) before attending over all S' allocated slots.
          query_b: None (every position queries), or [B] the one position per row that
            queries: every position's keys and values are still computed and written.
          lora_key: a key for the LoRA adapters' dropout (None: no dropout).

        Returns:
          ([B, T, D] output ([B, 1, D] with ``query_b``), the updated (k_bkhs, v_bksh) or None).
        """
        cfg, dt = self.cfg, self.cfg.dtype
        k = jnp.einsum("btd,dkh->btkh", x_btd, self.k_weight_dkh[...].astype(dt))
        k = _plus(k, _lora_delta(self, cfg, "k", x_btd, lora_key, 1))
        if cfg.attention_bias:
            k = k + self.k_bias_kh[...].astype(dt)
        v = jnp.einsum("btd,dkh->btkh", x_btd, self.v_weight_dkh[...].astype(dt))
        v = _plus(v, _lora_delta(self, cfg, "v", x_btd, lora_key, 2))
        if cfg.attention_bias:
            v = v + self.v_bias_kh[...].astype(dt)
        if cfg.qk_norm:
            k = self.k_norm(k)
        k = constrain(apply_rope(k, cos_bth, sin_bth), _KV_AXES)
        if query_b is not None:
            x_btd, cos_bth, sin_bth, mask_bts = (
                at_positions(a, query_b) for a in (x_btd, cos_bth, sin_bth, mask_bts)
            )
        q = jnp.einsum("btd,dnh->btnh", x_btd, self.q_weight_dnh[...].astype(dt))
        q = _plus(q, _lora_delta(self, cfg, "q", x_btd, lora_key, 0))
        if cfg.attention_bias:
            q = q + self.q_bias_nh[...].astype(dt)
        if cfg.qk_norm:
            q = self.q_norm(q)
        q = constrain(apply_rope(q, cos_bth, sin_bth), _Q_AXES)
        v = constrain(v, _KV_AXES)
        b, t, n, h = q.shape
        kv = cfg.num_kv_heads
        g = n // kv
        q_btkgh = q.reshape(b, t, kv, g, h)
        if cache_kv is None:
            # The chunk's own keys and values, laid out as a cache row's.
            k_bkhs, v_bksh = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
            # Causal when every position queries: long rows attend in causal bands.
            out_btkgh = _attention(
                q_btkgh, k_bkhs, v_bksh, mask_bts, cfg, slot_minor=True, causal=query_b is None
            )
            extra = None
        else:
            keys, v_bksh, write_bt, slot_minor = cache_kv
            rows_b1 = jnp.arange(b)[:, None]
            # One slot per row and token, written in place (the cache is donated to the turn and
            # threaded through its decode loop); the indexed axes come first in the update.
            if slot_minor:
                keys = keys.at[rows_b1, :, :, write_bt].set(k.astype(keys.dtype), mode="drop")
            else:
                keys = keys.at[rows_b1, :, write_bt].set(k.astype(keys.dtype), mode="drop")
            v_bksh = v_bksh.at[rows_b1, :, write_bt].set(v.astype(v_bksh.dtype), mode="drop")
            out_btkgh = _attention(q_btkgh, keys, v_bksh, mask_bts, cfg, slot_minor=slot_minor)
            extra = (keys, v_bksh)
        out_btnh = out_btkgh.reshape(b, t, n, h)
        out = jnp.einsum("btnh,nhd->btd", out_btnh, self.o_weight_nhd[...].astype(dt))
        out = _plus(out, _lora_delta(self, cfg, "o", out_btnh, lora_key, 3))
        return out, extra


# Queries attend in chunks of at most this many (query, key) pairs per row and head, so the
# scores stay about as large as one chunk's (a 512-token prompt over 8,192 cache slots would
# otherwise hold [B, K, G * 512, 8192] float32 scores at once).
_SCORES_PER_CHUNK = 1 << 20
# And at most this many over the whole batch and every head: a rollout batch's prefill (256 rows
# of a 512-token prompt over 8,192 slots) would otherwise hold 768 MiB of bf16 scores per chunk
# on each of 8 chips.
_SCORES_PER_BATCH_CHUNK = 1 << 28
# A teacher-forced row too long for one chunk of scores (past 1,024 tokens) runs its query
# chunks in up to this many causal bands (``_causal_band_count``): band i of the row's queries
# attends only to the keys up to its own end, not to the later ones its causal mask would zero.
# Bands of equal size attend (bands + 1) / (2 * bands) of the (query, key) pairs: 9/16 for 8.
_CAUSAL_BANDS = 8


def _query_chunk(b: int, t: int, slots: int, kv: int, g: int) -> int:
    """Queries per chunk when B rows of T queries (G per kv head, K kv heads) attend over S keys:
    T halved (down to 16, while it stays even) until a chunk's scores fit both budgets."""
    chunk = t

    def too_many(chunk):
        per_row = chunk * slots
        return per_row > _SCORES_PER_CHUNK or b * kv * g * per_row > _SCORES_PER_BATCH_CHUNK

    while too_many(chunk) and chunk % 2 == 0 and chunk > 16:
        chunk //= 2
    return chunk


def _causal_band_count(b: int, t: int, kv: int, g: int) -> int:
    """How many causal bands a teacher-forced pass of B rows of T tokens attends in (1: none).

    Only rows whose own scores are too many for one chunk (T * T > ``_SCORES_PER_CHUNK``), which
    run in query chunks anyway: shorter rows (the 768-token default runs) keep the one-pass
    computation, bit for bit. A band is a whole number of query chunks, so the count is the
    largest that divides the chunks up to ``_CAUSAL_BANDS``: 8 bands of 2 chunks for a
    3,072-token row (16 chunks of 192), 4 bands of 1 for 2,048 tokens (4 chunks of 512).
    """
    if t * t <= _SCORES_PER_CHUNK:
        return 1
    chunks = t // _query_chunk(b, t, t, kv, g)
    bands = max(1, min(_CAUSAL_BANDS, chunks))
    while chunks % bands:
        bands -= 1
    return bands


def causal_bands(cfg: ModelConfig, rows: int, length: int) -> int:
    """The causal bands (``_CAUSAL_BANDS``) a teacher-forced pass of ``rows`` rows of ``length``
    tokens attends in, 1 for none: it attends (bands + 1) / (2 * bands) of the row's (query,
    key) pairs (with the masked ones) where one pass attends them all."""
    kv = cfg.num_kv_heads
    return _causal_band_count(rows, length, kv, cfg.num_heads // kv)


def _attention(
    q_btkgh, keys, v_bksh, mask_bts, cfg: ModelConfig, *, slot_minor: bool, causal: bool = False
):
    """[B, T, K, G, H] attention of T queries over S keys: a cache row's slots, or the chunk's own
    keys (teacher forcing) laid out the same way.

    The queries of a kv head, X = G * T of them, are the rows of one plain matmul against the
    keys in the cache's layout (keys [B, K, H, S] when ``slot_minor``, else [B, K, S, H]; values
    [B, K, S, H]): no copy or transpose of the cache. Long chunks over many keys are split into
    query chunks (``_SCORES_PER_CHUNK``), run one after another. Scores are divided by the
    square root of ``cfg.query_pre_attn_scalar`` (default: the head dim).

    ``causal``: the keys are the queries' own positions and ``mask_bts`` masks every key after
    its query (teacher forcing, where every position queries). A long row's query chunks then
    run in causal bands (``_causal_band_count``): each band's over the keys up to the band's
    end, static slices, so a 3,072-token row attends 9/16 of the pairs one pass would. The
    masked keys a band leaves out weigh exactly 0 after the softmax, so the outputs equal the
    one pass's up to the sums' order, except at a query that sees no key at all (a left-padding
    position): both give it some average of values, which nothing reads.
    """
    dt = cfg.dtype
    scalar = cfg.query_pre_attn_scalar or q_btkgh.shape[-1]
    b, t, kv, g, h = q_btkgh.shape
    slots = v_bksh.shape[2]
    scores_spec = "bkxh,bkhs->bkxs" if slot_minor else "bkxh,bksh->bkxs"
    chunk = _query_chunk(b, t, slots, kv, g)

    def attend(keys, v_bksh, q_bckgh, mask_bcs):
        c = q_bckgh.shape[1]
        q_bkxh = q_bckgh.transpose(0, 2, 3, 1, 4).reshape(b, kv, g * c, h)
        scores = jnp.einsum(scores_spec, q_bkxh, keys.astype(dt))
        scores = scores.astype(jnp.float32) / jnp.sqrt(jnp.float32(scalar))
        mask_bxs = jnp.tile(mask_bcs, (1, g, 1))  # row x = (g, c) is query c's mask
        scores = jnp.where(mask_bxs[:, None], scores, _NEG_INF)
        # Softmax normalised after the values' matmul: the division runs over [.., H], not
        # over every slot's probability (one pass fewer over the [B, K, X, S'] scores).
        probs = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        out_bkxh = jnp.einsum("bkxs,bksh->bkxh", probs.astype(dt), v_bksh.astype(dt))
        out_bkxh = (out_bkxh / jnp.sum(probs, axis=-1, keepdims=True)).astype(dt)
        return out_bkxh.reshape(b, kv, g, c, h).transpose(0, 3, 1, 2, 4)

    if chunk == t:
        return attend(keys, v_bksh, q_btkgh, mask_bts)
    # Rematerialised: a gradient through the chunks would otherwise keep every chunk's scores
    # and probabilities for the backward pass at once, [n, B, K, G * chunk, S] in f32 several
    # times over (8 GiB of a Qwen2.5-1.5B update's 11.8 on a v5e chip at 8,192 tokens); each
    # chunk's are recomputed as its gradient is taken. No effect without a gradient (the
    # sampler).
    attend = jax.checkpoint(attend)

    def in_chunks(keys, v_bksh, q_bukgh, mask_bus):
        """U queries over the given keys, ``chunk`` of them at a time, one after another."""
        n = q_bukgh.shape[1] // chunk
        if n == 1:
            return attend(keys, v_bksh, q_bukgh, mask_bus)
        q_nbckgh = q_bukgh.reshape(b, n, chunk, kv, g, h).swapaxes(0, 1)
        mask_nbcs = mask_bus.reshape(b, n, chunk, mask_bus.shape[-1]).swapaxes(0, 1)
        out_nbckgh = jax.lax.map(lambda a: attend(keys, v_bksh, *a), (q_nbckgh, mask_nbcs))
        return out_nbckgh.swapaxes(0, 1).reshape(b, n * chunk, kv, g, h)

    bands = _causal_band_count(b, t, kv, g) if causal else 1
    if bands == 1:
        return in_chunks(keys, v_bksh, q_btkgh, mask_bts)
    size = t // bands
    out = []
    for i in range(bands):
        lo, hi = i * size, (i + 1) * size
        keys_i = keys[..., :hi] if slot_minor else keys[:, :, :hi]
        out.append(in_chunks(keys_i, v_bksh[:, :, :hi], q_btkgh[:, lo:hi], mask_bts[:, lo:hi, :hi]))
    return jnp.concatenate(out, axis=1)


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
        self.cfg = cfg
        self.dtype = cfg.dtype
        self.gate_weight_df = param(rngs, dense_init, (d, f), ("embed", "mlp"), pd)
        self.up_weight_df = param(rngs, dense_init, (d, f), ("embed", "mlp"), pd)
        self.down_weight_fd = param(rngs, dense_init, (f, d), ("mlp", "embed"), pd)
        _add_lora(self, cfg, ("gate", "up", "down"), rngs)

    def __call__(self, x_btd, lora_key=None):
        cfg, dt = self.cfg, self.dtype
        gate = jnp.einsum("btd,df->btf", x_btd, self.gate_weight_df[...].astype(dt))
        gate = _plus(gate, _lora_delta(self, cfg, "gate", x_btd, lora_key, 4))
        up = jnp.einsum("btd,df->btf", x_btd, self.up_weight_df[...].astype(dt))
        up = _plus(up, _lora_delta(self, cfg, "up", x_btd, lora_key, 5))
        if cfg.hidden_act == "gelu_tanh":
            hidden = jax.nn.gelu(gate, approximate=True) * up
        else:
            hidden = jax.nn.silu(gate) * up
        out = jnp.einsum("btf,fd->btd", hidden, self.down_weight_fd[...].astype(dt))
        return _plus(out, _lora_delta(self, cfg, "down", hidden, lora_key, 6))


class DecoderLayer(nnx.Module):
    """Attention and MLP, each behind a norm and added to the residual stream. ``post_attn_norm``
    is the MLP's input norm (Hugging Face's ``post_attention_layernorm`` in Qwen and Llama, its
    ``pre_feedforward_layernorm`` in Gemma 3); with ``cfg.sandwich_norms``, ``attn_out_norm`` and
    ``mlp_out_norm`` normalise the two outputs before they are added. ``sparse``: the MLP is
    routed experts (``MoE``; ``cfg.sparse_layers``)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, sparse: bool = False):
        self.input_norm = _norm(cfg, cfg.hidden_size, rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = _norm(cfg, cfg.hidden_size, rngs)
        self.sparse = sparse
        self.mlp = MoE(cfg, rngs=rngs) if sparse else MLP(cfg, rngs=rngs)
        self.sandwich = cfg.sandwich_norms
        if cfg.sandwich_norms:
            self.attn_out_norm = _norm(cfg, cfg.hidden_size, rngs)
            self.mlp_out_norm = _norm(cfg, cfg.hidden_size, rngs)

    def __call__(
        self,
        x_btd,
        cos_bth,
        sin_bth,
        mask_bts,
        cache_kv=None,
        query_b=None,
        lora_key=None,
        router_out=None,
    ):
        """One layer; with ``query_b`` ([B] positions) only those positions come out, [B, 1, D]
        (every position's keys and values still reach the cache). ``lora_key``: the LoRA
        dropout's key for this layer (None: none). ``router_out``: a list a sparse layer
        appends its router logits [B, T, E] to (``Trunk.router_logits``)."""
        attn_out, extra = self.attn(
            self.input_norm(x_btd), cos_bth, sin_bth, mask_bts, cache_kv, query_b, lora_key
        )
        if query_b is not None:
            x_btd = at_positions(x_btd, query_b)

        def mlp(h_btd):
            if self.sparse:
                return self.mlp(h_btd, lora_key, router_out)
            return self.mlp(h_btd, lora_key)

        if self.sandwich:
            x_btd = x_btd + self.attn_out_norm(attn_out)
            mlp_out = self.mlp_out_norm(mlp(self.post_attn_norm(x_btd)))
            return constrain(x_btd + mlp_out, _RESIDUAL_AXES), extra
        x_btd = x_btd + attn_out
        x_btd = constrain(x_btd + mlp(self.post_attn_norm(x_btd)), _RESIDUAL_AXES)
        return x_btd, extra


# What jax.checkpoint keeps of a layer for the backward pass, by ``ModelConfig.remat``.
_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _stacked_layers(cfg: ModelConfig, rngs: nnx.Rngs) -> DecoderLayer:
    """One DecoderLayer whose parameters are the L layers' stacked on a leading ``layers`` axis."""

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(
        in_axes=0,
        out_axes=0,
        # Prepend the layer axis to every parameter's logical axes (replicated: see sharding.py).
        transform_metadata={nnx.PARTITION_NAME: "layers", "logical_axes": "layers"},
    )
    def create(rngs: nnx.Rngs) -> DecoderLayer:
        # Every layer alike (ModelConfig refuses scanning mixed sparse and dense layers).
        return DecoderLayer(cfg, rngs=rngs, sparse=cfg.sparse_layers[0])

    return create(rngs)


def unroll_layers(model: nnx.Module) -> nnx.Module:
    """A scanned model (policy, value model or trunk) as the unrolled one with the same weights
    (its layer parameters are static slices of the stacked ones: new arrays); an unrolled model
    as it is.

    Usable inside jit. The sampler calls it once per turn, outside its decode loop: a loop body
    that slices the stacked parameters would copy every weight on every decode step.
    """
    if not model.cfg.scan_layers:
        return model
    cfg = model.cfg.replace(scan_layers=False)
    abstract = nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0)))
    return nnx.merge(nnx.graphdef(abstract), unstack_layers(nnx.state(model)))


class Trunk(nnx.Module):
    """Embeddings, decoder layers and the final norm: the part policy and value models share.

    ``layers`` is an ``nnx.List`` of L ``DecoderLayer``s, or with ``cfg.scan_layers`` one
    ``DecoderLayer`` whose parameters are stacked [L, ...] (see ``ModelConfig``).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_vd = param(
            rngs,
            dense_init,
            (cfg.vocab_size, cfg.hidden_size),
            ("vocab", "embed"),
            cfg.param_dtype,
        )
        if cfg.scan_layers:
            self.layers = _stacked_layers(cfg, rngs)
        else:
            self.layers = nnx.List(
                [DecoderLayer(cfg, rngs=rngs, sparse=sparse) for sparse in cfg.sparse_layers]
            )
        self.final_norm = _norm(cfg, cfg.hidden_size, rngs)

    def _embed(self, tokens_bt):
        """[B, T, D] input embeddings in the compute dtype."""
        cfg = self.cfg
        # FSDP: gather the table's embed axis before the lookup (as for any weight about to be
        # used), so the gathered rows come out batch-sharded rather than width-sharded.
        embed_vd = constrain(self.embed_vd[...], ("vocab", None))
        x_btd = jnp.take(embed_vd, tokens_bt, axis=0).astype(cfg.dtype)
        if cfg.embed_scale:
            # Gemma: sqrt(D) in the compute dtype, as transformers rounds it to the weights'.
            x_btd = x_btd * jnp.asarray(math.sqrt(cfg.hidden_size), cfg.dtype)
        return constrain(x_btd, _RESIDUAL_AXES)

    def router_logits(self, tokens_bt: jax.Array, *, mask_bt: jax.Array | None = None):
        """[L', B, T, E] the router logits of each of the L' sparse layers (``cfg.sparse_layers``)
        under teacher forcing: what ``load_balance`` and ``load_balancing_loss`` read. The
        layers run unrolled (a scanned model's are sliced), without remat."""
        cfg = self.cfg
        full, local = self._teacher_forcing_views(tokens_bt.shape, mask_bt)
        x_btd, out = self._embed(tokens_bt), []
        for i, layer in enumerate(unroll_layers(self).layers):
            x_btd, _ = layer(x_btd, *(local if cfg.sliding_layers[i] else full), router_out=out)
        if not out:
            raise ValueError("router_logits: the model has no sparse layers (num_experts=0)")
        return jnp.stack(out)

    def _teacher_forcing_views(self, shape_bt, mask_bt):
        """``_views`` of a chunk attending within itself: positions follow ``mask_bt`` (1 on
        real tokens; None: all), causal and padding-masked."""
        b, t = shape_bt
        mask_bt = jnp.ones((b, t), jnp.bool_) if mask_bt is None else mask_bt.astype(jnp.bool_)
        positions_bt = jnp.maximum(jnp.cumsum(mask_bt, axis=1) - 1, 0)
        mask_bts = jnp.tril(jnp.ones((t, t), jnp.bool_))[None] & mask_bt[:, None, :]
        return self._views(positions_bt, positions_bt, mask_bts)

    def _views(self, positions_bt, key_positions_bs, mask_bts):
        """What a layer attends with, ``(cos_bth, sin_bth, mask_bts)``: the full-attention
        layers' and, when some layer slides, the sliding layers' (else None): their own RoPE
        base, no scaling, and the mask without the keys (at ``key_positions_bs``: the chunk's
        positions, or a cache row's slot indices, [1, S]) a window or more behind the query."""
        cfg = self.cfg
        full = rope_tables(positions_bt, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        if not any(cfg.sliding_layers):
            return (*full, mask_bts), None
        theta = cfg.rope_local_theta or cfg.rope_theta
        near_bts = positions_bt[:, :, None] - key_positions_bs[:, None, :] < cfg.sliding_window
        local = rope_tables(positions_bt, cfg.head_dim, theta)
        return (*full, mask_bts), (*local, mask_bts & near_bts)

    def _run_layers(self, x_btd, views, lora_key=None):
        """Teacher forcing through every layer (scanned or unrolled), rematerialised per layer
        as ``cfg.remat`` says. Layer i's LoRA dropout key is ``fold_in(lora_key, i)``; it
        attends with ``views[cfg.sliding_layers[i]]`` (``_views``)."""
        cfg = self.cfg
        keys = None
        if lora_key is not None:
            keys = jax.vmap(lambda i: jax.random.fold_in(lora_key, i))(jnp.arange(cfg.num_layers))

        def apply(x_btd, graphdef, state, key, cos_bth, sin_bth, mask_bts):
            x_btd, _ = nnx.merge(graphdef, state)(x_btd, cos_bth, sin_bth, mask_bts, lora_key=key)
            return x_btd

        if cfg.remat != "none":
            # prevent_cse only matters outside a scan (jax.checkpoint's docs).
            apply = jax.checkpoint(
                apply,
                policy=_REMAT_POLICIES[cfg.remat],
                prevent_cse=not cfg.scan_layers,
                static_argnums=(1,),
            )
        full, local = views
        if not cfg.scan_layers:
            for i, layer in enumerate(self.layers):
                view = local if cfg.sliding_layers[i] else full
                x_btd = apply(x_btd, *nnx.split(layer), None if keys is None else keys[i], *view)
            return x_btd
        graphdef, state = nnx.split(self.layers)
        if local is None:
            x_btd, _ = jax.lax.scan(
                lambda x, s_k: (apply(x, graphdef, *s_k, *full), None), x_btd, (state, keys)
            )
            return x_btd

        def body(x, xs):
            # Mixed layer types in one scan: each layer picks its view by its flag.
            state, key, sliding = xs
            view = [jnp.where(sliding, a, b) for a, b in zip(local, full, strict=True)]
            return apply(x, graphdef, state, key, *view), None

        sliding_l = jnp.asarray(cfg.sliding_layers)
        x_btd, _ = jax.lax.scan(body, x_btd, (state, keys, sliding_l))
        return x_btd

    def __call__(
        self,
        tokens_bt: jax.Array,
        *,
        mask_bt: jax.Array | None = None,
        cache: KVCache | None = None,
        num_new_b: jax.Array | None = None,
        last_only: bool = False,
        lora_dropout_key: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Returns the final hidden states [B, T, D] and the updated cache (or None).

        Args:
          tokens_bt: [B, T] int token ids.
          mask_bt: [B, T] 1 on real tokens, 0 on padding (teacher forcing only; default all 1).
          cache: a KVCache to append to; the chunk is right-padded with ``num_new_b`` valid
            tokens (``mask_bt`` is then ignored). Tokens that would land past the allocated
            slots are dropped, as nothing can raise inside jit: callers check
            ``lengths + num_new_b <= cache.slots`` first.
          num_new_b: [B] int valid new tokens per row when a cache is given (default T).
          last_only: with a cache, return only each row's last new token's hidden state,
            [B, 1, D] (a row with no new tokens gives its chunk's first position). The last
            layer then runs its queries, attention output and MLP at that one position: only
            its keys and values are needed at the others. This is what a prefill needs for the
            next token's logits.
          lora_dropout_key: teacher forcing only: a PRNG key for the LoRA adapters' dropout
            (``cfg.lora.dropout``); None (the default, and always with a cache) applies none.
        """
        cfg = self.cfg
        if cache is not None and lora_dropout_key is not None:
            raise ValueError("lora_dropout_key is for teacher forcing; a cached pass has none")
        b, t = tokens_bt.shape
        x_btd = self._embed(tokens_bt)

        if cache is None:
            views = self._teacher_forcing_views((b, t), mask_bt)
            x_btd = self._run_layers(x_btd, views, lora_dropout_key)
            return self.final_norm(x_btd), None

        if num_new_b is None:
            num_new_b = jnp.full((b,), t, jnp.int32)
        positions_bt = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
        slots_s = jnp.arange(cache.slots, dtype=jnp.int32)
        mask_bts = slots_s[None, None, :] <= positions_bt[:, :, None]
        # Padding rows of the chunk are written to slot S' (out of bounds) and dropped, so a
        # short row never overwrites its own history or spills into a neighbour's slots.
        write_bt = jnp.where(jnp.arange(t)[None] < num_new_b[:, None], positions_bt, cache.slots)
        # A slot holds the key of the position equal to its index.
        full, local = self._views(positions_bt, slots_s[None], mask_bts)

        # With a cache, the layers run as a Python loop even when scanned: each reads and writes
        # its own layer's arrays of the cache in place. (A decode loop should call
        # ``unroll_layers`` once outside it rather than slice stacked parameters every step.)
        new_k, new_v = [], []
        layers = unroll_layers(self).layers
        last_b = jnp.maximum(num_new_b - 1, 0) if last_only else None
        for i, layer in enumerate(layers):
            x_btd, (k_i, v_i) = layer(
                x_btd,
                *(local if cfg.sliding_layers[i] else full),
                (cache.keys[i], cache.values[i], write_bt, cache.keys_slot_minor),
                last_b if i == len(layers) - 1 else None,
            )
            new_k.append(k_i)
            new_v.append(v_i)
        new_cache = cache.replace(
            keys=tuple(new_k), values=tuple(new_v), lengths=cache.lengths + num_new_b
        )
        return self.final_norm(x_btd), new_cache


class CausalLM(nnx.Module):
    """The policy: the trunk plus a language-model head (tied to the embeddings or not)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.trunk = Trunk(cfg, rngs=rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head_dv = param(
                rngs,
                dense_init,
                (cfg.hidden_size, cfg.vocab_size),
                ("embed", "vocab"),
                cfg.param_dtype,
            )

    def logits(self, hidden_btd: jax.Array) -> jax.Array:
        """[B, T, V] float32 logits from final hidden states."""
        dt = self.cfg.dtype
        if self.cfg.tie_word_embeddings:
            out = jnp.einsum("btd,vd->btv", hidden_btd, self.trunk.embed_vd[...].astype(dt))
        else:
            out = jnp.einsum("btd,dv->btv", hidden_btd, self.lm_head_dv[...].astype(dt))
        out = out.astype(jnp.float32)
        if self.cfg.final_logit_softcap is not None:
            cap = self.cfg.final_logit_softcap
            out = jnp.tanh(out / cap) * cap
        return constrain(out, ("batch", "seq", "act_vocab"))

    def __call__(
        self, tokens_bt, *, mask_bt=None, cache=None, num_new_b=None, lora_dropout_key=None
    ):
        """Returns (logits [B, T, V] float32, updated cache or None). See ``Trunk``."""
        hidden, cache = self.trunk(
            tokens_bt,
            mask_bt=mask_bt,
            cache=cache,
            num_new_b=num_new_b,
            lora_dropout_key=lora_dropout_key,
        )
        return self.logits(hidden), cache


class ValueModel(nnx.Module):
    """The critic: the same trunk with a scalar value head on every token."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, trunk: Trunk | None = None):
        """A fresh value model, or one around an existing ``trunk`` (see ``from_policy``)."""
        self.cfg = cfg
        self.trunk = Trunk(cfg, rngs=rngs) if trunk is None else trunk
        # A zero head: every value starts at 0, so early critic targets are not biased by noise.
        self.value_weight_d = param(rngs, zeros, (cfg.hidden_size,), ("embed",), cfg.param_dtype)
        self.value_bias = param(rngs, zeros, (), (), cfg.param_dtype)

    @classmethod
    def from_policy(cls, policy: CausalLM, *, rngs: nnx.Rngs | None = None) -> ValueModel:
        """A value model whose trunk starts as a copy of the policy's trunk.

        The trunk's arrays are copied (keeping their shardings), never shared: the policy and the
        critic are trained apart, and a train step that donates one must not free the other. A
        policy on a mesh gives a value model on the same mesh, head included.
        """
        graphdef, state = nnx.split(policy.trunk)
        trunk = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))
        model = cls(policy.cfg, rngs=nnx.Rngs(0) if rngs is None else rngs, trunk=trunk)
        placement = policy.trunk.embed_vd[...].sharding
        if isinstance(placement, NamedSharding):
            # A policy on a mesh: lay the new head out by the same rules as the trunk.
            shard_model(model, placement.mesh)
        return model

    def __call__(self, tokens_bt, *, mask_bt=None, lora_dropout_key=None):
        """[B, T] float32 values for each token's prefix (teacher forcing)."""
        hidden_btd, _ = self.trunk(tokens_bt, mask_bt=mask_bt, lora_dropout_key=lora_dropout_key)
        w = self.value_weight_d[...].astype(jnp.float32)
        return hidden_btd.astype(jnp.float32) @ w + self.value_bias[...].astype(jnp.float32)
