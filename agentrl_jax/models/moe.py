"""Routed experts (Qwen3-MoE's sparse MLP, ``models/qwen3_moe.py``): the router's top-k routing
as transformers computes it, the experts' layer, and the router's load balance and
load-balancing loss (``Trunk.router_logits`` gives the logits they read)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.params import dense_init, param
from agentrl_jax.sharding import constrain


def route(router_logits_bte: jax.Array, top_k: int, norm_topk_prob: bool):
    """Each token's experts and their weights, as transformers' ``Qwen3MoeTopKRouter``: a
    softmax over every expert (f32), the ``top_k`` most probable, renormalised to sum to 1 with
    ``norm_topk_prob``. Returns (weights [..., k] f32, experts [..., k] int32)."""
    probs = jax.nn.softmax(router_logits_bte.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    if norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts


def _routing_sums(router_logits_lbte, mask_bt, top_k: int):
    """Per sparse layer, over the real tokens: how many picked each expert ([L', E]), the sum of
    each expert's router probability ([L', E]), and the token count."""
    probs = jax.nn.softmax(router_logits_lbte.astype(jnp.float32), axis=-1)
    _, experts = jax.lax.top_k(probs, top_k)
    e = probs.shape[-1]
    mask = jnp.ones(probs.shape[1:3], jnp.float32) if mask_bt is None else mask_bt
    mask = jnp.asarray(mask, jnp.float32)
    picked = jnp.einsum("lbtke,bt->le", jax.nn.one_hot(experts, e, dtype=jnp.float32), mask)
    return picked, jnp.einsum("lbte,bt->le", probs, mask), jnp.sum(mask)


def load_balance(router_logits_lbte: jax.Array, mask_bt: jax.Array | None, top_k: int):
    """[L', E] each sparse layer's fraction of the real tokens' routing choices that went to
    each expert (rows sum to 1; 1 / E everywhere is a perfect balance)."""
    picked, _, tokens = _routing_sums(router_logits_lbte, mask_bt, top_k)
    return picked / (jnp.maximum(tokens, 1.0) * top_k)


def load_balancing_loss(router_logits_lbte: jax.Array, mask_bt: jax.Array | None, top_k: int):
    """The Switch Transformer's load-balancing loss as transformers'
    ``load_balancing_loss_func`` computes it: E * sum_e f_e P_e, with f_e the number of times
    expert e was picked per token (the f_e sum to k) and P_e its mean router probability, both
    over the real tokens of every sparse layer together: k when routing is uniform, at most E.
    0 when there is no real token."""
    picked, probs, tokens = _routing_sums(router_logits_lbte, mask_bt, top_k)
    layers, e = picked.shape
    # No real token (a microbatch of padding rows): 0, not 0 / 0.
    f = jnp.sum(picked, axis=0) / (layers * jnp.maximum(tokens, 1.0))
    p = jnp.sum(probs, axis=0) / (layers * jnp.maximum(tokens, 1.0))
    return e * jnp.sum(f * p)


class MoE(nnx.Module):
    """Routed experts (Qwen3-MoE's sparse MLP): a router [D, E] and E gated MLPs stacked on a
    leading ``expert`` axis (logical axis ``expert``: split over the mesh's ``expert`` axis where
    it has one, see ``agentrl_jax.sharding``), each of width ``moe_intermediate_size``.

    Each token's output is the weighted sum of its ``num_experts_per_tok`` experts' outputs
    (``route``). Computed densely: every expert runs on every token and the routing weights
    (zero off a token's top k) combine them in one contraction over (expert, width), so there
    is no gather, no capacity and nothing dropped, and an expert-sharded weight gives
    expert-sharded work; the cost is E / k times the routed FLOPs (16x for Qwen3-30B-A3B). A
    grouped matmul over tokens sorted by expert (``jax.lax.ragged_dot``) is the efficient
    alternative, not done here.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, e, f, pd = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.param_dtype
        self.cfg = cfg
        self.router_weight_de = param(rngs, dense_init, (d, e), ("embed", None), pd)
        axes = ("expert", "embed", "mlp")
        self.gate_weight_edf = param(rngs, dense_init, (e, d, f), axes, pd)
        self.up_weight_edf = param(rngs, dense_init, (e, d, f), axes, pd)
        self.down_weight_efd = param(rngs, dense_init, (e, f, d), ("expert", "mlp", "embed"), pd)

    def router_logits(self, x_btd):
        """[B, T, E] router logits in the compute dtype (transformers' ``F.linear``)."""
        dt = self.cfg.dtype
        return jnp.einsum("btd,de->bte", x_btd, self.router_weight_de[...].astype(dt))

    def __call__(self, x_btd, lora_key=None, router_out: list | None = None):
        """[B, T, D] output; ``router_out``: a list the router logits are appended to."""
        del lora_key  # the experts have no adapters
        cfg, dt = self.cfg, self.cfg.dtype
        logits_bte = self.router_logits(x_btd)
        if router_out is not None:
            router_out.append(logits_bte)
        weights_btk, experts_btk = route(logits_bte, cfg.num_experts_per_tok, cfg.norm_topk_prob)
        # [B, T, E]: a token's weight on each expert, zero off its top k (cast as transformers
        # casts the top-k weights to the logits' dtype). The weight scales the expert's hidden
        # activations before down_proj, where transformers scales its output after: the same
        # in f32, rounded differently in bf16.
        onehot = jax.nn.one_hot(experts_btk, cfg.num_experts, dtype=jnp.float32)
        combine_bte = jnp.einsum("btk,btke->bte", weights_btk, onehot).astype(dt)
        gate = jnp.einsum("btd,edf->btef", x_btd, self.gate_weight_edf[...].astype(dt))
        up = jnp.einsum("btd,edf->btef", x_btd, self.up_weight_edf[...].astype(dt))
        hidden = jax.nn.silu(gate) * up * combine_bte[..., None]
        hidden = constrain(hidden, ("batch", "seq", "act_expert", "act_mlp"))
        return jnp.einsum("btef,efd->btd", hidden, self.down_weight_efd[...].astype(dt))
