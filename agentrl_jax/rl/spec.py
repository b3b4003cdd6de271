"""One resolved spec of a run's RL settings: everything the learner's math reads, decided once.

A run's config names its RL settings in ``config.rl`` and ``config.envrl``; the kernels take them
as ``kernels.AdvantageConfig``, ``kernels.LossConfig`` and weights. :meth:`RLSpec.from_sections`
resolves the sections into one frozen :class:`RLSpec` at the boundary (``RunConfig.rl_spec``, in
run/), and every consumer reads the spec, never the config: the Learner's loss terms, the RL
update's rows, scores and advantages, the trainer's frozen reference, the memory plan and the
benchmarks. What follows from several settings is decided here, once:

- the KL to the frozen reference (:class:`KLSpec`): in "loss" mode a term of the loss
  (``weights.kl``), in "reward" mode a per-token reward penalty the estimator subtracts
  (``advantage.kl_coef``); the same estimator and clamp in both (``loss.kl_estimator``,
  ``loss.kl_clamp``); a reference policy is scored, and ``losses/kl_ref`` logged, exactly when
  ``kl.needs_reference``;
- the PPO ratio's level (``rl.ratio_level="auto"``: the estimator's own);
- the ENVRL weights' horizon (``envrl.horizon``, or with 0 the run's RL iterations).

This module imports nothing of run/ (the config sections are read by their field names), so
rl/ stays below run/ (tests/test_layers.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl_jax import kernels

KL_MODES = ("loss", "reward")
REFERENCE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """Coefficients of the total loss. ``kl`` multiplies the KL-to-reference loss term."""

    value: float = 0.5
    kl: float = 0.0
    entropy: float = 0.0


@dataclasses.dataclass(frozen=True)
class KLSpec:
    """The KL to the frozen reference policy (the policy as RL starts).

    Attributes:
      mode: "loss" (a term of the loss, weighted by ``coef``) or "reward" (``coef`` times the
        per-token KL subtracted from the rewards, by an estimator registered with
        ``kl_reward=True``).
      coef: beta >= 0; 0: no KL, and no reference policy is kept or scored.
      estimator: "k1", "k2" or "k3", in either mode.
      clamp: clamp of the per-token estimate, or None.
      reference_dtype: the frozen reference's parameters, "float32" or "bfloat16".
    """

    mode: str = "loss"
    coef: float = 0.0
    estimator: str = kernels.LossConfig.kl_estimator
    clamp: float | None = kernels.LossConfig.kl_clamp
    reference_dtype: str = "float32"

    def __post_init__(self):
        if self.mode not in KL_MODES:
            raise ValueError(f"KLSpec.mode is {self.mode!r}; expected one of {KL_MODES}")
        if not self.coef >= 0:
            raise ValueError(f"KLSpec.coef is {self.coef!r}; expected >= 0")
        if self.reference_dtype not in REFERENCE_DTYPES:
            raise ValueError(
                f"KLSpec.reference_dtype is {self.reference_dtype!r}; expected one of "
                f"{REFERENCE_DTYPES}"
            )

    @property
    def needs_reference(self) -> bool:
        """Whether the run keeps a frozen reference and scores its log-probs (either mode)."""
        return self.coef > 0

    @property
    def loss_coef(self) -> float:
        """The KL term's weight in the loss (0 in reward mode)."""
        return self.coef if self.mode == "loss" else 0.0

    @property
    def reward_coef(self) -> float:
        """The estimator's KL reward penalty coefficient (0 in loss mode)."""
        return self.coef if self.mode == "reward" else 0.0


