"""Frozen, hashable configs of the kernels (static jit arguments; validated on construction)."""

from __future__ import annotations

import dataclasses

AGGREGATIONS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "episode_mean")
RATIO_LEVELS = ("token", "action")


def _check_range(owner: str, name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ValueError(f"{owner}.{name} is {value!r}; expected a number in [{lo}, {hi}]")


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Settings shared by every advantage estimator (each reads the fields it needs).

    Attributes:
      gamma: discount over tokens (gae, reinforce_pp) or environment steps (gigpo, gagpo).
      lam: GAE lambda (gae, gagpo).
      norm_by_std: divide group-centred returns by the group std (grpo, gigpo, gagpo); False
        only subtracts the mean.
      eps: added to every std before dividing.
      step_weight: omega, the weight of GiGPO's step-level advantage.
      kl_coef: beta of the token-level KL reward penalty (gae, reinforce_pp; needs ``kl=``).
    """

    gamma: float = 1.0
    lam: float = 0.95
    norm_by_std: bool = True
    eps: float = 1e-6
    step_weight: float = 1.0
    kl_coef: float = 0.0

    def __post_init__(self):
        _check_range("AdvantageConfig", "gamma", self.gamma, 0.0, 1.0)
        _check_range("AdvantageConfig", "lam", self.lam, 0.0, 1.0)
        _check_range("AdvantageConfig", "eps", self.eps, 1e-12, 1.0)
        _check_range("AdvantageConfig", "kl_coef", self.kl_coef, 0.0, float("inf"))


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Settings of the policy, value, KL and entropy losses.

    Attributes:
      clip_low, clip_high: PPO clip range [1 - clip_low, 1 + clip_high] of the ratio.
      dual_clip: c > 1 of dual-clip PPO (bounds the loss of negative advantages by -c * A), or
        None to disable.
      ratio_level: "token" (one ratio per token) or "action" (exp of the mean token log-ratio over
        the action's tokens, shared by them, as GAGPO uses).
      aggregation: "token_mean", "seq_mean_token_sum", "seq_mean_token_mean" or "episode_mean"
        (see :func:`weighted.aggregate`).
      value_clip: clip range of the value prediction around the old value (None: unclipped).
      kl_estimator: "k1", "k2" or "k3" (low-variance).
      kl_clamp: clamp of the per-token KL estimate (None: no clamp).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    ratio_level: str = "token"
    aggregation: str = "token_mean"
    value_clip: float | None = 0.2
    kl_estimator: str = "k3"
    kl_clamp: float | None = None

    def __post_init__(self):
        _check_range("LossConfig", "clip_low", self.clip_low, 0.0, 1.0)
        _check_range("LossConfig", "clip_high", self.clip_high, 0.0, float("inf"))
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"LossConfig.dual_clip is {self.dual_clip!r}; expected None or > 1")
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(
                f"LossConfig.ratio_level is {self.ratio_level!r}; expected one of {RATIO_LEVELS}"
            )
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"LossConfig.aggregation is {self.aggregation!r}; expected one of {AGGREGATIONS}"
            )
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(
                f"LossConfig.kl_estimator is {self.kl_estimator!r}; expected 'k1', 'k2' or 'k3'"
            )
        for name in ("value_clip", "kl_clamp"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"LossConfig.{name} is {value!r}; expected None or > 0")


DEFAULT_LOSS_CONFIG = LossConfig()  # Immutable: safe as a shared default argument.
