"""Credit assignment and losses: pure functions of padded arrays, jit-compiled per shape bucket.

What the trainer calls (names come from config; see docs/algorithms.md)::

    from agentrl_jax import kernels

    batch = kernels.make_batch(loss_mask=..., step_ids=..., rewards=..., step_mask=...,
                               group_ids=..., state_keys=...,      # host-side, validated
                               bootstrap_values=...)  # [B] V after a cut episode, 0: terminal
    spec = kernels.get_advantage_spec(cfg.advantage)                # spec.needs_values: run critic?
    adv = spec.fn(batch, kernels.AdvantageConfig(gamma=..., lam=...),
                  values=values_bt,                                 # [B, T] or None
                  kl=kernels.kl_penalty(logp, ref_logp, batch.loss_mask))  # optional penalty
    # adv.tokens [B, T]; adv.steps [B, S] | None; adv.returns [B, T] | None (gae)

    loss_cfg = kernels.LossConfig(ratio_level="action", aggregation="token_mean", dual_clip=3.0)
    pg, metrics = kernels.get_policy_loss(cfg.loss)(
        logp, old_logp, adv.tokens, batch.loss_mask, step_ids=batch.step_ids, config=loss_cfg)
    vf, vf_metrics = kernels.value_loss(values, old_values, adv.returns, batch.loss_mask,
                                        config=loss_cfg)
    kl = kernels.kl_loss(logp, ref_logp, batch.loss_mask, config=loss_cfg)
    ent = kernels.entropy_bonus(entropy_bt, batch.loss_mask, loss_cfg.aggregation)

Uniform signatures:

- advantage estimator: ``fn(batch: Batch, config: AdvantageConfig, *, values=None, kl=None)
  -> Advantages``; registered ones: gae (needs values), grpo, rloo, reinforce_pp, gigpo, gagpo.
- policy loss: ``fn(logprobs, old_logprobs, advantages, loss_mask, *, step_ids=None,
  config: LossConfig) -> (Weighted, dict[str, Weighted])``; registered: ppo, pg.

Every loss and metric is a :class:`Weighted` (numerator, denominator): sum both over
microbatches and divide once, so token means stay exact.
"""

from agentrl_jax.kernels.advantages import (
    Advantages,
    episode_returns,
    gae,
    gagpo,
    gagpo_step_advantages,
    gigpo,
    gigpo_step_advantages,
    grpo,
    grpo_advantages,
    reinforce_pp,
    rloo,
    rloo_advantages,
    token_gae,
    token_rewards,
)
from agentrl_jax.kernels.batch import Batch, make_batch
from agentrl_jax.kernels.config import RATIO_LEVELS, AdvantageConfig, LossConfig
from agentrl_jax.kernels.entropy import entropy_bonus, entropy_from_logits
from agentrl_jax.kernels.envrl import (
    AuxExamples,
    EnvrlConfig,
    Transition,
    aux_loss,
    build_inverse_dynamics,
    build_state_prediction,
    cosine_weight,
    envrl_total_loss,
    target_logprobs,
)
from agentrl_jax.kernels.kl import kl_estimate, kl_loss, kl_penalty
from agentrl_jax.kernels.off_policy import CORRECTIONS, importance_weights
from agentrl_jax.kernels.policy_loss import action_mean, pg_loss, ppo_loss
from agentrl_jax.kernels.registry import (
    EstimatorSpec,
    advantage_estimators,
    get_advantage_estimator,
    get_advantage_spec,
    get_policy_loss,
    policy_losses,
    register_advantage_estimator,
    register_policy_loss,
)
from agentrl_jax.kernels.value_loss import explained_variance, value_loss
from agentrl_jax.kernels.weighted import Weighted, aggregate

__all__ = [
    "Advantages",
    "AdvantageConfig",
    "AuxExamples",
    "Batch",
    "CORRECTIONS",
    "EnvrlConfig",
    "EstimatorSpec",
    "LossConfig",
    "RATIO_LEVELS",
    "Transition",
    "Weighted",
    "action_mean",
    "advantage_estimators",
    "aggregate",
    "aux_loss",
    "build_inverse_dynamics",
    "build_state_prediction",
    "cosine_weight",
    "entropy_bonus",
    "entropy_from_logits",
    "envrl_total_loss",
    "episode_returns",
    "explained_variance",
    "gae",
    "gagpo",
    "gagpo_step_advantages",
    "get_advantage_estimator",
    "get_advantage_spec",
    "get_policy_loss",
    "gigpo",
    "gigpo_step_advantages",
    "grpo",
    "grpo_advantages",
    "importance_weights",
    "kl_estimate",
    "kl_loss",
    "kl_penalty",
    "make_batch",
    "pg_loss",
    "policy_losses",
    "ppo_loss",
    "register_advantage_estimator",
    "register_policy_loss",
    "reinforce_pp",
    "rloo",
    "rloo_advantages",
    "target_logprobs",
    "token_gae",
    "token_rewards",
    "value_loss",
]
