"""Importance weights that correct a policy-gradient loss for tokens sampled by another policy.

The learner's old log-probs (the policy being trained, scored before the update) and the
behaviour log-probs (what the sampler that acted computed) differ when the sampler's weights lag
the learner's (asynchronous rollouts, bounded staleness), and by numerics even when they do not
(a bf16 sampler, another kernel). The per-token ratio ``r = pi_old / mu`` (``"token"``), or its
geometric mean over an action's tokens (``"action"``, as the PPO ratio of ``ratio_level``), gives
the weight of each token's loss:

- ``"tis"``, truncated importance sampling: ``w = min(r, cap)``;
- ``"mis"``, masked importance sampling: ``w = r`` where ``1 / cap <= r <= cap``, else 0 (the
  token leaves the loss but stays in its denominator);
- ``"none"``: ``w = 1``.

The weights carry no gradient; the learner multiplies each token's advantage by its weight,
which weights each token's loss for every loss linear in the advantage (``ppo``, ``pg``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentrl_jax.kernels.policy_loss import action_mean

CORRECTIONS = ("none", "tis", "mis")


def importance_weights(
    old_logprobs: jax.Array,
    behaviour_logprobs: jax.Array,
    loss_mask: jax.Array,
    *,
    mode: str,
    cap: float,
    step_ids: jax.Array | None = None,
    ratio_level: str = "token",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """[B, T] importance weights of the agent tokens (0 elsewhere), and their metrics.

    Args:
      old_logprobs: [B, T] the trained policy's log-probs of the sampled tokens.
      behaviour_logprobs: [B, T] the sampler's log-probs of the same tokens.
      loss_mask: [B, T] 1 on agent tokens.
      mode: one of ``CORRECTIONS``.
      cap: C > 1, the truncation (tis) or the band [1/C, C] (mis).
      step_ids: [B, T] the step of each agent token; required for ``ratio_level="action"``.
      ratio_level: "token" or "action" (the ratio of an action's tokens' mean log-ratio).

    Returns:
      (weights, metrics): "off_policy/is_weight_mean" (the weights' mean over agent tokens),
      "off_policy/is_ratio_max" (the largest ratio, before truncation or masking) and
      "off_policy/clipped_fraction" (the agent tokens whose weight was truncated or masked).
    """
    if mode not in CORRECTIONS:
        raise ValueError(f"importance_weights: mode is {mode!r}; expected one of {CORRECTIONS}")
    if not cap > 1:
        raise ValueError(f"importance_weights: cap is {cap!r}; expected > 1")
    valid = loss_mask > 0
    log_ratio = jnp.where(valid, old_logprobs - behaviour_logprobs, 0.0)
    if ratio_level == "action":
        if step_ids is None:
            raise ValueError("importance_weights: ratio_level='action' needs step_ids")
        log_ratio = action_mean(log_ratio, step_ids, loss_mask)
    ratio = jnp.exp(log_ratio)
    if mode == "none":
        weights, changed = jnp.ones_like(ratio), jnp.zeros_like(valid)
    elif mode == "tis":
        weights, changed = jnp.minimum(ratio, cap), ratio > cap
    else:
        inside = (ratio >= 1.0 / cap) & (ratio <= cap)
        weights, changed = jnp.where(inside, ratio, 0.0), ~inside
    weights = jax.lax.stop_gradient(jnp.where(valid, weights, 0.0))
    count = jnp.maximum(jnp.sum(valid), 1)
    metrics = {
        "off_policy/is_weight_mean": jnp.sum(weights) / count,
        "off_policy/is_ratio_max": jnp.max(jnp.where(valid, ratio, 0.0)),
        "off_policy/clipped_fraction": jnp.sum(changed & valid) / count,
    }
    return weights, metrics
