"""Routed experts (Qwen3-MoE's sparse MLP, ``models/qwen3_moe.py``): the router's top-k routing
as transformers computes it, the experts' layer, and the router's load balance and
load-balancing loss (``Trunk.router_logits`` gives the logits they read)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.params import dense_init, param
from agentrl_jax.sharding import constrain, logical_to_spec


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


def grouped_experts(x_nd, weights_nk, experts_nk, gate_edf, up_edf, down_efd, first_expert=0):
    """[..., D]: each token's k experts' outputs, scaled by its routing weights and summed, as a
    grouped matmul: the N * k (token, expert) pairs sorted by expert, then ``jax.lax.ragged_dot``
    (rows of group j against expert j's weights) for gate / up and for down, unsorted.

    The weights hold experts ``first_expert ..`` ``first_expert + E' - 1`` (E' their leading
    size: all of them, or one device's share under ``shard_map``); a pair whose expert is not
    among them adds 0 (sorted after every group, past the rows ``ragged_dot`` computes).
    Rounded as transformers' ``Qwen3MoeExperts``: each expert's output (down_proj's) is scaled
    by the routing weight in the compute dtype, and a token's k outputs are added one by one in
    ascending expert order.

    Args:
      x_nd: [..., D] tokens (any leading shape, flattened to N), in the compute dtype (as are
        the expert weights).
      weights_nk: [..., k] routing weights (``route``'s, in the compute dtype).
      experts_nk: [..., k] int expert ids, distinct within a row.
      gate_edf, up_edf: [E', D, F]; down_efd: [E', F, D].
      first_expert: the id of the weights' expert 0 (an int or a traced int scalar).
    """
    lead, d = x_nd.shape[:-1], x_nd.shape[-1]
    k, e = experts_nk.shape[-1], gate_edf.shape[0]
    x_nd, weights_nk, experts_nk = (
        x_nd.reshape(-1, d),
        weights_nk.reshape(-1, k),
        experts_nk.reshape(-1, k),
    )
    n = x_nd.shape[0]
    # Each token's picks in ascending expert order: the order transformers adds them in.
    by_id = jnp.argsort(experts_nk, axis=-1)
    experts_nk = jnp.take_along_axis(experts_nk, by_id, axis=-1)
    weights_nk = jnp.take_along_axis(weights_nk, by_id, axis=-1)
    local_nk = experts_nk - first_expert
    mine_nk = (local_nk >= 0) & (local_nk < e)
    group_m = jnp.where(mine_nk, local_nk, e).reshape(n * k)  # group e: not these weights'
    order_m = jnp.argsort(group_m, stable=True)
    sizes_e = jnp.bincount(group_m, length=e + 1)[:e].astype(jnp.int32)
    x_md = jnp.take(x_nd, order_m // k, axis=0)
    gate_mf = jax.lax.ragged_dot(x_md, gate_edf, sizes_e)
    up_mf = jax.lax.ragged_dot(x_md, up_edf, sizes_e)
    out_md = jax.lax.ragged_dot(jax.nn.silu(gate_mf) * up_mf, down_efd, sizes_e)
    # Back to (token, pick) order. The rows past the groups (pairs of other experts) are zero
    # in jax's CPU lowering, but ragged_dot does not promise it: masked, not trusted.
    out_nkd = jnp.zeros_like(out_md).at[order_m].set(out_md, unique_indices=True)
    out_nkd = out_nkd.reshape(n, k, -1) * weights_nk[..., None]
    out_nkd = jnp.where(mine_nk[..., None], out_nkd, 0)
    out_nd = out_nkd[:, 0]
    for j in range(1, k):
        out_nd = out_nd + out_nkd[:, j]
    return out_nd.reshape(*lead, d)


def _sharded_grouped_experts(mesh, x_btd, weights_btk, experts_btk, gate, up, down):
    """``grouped_experts`` under ``shard_map`` over every axis of ``mesh``: each device routes
    its own rows of the batch (split over ``batch``'s mesh axes, as the activations are) through
    its own experts (split over ``expert``) and its slice of the expert width (over ``tp``), and
    the partial outputs are summed over those two axes (a psum). The weights' model width is
    gathered on entry (over ``fsdp``, as the dense way's einsums gather it)."""
    act = logical_to_spec(("batch", "seq", "act_embed"), x_btd.shape, mesh)
    picks = P(act[0], None, None)
    in_spec = logical_to_spec(("expert", "embed", "mlp"), gate.shape, mesh)
    expert_axes, width_axes = in_spec[0], in_spec[2]
    gate_spec = P(expert_axes, None, width_axes)
    down_spec = P(expert_axes, width_axes, None)

    def local(x_btd, weights_btk, experts_btk, gate, up, down):
        first = 0 if expert_axes is None else jax.lax.axis_index(expert_axes) * gate.shape[0]
        out_btd = grouped_experts(x_btd, weights_btk, experts_btk, gate, up, down, first)
        summed = tuple(a for axes in (expert_axes, width_axes) for a in _axis_names(axes))
        return jax.lax.psum(out_btd, summed) if summed else out_btd

    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(act, picks, picks, gate_spec, gate_spec, down_spec),
        out_specs=act,
    )(x_btd, weights_btk, experts_btk, gate, up, down)


def _axis_names(axes) -> tuple[str, ...]:
    """A PartitionSpec entry's mesh axes as a tuple (None: none)."""
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


class MoE(nnx.Module):
    """Routed experts (Qwen3-MoE's sparse MLP): a router [D, E] and E gated MLPs stacked on a
    leading ``expert`` axis (logical axis ``expert``: split over the mesh's ``expert`` axis where
    it has one, see ``agentrl_jax.sharding``), each of width ``moe_intermediate_size``.

    Each token's output is the weighted sum of its ``num_experts_per_tok`` experts' outputs
    (``route``), computed one of two ways (``cfg.moe_impl``; equal within f32 rounding):

    - ``"dense"`` (the default): every expert runs on every token and the routing weights (zero
      off a token's top k) combine them in one contraction over (expert, width): no gather, no
      capacity, nothing dropped, and an expert-sharded weight gives expert-sharded work under
      GSPMD. It costs E / k times the routed FLOPs (16x for Qwen3-30B-A3B) and [B, T, E, F]
      activations.
    - ``"grouped"``: the (token, expert) pairs sorted by expert and ``jax.lax.ragged_dot``
      (``grouped_experts``), rounded as transformers rounds (the weight scales each expert's
      output). Under a mesh, a ``shard_map``: each device its own rows and experts, then a psum
      over ``expert`` and ``tp``. Whether it saves anything is the backend's lowering of
      ``ragged_dot``: CPU's (jax's fallback) and XLA's default GPU one (``RaggedDotRewriter``)
      expand it into a dense dot over all E groups of the N * k rows, E times the routed FLOPs
      and k times the dense way's (measured on CPU, E=64, k=8, D=512, F=256, 2048 tokens:
      828 GFLOP and 16.6 s a forward against the dense way's 103 GFLOP and 2.3 s). TPU's
      compiler (v5e, compiled ahead of time, bf16, same shapes) makes the forward and the input
      gradient grouped-matmul kernels, at the routed FLOPs (13.1 GFLOP a forward against the
      dense way's 103.6), but the weight gradients (the ragged rows contracted) dense
      convolutions over every expert: 853.7 GFLOP forward and backward against 311.9
      (docs/models.md). On NVIDIA GPUs XLA's cuDNN fusion may lower it grouped
      (``--xla_gpu_experimental_use_ragged_dot_fusion``, cuDNN >= 9.22; not tried).
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
        if cfg.moe_impl == "grouped":
            return self._grouped(x_btd, weights_btk.astype(dt), experts_btk)
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

    def _grouped(self, x_btd, weights_btk, experts_btk):
        """[B, T, D] through ``grouped_experts``: under a mesh (``jax.set_mesh``), each device
        on its own rows and experts (``_sharded_grouped_experts``); without one, all tokens
        at once."""
        dt = self.cfg.dtype
        gate = self.gate_weight_edf[...].astype(dt)
        up = self.up_weight_edf[...].astype(dt)
        down = self.down_weight_efd[...].astype(dt)
        mesh = jax.sharding.get_abstract_mesh()
        if not mesh.empty:
            return _sharded_grouped_experts(mesh, x_btd, weights_btk, experts_btk, gate, up, down)
        return grouped_experts(x_btd, weights_btk, experts_btk, gate, up, down)
