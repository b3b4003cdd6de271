"""KL to the reference policy: k1, k2 and k3 (low-variance) estimators, as loss or penalty.

With rho = log pi(a) - log pi_ref(a) for the sampled token a ~ pi (Schulman, "Approximating KL
divergence", 2020)::

    k1 = rho                              unbiased, high variance, can be negative
    k2 = rho^2 / 2                        biased, low variance
    k3 = exp(-rho) - 1 + rho              unbiased, low variance, always >= 0
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentrl_jax.kernels.config import DEFAULT_LOSS_CONFIG, LossConfig
from agentrl_jax.kernels.weighted import Weighted, aggregate


def kl_estimate(
    logprobs: jax.Array,
    ref_logprobs: jax.Array,
    kind: str = "k3",
    clamp: float | None = None,
    *,
    mask: jax.Array | None = None,
) -> jax.Array:
    """Per-token KL(pi || pi_ref) estimate.

    Args:
      logprobs: [B, T] log pi of the sampled tokens.
      ref_logprobs: [B, T] log pi_ref of the same tokens (no gradient).
      kind: "k1", "k2" or "k3".
      clamp: clip the estimate to [-clamp, clamp] (k3 explodes where pi_ref >> pi).
      mask: optional [B, T], 1 where the estimate is wanted. rho is set to 0 elsewhere before
        any arithmetic (the estimate there is 0): positions off the loss mask may hold any
        log-ratio, and k3's exp(-rho) of a huge one overflows, whose gradient (0 * inf) is NaN
        even under a later ``where``.

    Returns:
      [B, T] estimates (0 where ``mask`` is 0).
    """
    rho = logprobs - jax.lax.stop_gradient(ref_logprobs)
    if mask is not None:
        rho = jnp.where(mask > 0, rho, 0.0)  # the safe-where: no exp of a masked-out rho
    if kind == "k1":
        kl = rho
    elif kind == "k2":
        kl = 0.5 * jnp.square(rho)
    elif kind == "k3":
        kl = jnp.exp(-rho) - 1.0 + rho
    else:
        raise ValueError(f"kl_estimate: kind is {kind!r}; expected 'k1', 'k2' or 'k3'")
    return kl if clamp is None else jnp.clip(kl, -clamp, clamp)


def kl_loss(
    logprobs: jax.Array,
    ref_logprobs: jax.Array,
    loss_mask: jax.Array,
    *,
    config: LossConfig = DEFAULT_LOSS_CONFIG,
) -> Weighted:
    """KL as a loss term (GRPO style): aggregate of ``kl_estimate`` over agent tokens.

    Args:
      logprobs, ref_logprobs, loss_mask: [B, T].
      config: kl_estimator, kl_clamp, aggregation.

    Returns:
      The KL term as numerator / denominator (the trainer multiplies by its coefficient).
    """
    kl = kl_estimate(logprobs, ref_logprobs, config.kl_estimator, config.kl_clamp, mask=loss_mask)
    return aggregate(kl, loss_mask, config.aggregation)


def kl_penalty(
    logprobs: jax.Array,
    ref_logprobs: jax.Array,
    loss_mask: jax.Array,
    kind: str = "k1",
    clamp: float | None = None,
) -> jax.Array:
    """KL as a reward penalty: the [B, T] per-token estimate to pass as ``kl=`` to gae or
    reinforce_pp (they subtract ``kl_coef * kl`` from the token rewards). No gradient flows.
    """
    kl = kl_estimate(logprobs, ref_logprobs, kind, clamp, mask=loss_mask)
    return jnp.where(loss_mask > 0, jax.lax.stop_gradient(kl), 0.0)
