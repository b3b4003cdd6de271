"""PPO clipped surrogate with token- or action-level ratios, dual clip, and exact aggregation."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentrl_jax.kernels.config import DEFAULT_LOSS_CONFIG, LossConfig
from agentrl_jax.kernels.registry import register_policy_loss
from agentrl_jax.kernels.weighted import Weighted, aggregate


def action_mean(x_bt: jax.Array, step_ids: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """Mean of x over the tokens of each action, given back to every token of that action.

    Args:
      x_bt: [B, T] per-token values.
      step_ids: [B, T] int32 step of each agent token (-1 elsewhere); real ids are < T because
        every step has at least one token.
      mask_bt: [B, T] 1 on agent tokens.

    Returns:
      [B, T]: mean over {t' : step_ids[b, t'] == step_ids[b, t], mask 1}; 0 off agent tokens.
    """
    b, t = x_bt.shape
    valid = mask_bt > 0
    ids = (jnp.arange(b, dtype=jnp.int32)[:, None] * t + jnp.maximum(step_ids, 0)).reshape(-1)
    w = valid.astype(x_bt.dtype).reshape(-1)
    x = jnp.where(valid, x_bt, 0.0).reshape(-1)
    sums = jax.ops.segment_sum(jnp.stack([x, w], axis=-1), ids, num_segments=b * t)
    mean = (sums[:, 0] / jnp.maximum(sums[:, 1], 1.0))[ids].reshape(b, t)
    return jnp.where(valid, mean, 0.0)


@register_policy_loss("ppo")
def ppo_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    *,
    step_ids: jax.Array | None = None,
    config: LossConfig = DEFAULT_LOSS_CONFIG,
) -> tuple[Weighted, dict[str, Weighted]]:
    """PPO clipped surrogate, to minimise.

    With log-ratio rho_t = log pi(a_t) - log pi_old(a_t) per token, the ratio is
    ``exp(rho_t)`` (``ratio_level="token"``) or ``exp(mean of rho over the action's tokens)``
    shared by those tokens (``"action"``, as GAGPO uses). Per token::

        l_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))
        l_t = min(l_t, -A_t * dual_clip)    if A_t < 0 and dual_clip is set   (dual-clip PPO)

    then reduced with ``config.aggregation`` (see :func:`weighted.aggregate`).

    Args:
      logprobs: [B, T] log-probabilities of the taken tokens under the current policy.
      old_logprobs: [B, T] the same under the behaviour policy (no gradient).
      advantages: [B, T] token advantages (``Advantages.tokens``).
      loss_mask: [B, T] 1 on agent tokens.
      step_ids: [B, T] step of each agent token; required for ``ratio_level="action"``.
      config: clip range, dual clip, ratio level, aggregation.

    Returns:
      (loss, metrics): the loss as numerator / denominator and cleanrl-named metrics
      (``losses/clipfrac``, ``losses/approx_kl``, ``losses/dual_clipfrac``), each as a
      token-mean numerator / denominator.
    """
    valid = loss_mask > 0
    log_ratio = jnp.where(valid, logprobs - jax.lax.stop_gradient(old_logprobs), 0.0)
    if config.ratio_level == "action":
        if step_ids is None:
            raise ValueError("ppo_loss: step_ids is None; ratio_level='action' needs [B, T] ids")
        log_ratio = action_mean(log_ratio, step_ids, loss_mask)
    ratio = jnp.exp(log_ratio)
    adv = jax.lax.stop_gradient(advantages)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    loss = jnp.maximum(unclipped, clipped)
    dual = jnp.zeros_like(valid)
    if config.dual_clip is not None:
        bound = -adv * config.dual_clip
        dual = (adv < 0) & (loss > bound)
        loss = jnp.where(dual, bound, loss)
    stats = jax.lax.stop_gradient
    metrics = {
        "losses/clipfrac": aggregate(
            stats(clipped > unclipped).astype(loss.dtype), valid, "token_mean"
        ),
        "losses/approx_kl": aggregate(stats(ratio - 1.0 - log_ratio), valid, "token_mean"),
        "losses/dual_clipfrac": aggregate(dual.astype(loss.dtype), valid, "token_mean"),
    }
    return aggregate(loss, loss_mask, config.aggregation), metrics


@register_policy_loss("pg")
def pg_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    *,
    step_ids: jax.Array | None = None,
    config: LossConfig = DEFAULT_LOSS_CONFIG,
) -> tuple[Weighted, dict[str, Weighted]]:
    """Vanilla policy gradient -A_t log pi(a_t) (no ratio, no clip); same signature as PPO."""
    del old_logprobs, step_ids  # Unused: kept for the uniform signature.
    loss = -jax.lax.stop_gradient(advantages) * logprobs
    return aggregate(loss, loss_mask, config.aggregation), {}