@dataclasses.dataclass(frozen=True)
class RLSpec:
    """The RL settings the learner's math reads, resolved once (module docstring).

    Attributes:
      algo: the registered advantage estimator (``kernels.get_advantage_spec``).
      advantage: its settings; its ``kl_coef`` is derived, ``kl.reward_coef``.
      policy_loss: the registered policy loss (``kernels.get_policy_loss``).
      loss: the losses' settings; ``ratio_level`` resolved; its ``kl_estimator`` /
        ``kl_clamp`` are derived, ``kl``'s.
      weights: the total loss's coefficients; its ``kl`` is derived, ``kl.loss_coef``.
      kl: the KL to the frozen reference: the one place the KL is set. The kernels' configs
        carry copies of it (``advantage``, ``loss``, ``weights``), which are made from it here
        whatever they held, so they cannot disagree.
      envrl: the ENVRL auxiliary losses (weights and resolved horizon), or None.
      envrl_by_updates: the ENVRL weights decay over RL updates (``envrl.horizon`` set), else
        over the RL phase's progress in iterations (``rl/envrl_data.py:schedule_step``).
      temperature: the rollouts' sampling temperature; the learner's log-probs are of
        ``logits / temperature``.
      context_mode: "episode" (a row per episode) or "step" (a row per step).
      epochs: shuffles of an iteration's rows per RL update.
      minibatch_size: rows per train step.
      microbatch_size: rows per microbatch of a train step (gradient accumulation), 0: whole.
      actor_lr, critic_lr, max_grad_norm: the optimizers' (Adam, global-norm clipping).
      off_policy_correction: "none", "tis" or "mis": the importance weights that correct each
        token's loss for the sampler's log-probs differing from the trained policy's
        (``kernels.importance_weights``); ``is_cap`` is their C.
      invalid_action_reward: added to the reward of each step whose action the env refused
        (``trajectory.refused``), before the advantages; 0 for none.
    """

    algo: str = "grpo"
    advantage: kernels.AdvantageConfig = kernels.AdvantageConfig()
    policy_loss: str = "ppo"
    loss: kernels.LossConfig = kernels.LossConfig()
    weights: LossWeights = LossWeights()
    kl: KLSpec = KLSpec()
    envrl: kernels.EnvrlConfig | None = None
    envrl_by_updates: bool = False
    temperature: float = 1.0
    context_mode: str = "episode"
    epochs: int = 1
    minibatch_size: int = 16
    microbatch_size: int = 0
    actor_lr: float = 2e-4
    critic_lr: float = 1e-3
    max_grad_norm: float = 1.0
    off_policy_correction: str = "none"
    is_cap: float = 2.0
    invalid_action_reward: float = 0.0

    def __post_init__(self):
        """The KL is set once, in ``kl``: the copies the kernels' configs carry are made from
        it."""
        kl = self.kl
        derived = {
            "advantage": dataclasses.replace(self.advantage, kl_coef=kl.reward_coef),
            "loss": dataclasses.replace(self.loss, kl_estimator=kl.estimator, kl_clamp=kl.clamp),
            "weights": dataclasses.replace(self.weights, kl=kl.loss_coef),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        if not self.temperature > 0:
            raise ValueError(f"RLSpec.temperature is {self.temperature!r}; expected > 0")
        if self.microbatch_size and self.minibatch_size % self.microbatch_size:
            raise ValueError(
                f"RLSpec.microbatch_size={self.microbatch_size} does not divide "
                f"minibatch_size={self.minibatch_size}"
            )

    @property
    def needs_critic(self) -> bool:
        """Whether the estimator reads a critic's values (a value model and value loss)."""
        return kernels.get_advantage_spec(self.algo).needs_values

    @property
    def score_rows(self) -> int:
        """Rows per chunk of the old / reference / value passes (``Learner.score``): a
        microbatch's when set (the activation memory a train step is sized for), else a
        minibatch's."""
        return self.microbatch_size or self.minibatch_size

    @classmethod
    def from_sections(
        cls, rl: Any, envrl: Any, *, context_mode: str, num_iterations: int = 1
    ) -> RLSpec:
        """The spec of a run's ``config.rl`` and ``config.envrl`` sections (read by field name).

        Args:
          rl: the ``rl`` section (``run/config.py:RLSection``).
          envrl: the ``envrl`` section (``EnvrlSection``).
          context_mode: ``config.rollout.context_mode``.
          num_iterations: the run's RL iterations: the ENVRL weights' horizon when
            ``envrl.horizon`` is 0.
        """
        kl = kl_spec(rl)
        envrl_config = None
        if envrl.enabled:
            envrl_config = kernels.EnvrlConfig(
                sp_weight=envrl.sp_weight,
                id_weight=envrl.id_weight,
                horizon=envrl.horizon or num_iterations,
            )
        return cls(
            algo=rl.algo,
            advantage=advantage_config(rl),
            policy_loss=rl.loss,
            loss=loss_config(rl),
            weights=LossWeights(value=rl.value_coef, entropy=rl.entropy_coef),
            kl=kl,
            envrl=envrl_config,
            envrl_by_updates=bool(envrl.horizon),
            temperature=float(rl.temperature),
            context_mode=context_mode,
            epochs=rl.epochs,
            minibatch_size=rl.minibatch_size,
            microbatch_size=rl.microbatch_size or 0,
            actor_lr=rl.actor_lr,
            critic_lr=rl.critic_lr,
            max_grad_norm=rl.max_grad_norm,
            off_policy_correction=rl.off_policy_correction,
            is_cap=rl.is_cap,
            invalid_action_reward=float(rl.invalid_action_reward),
        )

    @classmethod
    def for_losses(
        cls,
        *,
        loss_config: kernels.LossConfig | None = None,
        policy_loss: str = "ppo",
        weights: LossWeights | None = None,
        envrl: kernels.EnvrlConfig | None = None,
        temperature: float = 1.0,
    ) -> RLSpec:
        """The spec of a Learner built from its loss settings alone (SFT, tests, notebooks):
        the KL is a loss term of weight ``weights.kl`` (a reference is scored when it is > 0),
        with ``loss_config``'s estimator and clamp."""
        loss = loss_config or kernels.LossConfig()
        weights = weights or LossWeights()
        kl = KLSpec(mode="loss", coef=weights.kl, estimator=loss.kl_estimator, clamp=loss.kl_clamp)
        return cls(
            policy_loss=policy_loss,
            loss=loss,
            weights=weights,
            kl=kl,
            envrl=envrl,
            temperature=float(temperature),
        )


def kl_spec(rl: Any) -> KLSpec:
    """The KL part of an ``rl`` section."""
    return KLSpec(
        mode=rl.kl_mode,
        coef=rl.kl_coef,
        estimator=rl.kl_estimator,
        clamp=rl.kl_clamp,
        reference_dtype=rl.reference_dtype,
    )


def advantage_config(rl: Any) -> kernels.AdvantageConfig:
    """The estimators' settings of an ``rl`` section (the KL penalty in reward mode only, as
    ``RLSpec`` derives it)."""
    return kernels.AdvantageConfig(
        gamma=rl.gamma,
        lam=rl.lam,
        norm_by_std=rl.norm_by_std,
        step_weight=rl.step_weight,
        kl_coef=kl_spec(rl).reward_coef,
    )


def ratio_level(rl: Any) -> str:
    """``rl.ratio_level``, or with "auto" the one the estimator is registered with."""
    if rl.ratio_level == "auto":
        return kernels.get_advantage_spec(rl.algo).ratio_level
    return rl.ratio_level


def loss_config(rl: Any) -> kernels.LossConfig:
    """The losses' settings of an ``rl`` section (ratio level resolved)."""
    return kernels.LossConfig(
        clip_low=rl.clip_low,
        clip_high=rl.clip_high,
        dual_clip=rl.dual_clip,
        ratio_level=ratio_level(rl),
        aggregation=rl.aggregation,
        value_clip=rl.value_clip,
        kl_estimator=kl_spec(rl).estimator,
        kl_clamp=kl_spec(rl).clamp,
    )
