r"""A user's own advantage estimator and policy loss, registered from outside the library.

Nothing in ``agentrl_jax`` is edited: importing this module registers both names, and the config
selects them (docs/custom_losses.md)::

    PYTHONPATH=docs/examples python -m launch.train --config=configs/tiny_textworld.py \
        --workdir=runs/custom --config.plugins="('custom_rl',)" \
        --config.rl.algo=batch_mean_baseline --config.rl.loss=truncated_is_pg

``tests/test_custom_losses.py`` runs exactly this command on the ``:test`` config (``-m slow``).
"""

import jax
import jax.numpy as jnp
from absl import logging

import agentrl_jax as arl

MAX_WEIGHT = 2.0  # the truncation of the importance weight in truncated_is_pg


@arl.register_advantage_estimator("batch_mean_baseline")
def batch_mean_baseline(batch: arl.Batch, config: arl.AdvantageConfig, *, values=None, kl=None):
    """REINFORCE with the batch-mean episode return as the baseline.

    Args:
      batch: B trajectories; reads ``rewards`` [B, S], ``step_mask`` [B, S], ``loss_mask`` [B, T].
      config: ``gamma`` and the rest are unused: the return is the undiscounted sum.
      values: unused (registered with ``needs_values=False``, so the trainer runs no critic).
      kl: unused ([B, T] per-token KL penalty when ``rl.kl_mode='reward'``).

    Returns:
      Advantages with ``tokens`` [B, T]: every action token of episode b gets R_b - mean_b' R_b'.
    """
    del config, values, kl
    returns = arl.kernels.episode_returns(batch.rewards, batch.step_mask)  # [B]
    real = batch.step_mask[:, 0] > 0  # padding rows have no step
    baseline = jnp.sum(jnp.where(real, returns, 0.0)) / jnp.maximum(jnp.sum(real), 1)
    adv = jnp.where(real, returns - baseline, 0.0)  # [B]
    # Shapes are static, so this line also works under jit (it then logs once per trace).
    logging.info("batch_mean_baseline: advantages for %d rows", batch.rewards.shape[0])
    return arl.Advantages(tokens=adv[:, None] * batch.loss_mask)  # [B, T]


@arl.register_policy_loss("truncated_is_pg")
def truncated_is_pg(
    logprobs, old_logprobs, advantages, loss_mask, *, step_ids=None, config: arl.LossConfig
):
    """Policy gradient with a truncated importance weight, to minimise.

    Per token ``l_t = -min(r_t, MAX_WEIGHT) * A_t * log pi(a_t)`` with ``r_t = pi / pi_old``
    and no gradient through the weight (as in truncated-IS off-policy corrections), reduced with
    ``config.aggregation``.

    Args:
      logprobs: [B, T] log-probs of the taken tokens under the current policy.
      old_logprobs: [B, T] the same under the behaviour policy.
      advantages: [B, T] token advantages.
      loss_mask: [B, T] 1 on agent tokens.
      step_ids: [B, T] step of each agent token (unused here).
      config: the run's LossConfig.

    Returns:
      (loss, metrics): Weighted scalars; ``truncated_frac`` is logged as
      ``losses/truncated_frac`` (a metric name without "/" goes under ``losses/``).
    """
    del step_ids
    ratio = jnp.exp(logprobs - jax.lax.stop_gradient(old_logprobs))
    weight = jax.lax.stop_gradient(jnp.minimum(ratio, MAX_WEIGHT))
    loss = -weight * jax.lax.stop_gradient(advantages) * logprobs
    truncated = (ratio > MAX_WEIGHT).astype(logprobs.dtype)
    metrics = {"truncated_frac": arl.kernels.aggregate(truncated, loss_mask, "token_mean")}
    return arl.kernels.aggregate(loss, loss_mask, config.aggregation), metrics
